"""``auto`` profiles: each install's metric family and DCGM label style found, reported, cached, re-checked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import requests
from canary_sandbox.exporter import FixtureExporter
from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.kserve_metrics import Pod, Revision, Simulation
from canary_sandbox.prometheus import PrometheusServer
from structlog.testing import capture_logs

from canary.evidence import REQUESTS, EvidenceStatus
from canary.metrics import PrometheusConfig, PrometheusEvidenceSource
from tests.integration.metrics.support import AT, AT_SECONDS, END, make_policy, make_request

POD = revision_pod_name("llama-predictor-00002")
CHECKS = [
    {"name": "errors", "metric": "error-rate", "max": "1%"},
    {"name": "oom", "metric": "oom-kills", "max": 0},
    {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9},
]


def _install(requests_profile: str | None, gpu_labels: str = "pod", *, extra: Revision | None = None) -> str:
    """OpenMetrics of a small install: one revision, one pod with a GPU, 10 minutes of history."""
    revision = Revision(
        "ml", "llama", "llama-predictor-00002",
        (Pod(revision_pod_name("llama-predictor-00002"), AT_SECONDS - 3600, AT_SECONDS - 3500, gpus=1),),
        requests_profile=requests_profile, gpu_labels=gpu_labels, error_ratio=0.05,
    )  # fmt: skip
    return Simulation([revision, *([extra] if extra else [])], start=END - 600, end=END, step=5).openmetrics()


def _label_calls(url: str) -> float:
    total = 0.0
    for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and "/api/v1/label" in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(
    scope="module", params=["knative-opencensus", "knative-otel-queueproxy", "knative-otel-invocation"]
)
def install(request: pytest.FixtureRequest) -> Iterator[tuple[str, PrometheusServer]]:
    profile = str(request.param)
    gpu_labels = "exported_pod" if profile == "knative-otel-queueproxy" else "pod"
    with PrometheusServer(backfill=_install(profile, gpu_labels)) as prometheus:
        yield profile, prometheus


def test_auto_finds_the_installed_request_family_and_gpu_labels(
    install: tuple[str, PrometheusServer],
) -> None:
    profile, prometheus = install
    policy = make_policy(CHECKS, namespace="ml")
    with PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=5) as source:
        with capture_logs() as logs:
            report = source.detect(AT)
        evidence = source.collect(policy, make_request(policy, "ml", "llama-predictor-00002", None))
    expected_gpu = "exported_pod" if profile == "knative-otel-queueproxy" else "pod"
    assert evidence.profile["requests"] == profile
    assert evidence.profile["gpuLabels"] == expected_gpu
    assert evidence.canary["errors"].status is EvidenceStatus.OK
    assert evidence.canary["gpu"].status is EvidenceStatus.OK
    explained = report.as_dict()
    assert explained["requests"]["choice"] == profile
    assert explained["gpuLabels"]["choice"] == expected_gpu
    assert len(explained["requests"]["lookedFor"]) == 3
    detected = {
        entry["family"]: entry["choice"] for entry in logs if entry["event"] == "metric profile detected"
    }
    assert detected == {
        "requests": profile,
        "requestLabels": "scraped",
        "gpuLabels": expected_gpu,
        "kubeStateLabels": "pod",
    }


def test_dcgm_exporter_with_old_namespace_labels_is_detected_and_its_gpus_found() -> None:
    """dcgm-exporter --use-old-namespace names the workload pod_name/pod_namespace; behind a
    ServiceMonitor the series also carry the target's pod label: the exporter's own pod (issue #33, 8)."""
    with (
        PrometheusServer(backfill=_install("knative-otel-invocation", "pod_name")) as prometheus,
        PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=5) as source,
    ):
        policy = make_policy(CHECKS, namespace="ml")
        evidence = source.collect(policy, make_request(policy, "ml", "llama-predictor-00002", None))
        detection = source.detect(AT).detections["gpuLabels"]
    assert detection.choice == "pod_name"
    assert "--use-old-namespace" in detection.detail
    assert evidence.profile["gpuLabels"] == "pod_name"
    assert evidence.canary["gpu"].status is EvidenceStatus.OK, evidence.canary["gpu"]
    assert evidence.canary["gpu"].samples == 1


def test_detection_is_cached_and_not_repeated_per_evaluation(install: tuple[str, PrometheusServer]) -> None:
    _, prometheus = install
    policy = make_policy(CHECKS, namespace="ml")
    with PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=5) as source:
        before = _label_calls(prometheus.url)
        first = source.collect(policy, make_request(policy, "ml", "llama-predictor-00002", None))
        after_first = _label_calls(prometheus.url)
        second = source.collect(policy, make_request(policy, "ml", "llama-predictor-00002", None))
        after_second = _label_calls(prometheus.url)
    # one look-up per auto setting: the request family and its labels, DCGM's and kube-state-metrics' labels
    assert after_first - before == 4
    assert after_second == after_first
    # the detection, the tick's request and restart counter samples with their backfills and the GPU
    # peaks' backfill, which the second call (the same tick) reuses
    assert first.queries - second.queries == 4 + 2 + 2 + 1


