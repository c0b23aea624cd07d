"""The simulated queue-proxy writes its request histograms as Knative's does (issue #33, 4 and 9).

Upstream, as read for these expectations:

* knative/serving ``pkg/queue/sharedmain/handlers.go`` (commit 1437e6f19fc04d793d6888789c33c99cc6465024):
  line 78 composes ``requestAppMetricsHandler`` (the queue-proxy's own histogram) around the proxy to
  the model, line 79 wraps it in ``queue.ProxyHandler`` (the breaker), and line 106 wraps the whole
  chain in ``otelhttp.NewHandler`` with the same meter provider: the outer histogram.
* knative/serving ``pkg/queue/handler.go`` (commit 4556161dec622e531862642b41f085911b22f744), the
  breaker in ``ProxyHandler``: line 61 ``breaker.Maybe``, line 63 the inner chain runs only once a
  slot is free, lines 67-68 ``ErrRequestQueueFull`` is answered ``503`` without it.
* knative/serving ``pkg/queue/request_metric.go``, the 1.19-1.20 version: line 32
  ``scopeName = "knative.dev/serving/pkg/queue"``, line 33 the bounds 5 ms .. 10 s, line 62
  ``kn.queueproxy.app.duration``, line 106 ``float64(latency / time.Second)`` (whole seconds).
  1.21 renamed it ``kn.serving.invocation.duration`` (the serving release notes, #16290).
* open-telemetry/opentelemetry-go-contrib ``instrumentation/net/http/otelhttp/config.go`` (commit
  013433a5f0d211e91cce37270426af8976d118a9), line 30: the meter's name, the scope
  ``go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp``;
  ``internal/semconv/server.go`` (commit 177173ef730abd65290ef39c2b64845789ec06b3), lines 56-60:
  ``http.server.request.duration`` with bounds 0.005 .. 10 s.
* open-telemetry/opentelemetry-go ``exporters/prometheus/exporter.go`` (commit
  0237d616ba09c48b04feafa325c44096bbff22b5), line 49: every series carries ``otel_scope_name`` (and
  ``otel_scope_version``).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import pytest
from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.kserve_metrics import (
    MODEL_SERVER_SCOPE,
    OTEL_BUCKETS,
    OTELHTTP_SCOPE,
    QUEUE_PROXY_SCOPE,
    Pod,
    Revision,
    Simulation,
)

START, END, STEP = 1_000_000.0, 1_000_600.0, 5.0
INNER = {
    "knative-otel-queueproxy": "kn_queueproxy_app_duration_seconds",
    "knative-otel-invocation": "kn_serving_invocation_duration_seconds",
}
_LINE = re.compile(r"^([a-zA-Z_:][\w:]*)\{(.*)\} (\S+) (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _last_samples(text: str) -> Series:
    """The last value of every series in OpenMetrics text (as Prometheus would hold it at the end)."""
    last: Series = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match:
            labels = tuple(sorted(_LABEL.findall(match.group(2))))
            last[(match.group(1), labels)] = float(match.group(3))
    return last


def _by(series: Series, name: str, *, scope: str | None = None, le: str | None = None) -> dict[str, float]:
    """Per status code: ``name``'s values (of one scope; at one bucket bound)."""
    per_code: dict[str, float] = defaultdict(float)
    for (metric, labels), value in series.items():
        found = dict(labels)
        if metric != name or (scope is not None and found.get("otel_scope_name") != scope):
            continue
        if le is not None and found.get("le") != le:
            continue
        per_code[found["http_response_status_code"]] += value
    return dict(per_code)


def _overloaded(profile: str, *, model_server_otel: bool = False) -> Simulation:
    revision = "llama-predictor-00002"
    pods = tuple(
        Pod(revision_pod_name(revision, index), START - 3600.0, START - 3500.0) for index in range(2)
    )
    return Simulation(
        [
            Revision(
                "ns", "llama", revision, pods, requests_per_second=4.0, error_ratio=0.01,
                latency_median=0.6, latency_sigma=0.5, requests_profile=profile, shed_ratio=0.2,
                queue_seconds=1.5, model_server_otel=model_server_otel,
            )
        ],
        start=START, end=END, step=STEP, seed=33,
    )  # fmt: skip


