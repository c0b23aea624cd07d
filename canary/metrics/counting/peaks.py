"""Gauge peaks: per tick, the peak of each series since the previous tick; a window's peak is theirs.

gpu-memory-peak (bytes and fraction), kv-cache-usage and warmup-time: each tick, one query per family
asks every tracked revision's per-series peak since the previous tick (``max_over_time`` over that
span only); a window's value is the maximum of its ticks' peaks, and the series behind it are those
seen in any of them. A revision first asked for with a window reaching into the past gets it filled
once by a range query (one peak per scrape interval).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from canary.evidence import ErrorClass, EvidenceRequest
from canary.metrics.answers import GroupedAnswer, brief, labels_of, result_of
from canary.metrics.catalog import FIELD_LABEL, FIELD_SAMPLES, NAMESPACE_LABEL, REVISION_LABEL, RevisionKey
from canary.metrics.client import QueryFailure, QueryOutcome
from canary.metrics.counting.decode import point_time
from canary.metrics.counting.pipeline import (
    Answered,
    Ask,
    Instant,
    Pipeline,
    RangeQuery,
    Refresh,
    RevisionBook,
    Served,
    Track,
    plan_backfill,
)
from canary.metrics.plan import VALUE_FIELD, Need, PeaksAsk, measurement_for
from canary.metrics.tick_queries import PEAK_FIELD, PeakQuery, render_peaks
from canary.policy.model import PromotionPolicy

__all__ = ["PeakBook", "PeakEntry", "PeakSample", "PeaksPipeline", "parse_peak_matrix", "parse_peaks"]

Identity = frozenset[tuple[str, str]]  # a series' labels
_PEAK_SERIES_ESTIMATE = 64  # GPUs (x4 series in the fraction) or vLLM engines of a revision


@dataclass(frozen=True, slots=True)
class PeakSample:
    """One revision's per-series peaks over one span: series -> {evidence_field: value}."""

    values: Mapping[Identity, Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class PeakEntry:
    """The peaks of one revision's series in ``(start, end]``."""

    start: datetime
    end: datetime
    fields: Mapping[str, float]  # evidence_field -> the maximum over the revision's series
    series: frozenset[Identity]


def _maxima(fields: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Per field, ``max_over_time``'s maximum: NaN only when everything is NaN."""
    values: dict[str, list[float]] = {}
    for one in fields:
        for name, value in one.items():
            values.setdefault(name, []).append(value)
    maxima = {}
    for name, numbers in values.items():
        real = [value for value in numbers if not math.isnan(value)]
        maxima[name] = max(real) if real else math.nan
    return maxima


@dataclass(slots=True)
class _PeakTrack(Track):
    entries: list[PeakEntry] = field(default_factory=list)


class PeakBook(RevisionBook[_PeakTrack]):
    """Per revision, the peaks of its gauge series tick by tick."""

    def _new_track(self) -> _PeakTrack:
        return _PeakTrack()

    def _oldest(self, track: _PeakTrack) -> datetime | None:
        return track.entries[0].start if track.entries else None

    def _trim(self, track: _PeakTrack, oldest: datetime, now: datetime) -> None:
        oldest -= self.tolerance
        track.entries = [entry for entry in track.entries if entry.start >= oldest or entry.end > oldest]

    def entries(self, revision: RevisionKey) -> tuple[PeakEntry, ...]:
        track = self._tracks.get(revision)
        return tuple(track.entries) if track is not None else ()

    def last_end(self, revision: RevisionKey) -> datetime | None:
        track = self._tracks.get(revision)
        return track.entries[-1].end if track is not None and track.entries else None

    def record(self, revision: RevisionKey, start: datetime, end: datetime, sample: PeakSample) -> bool:
        track = self._track(revision)
        if end <= start or (track.entries and end <= track.entries[-1].end):
            return False
        maxima = _maxima(sample.values.values())
        track.entries.append(PeakEntry(start, end, maxima, frozenset(sample.values)))
        return True

    def replay(
        self, revision: RevisionKey, entries: Iterable[tuple[datetime, datetime, PeakSample]], start: datetime
    ) -> None:
        old = self._tracks.get(revision)
        self._tracks[revision] = _PeakTrack(asks=dict(old.asks) if old is not None else {})
        for entry_start, entry_end, sample in sorted(entries, key=lambda item: item[1]):
            self.record(revision, entry_start, entry_end, sample)
        self.mark_backfilled(revision, start)

    def window(self, revision: RevisionKey, start: datetime, end: datetime) -> tuple[dict[str, float], int]:
        """The maxima over the entries inside [start, end] and how many series they rest on."""
        track = self._tracks.get(revision)
        if track is None:
            return {}, 0
        inside = [
            entry
            for entry in track.entries
            if entry.start >= start - self.tolerance and entry.end <= end + self.tolerance
        ]
        series = frozenset[Identity]().union(*(entry.series for entry in inside))
        return _maxima(entry.fields for entry in inside), len(series)


# ---------------------------------------------------------------------------------------------
# Reading the peak query's answers


def parse_peaks(
    outcome: QueryOutcome, revisions: Collection[RevisionKey]
) -> dict[RevisionKey, PeakSample] | QueryFailure:
    """A peak query's instant answer, per revision asked for."""
    result = result_of(outcome, "vector")
    if isinstance(result, QueryFailure):
        return result
    found = _peak_series(
        [(series, series.get("value") if isinstance(series, dict) else None) for series in result], revisions
    )
    if isinstance(found, QueryFailure):
        return found
    return {key: PeakSample(found.get(key, {})) for key in revisions}


def parse_peak_matrix(
    outcome: QueryOutcome, revisions: Collection[RevisionKey]
) -> dict[float, dict[RevisionKey, PeakSample]] | QueryFailure:
    """A peak query's range answer, per evaluation time, per revision asked for."""
    result = result_of(outcome, "matrix")
    if isinstance(result, QueryFailure):
        return result
    by_time: dict[float, list[tuple[object, object]]] = {}
    for series in result:
        points = series.get("values") if isinstance(series, dict) else None
        if not isinstance(points, list):
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable series: {brief(series)}")
        for point in points:
            moment = point_time(point)
            if isinstance(moment, str):
                return QueryFailure(ErrorClass.UNEXPECTED_RESULT, moment)
            by_time.setdefault(round(moment, 3), []).append((series, point))
    parsed: dict[float, dict[RevisionKey, PeakSample]] = {}
    for moment, pairs in sorted(by_time.items()):
        found = _peak_series(pairs, revisions)
        if isinstance(found, QueryFailure):
            return found
        parsed[moment] = {key: PeakSample(found.get(key, {})) for key in revisions}
    return parsed


def _peak_series(
    pairs: Sequence[tuple[object, object]], revisions: Collection[RevisionKey]
) -> dict[RevisionKey, dict[Identity, dict[str, float]]] | QueryFailure:
    wanted = set(revisions)
    found: dict[RevisionKey, dict[Identity, dict[str, float]]] = {}
    for series, pair in pairs:
        labels = labels_of(series)
        if labels is None or not isinstance(pair, list) or len(pair) != 2:
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable series: {brief(series)}")
        namespace, revision, kind = (
            labels.get(NAMESPACE_LABEL),
            labels.get(REVISION_LABEL),
            labels.get(FIELD_LABEL),
        )
        if not isinstance(namespace, str) or not isinstance(revision, str) or not isinstance(kind, str):
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unexpected peak series: {brief(labels)}")
        key = RevisionKey(namespace, revision)
        if key not in wanted:
            continue
        try:
            value = float(str(pair[1]))
        except ValueError:
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable sample: {brief(pair)}")
        identity = frozenset((str(name), str(text)) for name, text in labels.items() if name != FIELD_LABEL)
        found.setdefault(key, {}).setdefault(identity, {})[kind] = value
    return found


# ---------------------------------------------------------------------------------------------
# The pipeline: one peak query per family per tick


class PeaksPipeline(Pipeline[PeakQuery, PeakBook]):
    """gpu-memory-peak, kv-cache-usage and warmup-time, from a :class:`PeakBook` per family."""

    def __init__(
        self,
        instant: Instant,
        range_query: RangeQuery,
        *,
        scrape_interval: float,
        min_window: float,
        idle: float,
        min_requests: float,
        sample_budget: int,
    ) -> None:
        super().__init__(
            instant,
            range_query,
            scrape_interval=scrape_interval,
            sample_budget=sample_budget,
            idle=idle,
            min_requests=min_requests,
        )
        self.min_window = timedelta(seconds=min_window)

    def _new_book(self, query: PeakQuery) -> PeakBook:
        return PeakBook(tolerance=self.tolerance, idle=self._idle)

    def _query_of(self, need: Need) -> PeakQuery | None:
        return need.ask.peaks if isinstance(need.ask, PeaksAsk) else None

    def _start(self, request: EvidenceRequest) -> datetime:
        """The window the peaks must cover: at least ``min_window``, as the per-window queries were."""
        return min(request.window_start, request.at - self.min_window)

    def _ask(self, need: Need, policy: PromotionPolicy, request: EvidenceRequest) -> Ask:
        who = (request.namespace, request.inference_service)
        return Ask(need.revision, who, self._start(request), request.at)

    def _register(self, book: PeakBook, ask: Ask) -> None:
        book.asked(ask.revision, ask.who, ask.start, ask.at)

    def _answer(self, served: Served, answered: Answered) -> None:
        for need, request, refresh in answered:
            assert isinstance(need.ask, PeaksAsk)
            shown = _peaks_for(need.ask.peaks, need.revision, refresh.span) if refresh.query else ""
            outcome = QueryOutcome(shown, None, None, 0, refresh.duration)
            parsed: GroupedAnswer | QueryFailure | None = refresh.failures.get(need.revision)
            if parsed is None:
                book = self.book(need.ask.peaks)
                maxima, series = book.window(need.revision, self._start(request), request.at)
                fields = {
                    (VALUE_FIELD if name == PEAK_FIELD else name): value for name, value in maxima.items()
                }
                if fields:
                    fields[FIELD_SAMPLES] = float(series)
                parsed = GroupedAnswer({need.revision: fields})
            served.measurements[id(need)] = measurement_for(
                need, outcome, parsed, min_requests=self.min_requests
            )

    def _sample_and_record(
        self, query: PeakQuery, book: PeakBook, starts: Mapping[RevisionKey, datetime | None], at: datetime
    ) -> Refresh:
        revisions = sorted(starts)
        backfill = self._to_backfill(book, starts, at)
        refresh = Refresh(at, set(revisions), {}, "")
        live = [revision for revision in revisions if revision not in backfill]
        unbuilt = self._sample_live(query, book, live, at, refresh) if live else None
        if unbuilt is not None:  # a catalog bug must not take the controller down
            refresh.failures.update(dict.fromkeys(revisions, unbuilt))
            return refresh
        if backfill:
            self._backfill(query, book, backfill, at, refresh)
        return refresh

    def _sample_live(
        self, query: PeakQuery, book: PeakBook, live: Sequence[RevisionKey], at: datetime, refresh: Refresh
    ) -> QueryFailure | None:
        """Each revision's peaks since its last entry (one scrape interval for the first); why the
        query could not be built, if it could not (then every revision of the tick fails)."""
        ends = {revision: book.last_end(revision) for revision in live}
        known = [end for end in ends.values() if end is not None and end < at]
        span_start = min(known) if known else at - timedelta(seconds=self.step)
        span = f"{max(1, round((at - span_start).total_seconds() * 1000))}ms"
        try:
            render_peaks(query, live, span)
        except ValueError as error:
            return QueryFailure(ErrorClass.BAD_QUERY, f"cannot build the query: {error}")

        def ask(
            part: Sequence[RevisionKey],
        ) -> tuple[QueryOutcome, dict[RevisionKey, PeakSample] | QueryFailure]:
            outcome = self._instant(render_peaks(query, part, span), at)
            return outcome, parse_peaks(outcome, part)

        # A sample Prometheus refuses for one rollout's series holds that rollout only (split).
        split = self.splitter.ask(query, live, book.owner, ask)
        refresh.query, refresh.span = split.query, span
        refresh.http_requests, refresh.duration = split.http_requests, split.duration
        refresh.failures.update(split.failures)
        for revision, sample in split.answers.items():
            book.record(revision, ends.get(revision) or span_start, at, sample)
        return None

    def _backfill(
        self,
        query: PeakQuery,
        book: PeakBook,
        starts: Mapping[RevisionKey, datetime],
        at: datetime,
        refresh: Refresh,
    ) -> None:
        """One peak per scrape interval, on a grid ending at ``at``, back to the earliest start."""
        start = min(starts.values())
        intervals = max(1, round((at - start).total_seconds() / self.step))
        first_point = at - timedelta(seconds=(intervals - 1) * self.step)
        revisions = sorted(starts)
        span = f"{round(self.step * 1000)}ms"
        estimate = dict.fromkeys(revisions, _PEAK_SERIES_ESTIMATE)
        chunks = plan_backfill(estimate, first_point, at, self.step, sample_budget=self.sample_budget)
        if not refresh.query and chunks:  # the live query's, else the first range query's
            refresh.query, refresh.span = render_peaks(query, chunks[0].revisions, span), span
        history: dict[RevisionKey, list[tuple[datetime, datetime, PeakSample]]] = {r: [] for r in revisions}
        render = functools.partial(render_peaks, query, span=span)
        for chunk, matrix in self._ranges(chunks, render, parse_peak_matrix, refresh):
            if isinstance(matrix, QueryFailure):
                failed = QueryFailure(
                    matrix.error_class, f"backfill of the peaks: {matrix.detail}", matrix.http_status
                )
                refresh.failures.update(dict.fromkeys(revisions, failed))
                return
            for moment, key in self._grid(chunk):
                per = matrix.get(key, {})
                for revision in chunk.revisions:
                    sample = per.get(revision, PeakSample({}))
                    history[revision].append((moment - timedelta(seconds=self.step), moment, sample))
        for revision in revisions:
            book.replay(revision, history[revision], start)


# The query a measurement shows is the grouped query narrowed to its own revision (the grouped one
# lists every revision of the tick): what was asked for it, readable, and bounded.
@functools.lru_cache(maxsize=8192)
def _peaks_for(query: PeakQuery, revision: RevisionKey, span: str) -> str:
    return render_peaks(query, [revision], span or "1ms")
