"""The counted measures: one counter sample per requests profile per tick, and the counter book.

``request-count``, ``latency`` and ``error-rate`` (and vLLM's ``ttft``/``e2e-latency``) from the raw
request counters and latency buckets of the requests profile; ``restarts`` and ``oom-kills`` from
kube-state-metrics' restart counters (:data:`~canary.metrics.catalog.RESTARTS_COUNTER`). Each has a
:class:`~canary.metrics.counting.book.CounterBook`; values are read from its tallies
(:func:`count_measurement`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Hashable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from canary.evidence import (
    REQUESTS,
    CountSeries,
    ErrorClass,
    EvidenceRequest,
    EvidenceStatus,
    Histogram,
    Measurement,
    Tally,
)
from canary.metrics.catalog import RevisionKey
from canary.metrics.client import QueryFailure, QueryOutcome
from canary.metrics.counting.book import CounterBook
from canary.metrics.counting.decode import parse_counter_matrix, parse_counter_vector
from canary.metrics.counting.pipeline import (
    Answered,
    Ask,
    Instant,
    Pipeline,
    RangeQuery,
    Refresh,
    Served,
    plan_backfill,
)
from canary.metrics.counting.rules import LATENCY, RevisionSample
from canary.metrics.counting.store import Snapshot
from canary.metrics.plan import CountsAsk, Need, Side
from canary.metrics.tick_queries import RESTARTS_COUNTER, CounterQuery, render_counters
from canary.policy.model import MetricKind, PromotionPolicy
from canary.policy.units import Unit

__all__ = ["CountsPipeline", "count_measurement", "interpolated_quantile"]

_MIN_SERIES_ESTIMATE = 64  # a revision's series in the past: pods come and go (the live count x 2)

# What a rollout's counted checks read of one revision over one range: the tally and its last
# snapshot (or why not), the pods seen, the OOM kills.
_Counts = tuple[tuple[Tally | None, Snapshot | None] | QueryFailure, int, int]


def _from_birth(need: Need, request: EvidenceRequest) -> bool:
    """Whether ``need`` reads a canary's restart counters from its birth (Pending, the first step)."""
    assert isinstance(need.ask, CountsAsk)
    canary = need.side is Side.CANARY and request.canary_born is not None
    return canary and need.ask.counter.profile is None  # the restart counters