def test_nothing_found_is_no_data_that_says_what_was_looked_for() -> None:
    with PrometheusServer(backfill=_install(None)) as prometheus:
        policy = make_policy([*CHECKS[:2], {"name": "p99", "metric": "latency", "max": "1s"}], namespace="ml")
        with PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=5) as source:
            evidence = source.collect(policy, make_request(policy, "ml", "llama-predictor-00002", None))
            explained = source.explain()["detected"]["requests"]
    for key in (REQUESTS, "errors", "p99"):
        measurement = evidence.canary[key]
        assert measurement.status is EvidenceStatus.NO_DATA
        for metric in (
            "revision_request_count",
            "kn_queueproxy_app_duration_seconds_count",
            "kn_serving_invocation_duration_seconds_count",
        ):
            assert metric in measurement.detail
        assert "metrics export is enabled" in measurement.detail
    assert evidence.profile["requests"] == "none"
    assert evidence.canary["oom"].value == 0.0  # kube-state-metrics is there: other families still work
    assert explained["choice"] is None


def test_several_families_prefer_the_newest_and_say_so() -> None:
    older = Revision(
        "ml", "llama", "llama-predictor-00001",
        (Pod(revision_pod_name("llama-predictor-00001"), AT_SECONDS - 7200, AT_SECONDS - 7100),),
        requests_profile="knative-opencensus",
    )  # fmt: skip
    with (
        PrometheusServer(backfill=_install("knative-otel-invocation", extra=older)) as prometheus,
        PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=5) as source,
    ):
        detection = source.detect(AT).detections["requests"]
    assert detection.choice == "knative-otel-invocation"
    assert "revision_request_count" in detection.detail


def test_detection_is_rechecked_when_the_cache_expires() -> None:
    """Scraped live: the family appears after the first look-up, and is found once the cache expires."""
    exporting = False
    counter = [0.0]

    def exposition() -> str:
        if not exporting:
            return f'kube_pod_created{{namespace="ml",pod="{POD}",uid="u"}} 1\n'
        counter[0] += 3
        pod = f'namespace="ml",pod="{POD}",http_response_status_code="200"'
        return f"kn_serving_invocation_duration_seconds_count{{{pod}}} {counter[0]}\n"

    now = [1000.0]
    with (
        FixtureExporter(exposition) as exporter,
        PrometheusServer(scrape_targets=[exporter.target]) as prometheus,
    ):
        source = PrometheusEvidenceSource(
            PrometheusConfig(url=prometheus.url), scrape_interval=1, detection_ttl=600, clock=lambda: now[0]
        )
        with source:
            first, _ = source.detector.requests_profile(datetime.now(UTC))
            exporting = True
            _wait_for_series(prometheus.url, "kn_serving_invocation_duration_seconds_count")
            cached, cost = source.detector.requests_profile(datetime.now(UTC))
            now[0] += 1.01  # "nothing found" is re-checked after one scrape interval, not the full TTL
            found, _ = source.detector.requests_profile(datetime.now(UTC))
            now[0] += 120
            still, cost_after = source.detector.requests_profile(datetime.now(UTC))
    assert (first.choice, cached.choice, cost) == (None, None, 0)
    assert found.choice == "knative-otel-invocation"
    assert (still.choice, cost_after) == ("knative-otel-invocation", 0)  # a positive answer lives for the TTL


def _wait_for_series(url: str, metric: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not requests.get(f"{url}/api/v1/query", params={"query": metric}, timeout=5).json()["data"][
        "result"
    ]:
        assert time.monotonic() < deadline, f"Prometheus did not scrape {metric}"
        time.sleep(0.1)


@pytest.mark.parametrize("profile", ["knative-otel-queueproxy", "knative-otel-invocation"])
def test_a_generation_found_without_the_queue_proxys_outer_histogram_is_warned_about(profile: str) -> None:
    """Knative >= 1.19's checks read otelhttp's histogram around the breaker (issue #33, 4): an install
    whose scrape drops it (a metric relabelling; the model server's series of that name remain, with
    their own scope) has the generation detected, and the detail says which series is missing."""
    revision = Revision(
        "ml", "llama", "llama-predictor-00002",
        (Pod(revision_pod_name("llama-predictor-00002"), AT_SECONDS - 3600, AT_SECONDS - 3500, gpus=1),),
        requests_profile=profile, error_ratio=0.05, model_server_otel=True,
    )  # fmt: skip
    text = Simulation([revision], start=END - 600, end=END, step=5).openmetrics()
    dropped = "".join(
        line
        for line in text.splitlines(keepends=True)
        if not (line.startswith("http_server_request_duration_seconds") and 'container="queue-proxy"' in line)
    )
    with (
        PrometheusServer(backfill=dropped) as prometheus,
        PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=5) as source,
    ):
        policy = make_policy(CHECKS[:1], namespace="ml")
        evidence = source.collect(policy, make_request(policy, "ml", "llama-predictor-00002", None))
        detection = source.detect(AT).detections["requests"]
    assert detection.choice == profile
    assert "WARNING: no http_server_request_duration_seconds_count{otel_scope_name=~" in detection.detail
    assert 'contrib/instrumentation/net/http/otelhttp)?"} series' in detection.detail
    assert evidence.canary["errors"].status is EvidenceStatus.NO_DATA  # never the model server's


def test_the_outer_histogram_present_raises_no_warning(install: tuple[str, PrometheusServer]) -> None:
    _, prometheus = install
    with PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=5) as source:
        detection = source.detect(AT).detections["requests"]
    assert "WARNING" not in detection.detail
