"""Long InferenceService names, on a real Prometheus: every pod-joined check finds its pods (issue #33, 1).

Pods are named as the cluster names them (:func:`canary_sandbox.k8s_names.revision_pod_name`, checked
against Knative's and the apiserver's own tests in tests/sandbox/test_k8s_names.py). With the old
patterns ``<revision>-deployment-.*`` / ``(.+)-deployment-.+`` every check below read no data from 31
characters on: a 31-character name's pods are ``...-predictor-00001-deploymentx2k9p``, and from 37
characters the Deployment name is md5-shortened (knative.dev/pkg kmeta/names.go, line 61).

All rollouts are collected together (``collect_many``), so one query carries revisions of every naming
shape at once, as the controller's per-tick queries do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from canary_sandbox.k8s_names import revision_name, revision_pod_name
from canary_sandbox.kserve_metrics import Pod, Restart, Revision, Simulation
from canary_sandbox.prometheus import PrometheusServer

from canary.evidence import Evidence, EvidenceStatus, Measurement
from canary.metrics import PrometheusConfig, PrometheusEvidenceSource
from tests.integration.metrics.support import AT_SECONDS, END, STEP, WINDOW, make_policy, make_request

NAMESPACE = "long"
ISVC = "llama-3-1-70b-instruct-awq-chatbot-prod-eu-west1-canary2"  # ISVC[:31] is the name
LENGTHS = (30, 31, 36, 37, 53)  # 53: "<name>-predictor" is the longest name Knative accepts (63)
CHECKS: list[dict[str, Any]] = [
    {"name": "oom", "metric": "oom-kills", "max": 0, "critical": True},
    {"name": "restarts", "metric": "restarts", "max": 0},
    {"name": "warmup", "metric": "warmup-time", "max": "3m"},
    # maxIncrease: the stable revision's value is read too
    {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9, "maxIncrease": "50%"},
    {"name": "kv", "metric": "kv-cache-usage", "max": "95%", "maxIncrease": "50%"},
    {"name": "errors", "metric": "error-rate", "max": "50%", "maxIncrease": "50%"},
    {"name": "p90", "metric": "latency", "quantile": 0.9, "max": "5s", "maxIncrease": "50%"},
]
READY_AFTER = 60.0


def revisions(length: int) -> tuple[str, str]:
    """Knative's revision names (``kmeta.ChildName(configuration, "-%05d")``: hashed at 53)."""
    isvc = ISVC[:length]
    return revision_name(f"{isvc}-predictor", 1), revision_name(f"{isvc}-predictor", 2)


def pods(revision: str, created: float, *, oom: bool) -> tuple[Pod, ...]:
    restarts = (Restart(AT_SECONDS - 200.0, "kserve-container", "OOMKilled"),) if oom else ()
    return tuple(
        Pod(revision_pod_name(revision, index), created, created + READY_AFTER, gpus=1,
            restarts=restarts if index == 0 else ())
        for index in range(2)
    )  # fmt: skip


def simulation() -> Simulation:
    simulated = []
    for length in LENGTHS:
        stable, canary = revisions(length)
        for name, created, oom in ((stable, END - 7200, False), (canary, AT_SECONDS - 900, True)):
            simulated.append(
                Revision(NAMESPACE, ISVC[:length], name, pods(name, created, oom=oom),
                         error_ratio=0.1, requests_profile="knative-otel-invocation", vllm=True)
            )  # fmt: skip
    return Simulation(simulated, start=END - 1200, end=END, step=STEP, seed=33)


@pytest.fixture(scope="module")
def evidence() -> Iterator[dict[int, Evidence]]:
    with (
        PrometheusServer(backfill=simulation().openmetrics()) as prometheus,
        PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=STEP) as source,
    ):
        rollouts = []
        for length in LENGTHS:
            stable, canary = revisions(length)
            policy = make_policy(CHECKS, namespace=NAMESPACE, name="llama", metrics={"gpuLabels": "pod"})
            rollouts.append(
                (policy, make_request(policy, NAMESPACE, canary, stable, inference_service=ISVC[:length]))
            )
        yield dict(zip(LENGTHS, source.collect_many(rollouts), strict=True))


def ok(measurement: Measurement) -> float:
    assert measurement.status is EvidenceStatus.OK, measurement
    assert measurement.value is not None
    return measurement.value


@pytest.mark.parametrize("length", LENGTHS)
def test_every_pod_joined_check_reads_the_canary_and_the_stable(
    evidence: dict[int, Evidence], length: int
) -> None:
    found = evidence[length]
    assert ok(found.canary["oom"]) == 1.0
    assert ok(found.canary["restarts"]) == 1.0
    assert found.canary["oom"].samples == 2  # both pods seen
    assert ok(found.canary["warmup"]) == READY_AFTER
    for side in (found.canary, found.stable):
        assert ok(side["gpu"]) > 0
        assert side["gpu"].samples == 2  # one GPU per pod
        assert 0 < ok(side["kv"]) <= 1
        assert 0 < ok(side["errors"]) < 0.5
        assert 0 < ok(side["p90"]) < 5


def test_the_window_is_the_one_asked_for() -> None:
    assert WINDOW == 600.0  # the canary's pods were born 900 s before: all its restarts are inside
