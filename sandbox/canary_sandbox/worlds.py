"""Simulated worlds as Prometheus sees them: per-revision counters, scraped every 15 s.

A :class:`World` has a stable and a canary revision behind one InferenceService. Every scrape
interval (15 s) it draws what each revision served — requests, 5xx errors, and the requests per
latency bucket — as integer counter increases, from the true behaviour of the revision at the
traffic share it had in that interval. It answers an :class:`~canary.evidence.EvidenceRequest`
the way the evidence layer does: :class:`~canary.evidence.CountSeries` of per-interval
:class:`~canary.evidence.Tally` values for both revisions (the judge's counts) *and* point
:class:`~canary.evidence.Measurement` values over the request's window (request count, error rate,
latency quantile by ``histogram_quantile``'s interpolation), so a judge reading either runs on it.

The model, per 15 s interval ``k`` and revision ``r`` with traffic share ``s_r``:

* **requests** ``n ~ Poisson(rps × m_k × s_r × 15)``. ``m_k`` is the traffic multiplier shared by
  both revisions: 1 for :attr:`Arrivals.POISSON`; for :attr:`Arrivals.BURSTY` a two-state Markov
  chain (calm / burst, :class:`Bursts`): bursts of ×5 the calm rate, 10 % of the intervals on
  average, 2 intervals (30 s) long on average, the calm rate lowered so the mean stays ``rps``.
  Per-interval counts are then over-dispersed (variance/mean well above 1).
* **errors** ``Binomial(n, e_r × c_k)``: ``e_r`` the revision's error rate, ``c_k`` the error
  multiplier shared by both revisions (a flaky dependency hits everyone): 1, or in bursty worlds
  a second, independent Markov chain of error storms (×5, 10 % of intervals, mean kept at ``e_r``).
* **latency**: lognormal per revision, given by its median (p50) and p99 (:class:`Latency`); the
  ``n`` requests are spread over the buckets of the layout (Knative's OpenCensus layout of Knative
  ≤ 1.18 or the OpenTelemetry one of ≥ 1.19, see :data:`LAYOUTS`) by a multinomial draw from the
  distribution's bucket probabilities, done as sequential binomials. Errors are requests too: the
  histogram's total is every request.
* a revision may behave differently when its share is at least :attr:`RevisionModel.load_share`
  (50 %): the load-dependent regression (``loaded``).
* **outages** (:attr:`WorldSpec.outages`): while Prometheus is down every query fails — every
  measurement is an ``unreachable`` error and both count series have status ``error``.

Sampling is pure Python and fast: Poisson and binomial draws by inversion for small means, by a
rounded normal approximation for large ones (mean ≥ 50 for Poisson, ``n·p`` ≥ 15 for binomial).

The environment's draws (the multipliers) come from their own random stream, consumed once per
interval whatever the traffic split, and each revision has its own stream: two deciders driving
worlds of the same spec and seed see the same bursts and storms at the same times.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from canary.evidence import (
    REQUESTS,
    CountSeries,
    ErrorClass,
    Evidence,
    EvidenceRequest,
    EvidenceStatus,
    Histogram,
    Measurement,
    Tally,
)
from canary.policy.model import Check, MetricKind
from canary.policy.units import Unit
from canary_sandbox.kserve_metrics import OPENCENSUS_BUCKETS_MS, OTEL_BUCKETS

__all__ = [
    "LAYOUTS",
    "SCRAPE_INTERVAL",
    "Arrivals",
    "Behaviour",
    "Bursts",
    "Latency",
    "RevisionModel",
    "World",
    "WorldSpec",
    "binomial",
    "histogram_quantile",
    "multinomial",
    "poisson",
]

SCRAPE_INTERVAL = 15.0  # seconds
# Latency bucket upper bounds in seconds (the +Inf bucket is implicit).
LAYOUTS: dict[str, tuple[float, ...]] = {
    "opencensus": tuple(ms / 1000.0 for ms in OPENCENSUS_BUCKETS_MS),  # Knative <= 1.18
    "otel": OTEL_BUCKETS,  # Knative >= 1.19
}
_Z99 = 2.3263478740408408  # the standard normal's 0.99 quantile
_SIDES = ("canary", "stable")


# ---------------------------------------------------------------------------------------------
# Sampling


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw: inversion below a mean of 50, a rounded normal above."""
    if mean <= 0.0:
        return 0
    if mean >= 50.0:
        return max(0, math.floor(rng.gauss(mean, math.sqrt(mean)) + 0.5))
    u = rng.random()
    k, probability = 0, math.exp(-mean)
    cumulative = probability
    while u > cumulative and probability > 0.0:
        k += 1
        probability *= mean / k
        cumulative += probability
    return k


