"""Few queries: counted by Prometheus itself, per evaluation, for one rollout and for a tick of several.

request-count, latency, error-rate, ttft, restarts and oom-kills come from the tick's counter samples, gpu-memory-peak and
kv-cache-usage and warmup-time from one peak query per family per tick (the first time a revision is asked for, its
past is filled by one range query per pipeline instead: /api/v1/query_range); the other checks are
one grouped query each. Both handlers are counted."""

from __future__ import annotations

from typing import Any

from canary.evidence import Evidence, EvidenceRequest
from canary.metrics import QueryGrouping
from canary.policy.model import PromotionPolicy
from tests.integration.metrics.support import Scenario, http_queries, make_policy, make_request, range_queries

CHECKS: list[dict[str, Any]] = [
    {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "2s", "maxIncrease": "20%"},
    {"name": "p95", "metric": "latency", "quantile": 0.95, "maxIncrease": "20%"},
    {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"},
    {"name": "oom", "metric": "oom-kills", "max": 0, "critical": True},
    {"name": "restarts", "metric": "restarts", "max": 0},
    {"name": "warmup", "metric": "warmup-time", "max": "3m"},
    {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9, "maxIncrease": "10%"},
    {"name": "kv", "metric": "kv-cache-usage", "max": "95%"},
    {"name": "ttft", "metric": "ttft", "quantile": 0.95, "max": "2s", "maxIncrease": "50%"},
]
EXPLICIT = {
    "requests": "knative-opencensus",
    "requestLabels": "scraped",
    "gpuLabels": "pod",
    "kubeStateLabels": "pod",
}
COUNTED = {"latency", "error-rate", "restarts", "oom-kills", "ttft"}
PEAKS = {"gpu-memory-peak", "kv-cache-usage", "warmup-time"}
OTHERS = [check for check in CHECKS if check["metric"] not in COUNTED | PEAKS]
# A fresh source's first tick: the request and the restart counters' samples and their backfills,
# and one backfill per peak family.
PIPELINES = 2 + 2 + len(PEAKS)


def _rollouts() -> list[tuple[PromotionPolicy, EvidenceRequest]]:
    llama = make_policy(CHECKS, metrics=EXPLICIT)
    quiet = make_policy(CHECKS, namespace="idle", name="quiet", metrics=EXPLICIT)
    dark = make_policy(CHECKS, namespace="idle", name="dark", metrics=EXPLICIT)
    return [
        (llama, make_request(llama, "kn118", "llama-predictor-00002", "llama-predictor-00001")),
        (quiet, make_request(quiet, "idle", "quiet-predictor-00002", None, inference_service="quiet")),
        (dark, make_request(dark, "idle", "dark-predictor-00002", None, inference_service="dark")),
    ]


def _values(evidence: Evidence) -> dict[str, tuple[str, float | None]]:
    measurements = {f"canary/{key}": m for key, m in evidence.canary.items()}
    measurements |= {f"stable/{key}": m for key, m in evidence.stable.items()}
    return {key: (m.status.value, m.value) for key, m in measurements.items()}


def _measured(scenario: Scenario, grouping: QueryGrouping, rollouts: list[tuple[PromotionPolicy, EvidenceRequest]]) -> tuple[list[Evidence], int]:  # fmt: skip
    with scenario.source(grouping=grouping) as source:
        before = http_queries(scenario.url) + range_queries(scenario.url)
        evidence = source.collect_many(rollouts)
        return evidence, http_queries(scenario.url) + range_queries(scenario.url) - before


def test_one_query_per_measure_answers_canary_and_stable(production: Scenario) -> None:
    rollout = _rollouts()[:1]
    grouped, grouped_queries = _measured(production, QueryGrouping.PER_ROLLOUT, rollout)
    naive, naive_queries = _measured(production, QueryGrouping.PER_REVISION, rollout)
    assert grouped_queries == PIPELINES + len(OTHERS) == grouped[0].queries
    compared = sum(1 for check in OTHERS if "maxIncrease" in check)
    assert naive_queries == PIPELINES + len(OTHERS) + compared == naive[0].queries
    assert _values(grouped[0]) == _values(naive[0])  # the same answers, fewer round trips


def test_a_tick_of_rollouts_costs_no_more_queries_than_one(production: Scenario) -> None:
    rollouts = _rollouts()
    tick, tick_queries = _measured(production, QueryGrouping.PER_TICK, rollouts)
    alone = [_measured(production, QueryGrouping.PER_ROLLOUT, [rollout]) for rollout in rollouts]
    assert tick_queries == PIPELINES + len(OTHERS)
    assert sum(queries for _, queries in alone) == len(rollouts) * (PIPELINES + len(OTHERS))
    for shared, (single, _) in zip(tick, alone, strict=True):
        assert _values(shared) == _values(single[0])
        assert shared.request == single[0].request


def test_per_rollout_grouping_does_not_share_the_other_checks_across_rollouts(production: Scenario) -> None:
    rollouts = _rollouts()
    _, queries = _measured(production, QueryGrouping.PER_ROLLOUT, rollouts)
    assert queries == PIPELINES + len(rollouts) * len(OTHERS)  # the pipelines are always per tick
