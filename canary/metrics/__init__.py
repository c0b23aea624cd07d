"""The evidence layer: Prometheus metrics per revision, honest values and honest "no data".

* :mod:`canary.metrics.catalog` — metric kinds × profiles → grouped PromQL;
* :mod:`canary.metrics.promql` — escaping and template rendering;
* :mod:`canary.metrics.client` — configuration, our retry policy, error classification;
* :mod:`canary.metrics.detect` — ``auto`` profile detection with a cache and an explain-ready report;
* :mod:`canary.metrics.plan` — requests → few queries → measurements (the evidence keys are documented
  there);
* :mod:`canary.metrics.prometheus` — :class:`PrometheusEvidenceSource`, the :class:`EvidenceSource`.
"""

from canary.metrics.client import PrometheusConfig, RetryPolicy
from canary.metrics.plan import FRACTION_SUFFIX, QueryGrouping, fraction_key
from canary.metrics.prometheus import PrometheusEvidenceSource

__all__ = [
    "FRACTION_SUFFIX",
    "PrometheusConfig",
    "PrometheusEvidenceSource",
    "QueryGrouping",
    "RetryPolicy",
    "fraction_key",
]