class CountsPipeline(Pipeline[CounterQuery, CounterBook]):
    """Samples the raw counters once per tick for every tracked revision, keeps a
    :class:`~canary.metrics.counting.book.CounterBook` per counter query, backfills a revision's past
    once, and answers the counted measures; every full sample also reports the revisions whose
    containers were OOM-killed since the last one (:meth:`take_alarms`)."""

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
        super().__init__(
            instant,
            range_query,
            scrape_interval=scrape_interval,
            sample_budget=sample_budget,
            idle=idle,
            min_requests=min_requests,
        )
        # The alarms and the watches asked for have a lock of their own: the tick takes and asks them
        # without waiting for a sample in flight (which holds the pipeline's lock while Prometheus
        # answers); a watch is entered in the book by the next sample.
        self._side = threading.Lock()
        self._alarms: set[RevisionKey] = set()
        self._watches: list[tuple[RevisionKey, Hashable, datetime, datetime, CounterQuery]] = []
        self._reaches: dict[CounterQuery, tuple[datetime, datetime]] = {}  # the last (at, reach)

    def serve(
        self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]], needs: Sequence[Need]
    ) -> Served:
        self._enter_watches()
        return super().serve(rollouts, needs)

    def _enter_watches(self) -> None:
        with self._side:
            watches, self._watches = self._watches, []
        if not watches:
            return
        with self._lock:
            for revision, who, born, at, counter in watches:
                book = self.book(counter)
                if not book.is_tracked(revision):
                    book.asked(revision, who, born, at, born=True)

    def explain(self) -> dict[str, Any]:
        with self._lock:
            return {
                "scrapeIntervalSeconds": self.step,
                "backfillSampleBudget": self.sample_budget,
                "trackedRevisions": dict(
                    sorted((counter.name, len(book.tracked())) for counter, book in self.books.items())
                ),
            }

    def _new_book(self, query: CounterQuery) -> CounterBook:
        # Only the requests family is judged tick by tick (count_series); the restart counters
        # are read over whole ranges, and their book keeps nothing per tick.
        return CounterBook(tolerance=self.tolerance, idle=self._idle, per_tick=query.profile is not None)

    def _query_of(self, need: Need) -> CounterQuery | None:
        return need.ask.counter if isinstance(need.ask, CountsAsk) else None

    def _ask(self, need: Need, policy: PromotionPolicy, request: EvidenceRequest) -> Ask:
        who = (request.namespace, request.inference_service)
        start, interval = request.counts_start, policy.spec.interval
        return Ask(
            need.revision, who, start, request.at, request.window_start, interval, _from_birth(need, request)
        )

    def _register(self, book: CounterBook, ask: Ask) -> None:
        starts = () if ask.step_start is None else (ask.step_start,)
        book.asked(
            ask.revision, ask.who, ask.start, ask.at, starts=starts, interval=ask.interval, born=ask.born
        )

    def _sampled(self, book: CounterBook, refresh: Refresh) -> None:
        # Every tracked revision was sampled: one whose containers were OOM-killed since the last
        # sample is an alarm (take_alarms), whoever is due now.
        killed = {
            revision
            for revision in refresh.revisions
            if revision not in refresh.failures and book.new_oom_kills(revision) > 0
        }
        with self._side:
            self._alarms.update(killed)

    # -- answering ------------------------------------------------------------------------------

    def _answer(self, served: Served, answered: Answered) -> None:
        # The ranges already added up in this call: a rollout's checks read the same revision over
        # the same range (p99 and error rate of one canary).
        ranges: dict[tuple[object, ...], _Counts] = {}
        for need, request, refresh in answered:
            assert isinstance(need.ask, CountsAsk)
            shown = _counters_for(need.ask.counter, need.revision) if refresh.query else ""
            if need.ask.counter.profile is not None:  # requests only
                self._series(served, need, request, refresh, shown)
            counts, pods, oom_kills = self._counts(need, request, refresh, ranges)
            served.measurements[id(need)] = count_measurement(
                need.measure or REQUESTS,
                need.unit,
                need.revision,
                need.ask.quantile,
                counts,
                min_requests=self.min_requests,
                query=shown,
                duration=refresh.duration,
                pods=pods,
                oom_kills=oom_kills,
            )

    def _series(
        self, served: Served, need: Need, request: EvidenceRequest, refresh: Refresh, shown: str
    ) -> None:
        """The rollout's tallies of the revision on ``need``'s side (once per side)."""
        assert isinstance(need.ask, CountsAsk)
        side = served.series.setdefault(need.rollout, {})
        if need.side.value in side:
            return
        failure = refresh.failures.get(need.revision)
        if failure is not None:
            side[need.side.value] = CountSeries(
                EvidenceStatus.ERROR, detail=failure.detail, error_class=failure.error_class, query=shown
            )
        else:
            book = self.book(need.ask.counter)
            side[need.side.value] = book.count_series(
                need.revision, request.counts_start, request.at, query=shown
            )

    def _counts(
        self,
        need: Need,
        request: EvidenceRequest,
        refresh: Refresh,
        ranges: dict[tuple[object, ...], _Counts],
    ) -> _Counts:
        assert isinstance(need.ask, CountsAsk)
        failure = refresh.failures.get(need.revision)
        if failure is not None:
            return failure, 0, 0
        born = _from_birth(need, request)
        start = request.restarts_start(born)
        key = (need.ask.counter, need.revision, start, request.at, born)
        known = ranges.get(key)
        if known is None:
            book = self.book(need.ask.counter)
            known = ranges[key] = (
                book.tally(need.revision, start, request.at, from_birth=born),
                book.pods_seen(need.revision, start, request.at),
                book.oom_kills(need.revision, start, request.at, from_birth=born),
            )
        return known

    # -- warm-up: the restart counters of canaries not evaluated yet ------------------------------

    def sample_restarts(self, at: datetime) -> None:
        """Sample every revision the restart book tracks at ``at`` unless a sample within the
        tolerance exists (see :meth:`watch`)."""
        self._enter_watches()
        with self._lock:  # one restart book per kube-state-metrics label style in use
            books = [(counter, book) for counter, book in self.books.items() if counter.profile is None]
        for counter, book in books:
            if book.tracked():
                self._refresh(counter, {}, [], at)

    def watch(
        self,
        revision: RevisionKey,
        who: Hashable,
        born: datetime,
        at: datetime,
        counter: CounterQuery = RESTARTS_COUNTER,
    ) -> None:
        """Sample ``revision``'s restart counters in every tick from now on, counted from birth (a
        canary warming up, not evaluated yet): an OOM kill then raises an alarm within a tick
        instead of waiting for the first evaluation. Once the revision is tracked (asked for, or
        watched before), nothing changes. Never waits for a sample in flight."""
        with self._side:
            self._watches.append((revision, who, born, at, counter))

    def take_alarms(self) -> set[RevisionKey]:
        """The revisions OOM-killed in a sample since the last call (each reported once). Never
        waits for a sample in flight."""
        with self._side:
            alarms, self._alarms = self._alarms, set()
        return alarms

    # -- sampling -------------------------------------------------------------------------------

    def _sample_and_record(
        self,
        counter: CounterQuery,
        book: CounterBook,
        starts: Mapping[RevisionKey, datetime | None],
        at: datetime,
    ) -> Refresh:
        revisions = sorted(starts)
        try:
            render_counters(counter, revisions)
        except ValueError as error:  # a catalog bug must not take the controller down
            failure = QueryFailure(ErrorClass.BAD_QUERY, f"cannot build the query: {error}")
            return Refresh(at, set(revisions), dict.fromkeys(revisions, failure), "")

        def ask(
            part: Sequence[RevisionKey],
        ) -> tuple[QueryOutcome, dict[RevisionKey, RevisionSample] | QueryFailure]:
            outcome = self._instant(render_counters(counter, part), at)
            return outcome, parse_counter_vector(
                outcome, part, divisor=counter.divisor, metric=counter.metric_name
            )

        # A sample Prometheus refuses for one rollout's series holds that rollout only (split).
        split = self.splitter.ask(counter, revisions, book.owner, ask)
        refresh = Refresh(
            at, set(revisions), split.failures, split.query, split.http_requests, split.duration
        )
        parsed = split.answers
        wanted = {revision: start for revision, start in starts.items() if revision in parsed}
        backfill = self._to_backfill(book, wanted, at)
        reach = self._reach(counter, parsed, at)
        filled = self._backfill(counter, book, backfill, parsed, reach, refresh) if backfill else set()
        for revision in parsed:
            if revision not in filled:
                book.record(revision, reach, parsed[revision])
        return refresh

    def _reach(
        self, counter: CounterQuery, parsed: Mapping[RevisionKey, RevisionSample], at: datetime
    ) -> datetime:
        """The time a request sample taken at ``at`` stands for: how far Prometheus' evidence reaches,
        the newest counter sample of any revision in it (never after ``at``, never before the last).
        Behind an ingestion lag the values a query sees at ``at`` are those of ``at - lag``: a tally
        between two samples then covers what was served between their reaches, so a step's own
        evidence is what was served after it began. One time for the whole tick, so that the
        canary's tallies and the stable revision's cover the same intervals. The restart counters
        stay at ``at``: a kill is counted in the window in which it became visible, never lost
        to a window already judged."""
        if counter.profile is None:
            return at
        last = self._reaches.get(counter)
        if last is not None and last[0] == at:
            return last[1]  # revisions added to the tick's sample: the tick's reach
        newest = max((sample.newest for sample in parsed.values() if sample.newest is not None), default=None)
        if newest is not None:
            reach = min(at, datetime.fromtimestamp(newest, UTC))
        else:  # nothing has series: as far behind as the last sample was
            reach = at - (last[0] - last[1]) if last is not None else at
        if last is not None:
            reach = max(reach, last[1])
        self._reaches[counter] = (at, reach)
        return reach

    def _backfill(
        self,
        counter: CounterQuery,
        book: CounterBook,
        starts: Mapping[RevisionKey, datetime],
        live: Mapping[RevisionKey, RevisionSample],
        at: datetime,
        refresh: Refresh,
    ) -> set[RevisionKey]:
        """Fill the revisions' past from [earliest start, at] with range queries; the ones filled.
        ``at`` is how far the live sample reaches (:meth:`_reach`): before it Prometheus holds
        everything, after it the grid would repeat values that are not there yet."""
        start = min(starts.values())
        estimate = {
            revision: max(_MIN_SERIES_ESTIMATE, 2 * len(live[revision].values)) for revision in starts
        }
        chunks = plan_backfill(estimate, start, at, self.step, sample_budget=self.sample_budget)
        history: dict[RevisionKey, list[tuple[datetime, RevisionSample]]] = {
            revision: [] for revision in starts
        }
        render = functools.partial(render_counters, counter)
        parse = functools.partial(parse_counter_matrix, divisor=counter.divisor, metric=counter.metric_name)
        for chunk, matrix in self._ranges(chunks, render, parse, refresh):
            if isinstance(matrix, QueryFailure):
                detail = f"backfill of the counters: {matrix.detail}"
                failure = QueryFailure(matrix.error_class, detail, matrix.http_status)
                refresh.failures.update(dict.fromkeys(chunk.revisions, failure))
                continue
            by_time = {round(moment, 3): samples for moment, samples in matrix.items()}
            for moment, key in self._grid(chunk):
                at_moment = by_time.get(key, {})
                for revision in chunk.revisions:
                    # A grid point without series is an empty sample, as a live tick without series.
                    history[revision].append((moment, at_moment.get(revision, RevisionSample({}))))
        filled = set()
        for revision in starts:
            if revision in refresh.failures:
                continue
            book.replay(
                revision, [item for item in history[revision] if item[0] < at] + [(at, live[revision])]
            )
            book.mark_backfilled(revision, start)
            filled.add(revision)
        return filled


