"""The counter book: per-tick samples of raw cumulative counters in, exact integer tallies out.

Pure, no I/O. :class:`CounterBook` applies :mod:`.rules` to each revision's samples (a
:class:`~canary.metrics.counting.rules.Counter` per revision), keeps a snapshot of the clean totals
per sample in a :class:`SnapshotStore`, answers the ranges rollouts ask for (rule 8), and compacts
the snapshots of past steps (rule 9).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Protocol

from canary.evidence import CountSeries, EvidenceStatus, Tally
from canary.metrics.catalog import RevisionKey
from canary.metrics.counting.pipeline import RevisionBook, Track
from canary.metrics.counting.rules import (
    Counter,
    Key,
    RevisionSample,
    presence,
    split_oom,
    standing_for,
    start_index,
)
from canary.metrics.counting.store import NOTHING_BETWEEN, ColumnStore, Snapshot

__all__ = ["CounterBook", "SnapshotStore"]

_MICROSECOND = timedelta(microseconds=1)
_NO_SERIES = "no request series"
_NO_PODS: frozenset[str] = frozenset()


class SnapshotStore(Protocol):
    """A revision's snapshots, oldest first: the clean totals at each sample, and what the sample
    had (request series, pods, OOM kills so far, a non-finite value). Times are integer
    microseconds since the first snapshot; what is rare is kept by time."""

    @property
    def times(self) -> Sequence[int]: ...
    @property
    def series(self) -> Sequence[int]: ...  # request series present in each sample
    @property
    def oom(self) -> Sequence[int]: ...  # OOM kills counted up to each
    @property
    def pods(self) -> Sequence[frozenset[str]]: ...
    @property
    def invalid(self) -> Mapping[int, str]: ...  # the non-finite value a sample had, by time
    # What the snapshots compacted just before a kept one saw (their pods, whether any had request
    # series), by the kept one's time.
    @property
    def between(self) -> Mapping[int, tuple[frozenset[str], bool]]: ...

    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> Snapshot: ...
    def micros(self, moment: datetime) -> int: ...
    def at(self, index: int) -> datetime: ...
    def bisect_right(self, moment: datetime) -> int: ...

    def append(
        self,
        at: datetime,
        keys: tuple[Key, ...],
        totals: list[int],
        series: int,
        invalid: str,
        pods: frozenset[str],
        oom: int,
    ) -> None: ...

    def keep(self, indices: Sequence[int], between: Mapping[int, tuple[frozenset[str], bool]]) -> None: ...
    def drop_before(self, count: int) -> None: ...
    def tally(self, first: int, last: int, *, since: datetime | None = None) -> Tally: ...
    def tallies(self, first: int, last: int) -> CountSeries: ...


@dataclass(slots=True)
class _CounterTrack(Track):
    """Everything the book keeps about one revision."""

    counter: Counter = field(default_factory=Counter)
    snapshots: SnapshotStore = field(default_factory=ColumnStore)
    born_at: datetime | None = None  # counted from birth: its first sample's time
    newest: datetime | None = None  # how far its counts reach (its newest sample as Prometheus holds it)
    # Compaction (CounterBook.prune): the evaluation times asked and not yet settled, each asker's
    # range starts and evaluation interval, and the time up to which snapshots are compacted.
    ends: list[datetime] = field(default_factory=list)
    anchors: dict[Hashable, tuple[datetime, ...]] = field(default_factory=dict)
    grains: dict[Hashable, float] = field(default_factory=dict)
    settled: datetime | None = None


class CounterBook(RevisionBook[_CounterTrack]):
    """Clean cumulative counter totals per revision, one snapshot per sample (see :mod:`.rules`).

    :param tolerance: how far a snapshot may be from a wanted moment and still stand for it.
    :param idle: a revision nobody asked about for this long (in sample time) is forgotten, and so is
        a series absent for this long.
    :param max_snapshots: a hard cap per revision, whatever the ranges asked for.
    :param per_tick: keep every tick of the current step and the tally between consecutive
        snapshots (:meth:`count_series`: the judge reads a step's requests tick by tick). False for a
        book only read over whole ranges (:meth:`tally`, :meth:`oom_kills`, :meth:`pods_seen`,
        :meth:`new_oom_kills`: the restart counters): it keeps the snapshots standing for the range
        starts asked for, those since each asker's latest evaluation and the last two, and no tally.
    """

    def __init__(
        self,
        *,
        tolerance: timedelta,
        idle: timedelta = timedelta(minutes=15),
        max_snapshots: int = 20_000,
        per_tick: bool = True,
    ) -> None:
        if max_snapshots < 2:
            raise ValueError("max_snapshots must be at least 2")
        super().__init__(tolerance=tolerance, idle=idle)
        self.max_snapshots = max_snapshots
        self.per_tick = per_tick

    def _new_track(self) -> _CounterTrack:
        return _CounterTrack()

    def _oldest(self, track: _CounterTrack) -> datetime | None:
        return track.snapshots.at(0) if len(track.snapshots) else None

    def snapshots(self, revision: RevisionKey) -> tuple[Snapshot, ...]:
        track = self._tracks.get(revision)
        if track is None:
            return ()
        return tuple(track.snapshots[index] for index in range(len(track.snapshots)))

    def asked(
        self,
        revision: RevisionKey,
        asker: Hashable,
        start: datetime,
        at: datetime,
        *,
        starts: Iterable[datetime] = (),
        interval: float | None = None,
        born: bool = False,
    ) -> None:
        """``asker`` (a rollout) wants ``revision``'s counts from ``start``, asked at ``at``
        (an evaluation); ``starts``: the other range starts it reads (its step's start);
        ``interval``: its evaluation interval in seconds (the grain the past is kept at).

        ``born``: every count the revision's series hold is its own (a canary's pods were all
        created for its rollout): a revision not sampled yet counts its first sample whole, and a
        range that starts before that sample counts from zero (:meth:`tally`, :meth:`oom_kills`).
        """
        super().asked(revision, asker, start, at)
        track = self._tracks[revision]
        if born and not len(track.snapshots):
            track.counter.from_birth = True
        track.anchors[asker] = (start, *starts)
        if not track.ends or at > track.ends[-1]:
            track.ends.append(at)
        if interval is not None and interval > 0:
            track.grains[asker] = interval

    # -- recording ------------------------------------------------------------------------------

    def record(self, revision: RevisionKey, at: datetime, sample: RevisionSample) -> bool:
        """Add the sample taken at ``at``; False (ignored) when it is not newer than the last one."""
        track = self._track(revision)
        store, counter = track.snapshots, track.counter
        previous = store.at(-1) if len(store) else None
        if previous is not None and at <= previous:
            return False
        if previous is None and counter.from_birth:
            track.born_at = at
        values, oom = split_oom(sample.values)
        counter.count(values, oom, previous)
        series, pods = presence(values)
        store.append(at, counter.keys, counter.totals, series, sample.invalid, pods, counter.oom_kills)
        # How far its counts reach: its newest sample; without series, where the sample stands
        # (Prometheus holds nothing newer for it up to there).
        track.newest = datetime.fromtimestamp(sample.newest, UTC) if sample.newest is not None else at
        if len(store) > self.max_snapshots:
            store.drop_before(len(store) - self.max_snapshots)
        return True

    def replay(self, revision: RevisionKey, samples: Iterable[tuple[datetime, RevisionSample]]) -> None:
        """Fill ``revision`` from samples of the past (a backfill): its earlier history is replaced."""
        old = self._tracks.get(revision)
        track = self._tracks[revision] = _CounterTrack()
        if old is not None:  # who asked, and how (compaction), stays
            track.asks, track.anchors, track.grains = dict(old.asks), dict(old.anchors), dict(old.grains)
            track.ends = list(old.ends)
            track.counter.from_birth = old.counter.from_birth
        for at, sample in sorted(samples, key=lambda item: item[0]):
            self.record(revision, at, sample)

    # -- reading --------------------------------------------------------------------------------

    def _span(
        self, revision: RevisionKey, start: datetime, end: datetime
    ) -> tuple[_CounterTrack, int, int] | None:
        """The revision's track and the indices of its snapshots standing for ``start`` and ``end``
        (rule 8); None without a snapshot."""
        track = self._tracks.get(revision)
        if track is None or not len(track.snapshots):
            return None
        store = track.snapshots
        span = standing_for(
            store.times, store.micros(start), store.micros(end), self.tolerance // _MICROSECOND
        )
        return None if span is None else (track, *span)

    def count_series(
        self, revision: RevisionKey, start: datetime, end: datetime, *, query: str = ""
    ) -> CountSeries:
        """The tallies between consecutive snapshots from the one standing for ``start`` to ``end``."""
        span = self._span(revision, start, end)
        if span is None:
            return CountSeries(EvidenceStatus.NO_DATA, detail=_NO_SERIES, query=query)
        track, first, last = span
        store = track.snapshots
        invalid = store.invalid.get(store.times[last]) if store.invalid else None
        if invalid:
            return CountSeries(EvidenceStatus.INVALID_VALUE, detail=invalid, query=query)
        if not _any_series(store, first, last):
            return CountSeries(EvidenceStatus.NO_DATA, detail=_NO_SERIES, query=query)
        return replace(store.tallies(first, last), query=query, newest=track.newest)

    def tally(
        self, revision: RevisionKey, start: datetime, end: datetime, *, from_birth: bool = False
    ) -> tuple[Tally | None, Snapshot | None]:
        """The whole tally over [start, end] (None when nothing is known), and its last snapshot.

        ``from_birth``: everything since the revision's birth up to ``end`` when it is counted from
        birth (``asked(born=True)`` before its first sample), whatever ``start`` and whatever
        snapshots were pruned since."""
        span = self._span(revision, start, end)
        if span is None:
            return None, None
        track, first, last = span
        store = track.snapshots
        final = store[last]
        if not _any_series(store, first, last):
            return None, final
        since = self._born(track, start) if from_birth else None
        return store.tally(first, last, since=since), final

    def oom_kills(
        self, revision: RevisionKey, start: datetime, end: datetime, *, from_birth: bool = False
    ) -> int:
        """Restarts counted in [start, end] while the container's last termination was an OOM kill
        (``from_birth``: as in :meth:`tally`)."""
        span = self._span(revision, start, end)
        if span is None:
            return 0
        track, first, last = span
        oom = track.snapshots.oom
        born = from_birth and self._born(track, start) is not None
        return oom[last] - (0 if born else oom[first])

    def new_oom_kills(self, revision: RevisionKey) -> int:
        """OOM kills counted in the latest sample of ``revision`` (since the one before it; for a
        revision counted from birth, its first sample's)."""
        track = self._tracks.get(revision)
        if track is None or not len(track.snapshots):
            return 0
        store = track.snapshots
        if len(store) == 1:
            return store.oom[0] if track.born_at == store.at(0) else 0
        return store.oom[-1] - store.oom[-2]

    @staticmethod
    def _born(track: _CounterTrack, start: datetime) -> datetime | None:
        """For a revision counted from birth, when its zero stands: at ``start`` (every snapshot's
        totals hold everything since its birth, whichever snapshots pruning left); None otherwise."""
        if track.born_at is None:
            return None
        return min(start, track.snapshots.at(0))

    def pods_seen(self, revision: RevisionKey, start: datetime, end: datetime) -> int:
        """How many pods had series in the snapshots standing for [start, end]."""
        span = self._span(revision, start, end)
        if span is None:
            return 0
        track, first, last = span
        store = track.snapshots
        # The first one's own pods: what was dropped before it lies before the range. Consecutive
        # snapshots share one set while a revision's pods stay: each set is added once.
        pods, between, times = store.pods, store.between, store.times
        previous = pods[first]
        seen = set(previous)
        for index in range(first + 1, last + 1):
            if pods[index] is not previous:
                previous = pods[index]
                seen.update(previous)
            if between:
                seen.update(between.get(times[index], NOTHING_BETWEEN)[0])
        return len(seen)

    # -- forgetting -----------------------------------------------------------------------------

    def _trim(self, track: _CounterTrack, oldest: datetime, now: datetime) -> None:
        store = track.snapshots
        # The last one at least a tolerance before the oldest start stays: it, or one after it,
        # stands for that start.
        keep_from = store.bisect_right(oldest - self.tolerance) - 1
        if keep_from > 0:
            store.drop_before(keep_from)
        track.anchors = {who: starts for who, starts in track.anchors.items() if who in track.asks}
        track.grains = {who: grain for who, grain in track.grains.items() if who in track.asks}
        self._compact(track)
        # Rule 5: a series absent for ``idle`` is forgotten (all of them when the latest sample is that old).
        counter = track.counter
        if len(store) and store.at(-1) < now - self.idle:
            counter.forget(list(counter.last))
        else:
            counter.forget([series for series, when in counter.absent.items() if when < now - self.idle])

    def _compact(self, track: _CounterTrack) -> None:
        """Rule 9: keep the past steps at the grain of evaluations, not of ticks.

        Snapshots before every asker's current step are settled: no later range can start inside
        them (a step starts after the evaluation that advanced it). Of those, the ones kept are the
        snapshot standing for each evaluation, the one standing for each range start (as
        :meth:`_span` picks it), and, where evaluations are further apart than one and a half
        evaluation intervals (a backfill after a restart, an outage), one per interval. Every range
        asked for reads the same totals as before, and the current step keeps its per-tick
        tallies; the past steps' consecutive tallies are per evaluation interval.
        """
        store = track.snapshots
        if len(store) < 3 or not track.asks:
            return
        horizon = self._horizon(track)
        if track.settled is not None and horizon <= track.settled:
            return  # no evaluation since the last compaction
        first = 1  # the oldest snapshot always stays (it stands for the oldest start)
        if track.settled is not None:
            # Per tick, what was compacted stays as it is; without per-tick tallies the last settled
            # one is looked at again (it stayed only as the boundary), or every tick would stay.
            again = 0 if self.per_tick else 1
            first = max(first, store.bisect_right(track.settled) - again)
        # The last settled one always stays (the next tally starts from it), and so does everything
        # after the horizon (a step that starts there may read from any of them), and the last two
        # whatever the horizon: new_oom_kills reads the latest sample against the one before it (a
        # step starting at the latest sample made a dropped one-before repeat an alarm).
        last = min(store.bisect_right(horizon) - 1, len(store) - 2)
        if last < first:
            return
        kept, joined = self._kept(track, first, last)
        settled = store.at(last)
        store.keep(kept, joined)
        track.settled = settled
        track.ends = [end for end in track.ends if end > settled]

    def _horizon(self, track: _CounterTrack) -> datetime:
        """Up to when the snapshots are settled."""
        if self.per_tick:
            # What lies before every asker's current step (the latest of its range starts). The
            # current step stays at the resolution it was sampled at, as its own evidence is judged.
            return min(
                min(max(track.anchors.get(who, ()), default=start), at)
                for who, (start, at) in track.asks.items()
            )
        # Nothing is read tick by tick: what lies before every asker's latest evaluation is settled
        # (a step's start is seen after the evaluation that moved the traffic, and becomes a range
        # start only at the next one), except the last two (new_oom_kills).
        return min(*(at for _, at in track.asks.values()), track.snapshots.at(-2))

    def _standing(self, track: _CounterTrack, first: int, last: int) -> set[int]:
        """The snapshots between ``first`` and ``last`` standing for an evaluation or a range start,
        as :meth:`_span` picks them, and ``last``."""
        store, tolerance = track.snapshots, self.tolerance
        keep: set[int] = {last}
        for end in track.ends:
            for moment in (end, end + tolerance):
                index = store.bisect_right(moment) - 1
                if first <= index <= last:
                    keep.add(index)
        within = tolerance // _MICROSECOND
        for starts in track.anchors.values():
            for start in starts:
                index = start_index(store.times, store.micros(start), within, len(store) - 1)
                if first <= index <= last:
                    keep.add(index)
        return keep

    def _kept(
        self, track: _CounterTrack, first: int, last: int
    ) -> tuple[list[int], dict[int, tuple[frozenset[str], bool]]]:
        """The indices compaction keeps, and what the ones dropped before each kept one saw."""
        store = track.snapshots
        keep = self._standing(track, first, last)
        # The past at the grain of evaluations is for count_series, which a book without per-tick
        # tallies never answers.
        grain = (min(track.grains.values(), default=0.0) if self.per_tick else 0.0) * 1_000_000
        within = self.tolerance // _MICROSECOND
        times = store.times
        kept: list[int] = list(range(first))
        joined: dict[int, tuple[frozenset[str], bool]] = {}
        dropped: list[int] = []  # since the last one kept
        for index in range(first, last + 1):
            if index not in keep and grain:
                # Far from the next evaluation (a backfilled past, an outage): one per interval.
                following = min((i for i in keep if i > index), default=last)
                wide = times[following] - times[kept[-1]] > grain * 1.5
                if wide and times[index] - times[kept[-1]] >= grain - within:
                    keep.add(index)
            if index not in keep:
                dropped.append(index)
                continue
            if dropped:
                joined[index] = _folded(store, dropped, index)
                dropped = []
            kept.append(index)
        kept.extend(range(last + 1, len(store)))
        return kept, joined


def _folded(store: SnapshotStore, dropped: Sequence[int], index: int) -> tuple[frozenset[str], bool]:
    """What the snapshot at ``index`` and the ones ``dropped`` just before it saw: their pods, and
    whether any had request series."""
    pods, between, times = store.pods, store.between, store.times
    own_pods, own_series = between.get(times[index], NOTHING_BETWEEN)
    seen = [(pods[gone], *between.get(times[gone], NOTHING_BETWEEN)) for gone in dropped]
    pods_between = own_pods.union(*(own | saw for own, saw, _ in seen))
    series_between = (
        own_series or any(store.series[gone] for gone in dropped) or any(had for _, _, had in seen)
    )
    if pods_between == pods[index]:
        pods_between = pods[index]  # one set while the pods stay, as the store shares it
    return (pods_between or _NO_PODS, series_between)


def _any_series(store: SnapshotStore, first: int, last: int) -> bool:
    """Whether any sample in the range from ``first`` to ``last`` had request series (the first
    one's own only: what was dropped before it lies before the range)."""
    series, between, times = store.series, store.between, store.times
    return bool(series[first]) or any(
        series[index] or between.get(times[index], NOTHING_BETWEEN)[1] for index in range(first + 1, last + 1)
    )