@pytest.mark.parametrize("profile", sorted(INNER))
def test_the_breakers_503s_and_queue_time_reach_only_the_outer_histogram(profile: str) -> None:
    simulation = _overloaded(profile)
    series = _last_samples(simulation.openmetrics())
    records = simulation.requests
    shed = [record for record in records if record.shed]
    admitted = [record for record in records if not record.shed]
    assert len(shed) > 100 and len(admitted) > 1000
    assert all(record.status == "503" and record.queued == 0.0 for record in shed)

    outer = "http_server_request_duration_seconds"
    counted = _by(series, f"{outer}_count", scope=OTELHTTP_SCOPE)
    # handlers.go line 106: every request, with the code the client got (the breaker's 503s too)
    assert counted == {
        "200": sum(1 for r in records if r.status == "200"),
        "503": sum(1 for r in records if r.status == "503"),
    }
    # the client's time: the wait for a slot included
    assert sum(_by(series, f"{outer}_sum", scope=OTELHTTP_SCOPE).values()) == pytest.approx(
        sum(record.latency for record in records)
    )
    # handlers.go lines 78-79, handler.go 61-68: only what the breaker admitted, without its queueing
    inner = INNER[profile]
    assert _by(series, f"{inner}_count", scope=QUEUE_PROXY_SCOPE) == {
        "200": sum(1 for r in admitted if r.status == "200"),
        "503": sum(1 for r in admitted if r.status == "503"),
    }
    truncated = profile == "knative-otel-queueproxy"  # request_metric.go line 106: whole seconds
    expected_sum = sum(math.floor(r.app_latency) if truncated else r.app_latency for r in admitted)
    assert sum(_by(series, f"{inner}_sum", scope=QUEUE_PROXY_SCOPE).values()) == pytest.approx(expected_sum)
    assert sum(record.queued for record in admitted) > 0.5 * len(admitted)  # queueing is real here


@pytest.mark.parametrize("profile", sorted(INNER))
def test_both_histograms_carry_their_scope_and_the_same_bounds(profile: str) -> None:
    series = _last_samples(_overloaded(profile).openmetrics())
    bounds = {format(bound, "g") for bound in OTEL_BUCKETS} | {"+Inf"}
    for name, scope in (
        (INNER[profile], QUEUE_PROXY_SCOPE),
        ("http_server_request_duration_seconds", OTELHTTP_SCOPE),
    ):
        buckets = [dict(labels) for metric, labels in series if metric == f"{name}_bucket"]
        assert buckets and {labels["otel_scope_name"] for labels in buckets} == {scope}
        assert {labels["le"] for labels in buckets} == bounds  # request_metric.go 33, server.go 56-60
        assert {labels["container"] for labels in buckets} == {"queue-proxy"}
        assert all("revision" not in labels for labels in buckets)  # the revision is no metric label


def test_a_model_servers_own_histogram_of_the_same_name_has_another_scope_and_container() -> None:
    series = _last_samples(_overloaded("knative-otel-invocation", model_server_otel=True).openmetrics())
    name = "http_server_request_duration_seconds_count"
    scopes = {dict(labels)["otel_scope_name"] for metric, labels in series if metric == name}
    assert scopes == {OTELHTTP_SCOPE, MODEL_SERVER_SCOPE}
    model = [
        dict(labels)
        for metric, labels in series
        if metric == name and dict(labels)["otel_scope_name"] == MODEL_SERVER_SCOPE
    ]
    assert {labels["container"] for labels in model} == {"kserve-container"}
    # The model server sees what the breaker admitted, never the breaker's 503s.
    assert sum(_by(series, name, scope=MODEL_SERVER_SCOPE).values()) == sum(
        _by(series, "kn_serving_invocation_duration_seconds_count", scope=QUEUE_PROXY_SCOPE).values()
    )


def test_without_overload_the_two_histograms_agree() -> None:
    revision = "bert-predictor-00001"
    pods = (Pod(revision_pod_name(revision, 0), START - 3600.0, START - 3500.0),)
    simulation = Simulation(
        [Revision("ns", "bert", revision, pods, error_ratio=0.05, latency_median=0.05,
                  requests_profile="knative-otel-invocation")],
        start=START, end=END, step=STEP, seed=4,
    )  # fmt: skip
    series = _last_samples(simulation.openmetrics())
    for suffix in ("_count", "_sum"):
        outer = _by(series, f"http_server_request_duration_seconds{suffix}", scope=OTELHTTP_SCOPE)
        inner = _by(series, f"kn_serving_invocation_duration_seconds{suffix}", scope=QUEUE_PROXY_SCOPE)
        assert outer == pytest.approx(inner)
