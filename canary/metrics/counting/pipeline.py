"""What the counted measures and the gauge peaks share: books of revisions, sampled once per tick.

A **book** (:class:`RevisionBook`) keeps, per revision, what its samples said (a track), who asked
for the revision and from when, and forgets what nobody can need any more. A **pipeline**
(:class:`Pipeline`) keeps a book per query and, in each tick, samples every revision the book tracks
with one instant query (calls whose ``at`` is within half a scrape interval share a sample:
single-flight, safe from worker threads), fills a revision's past once with range queries when it
is first asked for with a start in the past (within Prometheus' limits, :func:`plan_backfill`), and
answers each rollout's needs from the book.

:class:`~canary.metrics.counting.counts.CountsPipeline` (raw counters, :class:`.book.CounterBook`)
and :class:`~canary.metrics.counting.peaks.PeaksPipeline` (gauge peaks, ``PeakBook``) say what
differs: what a need asks, how a sample is taken and read, and how a need is answered.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, NamedTuple, TypeVar

from canary.evidence import CountSeries, ErrorClass, EvidenceRequest, Measurement
from canary.metrics.catalog import RevisionKey
from canary.metrics.client import QueryFailure, QueryOutcome
from canary.metrics.heap import collector_paused
from canary.metrics.plan import Need
from canary.metrics.split import Splitter
from canary.policy.model import PromotionPolicy

__all__ = [
    "MAX_POINTS_PER_SERIES",
    "Ask",
    "BackfillChunk",
    "Pipeline",
    "Refresh",
    "RevisionBook",
    "Served",
    "Track",
    "plan_backfill",
]

Instant = Callable[[str, datetime], QueryOutcome]
RangeQuery = Callable[[str, datetime, datetime, float], QueryOutcome]


@dataclass(slots=True)
class Track:
    """What a book keeps about one revision, whatever it keeps of its samples."""

    asks: dict[Hashable, tuple[datetime, datetime]] = field(default_factory=dict)  # who: (from, when)
    backfilled_from: datetime | None = None


TrackT = TypeVar("TrackT", bound=Track)


class RevisionBook(ABC, Generic[TrackT]):
    """Per revision, a track of what its samples said; a revision nobody asked about for ``idle``
    (in sample time) is forgotten, and what no range asked for can need any more is pruned.

    :param tolerance: how far a sample may be from a wanted moment and still stand for it (half the
        scrape interval: the samples of one tick need not share the exact same ``at``).
    """

    def __init__(self, *, tolerance: timedelta, idle: timedelta = timedelta(minutes=15)) -> None:
        self.tolerance = tolerance
        self.idle = idle
        self._tracks: dict[RevisionKey, TrackT] = {}

    @abstractmethod
    def _new_track(self) -> TrackT: ...

    @abstractmethod
    def _oldest(self, track: TrackT) -> datetime | None:
        """When the revision's oldest sample starts (None: nothing sampled)."""

    @abstractmethod
    def _trim(self, track: TrackT, oldest: datetime, now: datetime) -> None:
        """Forget what no range from ``oldest`` (the oldest asked for) can need, at ``now``."""

    def tracked(self) -> set[RevisionKey]:
        return set(self._tracks)

    def is_tracked(self, revision: RevisionKey) -> bool:
        return revision in self._tracks

    def _track(self, revision: RevisionKey) -> TrackT:
        track = self._tracks.get(revision)
        if track is None:
            track = self._tracks[revision] = self._new_track()
        return track

    def asked(self, revision: RevisionKey, asker: Hashable, start: datetime, at: datetime) -> None:
        """``asker`` (a rollout) wants ``revision`` from ``start``, asked at ``at`` (an evaluation)."""
        self._track(revision).asks[asker] = (start, at)

    def needs_backfill(self, revision: RevisionKey, start: datetime) -> bool:
        """Whether the book lacks ``revision``'s past from ``start`` and has not filled it yet."""
        track = self._tracks.get(revision)
        if track is None:
            return True
        if track.backfilled_from is not None and track.backfilled_from <= start + self.tolerance:
            return False
        oldest = self._oldest(track)
        return oldest is None or oldest > start + self.tolerance

    def owner(self, revision: RevisionKey) -> Hashable:
        """Whose ``revision`` is (the rollout that asked for it): what a failed sample is split into
        (:mod:`canary.metrics.split`)."""
        track = self._tracks.get(revision)
        return min(track.asks, key=repr) if track is not None and track.asks else revision

    def mark_backfilled(self, revision: RevisionKey, start: datetime) -> None:
        self._track(revision).backfilled_from = start

    def prune(self, now: datetime) -> None:
        """Forget what no range asked for can need any more (in sample time ``now``)."""
        for revision in list(self._tracks):
            track = self._tracks[revision]
            track.asks = {who: ask for who, ask in track.asks.items() if ask[1] >= now - self.idle}
            if not track.asks:
                del self._tracks[revision]
                continue
            self._trim(track, min(start for start, _ in track.asks.values()), now)