def binomial(rng: random.Random, n: int, p: float) -> int:
    """A binomial draw: inversion while ``n·min(p, 1-p)`` < 15, a rounded normal above."""
    if n <= 0 or p <= 0.0:
        return 0
    if p >= 1.0:
        return n
    if p > 0.5:
        return n - binomial(rng, n, 1.0 - p)
    mean = n * p
    if mean >= 15.0:
        draw = math.floor(rng.gauss(mean, math.sqrt(mean * (1.0 - p))) + 0.5)
        return min(n, max(0, draw))
    q = 1.0 - p
    ratio = p / q
    probability = math.exp(n * math.log1p(-p))
    cumulative = probability
    u = rng.random()
    k = 0
    while u > cumulative and k < n:
        probability *= ratio * (n - k) / (k + 1)
        k += 1
        cumulative += probability
    return k


def multinomial(rng: random.Random, n: int, probabilities: tuple[float, ...]) -> list[int]:
    """``n`` draws spread over categories (probabilities summing to 1) by sequential binomials."""
    counts = [0] * len(probabilities)
    remaining, rest = n, 1.0
    last = len(probabilities) - 1
    for index, p in enumerate(probabilities):
        if remaining <= 0:
            break
        if index == last or rest <= p:
            counts[index] = remaining
            break
        drawn = binomial(rng, remaining, p / rest) if p > 0.0 else 0
        counts[index] = drawn
        remaining -= drawn
        rest -= p
    return counts


# ---------------------------------------------------------------------------------------------
# Behaviour


@dataclass(frozen=True, slots=True)
class Latency:
    """A lognormal latency distribution given by its median and its p99 (seconds)."""

    p50: float
    p99: float

    def __post_init__(self) -> None:
        if not 0.0 < self.p50 < self.p99:
            raise ValueError(f"need 0 < p50 < p99, got p50={self.p50} p99={self.p99}")

    @property
    def sigma(self) -> float:
        return math.log(self.p99 / self.p50) / _Z99

    def cdf(self, seconds: float) -> float:
        if seconds <= 0.0:
            return 0.0
        return 0.5 * math.erfc(-math.log(seconds / self.p50) / (self.sigma * math.sqrt(2.0)))

    def quantile(self, q: float) -> float:
        return self.p50 * math.exp(self.sigma * _normal_quantile(q))

    def scaled(self, factor: float) -> Latency:
        """Every request ``factor`` times slower (a median regression: p50 and p99 both scale)."""
        return Latency(self.p50 * factor, self.p99 * factor)

    def with_p99(self, p99: float) -> Latency:
        """The same median with another tail (a tail regression)."""
        return Latency(self.p50, p99)

    def bucket_probabilities(self, edges: tuple[float, ...]) -> tuple[float, ...]:
        """The probability of each bucket ``(edges[i-1], edges[i]]``, the last one ``(edges[-1], +Inf)``."""
        cumulative = [self.cdf(edge) for edge in edges]
        probabilities = [cumulative[0]]
        probabilities += [high - low for low, high in itertools.pairwise(cumulative)]
        probabilities.append(1.0 - cumulative[-1])
        return tuple(max(0.0, p) for p in probabilities)


def _normal_quantile(q: float) -> float:
    # Bisection on erfc: exact enough, and only used to describe distributions (never per draw).
    low, high = -10.0, 10.0
    for _ in range(100):
        middle = (low + high) / 2
        if 0.5 * math.erfc(-middle / math.sqrt(2.0)) < q:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What one revision does to its requests: their latency and the share that fail (5xx)."""

    latency: Latency
    error_rate: float


@dataclass(frozen=True, slots=True)
class RevisionModel:
    """A revision's behaviour, and optionally another one once its traffic share is high enough."""

    normal: Behaviour
    loaded: Behaviour | None = None  # from load_share on (latency growing with load)
    load_share: float = 0.5

    def at_share(self, share: float) -> Behaviour:
        if self.loaded is not None and share >= self.load_share - 1e-9:
            return self.loaded
        return self.normal


