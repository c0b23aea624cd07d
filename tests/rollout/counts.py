"""Counts as the evidence pipeline delivers them, drawn from a known truth, for the judge's tests.

A revision is a request rate, an error share and a lognormal latency (its median and p99); every
interval draws its requests (Poisson), errors (binomial) and bucket counts (sequential binomials
over the real Knative bucket edges) — exact draws, no normal approximation — so what the judge sees
is what a Prometheus scraping real counters would show. ``burst`` multiplies the rate, and
(independently) the error share and the slow tail, of an interval by random factors of mean one: the
clustering real traffic has.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from statistics import NormalDist

from canary.evidence import REQUESTS, CountSeries, Evidence, EvidenceRequest, EvidenceStatus, Histogram, Tally
from canary.kserve.status_model import KServeSim
from canary.policy.units import Unit

# Knative >= 1.19 (OpenTelemetry) bucket edges, seconds; and <= 1.18 (OpenCensus), in seconds.
OTEL_EDGES = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
OPENCENSUS_EDGES = tuple(
    ms / 1000
    for ms in (5, 10, 20, 40, 60, 80, 100, 150, 200, 250, 300, 350, 400, 450, 500, 600, 700, 800, 900, 1000,
               2000, 5000, 10000, 20000, 50000, 100000)
)  # fmt: skip
_Z99 = NormalDist().inv_cdf(0.99)


def binomial(rng: random.Random, trials: int, share: float) -> int:
    """An exact binomial draw by inversion (O(trials * share))."""
    if trials <= 0 or share <= 0.0:
        return 0
    if share >= 1.0:
        return trials
    if share > 0.5:
        return trials - binomial(rng, trials, 1.0 - share)
    u = rng.random()
    q = 1.0 - share
    pmf = q**trials
    if pmf == 0.0:  # underflow for large trials: fall back to the normal approximation
        draw = round(rng.gauss(trials * share, math.sqrt(trials * share * q)))
        return min(max(draw, 0), trials)
    cumulative, k = pmf, 0
    while u > cumulative and k < trials:
        pmf *= (trials - k) / (k + 1) * share / q
        k += 1
        cumulative += pmf
    return k


def poisson(rng: random.Random, mean: float) -> int:
    if mean <= 0:
        return 0
    if mean > 500:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


@dataclass(frozen=True)
class Revision:
    rate: float  # requests per second
    error_share: float = 0.001
    p50: float = 0.2  # seconds
    p99: float = 0.5

    def slower_share(self, seconds: float, tail: float = 1.0) -> float:
        """The share of requests slower than ``seconds`` (lognormal through p50 and p99)."""
        sigma = math.log(self.p99 / self.p50) / _Z99
        z = (math.log(seconds) - math.log(self.p50)) / sigma
        return min(1.0, (1.0 - NormalDist().cdf(z)) * tail)


def draw_tally(
    rng: random.Random,
    revision: Revision,
    start: datetime,
    seconds: float,
    *,
    edges: tuple[float, ...] = OTEL_EDGES,
    burst: float = 0.0,
    share: float = 1.0,
    latency: bool = True,
) -> Tally:
    # Load and trouble vary independently (gamma factors of mean one): the share of errors and of slow
    # requests among all requests stays the revision's own, only clustered in time.
    load = rng.gammavariate(1.0 / burst, burst) if burst > 0 else 1.0
    factor = rng.gammavariate(1.0 / burst, burst) if burst > 0 else 1.0
    requests = poisson(rng, revision.rate * seconds * share * load)
    errors = binomial(rng, requests, min(1.0, revision.error_share * factor))
    if not latency:
        return Tally(start, start + timedelta(seconds=seconds), requests, errors)
    # Bucket counts band by band from the fastest: each band's count given what is left.
    at_most: list[int] = []
    remaining, mass_left, below = requests, 1.0, 0
    for edge in edges:
        band = (1.0 - revision.slower_share(edge, factor)) - (1.0 - mass_left)
        in_band = binomial(rng, remaining, min(max(band / mass_left, 0.0), 1.0)) if mass_left > 0 else 0
        remaining -= in_band
        mass_left -= max(band, 0.0)
        below += in_band
        at_most.append(below)
    return Tally(
        start,
        start + timedelta(seconds=seconds),
        requests,
        errors,
        0,
        {"latency": Histogram(edges, tuple(at_most), requests)},
    )


def series(tallies: list[Tally]) -> CountSeries:
    return CountSeries(EvidenceStatus.OK, tuple(tallies), query="counts")


def exact_tally(
    start: datetime,
    seconds: float,
    requests: int,
    errors: int,
    slower_than: dict[float, int],
    edges: tuple[float, ...] = OTEL_EDGES,
) -> Tally:
    """A tally with chosen counts: ``slower_than`` maps an edge to the requests slower than it (edges
    not named take the count of the next named edge above, i.e. nobody in between)."""
    at_most = []
    for edge in edges:
        named = [slower_than[e] for e in slower_than if e >= edge]
        at_most.append(requests - (max(named) if named else 0))
    return Tally(
        start,
        start + timedelta(seconds=seconds),
        requests,
        errors,
        0,
        {"latency": Histogram(edges, tuple(at_most), requests)},
    )


class CountingWorld:
    """Answers evidence requests with counts drawn every ``scrape`` seconds, the traffic split by the
    canary's weight in the KServe simulator's status — what the pipeline would deliver.

    Measured checks (OOM kills, GPU memory, ...) get the healthy values of ``measured``.
    """

    def __init__(
        self,
        sim: KServeSim,
        canary: Revision,
        stable: Revision,
        *,
        seed: int = 0,
        scrape: float = 15.0,
        burst: float = 0.0,
        edges: tuple[float, ...] = OTEL_EDGES,
        measured: Callable[[EvidenceRequest], Evidence] | None = None,
        canary_at: Callable[[int], Revision] | None = None,
        lag: float = 0.0,
    ) -> None:
        self.sim = sim
        self.canary, self.stable = canary, stable
        self.rng = random.Random(seed)
        self.scrape = timedelta(seconds=scrape)
        self.burst = burst
        self.edges = edges
        self.measured = measured
        self.canary_at = canary_at  # weight -> Revision: a canary that changes with its share
        # Ingestion lag: a tally is queryable ``lag`` seconds after it ends, and the counts say how
        # far they reach (CountSeries.newest), as the counter book delivers them.
        self.lag = timedelta(seconds=lag)
        self.stalled_at: datetime | None = None  # nothing served after this reaches Prometheus
        self.canary_tallies: list[Tally] = []
        self.stable_tallies: list[Tally] = []
        self.clock: datetime | None = None

    def advance(self, until: datetime) -> None:
        if self.clock is None:
            self.clock = until
            return
        while self.clock + self.scrape <= until:
            observed = self.sim.observe()
            revision = observed.latest_created_revision
            weight = observed.weight_of(revision) if revision is not None else 0
            share = (weight or 0) / 100.0
            canary = self.canary_at(weight or 0) if self.canary_at is not None else self.canary
            seconds = self.scrape.total_seconds()
            self.canary_tallies.append(
                draw_tally(
                    self.rng, canary, self.clock, seconds, edges=self.edges, burst=self.burst, share=share
                )
            )
            self.stable_tallies.append(
                draw_tally(
                    self.rng,
                    self.stable,
                    self.clock,
                    seconds,
                    edges=self.edges,
                    burst=self.burst,
                    share=1 - share,
                )
            )
            self.clock += self.scrape

    def __call__(self, request: EvidenceRequest) -> Evidence:
        from canary.evidence import Measurement

        self.advance(request.at)
        start, visible = request.counts_start, request.at - self.lag
        if self.stalled_at is not None:
            visible = min(visible, self.stalled_at)
        canary = [t for t in self.canary_tallies if t.start >= start and t.end <= visible]
        stable = [t for t in self.stable_tallies if t.start >= start and t.end <= visible]
        step = [t for t in canary if t.start >= request.window_start]
        newest = max((t.end for t in self.canary_tallies if t.end <= visible), default=None)
        base = self.measured(request) if self.measured is not None else None
        measurements = dict(base.canary) if base is not None else {}
        measurements[REQUESTS] = Measurement.ok(float(sum(t.requests for t in step)), Unit.COUNT)
        return Evidence(
            request=request,
            canary=measurements,
            stable=dict(base.stable) if base is not None else {},
            counts={
                "canary": replace(series(canary), newest=newest if self.lag else None),
                "stable": series(stable),
            },
        )


# A healthy latency profile as shares slower than OTel edges: p50 under 50ms, p99 under 250ms.
HEALTHY_SLOWER = {0.01: 0.9, 0.025: 0.7, 0.05: 0.3, 0.1: 0.1, 0.25: 0.005}


@dataclass(frozen=True)
class SteadyCounts:
    """Deterministic counts for any request: per 15 s from ``counts_start`` to ``at``, ``rate``
    requests a second (canary) with ``error_share`` errors and the healthy latency profile, plus
    ``slow_share`` of the requests slower than every edge up to ``slow_above``; the stable revision
    four times the traffic, healthy. The same request always gets the same evidence (for properties
    that re-decide)."""

    rate: float = 10.0
    error_share: float = 0.001
    slow_share: float = 0.0
    slow_above: float = 0.5
    measured: Callable[[EvidenceRequest], Evidence] | None = None

    def __call__(self, request: EvidenceRequest) -> Evidence:
        from canary.evidence import Measurement

        def tallies(rate: float, errors: float, slow: float) -> list[Tally]:
            out, start = [], request.counts_start
            while start + timedelta(seconds=15) <= request.at:
                requests = round(rate * 15)
                slower = {
                    edge: round(
                        requests * max(HEALTHY_SLOWER.get(edge, 0.0), slow if edge <= self.slow_above else 0)
                    )
                    for edge in OTEL_EDGES
                }
                out.append(exact_tally(start, 15, requests, round(requests * errors), slower))
                start += timedelta(seconds=15)
            return out

        canary = tallies(self.rate, self.error_share, self.slow_share)
        stable = tallies(self.rate * 4, 0.001, 0.0)
        base = self.measured(request) if self.measured is not None else None
        measurements = dict(base.canary) if base is not None else {}
        step = [t for t in canary if t.start >= request.window_start]
        measurements[REQUESTS] = Measurement.ok(float(sum(t.requests for t in step)), Unit.COUNT)
        return Evidence(
            request=request,
            canary=measurements,
            stable=dict(base.stable) if base is not None else {},
            counts={"canary": series(canary), "stable": series(stable)},
        )