# ---------------------------------------------------------------------------------------------
# Pipelines


class Ask(NamedTuple):
    """A rollout's ask for a revision: from ``start`` to ``at``."""

    revision: RevisionKey
    who: Hashable
    start: datetime
    at: datetime
    step_start: datetime | None = None  # the start of its current step (another range it reads)
    interval: float | None = None  # the policy's evaluation interval, seconds
    born: bool = False  # a canary's restart counters in its first step: counted from birth


@dataclass(slots=True)
class Refresh:
    """One tick's sample of one query, and what it cost the call that took it."""

    at: datetime
    revisions: set[RevisionKey]
    failures: dict[RevisionKey, QueryFailure]
    query: str
    http_requests: int = 0
    duration: float = 0.0
    span: str = ""  # a peak query's range


@dataclass(slots=True)
class Served:
    """What a pipeline gives one collect call."""

    measurements: dict[int, Measurement] = field(default_factory=dict)  # id(need) -> measurement
    series: dict[int, dict[str, CountSeries]] = field(default_factory=dict)  # rollout -> side -> counts
    http_requests: dict[int, int] = field(default_factory=dict)  # rollout -> round trips spent for it


Q = TypeVar("Q", bound=Hashable)
B = TypeVar("B", bound=RevisionBook[Any])
M = TypeVar("M")
Answered = list[tuple[Need, EvidenceRequest, Refresh]]