class Arrivals(StrEnum):
    POISSON = "poisson"
    BURSTY = "bursty"


@dataclass(frozen=True, slots=True)
class Bursts:
    """A two-state (calm / burst) Markov chain over scrape intervals giving a rate multiplier.

    In a burst the rate is ``factor`` times the calm rate; ``share`` of the intervals are bursts on
    average, a burst lasts ``mean_length`` intervals on average; the calm multiplier is chosen so
    the mean multiplier is 1 (the configured rate stays the mean rate).
    """

    factor: float = 5.0
    share: float = 0.1
    mean_length: float = 2.0

    @property
    def calm(self) -> float:
        return 1.0 / (1.0 + (self.factor - 1.0) * self.share)

    @property
    def leave(self) -> float:  # P(burst -> calm) per interval
        return 1.0 / self.mean_length

    @property
    def enter(self) -> float:  # P(calm -> burst) per interval, for the stationary share
        return self.leave * self.share / (1.0 - self.share)


@dataclass(frozen=True, slots=True)
class WorldSpec:
    """Everything that defines a world but its random draws."""

    rps: float  # requests per second to the whole InferenceService (both revisions)
    stable: RevisionModel
    canary: RevisionModel
    arrivals: Arrivals = Arrivals.POISSON
    request_bursts: Bursts = field(default_factory=Bursts)  # used when arrivals are bursty
    error_bursts: Bursts | None = None  # clustered errors; None: independent errors
    layout: str = "otel"  # a key of LAYOUTS
    # Prometheus down in [start, end) seconds after the world's start: every query fails.
    outages: tuple[tuple[float, float], ...] = ()
    min_samples: int = 20  # the evidence layer's --min-samples: fewer requests -> no data

    @property
    def edges(self) -> tuple[float, ...]:
        return LAYOUTS[self.layout]


# ---------------------------------------------------------------------------------------------
# The world


class _Side:
    """One revision's scraped counters: per-interval tallies and their running totals."""

    __slots__ = ("buckets", "cum_buckets", "cum_errors", "cum_requests", "rng", "shares", "tallies")

    def __init__(self, rng: random.Random, bucket_count: int) -> None:
        self.rng = rng
        self.tallies: list[Tally] = []
        self.shares: list[float] = []
        self.cum_requests = [0]
        self.cum_errors = [0]
        self.cum_buckets: list[tuple[int, ...]] = [(0,) * bucket_count]  # cumulative over time, per bucket
        self.buckets = bucket_count


