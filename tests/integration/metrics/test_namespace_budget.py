"""The per-namespace budget of Prometheus time for custom queries, against the real Prometheus with a
delaying proxy in front (docs/security.md, "Fairness between namespaces").

Team A (kn118) has eight custom checks whose queries take Prometheus 9 s each; team B (kn119) has
builtin checks and one quick custom check. One ``collect_many`` for both, as one tick asks: team A's
custom queries are cut and deferred at its 1 s budget, with a reason naming it; its builtin safety
checks (error rate, OOM kills) are never deferred; team B's evidence, custom check included, is
whole; and the call returns about a budget later, not 36 s later."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from canary_sandbox.faultproxy import FaultProxy, ProxyFault

from canary.evidence import ErrorClass, EvidenceRequest, EvidenceStatus
from canary.metrics import PrometheusConfig
from canary.policy import PromotionPolicy
from tests.integration.metrics.support import AT, Scenario, make_policy, make_request

BUILTIN = [
    {"name": "errors", "metric": "error-rate", "max": "50%"},
    {"name": "oom", "metric": "oom-kills", "max": 5},
]
SLOW = [
    {
        "name": f"slow{index}",
        "promql": f'count(up{{job="hogmarker{index}"}}) or vector(0)',
        "unit": "count",
        "max": 1,
    }
    for index in range(8)
]
QUICK = [{"name": "quick", "promql": "vector(1)", "unit": "count", "max": 2}]


def test_one_namespaces_slow_custom_queries_are_deferred_at_its_budget_and_delay_no_other(
    production: Scenario,
) -> None:
    hog = make_policy(BUILTIN + SLOW, namespace="kn118", metrics={"requests": "knative-opencensus"})
    fair = make_policy(
        BUILTIN + QUICK, namespace="kn119", name="bert", metrics={"requests": "knative-otel-queueproxy"}
    )

    def asks(at: datetime) -> list[tuple[PromotionPolicy, EvidenceRequest]]:
        return [
            (hog, make_request(hog, "kn118", "llama-predictor-00002", "llama-predictor-00001", at=at)),
            (
                fair,
                make_request(
                    fair,
                    "kn119",
                    "bert-predictor-00005",
                    "bert-predictor-00004",
                    at=at,
                    inference_service="bert",
                ),
            ),
        ]

    with FaultProxy(production.url) as proxy:
        slow = proxy.add(ProxyFault.delay(9.0), path=r"/api/v1/query", body="hogmarker")
        with production.source(config=PrometheusConfig(url=proxy.url), namespace_query_seconds=1.0) as source:
            source.collect_many(asks(AT - timedelta(seconds=10)))  # the tick before: the books filled
            started = time.monotonic()
            hogged, honest = source.collect_many(asks(AT))
            took = time.monotonic() - started
    assert slow.hits >= 1, "team A's slow query was asked"
    assert took < 2.0, f"one tick's evidence took {took:.1f}s with a budget of 1s"
    for index in range(8):
        measurement = hogged.canary[f"slow{index}"]
        assert measurement.error_class is ErrorClass.DEFERRED, measurement
        assert "namespace kn118 spent its budget of 1s of Prometheus query time" in measurement.detail
        assert "horizon clock is paused" in measurement.detail
    for name in ("errors", "oom"):  # team A's own safety checks: never deferred
        assert hogged.canary[name].status is EvidenceStatus.OK, hogged.canary[name]
    for name in ("errors", "oom", "quick"):
        assert honest.canary[name].status is EvidenceStatus.OK, honest.canary[name]
    assert honest.canary["quick"].value == 1.0
