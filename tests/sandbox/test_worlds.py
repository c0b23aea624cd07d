"""canary_sandbox.worlds: the simulated counters behave like Prometheus' would, and the benchmark runs."""

from __future__ import annotations

import itertools
import json
import math
import random
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from canary_sandbox.worlds import (
    LAYOUTS,
    Arrivals,
    Behaviour,
    Bursts,
    Latency,
    RevisionModel,
    World,
    WorldSpec,
    binomial,
    histogram_quantile,
    multinomial,
    poisson,
)

from benchmarks import decision_quality
from canary.evidence import REQUESTS, ErrorClass, EvidenceRequest, EvidenceStatus, Histogram

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
STABLE = Behaviour(Latency(0.15, 0.6), 0.003)
SLOW = Behaviour(Latency(0.15, 1.4), 0.003)


def _world(
    rps: float = 20.0, *, share: float = 0.3, minutes: int = 60, seed: int = 1, **kwargs: object
) -> World:
    spec_args: dict[str, object] = {
        "rps": rps,
        "stable": RevisionModel(STABLE),
        "canary": RevisionModel(STABLE),
    }
    spec_args.update(kwargs)
    world = World(WorldSpec(**spec_args), start=T0, seed=seed)  # type: ignore[arg-type]
    world.advance(T0 + timedelta(minutes=minutes), share)
    return world


def _request(
    world: World, window: timedelta, at: datetime, *, history: datetime | None = None
) -> EvidenceRequest:
    checks = tuple(decision_quality.policy("2m", "relative").spec.checks)
    return EvidenceRequest("ml", "llama", "v2", "v1", at - window, at, checks, history_start=history)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("arrivals", list(Arrivals))
def test_counts_are_integers_and_buckets_cumulative(layout: str, arrivals: Arrivals) -> None:
    world = _world(layout=layout, arrivals=arrivals, error_bursts=Bursts(), minutes=30)
    assert world.intervals == 120
    for side in ("canary", "stable"):
        for tally in world.tallies(side):
            assert (tally.end - tally.start).total_seconds() == 15
            histogram = tally.histograms["latency"]
            assert histogram.edges == LAYOUTS[layout]
            assert all(
                isinstance(n, int)
                for n in (tally.requests, tally.errors, histogram.total, *histogram.at_most)
            )
            assert list(histogram.at_most) == sorted(histogram.at_most)
            assert histogram.at_most[0] >= 0 and histogram.at_most[-1] <= histogram.total == tally.requests
            assert 0 <= tally.errors <= tally.requests


def test_tallies_are_consecutive_and_totals_add_up() -> None:
    world = _world(minutes=10)
    tallies = world.tallies("canary")
    assert all(a.end == b.start for a, b in itertools.pairwise(tallies))
    total = world.total("canary", T0 + timedelta(minutes=2), T0 + timedelta(minutes=5))
    window = tallies[8:20]
    assert total.requests == sum(t.requests for t in window)
    assert total.errors == sum(t.errors for t in window)
    summed = window[0]
    for tally in window[1:]:
        summed = summed + tally
    assert total.histograms["latency"] == summed.histograms["latency"]


def test_empirical_p99_matches_the_configured_one() -> None:
    # OpenCensus has 500, 600, 700 ms edges around the configured 600 ms p99: interpolation is close.
    world = _world(rps=200.0, share=0.5, minutes=60, layout="opencensus")
    total = world.total("stable", T0, world.now)
    histogram = total.histograms["latency"]
    assert histogram_quantile(0.99, histogram) == pytest.approx(0.6, rel=0.03)
    # And each bucket holds the distribution's share of the requests.
    edges = histogram.edges
    for index in (edges.index(0.1), edges.index(0.6), edges.index(1.0)):
        expected = STABLE.latency.cdf(edges[index])
        assert histogram.at_most[index] / histogram.total == pytest.approx(expected, abs=0.003)
    assert Latency(0.15, 0.6).quantile(0.99) == pytest.approx(0.6)
    assert Latency(0.15, 0.6).quantile(0.5) == pytest.approx(0.15)


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    histogram = Histogram((0.1, 0.5, 1.0), (50, 90, 100), 100)
    assert histogram_quantile(0.5, histogram) == pytest.approx(0.1)
    assert histogram_quantile(0.7, histogram) == pytest.approx(0.1 + 0.4 * 20 / 40)
    assert histogram_quantile(0.25, histogram) == pytest.approx(0.05)  # the first bucket starts at 0
    assert histogram_quantile(0.99, Histogram((0.1, 0.5), (10, 20), 100)) == 0.5  # +Inf bucket: top edge
    assert math.isnan(histogram_quantile(0.99, Histogram((0.1,), (0,), 0)))


