"""The evidence pipeline against a real Prometheus: per-tick counter samples, the counter book, the
backfill after a restart, and a Prometheus cost that does not grow with the number of rollouts.

Every count is compared *exactly* with the simulation's raw requests (no PromQL in the truth)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.kserve_metrics import E2E_BUCKETS, TTFT_BUCKETS, Pod, Revision, Simulation
from canary_sandbox.prometheus import PrometheusServer, free_port

from canary.evidence import (
    REQUESTS,
    CountSeries,
    ErrorClass,
    Evidence,
    EvidenceRequest,
    EvidenceStatus,
    Histogram,
)
from canary.metrics import PrometheusConfig, PrometheusEvidenceSource, RetryPolicy
from canary.metrics.counting.counts import interpolated_quantile
from canary.policy.model import PromotionPolicy
from tests.integration.metrics.support import (
    AT,
    AT_SECONDS,
    END,
    REACH,
    STEP,
    WINDOW_START,
    Scenario,
    at_most,
    counted_requests,
    http_queries,
    latency_bounds_seconds,
    make_policy,
    make_request,
    quantile_band,
    range_queries,
    revision_of,
)

CHECKS: list[dict[str, Any]] = [
    {"name": "p50", "metric": "latency", "quantile": 0.5, "maxIncrease": "20%"},
    {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "2s", "maxIncrease": "20%"},
    {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"},
]
PROFILES = [
    ("kn118", "llama", "llama-predictor-00002", "llama-predictor-00001", "knative-opencensus"),
    ("kn119", "bert", "bert-predictor-00005", "bert-predictor-00004", "knative-otel-queueproxy"),
    ("kn121", "resnet", "resnet-predictor-00008", "resnet-predictor-00007", "knative-otel-invocation"),
]


def _request(
    policy: PromotionPolicy,
    namespace: str,
    canary: str,
    stable: str | None,
    *,
    at: datetime,
    window_start: datetime,
    history_start: datetime | None = None,
    inference_service: str = "llama",
) -> EvidenceRequest:
    request = make_request(policy, namespace, canary, stable, at=at, inference_service=inference_service)
    return replace(request, window_start=window_start, history_start=history_start)


def _assert_exact(series: CountSeries, simulation: Simulation, revision: str, profile: str) -> None:
    """Every tally equals the raw requests between its two snapshots, bucket by bucket."""
    assert series.status is EvidenceStatus.OK, series
    bounds = latency_bounds_seconds(profile)
    for tally in series.tallies:
        raw = counted_requests(simulation, revision, tally.start.timestamp(), tally.end.timestamp())
        assert tally.requests == len(raw), tally
        assert tally.errors == sum(1 for record in raw if record.status.startswith("5"))
        assert tally.client_errors == 0
        histogram = tally.histograms.get("latency")
        if histogram is None:  # no bucket series yet (pods not serving)
            assert raw == []
        else:
            assert histogram == Histogram(bounds, at_most(raw, bounds), len(raw))


@pytest.mark.parametrize(("namespace", "name", "canary", "stable", "profile"), PROFILES)
def test_counts_equal_the_raw_requests_on_every_profile(
    production: Scenario, namespace: str, name: str, canary: str, stable: str, profile: str
) -> None:
    policy = make_policy(CHECKS, namespace=namespace, name=name, metrics={"requests": profile})
    request = make_request(policy, namespace, canary, stable, inference_service=name)
    with production.source() as source:
        evidence = source.collect(policy, request)
    simulation = production.simulation
    for side, revision in (("canary", canary), ("stable", stable)):
        series = evidence.counts[side]
        _assert_exact(series, simulation, revision, profile)
        assert series.tallies[0].start == WINDOW_START  # the backfill's grid starts at the window
        assert series.tallies[-1].end == REACH  # as far as the samples reach: the last scrape
        raw = counted_requests(simulation, revision, WINDOW_START.timestamp(), AT_SECONDS)
        assert len(raw) > 500, "the scenario must give a meaningful sample"
        total = CountSeries.total(series.tallies)
        assert total is not None and total.requests == len(raw)

        measurements = evidence.canary if side == "canary" else evidence.stable
        assert (measurements[REQUESTS].value, measurements[REQUESTS].samples) == (len(raw), len(raw))
        errors = sum(1 for record in raw if record.status.startswith("5"))
        assert (measurements["errors"].value, measurements["errors"].samples) == (errors / len(raw), len(raw))
        bounds = latency_bounds_seconds(profile)
        histogram = Histogram(bounds, at_most(raw, bounds), len(raw))
        for check, quantile in (("p50", 0.5), ("p99", 0.99)):
            measured = measurements[check]
            assert measured.value == interpolated_quantile(quantile, histogram)
            assert measured.samples == len(raw)
            low, high = quantile_band([record.latency for record in raw], quantile, bounds)
            assert measured.value is not None and low <= measured.value <= high
        # no rate, no increase, no range selector: raw counters only
        for measurement in measurements.values():
            assert "increase(" not in measurement.query and "rate(" not in measurement.query
            assert re.search(r"\[\d+[smh]\]", measurement.query) is None


def test_vllm_histograms_travel_in_the_counts_and_equal_the_raw_requests(production: Scenario) -> None:
    checks = [
        {"name": "ttft", "metric": "ttft", "quantile": 0.95, "max": "2s", "maxIncrease": "25%"},
        {"name": "e2e", "metric": "e2e-latency", "max": "60s"},
    ]
    policy = make_policy(checks, metrics={"requests": "knative-opencensus"})
    with production.source() as source:
        evidence = source.collect(
            policy, make_request(policy, "kn118", "llama-predictor-00002", "llama-predictor-00001")
        )
    for side, revision in (("canary", "llama-predictor-00002"), ("stable", "llama-predictor-00001")):
        series = evidence.counts[side]
        for tally in series.tallies:
            raw = counted_requests(
                production.simulation, revision, tally.start.timestamp(), tally.end.timestamp()
            )
            ttft = tally.histograms.get("ttft")
            if ttft is None:
                assert raw == []
                continue
            assert ttft.edges == TTFT_BUCKETS
            assert ttft == Histogram(
                TTFT_BUCKETS, tuple(sum(1 for r in raw if r.ttft <= b) for b in TTFT_BUCKETS), len(raw)
            )
            e2e = tally.histograms["e2e-latency"]
            assert e2e == Histogram(
                E2E_BUCKETS, tuple(sum(1 for r in raw if r.e2e <= b) for b in E2E_BUCKETS), len(raw)
            )
        total = CountSeries.total(series.tallies)
        assert total is not None
        measurement = (evidence.canary if side == "canary" else evidence.stable)["ttft"]
        assert measurement.value == interpolated_quantile(0.95, total.histograms["ttft"])
        assert measurement.samples == total.histograms["ttft"].total == total.requests


def test_the_live_book_across_queue_proxy_restarts_equals_the_truth_and_the_backfill(
    production: Scenario,
) -> None:
    # llama's stable pod 2 restarts its queue-proxy at AT-250, the canary's pod 1 at AT-200.
    restarts = [
        restart.at
        for name in ("llama-predictor-00001", "llama-predictor-00002")
        for pod in revision_of(production.simulation, name).pods
        for restart in pod.restarts
        if restart.container == "queue-proxy"
    ]
    start = AT - timedelta(seconds=300)
    assert all(start.timestamp() < moment < AT_SECONDS for moment in restarts) and len(restarts) == 2
    policy = make_policy(CHECKS, metrics={"requests": "knative-opencensus"})
    ticks = [start + timedelta(seconds=index * STEP) for index in range(round(300 / STEP) + 1)]
    with production.source() as live:
        ranges_before = range_queries(production.url)
        instants_before = http_queries(production.url)
        for tick in ticks:
            request = _request(
                policy,
                "kn118",
                "llama-predictor-00002",
                "llama-predictor-00001",
                at=tick,
                window_start=max(start, tick - timedelta(seconds=60)),
                history_start=start,
            )
            evidence = live.collect(policy, request)
        assert range_queries(production.url) == ranges_before  # live from the first tick: no backfill
        assert http_queries(production.url) - instants_before == len(ticks)  # one sample per tick
    for side, revision in (("canary", "llama-predictor-00002"), ("stable", "llama-predictor-00001")):
        _assert_exact(evidence.counts[side], production.simulation, revision, "knative-opencensus")
        assert len(evidence.counts[side].tallies) == len(ticks) - 1
    # The window measurement rests on the last minute only, from the same counts.
    last_minute = counted_requests(
        production.simulation, "llama-predictor-00002", (AT - timedelta(seconds=60)).timestamp(), AT_SECONDS
    )
    assert evidence.canary[REQUESTS].value == len(last_minute)

    # A restarted controller: a fresh source asked the same at AT fills the past with one range query.
    with production.source() as fresh:
        ranges_before = range_queries(production.url)
        again = fresh.collect(policy, request)
        assert range_queries(production.url) - ranges_before == 1
    # The same counts; the past the restarted one filled is kept one tally per evaluation interval
    # (30 s) before the window's start, at the backfill's 5 s step after it (the last 4.5 s).
    for side in ("canary", "stable"):
        live_total, filled_total = (
            CountSeries.total(evidence.counts[side].tallies),
            CountSeries.total(again.counts[side].tallies),
        )
        assert live_total is not None and filled_total is not None
        # The same counts. The live book's first snapshot stands where its sample reaches (the
        # scrape before its tick), the backfill's at its grid point.
        assert replace(live_total, start=filled_total.start) == filled_total
        spans = [round((t.end - t.start).total_seconds()) for t in again.counts[side].tallies]
        # The last ends where the live sample reaches: the scrape half a second before AT.
        assert spans == [30] * 8 + [5] * 11 + [4]
    for key in evidence.canary:
        for before, after in (
            (evidence.canary[key], again.canary[key]),
            (evidence.stable[key], again.stable[key]),
        ):
            assert (after.status, after.value, after.samples) == (before.status, before.value, before.samples)


def test_restarts_from_the_restart_counters_live_and_backfilled(production: Scenario) -> None:
    # llama's canary: kserve-container OOMKilled at AT-300, queue-proxy at AT-200; stable: queue-proxy
    # at AT-250 (each asked as the canary of its own rollout here: restarts are not compared). The
    # live ticks are 30 s apart, the backfill's 5 s: both see every restart and its reason.
    policy = make_policy(
        [
            {"name": "restarts", "metric": "restarts", "max": 0},
            {"name": "oom", "metric": "oom-kills", "max": 0},
        ]
    )
    start = AT - timedelta(seconds=310)
    ticks = [start + timedelta(seconds=index * 30) for index in range(11)] + [AT]
    revisions = ("llama-predictor-00002", "llama-predictor-00001")

    def rollouts(at: datetime) -> list[tuple[PromotionPolicy, EvidenceRequest]]:
        return [
            (policy, _request(policy, "kn118", name, None, at=at, window_start=start, inference_service=name))
            for name in revisions
        ]

    with production.source() as live:
        for tick in ticks:
            evidence = live.collect_many(rollouts(tick))
    with production.source() as fresh:
        again = fresh.collect_many(rollouts(AT))
    simulation = production.simulation
    for answers in (evidence, again):
        for answer, revision in zip(answers, revisions, strict=True):
            restarts = answer.canary["restarts"]
            pods = revision_of(simulation, revision).pods
            truth = sum(1 for pod in pods for r in pod.restarts if start.timestamp() < r.at <= AT_SECONDS)
            assert (restarts.status, restarts.value, restarts.samples) == (
                EvidenceStatus.OK,
                truth,
                len(pods),
            )
            assert "increase(" not in restarts.query and "max_over_time" not in restarts.query
            oom = answer.canary["oom"]
            killed = sum(
                1
                for pod in pods
                for r in pod.restarts
                if start.timestamp() < r.at <= AT_SECONDS and r.reason == "OOMKilled"
            )
            assert (oom.status, oom.value, oom.samples) == (EvidenceStatus.OK, killed, len(pods))
            # the restart counters are not request counts
            assert "restarts_total" not in answer.counts["canary"].query
    assert [answer.canary["restarts"].value for answer in evidence] == [2, 1]
    assert [answer.canary["oom"].value for answer in evidence] == [1, 0]  # the queue-proxy's is no OOM


def test_a_canary_oom_killed_while_warming_up_counts_in_its_first_step(production: Scenario) -> None:
    """resnet's canary: pods created at AT-400, one storage-initializer OOMKilled at AT-380, Ready
    about AT-355; the rollout's first step starts at AT-300, after the kill. Its warm-up belongs to
    the first step (EvidenceRequest.canary_born): the kill is counted live and after a restart
    (backfilled), and is not when the step is not the first (the same window, no canary_born)."""
    policy = make_policy(
        [
            {"name": "restarts", "metric": "restarts", "max": 0},
            {"name": "oom", "metric": "oom-kills", "max": 0, "critical": True},
        ],
        namespace="kn121",
        name="resnet",
    )
    canary, stable = "resnet-predictor-00008", "resnet-predictor-00007"
    born, step_start = AT - timedelta(seconds=390), AT - timedelta(seconds=300)
    pods = revision_of(production.simulation, canary).pods
    kills = [r for pod in pods for r in pod.restarts if r.at <= AT_SECONDS]
    assert [r.reason for r in kills] == ["OOMKilled"] and kills[0].at < step_start.timestamp()

    def request(at: datetime, first_step: bool) -> EvidenceRequest:
        plain = _request(
            policy, "kn121", canary, stable, at=at, window_start=step_start, inference_service="resnet"
        )
        return replace(plain, canary_born=born if first_step else None)

    ticks = [step_start + timedelta(seconds=index * 30) for index in range(1, 11)]
    for first_step, counted in ((True, 1), (False, 0)):
        with production.source() as live:
            for tick in ticks:
                evidence = live.collect(policy, request(tick, first_step))
                assert evidence.canary["oom"].value == counted, (tick, first_step)
        with production.source() as fresh:  # a restarted controller: the same counts, backfilled
            again = fresh.collect(policy, request(AT, first_step))
        for answer in (evidence, again):
            oom, restarts = answer.canary["oom"], answer.canary["restarts"]
            assert (oom.status, oom.value, oom.samples) == (EvidenceStatus.OK, counted, len(pods))
            assert (restarts.status, restarts.value) == (EvidenceStatus.OK, counted)


@pytest.mark.parametrize("others", ["bert evaluated", "nothing else"])
def test_a_watched_canary_oom_killed_while_warming_up_is_an_alarm_before_any_evaluation(
    production: Scenario, others: str
) -> None:
    """resnet's canary is watched (PrometheusEvidenceSource.watch_warm_up) from its rollout's start,
    every 10 s, while bert's rollout is evaluated (its collect takes the tick's sample) or nothing else
    needs evidence (sample_warm_up takes it): the canary's storage-initializer OOM kill (AT-380) is an
    alarm in the first tick whose sample holds it, once — whether the watch began before its pods
    existed or after the kill (its first sample counted from birth). Unwatched, a revision nobody
    evaluates raises nothing. sample_warm_up after a collect in the same tick asks Prometheus nothing."""
    resnet = make_policy([{"name": "oom", "metric": "oom-kills", "max": 0, "critical": True}], namespace="kn121",
                         name="resnet")  # fmt: skip
    bert = make_policy([{"name": "restarts", "metric": "restarts", "max": 3}], namespace="kn119", name="bert")
    canary = "resnet-predictor-00008"
    kills = [r.at for pod in revision_of(production.simulation, canary).pods for r in pod.restarts]
    assert len(kills) == 1
    start = AT - timedelta(seconds=420)
    ticks = [start + timedelta(seconds=index * 10) for index in range(20)]
    for watch_from in (AT - timedelta(seconds=410), AT - timedelta(seconds=330), None):
        alarms: list[datetime] = []
        with production.source() as source:
            for tick in ticks:
                if watch_from is not None and tick >= watch_from:
                    source.watch_warm_up(resnet, canary, AT - timedelta(seconds=410), tick)
                if others == "bert evaluated":
                    request = _request(bert, "kn119", "bert-predictor-00005", None, at=tick, window_start=start,
                                       inference_service="bert")  # fmt: skip
                    source.collect(bert, request)
                    before = http_queries(production.url)
                    source.sample_warm_up(tick)
                    assert http_queries(production.url) == before, "the collect's sample serves the tick"
                else:
                    source.sample_warm_up(tick)
                if ("kn121", canary) in source.take_alarms():
                    alarms.append(tick)
        if watch_from is None:
            assert alarms == []
            continue
        (raised,) = alarms
        first_look = max(kills[0], watch_from.timestamp())
        assert first_look <= raised.timestamp() <= first_look + STEP + 10, (watch_from, raised)


def test_a_backfill_split_by_the_sample_budget_gives_the_same_counts(production: Scenario) -> None:
    policy = make_policy(CHECKS, metrics={"requests": "knative-opencensus"})
    request = make_request(policy, "kn118", "llama-predictor-00002", "llama-predictor-00001")
    with production.source() as whole:
        expected = whole.collect(policy, request)
    with production.source(backfill_sample_budget=2_000) as split:
        before = range_queries(production.url)
        evidence = split.collect(policy, request)
        spent = range_queries(production.url) - before
    assert spent > 2  # two revisions, each over the budget for the whole range
    assert evidence.counts == expected.counts


def test_no_series_is_no_data_and_no_requests_is_zero(production: Scenario) -> None:
    for name in ("dark", "quiet"):
        policy = make_policy(CHECKS, namespace="idle", name=name, metrics={"requests": "knative-opencensus"})
        request = make_request(policy, "idle", f"{name}-predictor-00002", None, inference_service=name)
        with production.source() as source:
            evidence = source.collect(policy, request)
        series = evidence.counts["canary"]
        assert "stable" not in evidence.counts
        if name == "dark":  # pods, no request series at all
            assert series.status is EvidenceStatus.NO_DATA
            assert evidence.canary[REQUESTS].status is EvidenceStatus.NO_DATA
        else:  # request series that never move: ok, zero requests, and too few for a rate
            assert series.status is EvidenceStatus.OK
            total = CountSeries.total(series.tallies)
            assert total is not None and (total.requests, total.errors) == (0, 0)
            assert (evidence.canary[REQUESTS].status, evidence.canary[REQUESTS].value) == (
                EvidenceStatus.OK,
                0,
            )
            assert evidence.canary["errors"].status is EvidenceStatus.NO_DATA
            assert evidence.canary["errors"].detail == "no requests in the window; a value needs at least 1"


def test_a_failed_sample_is_error_counts_never_a_failure() -> None:
    closed = PrometheusConfig(url=f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(attempts=1))
    policy = make_policy(CHECKS, metrics={"requests": "knative-opencensus"})
    request = make_request(policy, "kn118", "llama-predictor-00002", "llama-predictor-00001")
    with PrometheusEvidenceSource(closed, scrape_interval=STEP) as source:
        evidence = source.collect(policy, request)
    for side in ("canary", "stable"):
        assert evidence.counts[side].status is EvidenceStatus.ERROR
        assert evidence.counts[side].error_class is ErrorClass.UNREACHABLE
    for measurement in (*evidence.canary.values(), *evidence.stable.values()):
        assert (measurement.status, measurement.error_class) == (EvidenceStatus.ERROR, ErrorClass.UNREACHABLE)


def test_gauge_peaks_tick_by_tick_equal_the_raw_samples_and_the_backfill(production: Scenario) -> None:
    checks = [
        {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9, "maxIncrease": "10%"},
        {"name": "kv", "metric": "kv-cache-usage", "max": "95%", "maxIncrease": "50%"},
    ]
    policy = make_policy(checks, metrics={"gpuLabels": "pod"})
    start = AT - timedelta(seconds=300)
    ticks = [start + timedelta(seconds=index * STEP) for index in range(round(300 / STEP) + 1)]
    window = timedelta(seconds=120)  # the canary's GPU-memory spike is mid-way through its life
    with production.source() as live:
        for tick in ticks:
            request = _request(
                policy,
                "kn118",
                "llama-predictor-00002",
                "llama-predictor-00001",
                at=tick,
                window_start=max(start, tick - window),
            )
            evidence = live.collect(policy, request)
    simulation = production.simulation
    window_start = (AT - window).timestamp()
    for side, revision in (("canary", "llama-predictor-00002"), ("stable", "llama-predictor-00001")):
        measurements = evidence.canary if side == "canary" else evidence.stable
        samples = [
            sample
            for (name, _pod, _gpu), series in simulation.gpu_samples.items()
            if name == revision
            for sample in series
            if window_start < sample[0] <= AT_SECONDS
        ]
        assert measurements["gpu"].value == max(used for _t, used, _f, _r in samples) * 1048576
        fraction = max(used / (used + free + reserved) for _t, used, free, reserved in samples)
        assert measurements["gpu:fraction"].value == pytest.approx(fraction, rel=1e-9)
        assert measurements["gpu"].samples == len(
            {key for key in simulation.gpu_samples if key[0] == revision}
        )
        levels = [
            level
            for (name, _pod), series in simulation.kv_samples.items()
            if name == revision
            for moment, level in series
            if window_start < moment <= AT_SECONDS
        ]
        assert measurements["kv"].value == pytest.approx(max(levels), rel=1e-12)
    with production.source() as fresh:  # after a restart: the same values from one backfill each
        again = fresh.collect(policy, request)
    for key in evidence.canary:
        for before, after in (
            (evidence.canary[key], again.canary[key]),
            (evidence.stable.get(key), again.stable.get(key)),
        ):
            if before is not None and after is not None:
                assert (after.status, after.value, after.samples) == (
                    before.status,
                    before.value,
                    before.samples,
                )


# ---------------------------------------------------------------------------------------------
# Cost independent of the number of rollouts

FLEET = 50
FLEET_END = END
# The fleet's scrape interval: a common one in production, and a third of the samples of the 5 s that
# the other tests use to see tallies per scrape (100 revisions' histograms are 390 MB of OpenMetrics
# to backfill at 5 s). The assertions below hold for any interval.
FLEET_STEP = 15.0
FLEET_AT = datetime.fromtimestamp(FLEET_END + 0.5, UTC)


def _fleet_revisions() -> list[Revision]:
    revisions = []
    for index in range(FLEET):
        for number in (1, 2):
            name = f"m{index}-predictor-0000{number}"
            pod = Pod(
                name=revision_pod_name(name),
                created=FLEET_END - 7200,
                ready=FLEET_END - 7000,
                gpus=1,
            )
            revisions.append(
                Revision(
                    "fleet",
                    f"m{index}",
                    name,
                    (pod,),
                    requests_per_second=1.0,
                    error_ratio=0.02,
                    requests_profile="knative-otel-invocation",
                    vllm=True,
                )
            )
    return revisions


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[Simulation, PrometheusServer]]:
    simulation = Simulation(
        _fleet_revisions(), start=FLEET_END - 600, end=FLEET_END, step=FLEET_STEP, seed=12
    )
    with PrometheusServer(backfill=simulation.openmetrics()) as prometheus:
        yield simulation, prometheus


FLEET_CHECKS = [
    *CHECKS,
    {"name": "restarts", "metric": "restarts", "max": 0},
    {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9, "maxIncrease": "10%"},
    {"name": "kv", "metric": "kv-cache-usage", "max": "95%"},
    {"name": "warmup", "metric": "warmup-time", "max": "5m"},
]


def _fleet_rollouts(count: int, at: datetime) -> list[tuple[PromotionPolicy, EvidenceRequest]]:
    rollouts = []
    for index in range(count):
        policy = make_policy(
            FLEET_CHECKS,
            namespace="fleet",
            name=f"m{index}",
            metrics={"requests": "knative-otel-invocation", "gpuLabels": "pod"},
        )
        step_start = FLEET_AT - timedelta(seconds=400) + timedelta(seconds=7 * index)  # staggered
        request = _request(
            policy,
            "fleet",
            f"m{index}-predictor-00002",
            f"m{index}-predictor-00001",
            at=at,
            window_start=step_start,
            history_start=step_start - timedelta(seconds=120),
            inference_service=f"m{index}",
        )
        rollouts.append((policy, request))
    return rollouts


def _tick_cost(prometheus: PrometheusServer, collect: Any) -> tuple[int, int]:
    instants, ranges = http_queries(prometheus.url), range_queries(prometheus.url)
    collect()
    return http_queries(prometheus.url) - instants, range_queries(prometheus.url) - ranges


@pytest.mark.parametrize("count", [2, FLEET])
def test_queries_per_tick_are_the_same_for_2_and_50_rollouts(
    fleet: tuple[Simulation, PrometheusServer], count: int
) -> None:
    simulation, prometheus = fleet
    ticks = [FLEET_AT - timedelta(seconds=60), FLEET_AT - timedelta(seconds=30), FLEET_AT]
    config = PrometheusConfig(url=prometheus.url)
    with PrometheusEvidenceSource(config, scrape_interval=FLEET_STEP) as source:
        first = _tick_cost(prometheus, lambda: source.collect_many(_fleet_rollouts(count, ticks[0])))
        second = _tick_cost(prometheus, lambda: source.collect_many(_fleet_rollouts(count, ticks[1])))
        # The controller's way: one collect per rollout from worker threads, each with its own `now`
        # (within half a scrape interval): one sample serves them all.
        rollouts = _fleet_rollouts(count, ticks[2])
        jittered = [
            (policy, replace(request, at=request.at - timedelta(seconds=(index % 5) * 0.4)))
            for index, (policy, request) in enumerate(rollouts)
        ]
        results: list[Evidence] = []

        def threaded() -> None:
            with ThreadPoolExecutor(max_workers=8) as pool:
                results.extend(pool.map(lambda pair: source.collect(*pair), jittered))

        third = _tick_cost(prometheus, threaded)
    # The first tick: the request and restart counters' samples, and one range query each filling
    # every rollout's history of request counts, restarts, GPU, KV-cache and warm-up peaks. Then one
    # query per pipeline per tick, whatever the number of rollouts.
    assert first[0] == 2
    assert first[1] >= 5  # one per pipeline, more when a backfill is split by the sample budget
    assert second == (5, 0)
    assert third == (5, 0)
    # The shared sample stands for every `at`, where it reaches: the newest scrape before the tick.
    reach = results[0].counts["canary"].tallies[-1].end
    assert ticks[2] - timedelta(seconds=FLEET_STEP) < reach <= ticks[2]
    for (_, request), evidence in zip(jittered, results, strict=True):
        canary = request.canary_revision
        series = evidence.counts["canary"]
        assert series.status is EvidenceStatus.OK
        assert series.tallies[-1].end == reach
        assert series.newest is not None and series.newest <= reach  # its own newest sample
        picked = series.since(request.counts_start - timedelta(seconds=FLEET_STEP / 2))
        total = CountSeries.total(picked)
        raw = counted_requests(simulation, canary, picked[0].start.timestamp(), ticks[2].timestamp())
        assert total is not None and total.requests == len(raw) > 0
        assert evidence.canary["warmup"].value == 200.0  # ready 200 s after creation
        for key in ("gpu", "gpu:fraction", "kv", "warmup"):
            assert evidence.canary[key].status is EvidenceStatus.OK, evidence.canary[key]
        assert evidence.canary["gpu"].samples == 1
        # Each measurement shows the query narrowed to its own revision, not the tick's grouped one
        # (at 1,000 rollouts that one is about 100 kB, and explain.json would hold it per check).
        others = {r.canary_revision for _, r in jittered} - {canary}
        for key, measurement in evidence.canary.items():
            assert canary in measurement.query, (key, measurement.query)
            assert not [other for other in others if other in measurement.query], (key, measurement.query)


# ---------------------------------------------------------------------------------------------
# The per-tick budget of custom queries


def test_custom_queries_beyond_the_tick_budget_are_deferred_and_take_turns(production: Scenario) -> None:
    custom = [
        {
            "name": "custom",
            "promql": 'sum(revision_request_count{revision_name="{{ revision }}"})',
            "max": 1e9,
        }
    ]
    rollouts = []
    for name, revision in (("llama", "llama-predictor-00002"), ("other", "llama-predictor-00001")):
        policy = make_policy(custom, metrics={"requests": "knative-opencensus"})
        rollouts.append((policy, make_request(policy, "kn118", revision, None, inference_service=name)))
    deferred_per_tick = []
    with production.source(max_single_queries_per_tick=1) as source:
        for tick in range(4):
            at = AT - timedelta(seconds=30 * (4 - tick))
            evidence = source.collect_many(
                [(p, replace(r, at=at, window_start=at - timedelta(seconds=60))) for p, r in rollouts]
            )
            deferred = [
                index
                for index, answer in enumerate(evidence)
                if answer.canary["custom"].error_class is ErrorClass.DEFERRED
            ]
            assert len(deferred) == 1
            measurement = evidence[deferred[0]].canary["custom"]
            assert measurement.status is EvidenceStatus.ERROR
            assert measurement.detail == (
                "not asked this tick: the per-tick budget of 1 custom queries is spent; asked next tick"
            )
            assert evidence[1 - deferred[0]].canary["custom"].status is EvidenceStatus.OK
            deferred_per_tick.append(deferred[0])
    assert deferred_per_tick in ([1, 0, 1, 0], [0, 1, 0, 1])  # nobody starved


def test_an_oom_kill_is_an_alarm_once_in_the_first_sample_that_shows_it(production: Scenario) -> None:
    """The per-tick sample of every tracked revision reports the canaries OOM-killed since the last
    one (the controller looks at their rollouts at once): llama's canary, once, in the first live
    tick whose sample holds the kill; never the stable, whose only restart is its queue-proxy's."""
    policy = make_policy([{"name": "oom", "metric": "oom-kills", "max": 0, "critical": True}])
    start = AT - timedelta(seconds=400)
    ticks = [start + timedelta(seconds=index * 10) for index in range(41)]
    revisions = ("llama-predictor-00002", "llama-predictor-00001")
    canary_pods = revision_of(production.simulation, revisions[0]).pods
    kills = sorted(r.at for pod in canary_pods for r in pod.restarts if r.reason == "OOMKilled")
    assert kills and start.timestamp() < kills[0] < AT_SECONDS, "the scenario's OOM kill is in range"
    alarms: list[tuple[datetime, set[tuple[str, str]]]] = []
    with production.source() as live:
        for tick in ticks:
            live.collect_many(
                [
                    (
                        policy,
                        _request(
                            policy, "kn118", name, None, at=tick, window_start=start, inference_service=name
                        ),
                    )
                    for name in revisions
                ]
            )
            taken = live.take_alarms()
            if taken:
                alarms.append((tick, taken))
    assert [found for _, found in alarms] == [{("kn118", revisions[0])}], alarms
    # The first tick whose sample holds the kill: the first after the scrape that recorded it.
    raised = alarms[0][0].timestamp()
    assert kills[0] < raised <= kills[0] + STEP + 10, (kills[0], raised)
