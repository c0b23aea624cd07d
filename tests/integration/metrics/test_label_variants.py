"""Label variants of real installs, each on its own real Prometheus, detected with ``auto`` (issue #33, 5 and 8).

* Knative's queue-proxy pushing over OTLP to Prometheus' OTLP receiver: no ``namespace`` or ``pod``
  label — ``job``/``instance`` and, when promoted, ``k8s_namespace_name``; otherwise only
  ``target_info`` carries the namespace and the revision.
* kube-state-metrics behind a ServiceMonitor without honorLabels: ``exported_namespace``,
  ``exported_pod``, ``exported_container`` (the target's own labels take the plain names).
* request series that carry none of the labels the checks join on: detection says which setting
  to change, and the checks read no data with that reason.

What the series look like is the emulator's business (``canary_sandbox.kserve_metrics``, its
expectations cited in ``tests/sandbox/test_label_styles.py``); the truth comes from the raw events.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from canary_sandbox.kserve_metrics import Pod, Restart, Revision, Simulation
from canary_sandbox.prometheus import PrometheusServer
from structlog.testing import capture_logs

from canary.evidence import REQUESTS, EvidenceStatus, Measurement
from tests.integration.metrics.support import (
    AT_SECONDS,
    END,
    START,
    STEP,
    WINDOW,
    Scenario,
    counted_requests,
    make_policy,
    make_request,
)

NAMESPACE, MODEL = "llm", "mistral"
STABLE, CANARY = "mistral-predictor-00001", "mistral-predictor-00002"
CHECKS: list[dict[str, Any]] = [
    {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"},
    {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "2s"},
    {"name": "oom", "metric": "oom-kills", "max": 0},
    {"name": "restarts", "metric": "restarts", "max": 3},
    {"name": "warmup", "metric": "warmup-time", "max": "10m"},
]


def _world(request_labels: str = "scraped", ksm_labels: str = "pod") -> Simulation:
    from canary_sandbox.k8s_names import revision_pod_name

    def pods(revision: str, created: float, restarts: tuple[Restart, ...] = ()) -> tuple[Pod, ...]:
        return tuple(
            Pod(revision_pod_name(revision, index), created, created + 60 + 15 * index,
                restarts=restarts if index == 0 else ())
            for index in range(2)
        )  # fmt: skip

    common: dict[str, Any] = {
        "requests_profile": "knative-otel-invocation",
        "request_labels": request_labels,
        "ksm_labels": ksm_labels,
    }
    oom = (Restart(AT_SECONDS - 300.0, "kserve-container", "OOMKilled"),)
    revisions = [
        Revision(NAMESPACE, MODEL, STABLE, pods(STABLE, START - 7200.0), error_ratio=0.01, **common),
        Revision(NAMESPACE, MODEL, CANARY, pods(CANARY, AT_SECONDS - 900.0, oom), error_ratio=0.06, **common),
    ]
    return Simulation(revisions, start=START, end=END, step=STEP, seed=33)


def _scenario(
    simulation: Simulation, drop: str | None = None, replace: tuple[tuple[str, str], ...] = ()
) -> Iterator[Scenario]:
    text = simulation.openmetrics()
    for old, new in replace:
        text = text.replace(old, new)
    if drop is not None:  # series that never reached Prometheus
        text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith(drop))
        text = text.replace(f"# TYPE {drop} gauge\n", "")
    with PrometheusServer(backfill=text) as prometheus:
        yield Scenario(simulation, prometheus)


@pytest.fixture(scope="module")
def otlp_promoted() -> Iterator[Scenario]:
    yield from _scenario(_world("otlp"))


@pytest.fixture(scope="module")
def otlp_target_info() -> Iterator[Scenario]:
    yield from _scenario(_world("otlp-target-info"))


@pytest.fixture(scope="module")
def ksm_exported() -> Iterator[Scenario]:
    yield from _scenario(_world(ksm_labels="exported_pod"))


def _collect(scenario: Scenario, metrics: dict[str, Any] | None = None) -> Any:
    policy = make_policy(CHECKS, namespace=NAMESPACE, name=MODEL, metrics=metrics)
    with scenario.source() as source:
        return source.collect(
            policy, make_request(policy, NAMESPACE, CANARY, STABLE, inference_service=MODEL)
        )


def _ok(measurement: Measurement) -> float:
    assert measurement.status is EvidenceStatus.OK, measurement
    assert measurement.value is not None
    return measurement.value


def _assert_requests_read(scenario: Scenario, evidence: Any) -> None:
    for side, revision in (("canary", CANARY), ("stable", STABLE)):
        measurements = evidence.canary if side == "canary" else evidence.stable
        raw = counted_requests(scenario.simulation, revision, AT_SECONDS - WINDOW, AT_SECONDS)
        assert raw, "the simulation served requests"
        assert _ok(measurements[REQUESTS]) == len(raw)
        assert _ok(measurements["errors"]) == sum(1 for r in raw if r.status.startswith("5")) / len(raw)
    assert _ok(evidence.canary["p99"]) > 0


def test_otlp_pushed_request_metrics_with_the_namespace_promoted_are_read(otlp_promoted: Scenario) -> None:
    evidence = _collect(otlp_promoted)
    _assert_requests_read(otlp_promoted, evidence)
    assert evidence.profile["requests"] == "knative-otel-invocation"
    assert evidence.profile["requestLabels"] == "otlp"
    # the namespace from the promoted resource attribute, the pod from service.instance.id
    assert 'k8s_namespace_name="llm"' in evidence.canary["errors"].query
    assert "instance=~" in evidence.canary["errors"].query


def test_otlp_pushed_request_metrics_without_promotion_are_joined_with_target_info(
    otlp_target_info: Scenario,
) -> None:
    evidence = _collect(otlp_target_info)
    _assert_requests_read(otlp_target_info, evidence)
    assert evidence.profile["requestLabels"] == "otlp-target-info"
    query = evidence.canary["errors"].query
    assert "* on (job, instance) group_left (k8s_namespace_name, kn_revision_name) target_info{" in query
    assert f'kn_revision_name="{CANARY}"' in query
    # explain's own query for people joins the same way
    assert "target_info{" in evidence.canary_queries["errors"].promql


def test_the_otlp_style_can_be_set_instead_of_detected(otlp_target_info: Scenario) -> None:
    evidence = _collect(
        otlp_target_info, {"requests": "knative-otel-invocation", "requestLabels": "otlp-target-info"}
    )
    assert evidence.profile["requestLabels"] == "otlp-target-info"
    _assert_requests_read(otlp_target_info, evidence)
    # the wrong style is an honest no-data, never a zero
    wrong = _collect(otlp_target_info, {"requestLabels": "scraped"})
    assert wrong.canary["errors"].status is EvidenceStatus.NO_DATA


def test_kube_state_metrics_scraped_without_honor_labels_is_detected_and_read(ksm_exported: Scenario) -> None:
    evidence = _collect(ksm_exported)
    # the canary's first pod was OOM-killed once in the window (the simulation's raw event)
    assert _ok(evidence.canary["oom"]) == 1
    assert evidence.profile["kubeStateLabels"] == "exported_pod"
    assert _ok(evidence.canary["restarts"]) == 1
    assert evidence.canary["oom"].samples == 2  # both pods seen
    assert 0 < _ok(evidence.canary["warmup"]) <= 75  # ready 60 s and 75 s after creation
    assert "exported_pod=~" in evidence.canary_queries["oom"].promql


def test_request_series_without_the_join_labels_are_no_data_that_names_the_setting() -> None:
    """OTLP-pushed series with neither k8s_namespace_name nor a target_info to join: the metric
    exists, yet every query would match nothing; detection says so and which setting to change."""
    for scenario in _scenario(_world("otlp-target-info"), drop="target_info"):
        with capture_logs() as logs:
            evidence = _collect(scenario)
    errors = evidence.canary["errors"]
    assert errors.status is EvidenceStatus.NO_DATA
    assert "http_server_request_duration_seconds_count series exist" in errors.detail
    assert "spec.metrics.requestLabels" in errors.detail
    warned = [entry for entry in logs if entry.get("family") == "requestLabels"]
    assert warned and warned[0]["log_level"] == "warning"
    # the other families are read as usual
    assert _ok(evidence.canary["oom"]) == 1
    assert evidence.profile["requestLabels"] == "none"


def test_kube_state_metrics_without_pod_labels_name_the_setting_and_custom_names_read_them() -> None:
    """kube-state-metrics relabelled so that its series carry neither ``pod`` nor ``exported_pod``:
    detection says which setting to change; naming the labels in the policy reads the data."""
    renamed = ((',pod="kube-state-metrics-7c9d8b6f5d-x2x4k"', ""), ('exported_pod="', 'k8s_pod="'))
    for scenario in _scenario(_world(ksm_labels="exported_pod"), replace=renamed):
        blind = _collect(scenario)
        named = _collect(
            scenario,
            {
                "kubeStateLabels": "pod",
                "labels": {
                    "kubeStateMetrics": {
                        "namespace": "exported_namespace",
                        "pod": "k8s_pod",
                        "container": "exported_container",
                    }
                },
            },
        )
    oom = blind.canary["oom"]
    assert oom.status is EvidenceStatus.NO_DATA
    assert (
        "spec.metrics.kubeStateLabels" in oom.detail and "spec.metrics.labels.kubeStateMetrics" in oom.detail
    )
    assert _ok(blind.canary["errors"]) > 0  # the request checks are read as usual
    assert _ok(named.canary["oom"]) == 1
    assert 'k8s_pod=~"' in named.canary_queries["oom"].promql
