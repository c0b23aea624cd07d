"""The simulated model pods produce the distributions they are configured with."""

from __future__ import annotations

import math

from canary_sandbox.fleet.behaviour import KNATIVE_LATENCY_BUCKETS_MS, PodSimulator, RevisionBehaviour


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
