"""The evidence layer: Prometheus metrics per revision, honest values and honest "no data".

* :mod:`canary.metrics.catalog` — metric kinds × profiles → grouped PromQL (per tick: ``tick_queries``);
* :mod:`canary.metrics.promql` — escaping and template rendering;
* :mod:`canary.metrics.client` — HTTP and our retries (``envelope``: answers, ``connection``: settings);
* :mod:`canary.metrics.detect` — ``auto`` profile detection (``resolve``: each policy's per family);
* :mod:`canary.metrics.plan` — requests → few queries → measurements (the evidence keys are documented
  there);
* :mod:`canary.metrics.prometheus` — :class:`PrometheusEvidenceSource`, the :class:`EvidenceSource`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from canary.metrics.client import PrometheusConfig, RetryPolicy
    from canary.metrics.plan import FRACTION_SUFFIX, QueryGrouping, fraction_key
    from canary.metrics.prometheus import PrometheusEvidenceSource

# Imported on first use (PEP 562): `kserve-canary validate` needs canary.metrics.buckets and must not
# pay for the Prometheus client (requests, structlog) that these names pull in.
_LAZY = {
    "FRACTION_SUFFIX": "canary.metrics.plan",
    "PrometheusConfig": "canary.metrics.client",
    "PrometheusEvidenceSource": "canary.metrics.prometheus",
    "QueryGrouping": "canary.metrics.plan",
    "RetryPolicy": "canary.metrics.client",
    "fraction_key": "canary.metrics.plan",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'canary.metrics' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "FRACTION_SUFFIX",
    "PrometheusConfig",
    "PrometheusEvidenceSource",
    "QueryGrouping",
    "RetryPolicy",
    "fraction_key",
]