class Pipeline(ABC, Generic[Q, B]):
    """A book per query ``Q``, sampled once per tick (see the module docstring).

    A sample taken at ``t`` serves every collect call whose ``at`` is within half a scrape interval
    of ``t``; a revision new in that tick is sampled on its own at ``t``.
    """

    def __init__(
        self,
        instant: Instant,
        range_query: RangeQuery,
        *,
        scrape_interval: float,
        sample_budget: int,
        idle: float,
        min_requests: float = 1.0,
    ) -> None:
        if scrape_interval <= 0:
            raise ValueError("scrape_interval must be positive")
        self._instant = instant
        self._range = range_query
        self.step = scrape_interval
        self.tolerance = timedelta(seconds=scrape_interval / 2)
        self.sample_budget = sample_budget
        self.min_requests = min_requests
        self._idle = timedelta(seconds=idle)
        self._lock = threading.Lock()
        self.books: dict[Q, B] = {}
        self._last: dict[Q, Refresh] = {}
        self.splitter = Splitter()  # a failed sample asked again by namespace, then by rollout

    # -- what differs ---------------------------------------------------------------------------

    @abstractmethod
    def _new_book(self, query: Q) -> B: ...

    @abstractmethod
    def _query_of(self, need: Need) -> Q | None:
        """The query that answers ``need``; None when this pipeline does not answer it."""

    @abstractmethod
    def _ask(self, need: Need, policy: PromotionPolicy, request: EvidenceRequest) -> Ask: ...

    @abstractmethod
    def _register(self, book: B, ask: Ask) -> None:
        """Tell ``book`` who asked for what."""

    @abstractmethod
    def _sample_and_record(
        self, query: Q, book: B, starts: Mapping[RevisionKey, datetime | None], at: datetime
    ) -> Refresh:
        """Sample the revisions of ``starts`` at ``at`` into ``book``, filling the past from their
        start (None: no past wanted) where the book lacks it."""

    @abstractmethod
    def _answer(self, served: Served, answered: Answered) -> None:
        """The measurements of these needs, from the book (under the lock)."""

    def _sampled(self, book: B, refresh: Refresh) -> None:
        """Every tracked revision was just sampled (``refresh``)."""

    # -- what is shared -------------------------------------------------------------------------

    def book(self, query: Q) -> B:
        book = self.books.get(query)
        if book is None:
            book = self.books[query] = self._new_book(query)
        return book

    def serve(
        self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]], needs: Sequence[Need]
    ) -> Served:
        mine = [(need, query) for need in needs if (query := self._query_of(need)) is not None]
        # Per (query, tick): the revisions wanted and the earliest start each must cover.
        wanted: dict[tuple[Q, datetime], dict[RevisionKey, datetime]] = {}
        askers: dict[Q, list[Ask]] = {}
        for need, query in mine:
            policy, request = rollouts[need.rollout]
            ask = self._ask(need, policy, request)
            starts = wanted.setdefault((query, request.at), {})
            starts[need.revision] = min(ask.start, starts.get(need.revision, ask.start))
            askers.setdefault(query, []).append(ask)
        refreshes = {
            (query, at): self._refresh(query, wanted[(query, at)], askers[query], at)
            for query, at in sorted(wanted, key=lambda item: item[1])
        }
        served = Served()
        charged: set[tuple[int, Q, datetime]] = set()
        answered: Answered = []
        with self._lock:
            for need, query in mine:
                request = rollouts[need.rollout][1]
                refresh, paid = refreshes[(query, request.at)]
                charge = (need.rollout, query, request.at)
                if paid and charge not in charged:
                    charged.add(charge)
                    spent = served.http_requests.get(need.rollout, 0) + refresh.http_requests
                    served.http_requests[need.rollout] = spent
                answered.append((need, request, refresh))
            self._answer(served, answered)
        return served

    def _refresh(
        self, query: Q, wanted: Mapping[RevisionKey, datetime], askers: Sequence[Ask], at: datetime
    ) -> tuple[Refresh, bool]:
        """The sample standing for tick ``at`` (taken now unless one within tolerance exists); and
        whether this call paid for a query."""
        with self._lock:
            book = self.book(query)
            for ask in askers:
                self._register(book, ask)
            last = self._last.get(query)
            if last is not None and abs(last.at - at) <= self.tolerance:
                missing = {
                    revision: start for revision, start in wanted.items() if revision not in last.revisions
                }
                if not missing:
                    return last, False
                fresh = self._sample(query, book, missing, last.at)
                last.revisions |= fresh.revisions
                last.failures.update(fresh.failures)
                return Refresh(
                    last.at, last.revisions, last.failures, fresh.query, fresh.http_requests, fresh.duration
                ), True
            starts: dict[RevisionKey, datetime | None] = dict.fromkeys(book.tracked())
            starts.update(wanted)
            refresh = self._sample(query, book, starts, at)
            self._last[query] = refresh
            book.prune(at)
            self._sampled(book, refresh)
            return refresh, True

    def _sample(
        self, query: Q, book: B, starts: Mapping[RevisionKey, datetime | None], at: datetime
    ) -> Refresh:
        # The answer lives only until it is recorded; the collector waits (canary.metrics.heap).
        with collector_paused():
            return self._sample_and_record(query, book, starts, at)

    def _to_backfill(
        self, book: B, starts: Mapping[RevisionKey, datetime | None], at: datetime
    ) -> dict[RevisionKey, datetime]:
        """The revisions whose past from their start the book lacks."""
        return {
            revision: start
            for revision, start in starts.items()
            if start is not None and start < at - self.tolerance and book.needs_backfill(revision, start)
        }

    def _ranges(
        self,
        chunks: Sequence[BackfillChunk],
        render: Callable[[Sequence[RevisionKey]], str],
        parse: Callable[[QueryOutcome, Sequence[RevisionKey]], M | QueryFailure],
        refresh: Refresh,
    ) -> Iterator[tuple[BackfillChunk, M | QueryFailure]]:
        """Each chunk's range answer, read (its cost added to ``refresh``); a chunk Prometheus timed
        out on is asked again once, as two halves of its revisions (the same query re-run would
        time out again; two smaller ones may not)."""
        pending = [(chunk, False) for chunk in chunks]
        while pending:
            chunk, halved = pending.pop(0)
            outcome = self._range(render(chunk.revisions), chunk.start, chunk.end, self.step)
            refresh.http_requests += outcome.http_requests
            refresh.duration += outcome.duration
            answer = parse(outcome, chunk.revisions)
            if not halved and _timed_out(answer) and len(chunk.revisions) >= 2:
                middle = len(chunk.revisions) // 2
                pending[:0] = [
                    (BackfillChunk(chunk.revisions[:middle], chunk.start, chunk.end), True),
                    (BackfillChunk(chunk.revisions[middle:], chunk.start, chunk.end), True),
                ]
                continue
            yield chunk, answer

    def _grid(self, chunk: BackfillChunk) -> Iterator[tuple[datetime, float]]:
        """A chunk's evaluation times, and each as a range answer keys it (Unix seconds, ms)."""
        points = round((chunk.end - chunk.start).total_seconds() / self.step)
        for index in range(points + 1):
            moment = chunk.start + timedelta(seconds=index * self.step)
            yield moment, round(moment.timestamp(), 3)


