"""The dashboard's Prometheus history of built-in checks, against a real Prometheus (issue 35, item 4).

A real Prometheus is backfilled with the simulated exporters of ``ml/llama`` (stable 00001: 2 % 5xx,
median latency 90 ms, 41,000 MiB per GPU; canary 00002: no 5xx, 130 ms, 52,000 MiB plus one spike).
The controller's own evidence source evaluates the checks on it; the evaluation goes into
``explain.json`` as the controller writes it, and the dashboard, over real HTTP, must draw each
built-in check per revision from Prometheus, not from "evaluations seen by the dashboard".
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.kserve_metrics import Pod, Revision, Simulation
from canary_sandbox.prometheus import PrometheusServer

from canary.metrics import PrometheusConfig, PrometheusEvidenceSource
from canary.policy.model import PromotionPolicy
from canary.policy.units import Unit, format_value
from canary.rollout.judge import judge_check
from canary.rollout.records import ExplainCheck, ExplainDocument
from tests.dashboard.conftest import CANARY, Api, World, start_dashboard
from tests.integration.metrics.support import AT, END, START, STEP, make_policy, make_request

STABLE = "llama-predictor-00001"
GIB_PER_MIB = 1 / 1024
CHECKS = [
    {"name": "p99", "metric": "latency", "quantile": 0.99, "maxIncrease": "50%"},
    {"name": "errors", "metric": "error-rate", "max": "5%"},
    {"name": "gpu", "metric": "gpu-memory-peak", "max": "100Gi"},
]


def _revision(name: str, created: float, **behaviour: object) -> Revision:
    pods = tuple(
        Pod(name=revision_pod_name(name, index), created=created, ready=created + 30.0 + 15 * index, gpus=1)
        for index in range(2)
    )
    return Revision("ml", "llama", name, pods, requests_profile="knative-opencensus", **behaviour)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def prometheus() -> Iterator[str]:
    simulation = Simulation(
        [
            _revision(STABLE, START - 7200, error_ratio=0.02, latency_median=0.09, gpu_used_mib=41000.0),
            _revision(CANARY, START - 60, latency_median=0.13, gpu_used_mib=52000.0, gpu_spike_mib=20000.0),
        ],
        start=START,
        end=END,
        step=STEP,
        seed=35,
    )
    with PrometheusServer(backfill=simulation.openmetrics()) as server:
        yield server.url


def _evaluated(url: str, world: World) -> tuple[ExplainDocument, PromotionPolicy]:
    """The evaluation at AT as the controller records it: judged values, grouped queries, and the
    canary's and the stable's own queries, all from the controller's evidence source."""
    policy = make_policy(CHECKS, namespace="ml", name="llama")
    with PrometheusEvidenceSource(PrometheusConfig(url=url), scrape_interval=STEP) as source:
        evidence = source.collect(policy, make_request(policy, "ml", CANARY, STABLE))
    judged = {
        check.name: judge_check(check, evidence.canary, evidence.stable, compare_with_stable=True)
        for check in policy.spec.checks
    }
    checks = tuple(
        ExplainCheck(
            name,
            str(judgement.verdict),
            judgement.value,
            judgement.unit,
            judgement.limit,
            judgement.stable_value,
            query=evidence.canary[name].query,
            canary_query=evidence.canary_queries[name].promql,
            stable_query=evidence.stable_queries[name].promql,
            max_allowed=judgement.max_allowed,
            min_allowed=judgement.min_allowed,
        )
        for name, judgement in judged.items()
    )
    document = ExplainDocument(
        at=AT, decision_id="d-history", revision=CANARY, stable_revision=STABLE, action="wait", checks=checks
    )
    return document, policy


def test_built_in_checks_are_drawn_per_revision_from_prometheus_history(
    prometheus: str, world: World
) -> None:
    state = world.start_rollout()
    document, _ = _evaluated(prometheus, world)
    stored = world.stored()
    # The rollout began 15 minutes before the evaluation (the samples end a minute before now).
    began = replace(state, started_at=AT - timedelta(minutes=15))
    world.store.save_files(
        "ml",
        "llama",
        {"state.json": began.to_json(), "explain.json": document.to_json()},
        resource_version=stored.resource_version,
        owner_uid=stored.owner_uid,
    )
    board = start_dashboard(world, prometheus_url=prometheus)
    try:
        charts = Api(board).get("/api/rollouts/ml/llama").json()["charts"]
    finally:
        board.stop()
    drawn = {chart["title"]: chart for chart in charts["checks"]}
    for chart in drawn.values():
        assert chart["prometheusError"] is None, chart
        assert chart["source"].startswith("Prometheus range queries"), chart["source"]
    curves = {
        title: {series["label"].split(" · ")[1]: series["points"] for series in chart["series"]}
        for title, chart in drawn.items()
    }
    # Every check has both curves over the rollout (15 minutes every 5 s or more: dozens of points).
    for title, revisions in curves.items():
        assert set(revisions) == {CANARY, STABLE}, title
        assert all(len(points) >= 20 for points in revisions.values()), (title, revisions)
    errors = curves["errors"]
    assert {value for _, value in errors[CANARY]} == {0.0}  # the canary answered no 5xx at all
    # 2 % 5xx, in %: each window's share is a sample of a few hundred requests, so the curve wanders.
    stable_errors = [value for _, value in errors[STABLE]]
    assert 1.0 < statistics.mean(stable_errors) < 3.0 and max(stable_errors) < 10.0, errors[STABLE]
    stable_p99 = dict(map(tuple, curves["p99"][STABLE]))
    canary_p99 = dict(map(tuple, curves["p99"][CANARY]))
    shared = set(stable_p99) & set(canary_p99)
    assert len(shared) >= 20
    assert sum(canary_p99[t] > stable_p99[t] for t in shared) > 0.8 * len(shared)  # 130 ms vs 90 ms median
    assert drawn["p99"]["unit"] == "ms"
    gpu = curves["gpu"]
    assert max(value for _, value in gpu[STABLE]) == pytest.approx(41000 * GIB_PER_MIB, rel=0.02)
    assert max(value for _, value in gpu[CANARY]) == pytest.approx(72000 * GIB_PER_MIB, rel=0.02)
    assert datetime.fromtimestamp(charts["from"], UTC) == AT - timedelta(minutes=15)
    # The limit line is the bound the judge compared the canary with (item 7), labelled as such.
    p99 = next(check for check in document.checks if check.name == "p99")
    assert p99.max_allowed is not None
    assert [(line["label"], line["value"]) for line in drawn["p99"]["limits"]] == [
        (
            f"judged bound ≤ {format_value(p99.max_allowed, Unit.SECONDS)}",
            pytest.approx(p99.max_allowed * 1000),
        )
    ]