def _dispersion(world: World, side: str = "stable") -> float:
    counts = [tally.requests for tally in world.tallies(side)]
    return statistics.pvariance(counts) / statistics.fmean(counts)


def test_bursty_arrivals_are_over_dispersed_poisson_ones_are_not() -> None:
    poisson_world = _world(rps=20.0, share=0.1, minutes=240)
    bursty_world = _world(rps=20.0, share=0.1, minutes=240, arrivals=Arrivals.BURSTY)
    assert 0.8 < _dispersion(poisson_world) < 1.25
    assert 0.8 < _dispersion(poisson_world, "canary") < 1.25
    assert _dispersion(bursty_world) > 2
    assert _dispersion(bursty_world, "canary") > 2
    # The bursts keep the mean rate.
    for world in (poisson_world, bursty_world):
        mean = statistics.fmean(t.requests for t in world.tallies("stable"))
        assert mean == pytest.approx(20.0 * 0.9 * 15, rel=0.1)


def test_clustered_errors_are_over_dispersed_and_keep_the_mean() -> None:
    world = _world(rps=200.0, share=0.5, minutes=240, error_bursts=Bursts())
    tallies = world.tallies("stable")
    errors = [tally.errors for tally in tallies]
    assert statistics.pvariance(errors) / statistics.fmean(errors) > 2
    rate = sum(errors) / sum(t.requests for t in tallies)
    assert rate == pytest.approx(0.003, rel=0.15)


def test_the_weight_split_is_respected() -> None:
    world = World(
        WorldSpec(rps=50.0, stable=RevisionModel(STABLE), canary=RevisionModel(STABLE)), start=T0, seed=3
    )
    for minute, share in ((20, 0.1), (40, 0.3), (60, 0.5)):
        world.advance(T0 + timedelta(minutes=minute), share)
    for minute, share in ((0, 0.1), (20, 0.3), (40, 0.5)):
        start, end = T0 + timedelta(minutes=minute), T0 + timedelta(minutes=minute + 20)
        canary = world.total("canary", start, end).requests
        stable = world.total("stable", start, end).requests
        assert canary / (canary + stable) == pytest.approx(share, abs=0.015)
        assert canary + stable == pytest.approx(50.0 * 20 * 60, rel=0.03)
    assert world.shares("canary")[:80] == [0.1] * 80


def test_the_load_dependent_regression_switches_at_half_the_traffic() -> None:
    model = RevisionModel(STABLE, loaded=SLOW, load_share=0.5)
    assert model.at_share(0.3) is STABLE
    assert model.at_share(0.5) is SLOW
    assert model.at_share(1.0) is SLOW
    world = World(
        WorldSpec(rps=200.0, stable=RevisionModel(STABLE), canary=model, layout="opencensus"),
        start=T0,
        seed=4,
    )
    world.advance(T0 + timedelta(minutes=20), 0.3)
    world.advance(T0 + timedelta(minutes=40), 0.5)
    below = world.total("canary", T0, T0 + timedelta(minutes=20)).histograms["latency"]
    above = world.total("canary", T0 + timedelta(minutes=20), T0 + timedelta(minutes=40)).histograms[
        "latency"
    ]
    assert histogram_quantile(0.99, below) == pytest.approx(0.6, rel=0.05)
    assert histogram_quantile(0.99, above) > 1.0  # interpolated in the 1 s .. 2 s bucket
    second = below.edges.index(1.0)
    for histogram, behaviour in ((below, STABLE), (above, SLOW)):
        slower = histogram.slower_than(second) / histogram.total
        assert slower == pytest.approx(1.0 - behaviour.latency.cdf(1.0), rel=0.15, abs=0.0005)


def test_evidence_covers_the_counts_range_and_measures_the_window() -> None:
    world = _world(rps=20.0, share=0.3, minutes=10)
    at = T0 + timedelta(minutes=10)
    request = _request(world, timedelta(minutes=2), at, history=T0 + timedelta(minutes=1))
    evidence = world.evidence(request)
    for side in ("canary", "stable"):
        series = evidence.counts[side]
        assert series.status is EvidenceStatus.OK
        assert series.tallies[0].start == T0 + timedelta(minutes=1)
        assert series.tallies[-1].end == at
        assert len(series.tallies) == 36
    in_window = world.total("canary", at - timedelta(minutes=2), at)
    assert evidence.canary[REQUESTS].value == in_window.requests
    errors = evidence.canary["errors"]
    assert errors.status is EvidenceStatus.OK
    assert errors.value == in_window.errors / in_window.requests
    assert errors.samples == in_window.requests
    p99 = evidence.canary["p99"]
    assert p99.value == histogram_quantile(0.99, in_window.histograms["latency"])
    assert set(evidence.stable) == {"p99", "errors"}