def _timed_out(answer: object) -> bool:
    return isinstance(answer, QueryFailure) and answer.error_class is ErrorClass.TIMEOUT


# ---------------------------------------------------------------------------------------------
# Backfill: within Prometheus' limits


@dataclass(frozen=True, slots=True)
class BackfillChunk:
    """One range query of a backfill: these revisions, evaluated from ``start`` to ``end``."""

    revisions: tuple[RevisionKey, ...]
    start: datetime
    end: datetime


MAX_POINTS_PER_SERIES = 11_000  # Prometheus refuses a range query with more points per series


def plan_backfill(
    series: Mapping[RevisionKey, int],
    start: datetime,
    end: datetime,
    step: float,
    *,
    sample_budget: int,
    max_points: int = MAX_POINTS_PER_SERIES,
) -> list[BackfillChunk]:
    """Range queries covering [start, end] at ``step`` for every revision of ``series`` (its estimated
    series count), each within ``max_points`` points per series and ``sample_budget`` series x points.

    The evaluation grid is the same in every chunk (``start + k * step``), so chunks of one revision
    continue each other without a gap or an overlap.
    """
    if step <= 0 or sample_budget < 1 or max_points < 1:
        raise ValueError("need a positive step, sample budget and point limit")
    if not series or end < start:
        return []
    total_points = int((end - start).total_seconds() // step) + 1
    points = min(total_points, max_points)
    chunks = []
    for members, per_chunk in _groups(series, points, sample_budget):
        for first in range(0, total_points, per_chunk):
            last = min(total_points, first + per_chunk) - 1
            chunks.append(
                BackfillChunk(
                    tuple(members),
                    start + timedelta(seconds=first * step),
                    start + timedelta(seconds=last * step),
                )
            )
    return chunks


def _groups(
    series: Mapping[RevisionKey, int], points: int, sample_budget: int
) -> list[tuple[Collection[RevisionKey], int]]:
    """Revisions grouped into queries within the sample budget, and the points per chunk of each
    (one revision alone over budget: its range is split instead)."""
    groups: list[tuple[Collection[RevisionKey], int]] = []
    current: list[RevisionKey] = []
    current_series = 0
    for revision in sorted(series):
        count = max(1, series[revision])
        if count * points > sample_budget:
            groups.append(([revision], max(1, min(points, sample_budget // count))))
            continue
        if current and (current_series + count) * points > sample_budget:
            groups.append((current, points))
            current, current_series = [], 0
        current.append(revision)
        current_series += count
    if current:
        groups.append((current, points))
    return groups
