"""The simulated model pods produce the distributions they are configured with."""

from __future__ import annotations

import math
import re

from canary_sandbox.fleet.behaviour import KNATIVE_LATENCY_BUCKETS_MS, PodSimulator, RevisionBehaviour
from canary_sandbox.fleet.world import _OTEL_BOUNDS_MS, _render


def quantile_from_buckets(buckets: list[float], total: float, q: float) -> float:
    rank = q * total
    for bound, count in zip(KNATIVE_LATENCY_BUCKETS_MS, buckets, strict=True):
        if count >= rank:
            return bound
    return math.inf


def test_latency_median_follows_the_behaviour_and_grows_with_traffic_share() -> None:
    calm = PodSimulator("p1", "r1", "ml", RevisionBehaviour(median_ms=80, load_sensitivity=3.0), seed=1)
    calm.serve(5000, traffic_share=0.1)
    busy = PodSimulator("p2", "r1", "ml", RevisionBehaviour(median_ms=80, load_sensitivity=3.0), seed=1)
    busy.serve(5000, traffic_share=0.5)
    calm_median = quantile_from_buckets(calm.buckets, calm.latency_count, 0.5)
    busy_median = quantile_from_buckets(busy.buckets, busy.latency_count, 0.5)
    assert 80 <= calm_median <= 150  # 80 * 1.3 = 104 ms, within bucket resolution
    assert busy_median >= 200  # 80 * 2.5 = 200 ms


def test_error_rate_is_close_to_the_configured_one() -> None:
    pod = PodSimulator("p", "r", "ml", RevisionBehaviour(error_rate=0.05), seed=3)
    pod.serve(20000, 0.5)
    rate = pod.requests["5xx"] / (pod.requests["2xx"] + pod.requests["5xx"])
    assert abs(rate - 0.05) < 0.01


def test_gpu_memory_creeps_until_the_container_is_oom_killed() -> None:
    behaviour = RevisionBehaviour(gpu_base_mib=30000, gpu_mib_per_request=10, oom_at_mib=40000)
    pod = PodSimulator("p", "r", "ml", behaviour, seed=1)
    pod.serve(500, 0.1)
    assert pod.gpu_used_mib == 35000
    assert pod.restarts == 0
    pod.serve(500, 0.1)
    assert pod.restarts == 1
    assert pod.last_terminated_reason == "OOMKilled"
    assert pod.gpu_used_mib == 30000


def test_the_same_seed_gives_the_same_counters() -> None:
    first = PodSimulator("p", "r", "ml", RevisionBehaviour(), seed=42)
    second = PodSimulator("p", "r", "ml", RevisionBehaviour(), seed=42)
    first.serve(1000, 0.3)
    second.serve(1000, 0.3)
    assert (first.buckets, first.requests) == (second.buckets, second.requests)


def test_a_model_that_does_not_fit_is_oom_killed_each_time_it_loads() -> None:
    pod = PodSimulator("p", "r", "ml", RevisionBehaviour(ready_after_s=None, oom_while_loading_s=2.0), seed=1)
    for _ in range(9):
        pod.load(0.5)  # 4.5 s of loading: killed at 2 s and at 4 s
    assert (pod.restarts, pod.last_terminated_reason) == (2, "OOMKilled")
    fits = PodSimulator("q", "r", "ml", RevisionBehaviour(), seed=1)
    fits.load(60.0)
    assert (fits.restarts, fits.last_terminated_reason) == (0, None)


def test_the_breakers_503s_and_queue_time_count_only_around_it() -> None:
    """knative/serving pkg/queue/sharedmain/handlers.go (commit 1437e6f1) lines 78-79: the
    queue-proxy's own histogram sits inside ProxyHandler's breaker, which answers ErrRequestQueueFull
    with 503 without calling it (pkg/queue/handler.go, commit 4556161d, lines 61-68); line 106:
    otelhttp's histogram wraps the whole chain (the rest of the citations:
    tests/sandbox/test_queue_proxy_histograms.py)."""
    behaviour = RevisionBehaviour(median_ms=80, error_rate=0.0, shed_ratio=0.2, queue_ms=500.0)
    pod = PodSimulator("p", "r", "ml", behaviour, seed=5, keeps_inner=True)
    pod.serve(5000, 0.5)
    shed = pod.outer.counts["5xx"]
    assert 800 < shed < 1200  # 20 % of 5000
    assert pod.inner.counts == {"2xx": 5000 - shed}  # the model never saw them, and failed none
    assert pod.outer.total == 5000
    # the outer's time includes the wait for a slot (500 ms on average), the inner's does not
    assert pod.outer.sums_ms["2xx"] / pod.outer.counts["2xx"] > 500
    assert pod.inner.sums_ms["2xx"] / pod.inner.counts["2xx"] < 150
    assert pod.served_since_start == 5000 - shed  # what reached the model (GPU memory grows with it)


def test_knative_1_19_s_own_histogram_records_whole_seconds() -> None:
    """pkg/queue/request_metric.go (the kn.queueproxy.app.duration version) line 106:
    ``float64(latency / time.Second)``."""
    pod = PodSimulator("p", "r", "ml", RevisionBehaviour(median_ms=1500), seed=2, keeps_inner=True,
                       inner_whole_seconds=True)  # fmt: skip
    pod.serve(1000, 0.5)
    assert all(value % 1000 == 0 for value in pod.inner.sums_ms.values())
    assert pod.outer.sums_ms["2xx"] % 1000 != 0


def test_the_fleet_exports_both_otel_histograms_with_their_scopes() -> None:
    pod = PodSimulator("p", "llama-predictor-00002", "ml", RevisionBehaviour(shed_ratio=0.1), seed=1,
                       bounds_ms=_OTEL_BOUNDS_MS, keeps_inner=True)  # fmt: skip
    pod.serve(500, 0.5)
    text = _render(
        {("ml", "p"): pod}, {("ml", "p"): ("uid", 0.0, 1.0)}, "pod", "pod", "knative-otel-invocation"
    )
    assert "revision_request_count" not in text
    counts: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        if "_count{" in line:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            key = (line.split("{")[0], labels["otel_scope_name"], labels["http_response_status_code"])
            counts[key] = float(line.rsplit(" ", 1)[1])
    outer, inner = (
        "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp",
        "knative.dev/serving/pkg/queue",
    )
    assert counts == {
        ("kn_serving_invocation_duration_seconds_count", inner, "200"): pod.inner.counts["2xx"],
        ("http_server_request_duration_seconds_count", outer, "200"): pod.outer.counts["2xx"],
        ("http_server_request_duration_seconds_count", outer, "503"): pod.outer.counts["5xx"],
    }
    assert pod.outer.counts["5xx"] > 20