# The query a measurement shows (explain.json, status, notifications) is the grouped query narrowed
# to its own revision: what was asked for it, readable, and bounded. The grouped query itself lists
# every revision of the tick, and every explain document would hold a copy per check.
@functools.lru_cache(maxsize=8192)
def _counters_for(counter: CounterQuery, revision: RevisionKey) -> str:
    return render_counters(counter, [revision])


# ---------------------------------------------------------------------------------------------
# Measurements from counts


def interpolated_quantile(quantile: float, histogram: Histogram) -> float | None:
    """``histogram_quantile``'s estimate from bucket counts: linear inside the bucket (from 0 in the
    first one); the highest finite bound when the rank falls into ``+Inf``; None without observations."""
    if histogram.total <= 0 or not histogram.edges:
        return None
    rank = quantile * histogram.total
    for index, (bound, count) in enumerate(zip(histogram.edges, histogram.at_most, strict=True)):
        if count < rank:
            continue
        if index == 0 and bound <= 0:
            return bound
        lower = 0.0 if index == 0 else histogram.edges[index - 1]
        below = 0 if index == 0 else histogram.at_most[index - 1]
        inside = count - below
        if inside <= 0:
            return lower
        return lower + (bound - lower) * (rank - below) / inside
    return histogram.edges[-1]