def test_too_few_requests_are_no_data() -> None:
    world = _world(rps=0.5, share=0.1, minutes=5)
    evidence = world.evidence(_request(world, timedelta(minutes=2), T0 + timedelta(minutes=5)))
    assert evidence.canary["p99"].status is EvidenceStatus.NO_DATA
    assert evidence.canary["errors"].status is EvidenceStatus.NO_DATA
    assert evidence.canary[REQUESTS].status is EvidenceStatus.OK


def test_outages_fail_every_query_and_the_counts() -> None:
    world = _world(minutes=10, outages=((180.0, 360.0),))
    during = world.evidence(_request(world, timedelta(minutes=2), T0 + timedelta(minutes=4)))
    assert during.counts["canary"].status is EvidenceStatus.ERROR
    assert during.counts["stable"].status is EvidenceStatus.ERROR
    assert during.counts["canary"].error_class is ErrorClass.UNREACHABLE
    assert all(m.status is EvidenceStatus.ERROR for m in (*during.canary.values(), *during.stable.values()))
    assert during.canary[REQUESTS].error_class is ErrorClass.UNREACHABLE
    after = world.evidence(_request(world, timedelta(minutes=2), T0 + timedelta(minutes=8)))
    assert after.counts["canary"].status is EvidenceStatus.OK
    assert after.canary[REQUESTS].status is EvidenceStatus.OK


def test_same_seed_same_bursts_whatever_the_split() -> None:
    first = _world(share=0.1, arrivals=Arrivals.BURSTY, error_bursts=Bursts(), seed=9)
    second = _world(share=0.5, arrivals=Arrivals.BURSTY, error_bursts=Bursts(), seed=9)
    assert first.multipliers == second.multipliers
    assert len(set(first.multipliers)) > 1


@pytest.mark.parametrize(("n", "p"), [(10, 0.3), (40, 0.01), (1000, 0.2), (500, 0.9), (3, 1.0), (0, 0.5)])
def test_binomial_mean_and_variance(n: int, p: float) -> None:
    rng = random.Random(5)
    draws = [binomial(rng, n, p) for _ in range(4000)]
    assert all(0 <= d <= n for d in draws)
    assert statistics.fmean(draws) == pytest.approx(n * p, abs=0.05 * n * p + 0.05)
    assert statistics.pvariance(draws) == pytest.approx(n * p * (1 - p), rel=0.15, abs=0.05)


@pytest.mark.parametrize("mean", [0.0, 0.3, 4.0, 30.0, 300.0])
def test_poisson_mean_and_variance(mean: float) -> None:
    rng = random.Random(6)
    draws = [poisson(rng, mean) for _ in range(4000)]
    assert statistics.fmean(draws) == pytest.approx(mean, rel=0.05, abs=0.03)
    assert statistics.pvariance(draws) == pytest.approx(mean, rel=0.15, abs=0.03)


def test_multinomial_spreads_every_draw() -> None:
    rng = random.Random(7)
    probabilities = (0.5, 0.3, 0.0, 0.15, 0.05)
    totals = [0] * 5
    for _ in range(2000):
        counts = multinomial(rng, 100, probabilities)
        assert sum(counts) == 100
        assert counts[2] == 0
        totals = [a + b for a, b in zip(totals, counts, strict=True)]
    assert [t / 200_000 for t in totals] == pytest.approx(list(probabilities), abs=0.005)


def test_benchmark_runs_a_tiny_cell_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results.json"
    argv = ["--rollouts", "3", "--cells", "window=2m", "limits=absolute", "arrivals=poisson"]
    argv += ["rps=20", "scenario=healthy,tail", "placement=edge", "--json", str(out)]
    assert decision_quality.main(argv) == 0
    printed = capsys.readouterr().out
    assert "decision quality per cell" in printed
    assert "kserve-canary right" in printed
    assert "healthy" in printed and "tail" in printed
    assert "never a promotion below minRequests" in printed
    document = json.loads(out.read_text())
    assert len(document["cells"]) == 2
    assert all(cell["kserve_canary"]["rollouts"] == 3 for cell in document["cells"])
    # The columns: p95 minutes, the share decided at a horizon, the fixed-sample bound.
    for cell in document["cells"]:
        assert cell["resolvable"] is True
        assert cell["fixed_sample_requests"] > 0
        assert cell["kserve_canary"]["p95_minutes"] >= cell["kserve_canary"]["median_minutes"]
        assert 0 <= cell["kserve_canary"]["decided_at_horizon"] <= 3
    assert {target["name"] for target in document["targets"]} >= {"never a promotion below minRequests"}
