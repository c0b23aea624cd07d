"""Every builtin value, on every profile, against the truth computed from the raw simulated events."""

from __future__ import annotations

import math
from typing import Any

import pytest
from canary_sandbox.kserve_metrics import E2E_BUCKETS, TTFT_BUCKETS

from canary.evidence import REQUESTS, EvidenceStatus, Measurement
from canary.metrics import fraction_key
from canary.policy.units import Unit
from tests.integration.metrics.support import (
    AT_SECONDS,
    WINDOW,
    Scenario,
    counted_requests,
    latency_bounds_seconds,
    make_policy,
    make_request,
    quantile_band,
    revision_of,
)

MIB = 1048576

REQUEST_CHECKS: list[dict[str, Any]] = [
    {"name": "p50", "metric": "latency", "quantile": 0.5, "maxIncrease": "20%"},
    {"name": "p95", "metric": "latency", "quantile": 0.95, "maxIncrease": "20%"},
    {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "2s", "maxIncrease": "20%"},
    {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"},
]

PROFILES = [
    ("kn118", "llama", "llama-predictor-00002", "llama-predictor-00001", "knative-opencensus"),
    ("kn119", "bert", "bert-predictor-00005", "bert-predictor-00004", "knative-otel-queueproxy"),
    ("kn121", "resnet", "resnet-predictor-00008", "resnet-predictor-00007", "knative-otel-invocation"),
]


def _ok(measurement: Measurement) -> float:
    assert measurement.status is EvidenceStatus.OK, measurement
    assert measurement.value is not None
    return measurement.value


@pytest.mark.parametrize(("namespace", "name", "canary", "stable", "profile"), PROFILES)
def test_request_metrics_match_the_raw_requests(
    production: Scenario, namespace: str, name: str, canary: str, stable: str, profile: str
) -> None:
    policy = make_policy(REQUEST_CHECKS, namespace=namespace, name=name, metrics={"requests": profile})
    with production.source() as source:
        evidence = source.collect(
            policy, make_request(policy, namespace, canary, stable, inference_service=name)
        )
    assert evidence.profile["requests"] == profile
    for side, revision in (("canary", canary), ("stable", stable)):
        measurements = evidence.canary if side == "canary" else evidence.stable
        # Counted exactly (canary.metrics.counting): every request scraped after the window's first
        # sample, across queue-proxy restarts; tests/integration/metrics/test_counters.py checks
        # every bucket.
        raw = counted_requests(production.simulation, revision, AT_SECONDS - WINDOW, AT_SECONDS)
        latencies = [record.latency for record in raw]
        errors = sum(1 for record in raw if record.status.startswith("5"))
        assert len(raw) > 500, "the scenario must give a meaningful sample"

        requests = measurements[REQUESTS]
        assert requests.unit is Unit.COUNT
        assert _ok(requests) == len(raw)

        bounds = latency_bounds_seconds(profile)
        for check, quantile in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
            measured = measurements[check]
            low, high = quantile_band(latencies, quantile, bounds)
            assert low <= _ok(measured) <= high, (side, check, measured.value, (low, high))
            assert measured.unit is Unit.SECONDS
            assert measured.samples == len(raw)

        error_rate = measurements["errors"]
        assert _ok(error_rate) == errors / len(raw)
        assert error_rate.samples == len(raw)
        assert revision in error_rate.query


def test_kube_state_and_gpu_values_match_the_raw_events(production: Scenario) -> None:
    checks = [
        {"name": "oom", "metric": "oom-kills", "max": 0, "critical": True},
        {"name": "restarts", "metric": "restarts", "max": 0},
        {"name": "warmup", "metric": "warmup-time", "max": "3m"},
        {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9, "maxIncrease": "10%"},
        {"name": "kv", "metric": "kv-cache-usage", "max": "95%", "maxIncrease": "50%"},
    ]
    policy = make_policy(checks, metrics={"gpuLabels": "pod"})
    canary, stable = "llama-predictor-00002", "llama-predictor-00001"
    with production.source() as source:
        evidence = source.collect(policy, make_request(policy, "kn118", canary, stable))

    canary_revision = revision_of(production.simulation, canary)
    in_window = [
        restart
        for pod in canary_revision.pods
        for restart in pod.restarts
        if AT_SECONDS - WINDOW < restart.at <= AT_SECONDS
    ]
    assert _ok(evidence.canary["oom"]) == sum(1 for r in in_window if r.reason == "OOMKilled")
    assert _ok(evidence.canary["restarts"]) == len(in_window) == 2
    assert evidence.canary["oom"].samples == len(canary_revision.pods)

    ready = [pod.ready - pod.created for pod in canary_revision.pods if pod.ready is not None]
    assert _ok(evidence.canary["warmup"]) == max(ready)

    for side, revision in (("canary", canary), ("stable", stable)):
        measurements = evidence.canary if side == "canary" else evidence.stable
        samples = [
            sample
            for (name, _pod, _gpu), series in production.simulation.gpu_samples.items()
            if name == revision
            for sample in series
            if AT_SECONDS - WINDOW <= sample[0] <= AT_SECONDS
        ]
        peak_mib = max(used for _t, used, _free, _reserved in samples)
        peak_fraction = max(used / (used + free + reserved) for _t, used, free, reserved in samples)
        gpu = measurements["gpu"]
        assert _ok(gpu) == peak_mib * MIB
        assert gpu.unit is Unit.BYTES
        fraction = measurements[fraction_key("gpu")]
        assert _ok(fraction) == pytest.approx(peak_fraction, rel=1e-9)
        assert fraction.unit is Unit.RATIO
        gpus = {
            (pod, gpu_index)
            for (name, pod, gpu_index) in production.simulation.gpu_samples
            if name == revision
        }
        assert gpu.samples == len(gpus)

        kv = [
            level
            for (name, _pod), series in production.simulation.kv_samples.items()
            if name == revision
            for moment, level in series
            if AT_SECONDS - WINDOW <= moment <= AT_SECONDS
        ]
        # the stable revision exports the old vLLM name, the canary the new one
        assert _ok(measurements["kv"]) == pytest.approx(max(kv), rel=1e-12)


def test_storage_initializer_oom_counts_and_pods_born_in_the_window(production: Scenario) -> None:
    checks = [
        {"name": "oom", "metric": "oom-kills", "max": 0},
        {"name": "restarts", "metric": "restarts", "max": 0},
        {"name": "warmup", "metric": "warmup-time", "max": "3m"},
    ]
    policy = make_policy(checks, namespace="kn121", name="resnet")
    with production.source() as source:
        evidence = source.collect(
            policy, make_request(policy, "kn121", "resnet-predictor-00008", "resnet-predictor-00007")
        )
    revision = revision_of(production.simulation, "resnet-predictor-00008")
    assert _ok(evidence.canary["oom"]) == 1.0  # the storage-initializer, not the model container
    assert _ok(evidence.canary["restarts"]) == 1.0
    assert _ok(evidence.canary["warmup"]) == max(
        pod.ready - pod.created for pod in revision.pods if pod.ready
    )


def test_vllm_latency_quantiles_match_the_raw_requests(production: Scenario) -> None:
    checks = [
        {"name": "ttft-p95", "metric": "ttft", "quantile": 0.95, "max": "2s", "maxIncrease": "25%"},
        {"name": "e2e-p99", "metric": "e2e-latency", "max": "60s"},
    ]
    policy = make_policy(checks)
    with production.source() as source:
        evidence = source.collect(
            policy, make_request(policy, "kn118", "llama-predictor-00002", "llama-predictor-00001")
        )
    for revision, measurements in (
        ("llama-predictor-00002", evidence.canary),
        ("llama-predictor-00001", evidence.stable),
    ):
        # vLLM's histograms live in the model server: a queue-proxy restart does not reset them, and
        # they start with the pod's first request.
        first = production.simulation.first_tick_at_or_after(AT_SECONDS - WINDOW)
        firsts: dict[str, float] = {}
        for record in production.simulation.requests:
            if record.revision == revision:
                firsts[record.pod] = min(firsts.get(record.pod, math.inf), record.tick)
        raw = [
            r
            for r in production.simulation.requests
            if r.revision == revision and max(first, firsts[r.pod]) < r.tick <= AT_SECONDS
        ]
        low, high = quantile_band([r.ttft for r in raw], 0.95, TTFT_BUCKETS)
        assert low <= _ok(measurements["ttft-p95"]) <= high
        assert measurements["ttft-p95"].samples == pytest.approx(len(raw), rel=0.03)
        if revision == "llama-predictor-00002":
            low, high = quantile_band([r.e2e for r in raw], 0.99, E2E_BUCKETS)  # the default quantile
            assert low <= _ok(measurements["e2e-p99"]) <= high
    assert "e2e-p99" not in evidence.stable  # no maxIncrease: no stable measurement


def test_exported_pod_label_style_finds_the_gpus(production: Scenario) -> None:
    policy = make_policy(
        [{"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9}],
        namespace="kn119",
        name="bert",
        metrics={"gpuLabels": "exported_pod"},
    )
    with production.source() as source:
        evidence = source.collect(policy, make_request(policy, "kn119", "bert-predictor-00005", None))
        wrong_style = source.collect(
            make_policy(
                [{"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9}],
                namespace="kn119",
                name="bert",
                metrics={"gpuLabels": "pod"},
            ),
            make_request(policy, "kn119", "bert-predictor-00005", None),
        )
    samples = [
        used
        for (name, _pod, _gpu), series in production.simulation.gpu_samples.items()
        if name == "bert-predictor-00005"
        for moment, used, _free, _reserved in series
        if AT_SECONDS - WINDOW <= moment <= AT_SECONDS
    ]
    assert _ok(evidence.canary["gpu"]) == max(samples) * MIB
    # with the wrong label style nothing matches: an honest no-data, never a zero
    assert wrong_style.canary["gpu"].status is EvidenceStatus.NO_DATA
    assert "DCGM" in wrong_style.canary["gpu"].detail


def test_relabelled_revision_label_selects_the_revision(production: Scenario) -> None:
    policy = make_policy(
        REQUEST_CHECKS[2:],
        namespace="relabel",
        name="gemma",
        metrics={"requests": "knative-otel-invocation", "revisionLabel": "knative_revision"},
    )
    with production.source() as source:
        evidence = source.collect(
            policy, make_request(policy, "relabel", "gemma-predictor-00003", None, inference_service="gemma")
        )
    raw = counted_requests(production.simulation, "gemma-predictor-00003", AT_SECONDS - WINDOW, AT_SECONDS)
    errors = evidence.canary["errors"]
    assert 'knative_revision="gemma-predictor-00003"' in errors.query
    # the request metrics not by pod name (vLLM's histograms, which come along, always are)
    request_part = errors.query.split("vllm:")[0]
    assert "http_server_request_duration_seconds" in request_part  # the queue-proxy's, by its scope
    assert 'otel_scope_name="go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"' in request_part
    assert "deployment" not in request_part
    assert _ok(errors) == sum(1 for r in raw if r.status.startswith("5")) / len(raw)
    assert _ok(evidence.canary[REQUESTS]) == len(raw)