def _where(revision: RevisionKey) -> str:
    return f"revision {revision.revision!r} in namespace {revision.namespace!r}"


def _no_tally(measure: str, revision: RevisionKey) -> str:
    """Why a measure has no value when the range has no series."""
    if measure in {MetricKind.RESTARTS.value, MetricKind.OOM_KILLS.value}:
        return f"kube-state-metrics shows no pods of {_where(revision)} in the window"
    if measure == REQUESTS:
        return (
            f"no request series for {_where(revision)} in the window "
            "(no requests yet, or its metrics are not scraped)"
        )
    if measure == MetricKind.ERROR_RATE.value:
        return f"no request series for {_where(revision)} in the window: an error rate needs requests"
    return f"no latency series for {_where(revision)} in the window"


def count_measurement(
    measure: str,
    unit: Unit,
    revision: RevisionKey,
    quantile: float | None,
    counts: tuple[Tally | None, Snapshot | None] | QueryFailure,
    *,
    min_requests: float,
    query: str = "",
    duration: float = 0.0,
    pods: int = 0,
    oom_kills: int = 0,
) -> Measurement:
    """``request-count``, ``error-rate`` or ``latency`` over a window, from the book's tally; or
    ``restarts`` from the restart counters' (``pods``: the pods seen, the samples behind it)."""
    if isinstance(counts, QueryFailure):
        return Measurement.error(counts.error_class, counts.detail, unit, query=query, duration=duration)
    tally, last = counts
    if last is not None and last.invalid:
        return Measurement.invalid(last.invalid, unit, query=query, duration=duration)
    if tally is None:
        return Measurement.no_data(_no_tally(measure, revision), unit, query=query, duration=duration)
    if measure == REQUESTS:
        return Measurement.ok(tally.requests, unit, samples=tally.requests, query=query, duration=duration)
    if measure == MetricKind.RESTARTS.value:  # the restart counters: "requests" are restarts
        return Measurement.ok(tally.requests, unit, samples=pods, query=query, duration=duration)
    if measure == MetricKind.OOM_KILLS.value:
        return Measurement.ok(oom_kills, unit, samples=pods, query=query, duration=duration)
    if measure == MetricKind.ERROR_RATE.value:
        samples, histogram = tally.requests, None
    else:
        histogram = tally.histograms.get(LATENCY if measure == MetricKind.LATENCY.value else measure)
        if histogram is None:
            detail = f"no latency series for {_where(revision)} in the window"
            return Measurement.no_data(detail, unit, query=query, duration=duration)
        samples = histogram.total
    if samples < min_requests:
        counted = "no requests" if samples == 0 else f"{samples} requests"
        detail = f"{counted} in the window; a value needs at least {min_requests:g}"
        return Measurement.no_data(detail, unit, samples=samples, query=query, duration=duration)
    if histogram is None:
        value = tally.errors / tally.requests
    else:
        estimated = interpolated_quantile(quantile if quantile is not None else 0.5, histogram)
        if estimated is None:
            detail = f"no latency observations for {_where(revision)} in the window"
            return Measurement.no_data(detail, unit, samples=samples, query=query, duration=duration)
        value = estimated
    return Measurement.ok(value, unit, samples=samples, query=query, duration=duration)