class World:
    """One rollout's world: draws 15 s intervals as time advances, answers evidence requests.

    :meth:`advance` moves time on with the canary's current traffic share (read it from the
    InferenceService's status traffic); :meth:`evidence` answers an evidence request for any range
    already drawn.
    """

    def __init__(self, spec: WorldSpec, *, start: datetime, seed: int) -> None:
        self.spec = spec
        self.start = start
        self.step = timedelta(seconds=SCRAPE_INTERVAL)
        root = random.Random(seed)  # noqa: S311 - reproducible worlds, not secrets
        self._env = random.Random(root.getrandbits(64))  # noqa: S311
        edges = spec.edges
        self._edges = edges
        self._sides = {
            side: _Side(random.Random(root.getrandbits(64)), len(edges) + 1)  # noqa: S311
            for side in _SIDES
        }
        self._in_burst = False
        self._in_storm = False
        self._probabilities: dict[Latency, tuple[float, ...]] = {}
        self.multipliers: list[tuple[float, float]] = []  # per interval: (traffic, errors)

    # -- time ----------------------------------------------------------------------------------

    @property
    def intervals(self) -> int:
        return len(self.multipliers)

    @property
    def now(self) -> datetime:
        return self.start + self.step * self.intervals

    def index(self, at: datetime) -> int:
        """The number of whole intervals between the world's start and ``at`` (clamped to drawn)."""
        seconds = (at - self.start).total_seconds()
        return min(self.intervals, max(0, math.floor(seconds / SCRAPE_INTERVAL + 1e-9)))

    def _start_index(self, at: datetime) -> int:
        seconds = (at - self.start).total_seconds()
        return min(self.intervals, max(0, math.ceil(seconds / SCRAPE_INTERVAL - 1e-9)))

    def down(self, at: datetime) -> bool:
        offset = (at - self.start).total_seconds()
        return any(start <= offset < end for start, end in self.spec.outages)

    def advance(self, until: datetime, canary_share: float) -> None:
        """Draw every interval that ends at or before ``until`` with the canary at ``canary_share``."""
        share = min(1.0, max(0.0, canary_share))
        while self.start + self.step * (self.intervals + 1) <= until:
            self._draw(share)

    def _multiplier(self, bursts: Bursts, in_burst: bool) -> tuple[float, bool]:
        u = self._env.random()
        in_burst = (u >= bursts.leave) if in_burst else (u < bursts.enter)
        return (bursts.calm * bursts.factor if in_burst else bursts.calm), in_burst

    def _draw(self, canary_share: float) -> None:
        spec = self.spec
        # The environment's stream is consumed identically whatever the arrivals and the split.
        traffic, burst = self._multiplier(spec.request_bursts, self._in_burst)
        storm_bursts = spec.error_bursts or Bursts()
        errors, storm = self._multiplier(storm_bursts, self._in_storm)
        if spec.arrivals is Arrivals.BURSTY:
            self._in_burst = burst
        else:
            traffic = 1.0
        if spec.error_bursts is not None:
            self._in_storm = storm
        else:
            errors = 1.0
        start = self.now
        end = start + self.step
        self.multipliers.append((traffic, errors))
        for name, model, share in (
            ("canary", spec.canary, canary_share),
            ("stable", spec.stable, 1.0 - canary_share),
        ):
            side = self._sides[name]
            rng = side.rng
            behaviour = model.at_share(share)
            requests = poisson(rng, spec.rps * traffic * share * SCRAPE_INTERVAL)
            failed = binomial(rng, requests, min(1.0, behaviour.error_rate * errors))
            probabilities = self._probabilities.get(behaviour.latency)
            if probabilities is None:
                probabilities = behaviour.latency.bucket_probabilities(self._edges)
                self._probabilities[behaviour.latency] = probabilities
            counts = multinomial(rng, requests, probabilities) if requests else [0] * side.buckets
            self._record(side, start, end, share, requests, failed, counts)

    def _record(
        self,
        side: _Side,
        start: datetime,
        end: datetime,
        share: float,
        requests: int,
        errors: int,
        counts: list[int],
    ) -> None:
        at_most: list[int] = []
        running = 0
        for count in counts[:-1]:
            running += count
            at_most.append(running)
        histogram = Histogram(self._edges, tuple(at_most), requests)
        side.tallies.append(Tally(start, end, requests, errors, 0, {"latency": histogram}))
        side.shares.append(share)
        side.cum_requests.append(side.cum_requests[-1] + requests)
        side.cum_errors.append(side.cum_errors[-1] + errors)
        side.cum_buckets.append(tuple(a + b for a, b in zip(side.cum_buckets[-1], counts, strict=True)))

    # -- reading -------------------------------------------------------------------------------

    def tallies(self, side: str) -> list[Tally]:
        """Every interval drawn for ``side`` ("canary" or "stable"), oldest first."""
        return self._sides[side].tallies

    def shares(self, side: str) -> list[float]:
        """The traffic share ``side`` had in each interval."""
        return self._sides[side].shares

    def total(self, side: str, start: datetime, end: datetime) -> Tally:
        """What ``side`` served in the intervals within ``[start, end]`` (running-total differences)."""
        record = self._sides[side]
        first, last = self._start_index(start), self.index(end)
        last = max(first, last)
        cumulative = [b - a for a, b in zip(record.cum_buckets[first], record.cum_buckets[last], strict=True)]
        at_most: list[int] = []
        running = 0
        for count in cumulative[:-1]:
            running += count
            at_most.append(running)
        requests = record.cum_requests[last] - record.cum_requests[first]
        histogram = Histogram(self._edges, tuple(at_most), requests)
        return Tally(
            self.start + self.step * first,
            self.start + self.step * last,
            requests,
            record.cum_errors[last] - record.cum_errors[first],
            0,
            {"latency": histogram},
        )

    def series(self, side: str, start: datetime, end: datetime) -> CountSeries:
        """``side``'s tallies within ``[start, end]`` as the evidence layer would return them."""
        if self.down(end):
            return CountSeries(
                EvidenceStatus.ERROR,
                detail="Prometheus unreachable: connection refused",
                error_class=ErrorClass.UNREACHABLE,
                query="simulated",
            )
        first, last = self._start_index(start), self.index(end)
        return CountSeries(EvidenceStatus.OK, tuple(self._sides[side].tallies[first:last]), query="simulated")

    def measurement(self, check: Check, tally: Tally) -> Measurement:
        """A check's point estimate over a window's tally, as the evidence layer computes it."""
        unit = check.value_unit
        requests = tally.requests
        if requests <= 0:
            return Measurement.no_data("no requests in the window", unit, samples=0.0)
        if requests < self.spec.min_samples:
            return Measurement.no_data(
                f"{requests} requests in the window; a value needs at least {self.spec.min_samples}",
                unit,
                samples=float(requests),
            )
        if check.metric is MetricKind.ERROR_RATE:
            return Measurement.ok(tally.errors / requests, unit, samples=float(requests), query="simulated")
        quantile = check.effective_quantile
        if check.metric is MetricKind.LATENCY and quantile is not None:
            value = histogram_quantile(quantile, tally.histograms["latency"])
            return Measurement.ok(value, unit, samples=float(requests), query="simulated")
        return Measurement.no_data(f"{check.metric or 'promql'} is not simulated", unit)

    @staticmethod
    def _compared(request: EvidenceRequest, check: Check) -> bool:
        """Whether the stable revision's value of ``check`` is wanted (a relative limit applies)."""
        return (
            request.compare_with_stable
            and request.stable_revision is not None
            and check.max_increase is not None
            and check.comparable_to_stable
        )

    def evidence(self, request: EvidenceRequest) -> Evidence:
        """The answer to ``request``: counts over ``[counts_start, at]``, measurements over the window."""
        checks = request.checks
        if self.down(request.at):
            failure = Measurement.error(ErrorClass.UNREACHABLE, "Prometheus unreachable: connection refused")
            failed_counts = self.series("canary", request.counts_start, request.at)
            canary_failed = {REQUESTS: failure, **{check.name: failure for check in checks}}
            stable_failed = {
                check.name: failure
                for check in checks
                if request.compare_with_stable
                and check.max_increase is not None
                and check.comparable_to_stable
            }
            counts = {"canary": failed_counts}
            if request.stable_revision is not None:
                counts["stable"] = failed_counts
            return Evidence(request, canary_failed, stable_failed, counts=counts)
        window = self.total("canary", request.window_start, request.at)
        canary: dict[str, Measurement] = {
            REQUESTS: Measurement.ok(float(window.requests), Unit.COUNT, samples=float(window.requests))
        }
        stable: dict[str, Measurement] = {}
        stable_window: Tally | None = None
        for check in checks:
            canary[check.name] = self.measurement(check, window)
            if self._compared(request, check):
                if stable_window is None:
                    stable_window = self.total("stable", request.window_start, request.at)
                stable[check.name] = self.measurement(check, stable_window)
        counts = {"canary": self.series("canary", request.counts_start, request.at)}
        if request.stable_revision is not None:
            counts["stable"] = self.series("stable", request.counts_start, request.at)
        return Evidence(request, canary, stable, queries=1 + len(checks) * 2, counts=counts)


def histogram_quantile(q: float, histogram: Histogram) -> float:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding rank ``q·total``.

    NaN without observations; the highest finite edge when the rank falls in the ``+Inf`` bucket;
    the first bucket's lower bound is 0.
    """
    total = histogram.total
    if total <= 0:
        return math.nan
    rank = q * total
    at_most = histogram.at_most
    index = bisect.bisect_left(at_most, rank)
    edges = histogram.edges
    if index >= len(at_most):
        return edges[-1]
    below = at_most[index - 1] if index > 0 else 0
    lower = edges[index - 1] if index > 0 else 0.0
    upper = edges[index]
    in_bucket = at_most[index] - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket
