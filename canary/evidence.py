"""The vocabulary between the evidence layer (``canary.metrics``) and the decision core (``canary.rollout``).

The core says *what* it needs to know (:class:`EvidenceRequest`: which revisions, over which window,
for which checks); an :class:`EvidenceSource` answers with :class:`Evidence`. Both are plain values,
so the same core runs against a live Prometheus, recorded data in a backtest, or a simulation.

Three outcomes per measurement, never confused with each other:

* ``ok`` — a finite or infinite value the check can be judged on;
* ``no-data`` — nothing to judge yet (no requests, too few, no pods): the step cannot pass;
* ``error`` — *we* could not ask (Prometheus down, slow, bad query): never a failed check and never
  counted towards ``onNoData``; the rollout holds and the evaluation is retried.

and a fourth, treated like ``error`` by the judge:

* ``invalid-value`` — Prometheus answered a number no limit can be judged on (``NaN``, ``+Inf``,
  ``-Inf``: a division by zero, an overflowing counter, a broken exporter): never a pass, never a fail,
  never counted as no-data; the rollout holds and the reason names the check and the value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from canary.policy.model import Check, PromotionPolicy
from canary.policy.units import Unit

__all__ = [
    "FRACTION_SUFFIX",
    "REQUESTS",
    "CanaryQuery",
    "CountSeries",
    "ErrorClass",
    "Evidence",
    "EvidenceRequest",
    "EvidenceSource",
    "EvidenceStatus",
    "Histogram",
    "Measurement",
    "Tally",
    "fraction_key",
    "tallies_since",
]

# The name under which the canary's request count (minRequests) travels in Evidence.
REQUESTS = "request-count"
FRACTION_SUFFIX = ":fraction"


def fraction_key(check: Check | str) -> str:
    """Where gpu-memory-peak's used/total fraction (judged against ``maxFraction``) travels in Evidence.

    Check names cannot contain ``:``, so the key never collides with a check's own.
    """
    return (check if isinstance(check, str) else check.name) + FRACTION_SUFFIX


class EvidenceStatus(StrEnum):
    OK = "ok"
    NO_DATA = "no-data"
    ERROR = "error"
    INVALID_VALUE = "invalid-value"  # NaN or ±Inf from Prometheus: judged like a query problem


class ErrorClass(StrEnum):
    """Why a query could not be answered — always the controller's problem, not the canary's."""

    UNREACHABLE = "unreachable"  # connection refused, DNS, TLS
    TIMEOUT = "timeout"  # client timeout or Prometheus' own 503 timeout
    BAD_QUERY = "bad-query"  # HTTP 400 bad_data: a malformed (custom) query
    EXECUTION = "execution"  # HTTP 422: the query could not be executed
    UNEXPECTED_RESULT = "unexpected-result"  # several series or a matrix where one value was expected
    SERVER = "server"  # any other non-2xx answer
    UNAVAILABLE = "unavailable"  # Prometheus (or its proxy) answered that it cannot serve: 503, 502, 429
    MALFORMED_RESPONSE = "malformed-response"  # not a Prometheus answer: not JSON, truncated, HTML, no data
    DEFERRED = "deferred"  # not asked this tick: the per-tick budget of custom queries was spent


@dataclass(frozen=True, slots=True)
class Measurement:
    """One value for one revision, with everything needed to explain a decision made on it."""

    status: EvidenceStatus
    value: float | None = None  # canonical unit (seconds, fraction, bytes, count); None unless ok
    unit: Unit = Unit.NONE
    samples: float | None = None  # requests (or pods, or scrape samples) behind the value
    query: str = ""  # the resolved PromQL
    duration: float = 0.0  # seconds spent asking
    error_class: ErrorClass | None = None
    detail: str = ""  # why there is no data, or what failed

    @classmethod
    def ok(
        cls, value: float, unit: Unit, *, samples: float | None = None, query: str = "", duration: float = 0.0
    ) -> Measurement:
        return cls(EvidenceStatus.OK, value, unit, samples, query, duration)

    @classmethod
    def no_data(
        cls,
        detail: str,
        unit: Unit = Unit.NONE,
        *,
        samples: float | None = None,
        query: str = "",
        duration: float = 0.0,
    ) -> Measurement:
        return cls(EvidenceStatus.NO_DATA, None, unit, samples, query, duration, None, detail)

    @classmethod
    def error(
        cls,
        error_class: ErrorClass,
        detail: str,
        unit: Unit = Unit.NONE,
        *,
        query: str = "",
        duration: float = 0.0,
    ) -> Measurement:
        return cls(EvidenceStatus.ERROR, None, unit, None, query, duration, error_class, detail)

    @classmethod
    def invalid(
        cls,
        detail: str,
        unit: Unit = Unit.NONE,
        *,
        samples: float | None = None,
        query: str = "",
        duration: float = 0.0,
    ) -> Measurement:
        """A value Prometheus answered that cannot be judged (NaN, ±Inf); ``detail`` names it."""
        return cls(EvidenceStatus.INVALID_VALUE, None, unit, samples, query, duration, None, detail)


@dataclass(frozen=True, slots=True)
class EvidenceRequest:
    """What the core wants measured: the checks, for the canary (and stable revision), over [start, at]."""

    namespace: str
    inference_service: str
    canary_revision: str
    stable_revision: str | None  # None when there is nothing to compare with (e.g. while baking)
    window_start: datetime
    at: datetime  # evaluation time T: every query is evaluated at T with its window ending at T
    checks: tuple[Check, ...]
    compare_with_stable: bool = True  # False while baking: absolute limits only
    # Where the rollout's evidence begins (its first step's start): counts are wanted over
    # [history_start, at] so the judge can pool steps; None means the window's start.
    history_start: datetime | None = None
    # Set while the canary is Pending and in its first step (RolloutState.warm_up_counted): when the
    # rollout of the canary began. The canary revision is new to the rollout, so every restart of its
    # pods is its own; restarts and OOM kills before the first step's window (a GPU model OOM-killed
    # while loading, before it ever became Ready) are counted there instead of falling before every
    # window (docs/design.md §3.5).
    canary_born: datetime | None = None

    def restarts_start(self, side_is_canary: bool) -> datetime:
        """Where a revision's restart and OOM-kill counts begin: the window's start, or for the
        canary in its first step the rollout's start (its pods' counters counted from zero)."""
        if side_is_canary and self.canary_born is not None and self.canary_born < self.window_start:
            return self.canary_born
        return self.window_start

    @property
    def counts_start(self) -> datetime:
        """The start of the range the counts must cover."""
        if self.history_start is None or self.history_start > self.window_start:
            return self.window_start
        return self.history_start

    @property
    def window_seconds(self) -> float:
        return (self.at - self.window_start).total_seconds()


@dataclass(frozen=True, slots=True)
class Histogram:
    """Requests by latency bucket over some range: raw differences of the bucket counters.

    ``at_most[i]`` requests took at most ``edges[i]`` seconds (cumulative, as Prometheus' ``le``);
    ``total`` is the ``+Inf`` bucket, every request the histogram saw. The edges are read from the
    series themselves (never assumed), in seconds, ascending.
    """

    edges: tuple[float, ...]
    at_most: tuple[int, ...]
    total: int

    def slower_than(self, index: int) -> int:
        """Requests slower than ``edges[index]``."""
        return self.total - self.at_most[index]

    def __add__(self, other: Histogram) -> Histogram:
        if other.edges != self.edges:
            return _merge_histograms(self, other)
        return Histogram(
            self.edges,
            tuple(a + b for a, b in zip(self.at_most, other.at_most, strict=True)),
            self.total + other.total,
        )


def _merge_histograms(first: Histogram, second: Histogram) -> Histogram:
    # Two layouts (a revision whose pods export different buckets): keep the edges both have.
    common = sorted(set(first.edges) & set(second.edges))
    at_most = tuple(
        first.at_most[first.edges.index(edge)] + second.at_most[second.edges.index(edge)] for edge in common
    )
    return Histogram(tuple(common), at_most, first.total + second.total)


@dataclass(frozen=True, slots=True)
class Tally:
    """What one revision's counters say happened in ``(start, end]``: raw counter differences.

    Integers, never extrapolated: the sum over the revision's series of each series' increase
    between the two samples, a reset counting from zero. ``histograms`` maps a latency measure
    (``latency``, ``ttft``, ``e2e-latency``) to its bucket counts when the revision exports it.
    """

    start: datetime
    end: datetime
    requests: int
    errors: int  # 5xx responses
    client_errors: int = 0  # 4xx responses
    histograms: Mapping[str, Histogram] = field(default_factory=dict)

    def __add__(self, other: Tally) -> Tally:
        histograms = dict(self.histograms)
        for measure, histogram in other.histograms.items():
            mine = histograms.get(measure)
            histograms[measure] = histogram if mine is None else mine + histogram
        return Tally(
            min(self.start, other.start),
            max(self.end, other.end),
            self.requests + other.requests,
            self.errors + other.errors,
            self.client_errors + other.client_errors,
            histograms,
        )


def tallies_since(tallies: Iterable[Tally], start: datetime) -> tuple[Tally, ...]:
    """The tallies that began at or after ``start``."""
    return tuple(tally for tally in tallies if tally.start >= start)


@dataclass(frozen=True, slots=True)
class CountSeries:
    """One revision's consecutive tallies over ``[request.counts_start, request.at]``, oldest first.

    Each tally covers the time between two samples of the revision's counters (one per tick of the
    evidence pipeline); tallies do not overlap and leave no gap. ``status`` is ``ok`` with the tallies
    (possibly empty: the range is shorter than one tick), ``no-data`` when the revision has no
    request series at all, ``error`` (with ``error_class``) when the counters could not be read.
    """

    status: EvidenceStatus
    # A tuple, or a sequence that builds each tally when read (the counter book's: a tick holds the
    # evidence of every rollout it decides at once, and their steps' tallies were megabytes).
    tallies: Sequence[Tally] = ()
    detail: str = ""
    error_class: ErrorClass | None = None
    query: str = ""  # the PromQL the counters come from (for explain)
    # When the revision's newest counter sample was taken, as Prometheus holds it: how far the
    # evidence reaches behind an ingestion lag. None: the source does not say (read as ``at``).
    newest: datetime | None = None
    # What :meth:`total_since` answers, when the source can add the tallies up without adding them
    # one by one (the counter book: the difference of two cumulative snapshots). None: they are added.
    summed: Callable[[datetime | None], Tally | None] | None = field(default=None, compare=False, repr=False)

    def since(self, start: datetime) -> tuple[Tally, ...]:
        """The tallies that began at or after ``start`` (a step's own evidence)."""
        return tallies_since(self.tallies, start)

    def total_since(self, start: datetime | None) -> Tally | None:
        """The tallies that began at or after ``start`` (all: None) added up, as :meth:`total` adds
        them."""
        if self.summed is not None:
            return self.summed(start)
        return CountSeries.total(self.tallies if start is None else self.since(start))

    @staticmethod
    def total(tallies: Sequence[Tally]) -> Tally | None:
        """The tallies added up (None for none). Summed field by field: an hour of 15 s tallies is
        240 of them, added for every check of every rollout at every tick."""
        if not tallies:
            return None
        if len(tallies) == 1:
            return tallies[0]
        histograms: dict[str, Histogram] = {}
        measures = {measure for tally in tallies for measure in tally.histograms}
        for measure in measures:
            parts = [tally.histograms[measure] for tally in tallies if measure in tally.histograms]
            edges = parts[0].edges
            if all(part.edges == edges for part in parts):
                at_most = tuple(map(sum, zip(*(part.at_most for part in parts), strict=True)))
                histograms[measure] = Histogram(edges, at_most, sum(part.total for part in parts))
            else:  # layouts differ (pods of one revision exporting different buckets): the slow way
                combined = parts[0]
                for part in parts[1:]:
                    combined = combined + part
                histograms[measure] = combined
        return Tally(
            min(tally.start for tally in tallies),
            max(tally.end for tally in tallies),
            sum(tally.requests for tally in tallies),
            sum(tally.errors for tally in tallies),
            sum(tally.client_errors for tally in tallies),
            histograms,
        )


@dataclass(frozen=True, slots=True)
class CanaryQuery:
    """For people (``kserve-canary explain``): an instant query that returns the canary revision's
    value of one check alone, over the evaluated window, evaluated at ``request.at``.

    ``note`` says why Prometheus' answer can differ a little from the judged value (``""``: it
    should not). Built by :mod:`canary.metrics.explain_queries`; the judge never reads it.
    """

    promql: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class Evidence:
    """The answer to an :class:`EvidenceRequest`.

    ``canary`` and ``stable`` map a check name (and :data:`REQUESTS`) to its measurement; a check
    without relative limits has no stable measurement. ``counts`` carries the revisions' request,
    error and latency-bucket counts (``"canary"``, ``"stable"``) as :class:`CountSeries`: the judge
    tests error-rate and latency checks on them (docs/design.md §3.4); a check it has no counts for
    is judged on its measurement, as measured. ``canary_queries`` (for explain and the dashboard only)
    holds, per check, PromQL returning the canary's value alone; ``stable_queries`` the stable
    revision's, built the same way (the dashboard draws both over the rollout as range queries).
    """

    request: EvidenceRequest
    canary: Mapping[str, Measurement]
    stable: Mapping[str, Measurement] = field(default_factory=dict)
    queries: int = 0  # HTTP round trips it took
    profile: Mapping[str, str] = field(default_factory=dict)  # metric family -> profile used
    counts: Mapping[str, CountSeries] = field(default_factory=dict)  # "canary" / "stable"
    canary_queries: Mapping[str, CanaryQuery] = field(default_factory=dict)  # check name -> query
    stable_queries: Mapping[str, CanaryQuery] = field(default_factory=dict)  # the same, for the stable


class EvidenceSource(Protocol):
    """Anything that can answer evidence requests: a Prometheus, recorded data, a simulation."""

    def collect(self, policy: PromotionPolicy, request: EvidenceRequest) -> Evidence: ...
