"""Evidence counting, the rules: Prometheus counter samples in, per-interval tallies out.

Once per tick :class:`~canary.metrics.prometheus.PrometheusEvidenceSource` samples the raw cumulative
counters of every tracked revision (one instant query, no ``rate``/``increase``): a sample maps each
series of a revision (pod x response class, and for a latency histogram x ``le``) to its value. The
rules below turn a revision's samples, one after the other, into **clean totals**: per key (a
response class, or a latency measure's bucket bound), what the revision served since its first
sample. A **snapshot** is those totals at one sample.

1. **Baseline.** At the revision's first sample every total is zero, whatever the series hold. A
   revision counted from birth (a canary's restart counters: its pods were all created for it)
   counts its first sample whole instead.
2. **Increase.** A series seen in the previous sample adds ``value - previous``.
3. **Restarts.** A series that went down means its pod's process restarted: every series of that
   pod and kind (the request counters, or one histogram's buckets) counts from zero, that is its
   whole value. One whose value looks unchanged counts nothing and is taken as stale (Prometheus'
   lookback still shows the value from before) until it changes; then it counts its whole value.
   One absent at the restart counts its whole value when it comes back.
4. **New series.** A series first seen after the first sample (a new pod, the first 5xx) counts
   its whole value.
5. **Forgetting.** A series absent for the book's ``idle`` time is forgotten: back later, it is new
   (rule 4).
6. **OOM kills.** OOM markers are not counters: they name the containers whose last termination was
   an OOM kill, and the restarts such a container counts are OOM kills too.
7. **Tallies.** The tally between two snapshots is the difference of their totals, key by key (a
   key that appeared after the first is zero in it): requests are every response class, errors the
   5xx, client errors the 4xx, and each latency measure a histogram (its finite bounds ascending, the
   requests at most each, the total in ``+Inf``). Integers, never extrapolated, and consecutive
   tallies add up to the tally of the whole range.
8. **Standing for a moment.** A range ``[start, end]`` is read between two snapshots: for ``end``
   the last one at most a tolerance after it; for ``start``, among those up to that one, the nearest
   within a tolerance (the earlier of two as near), else the last one before it, else the first.
9. **Compaction.** Snapshots no later range can start inside (before every asker's current step)
   may be dropped, except those standing for an evaluation or a range start, and one per evaluation
   interval where evaluations are further apart. What a dropped snapshot saw (its pods, whether it
   had request series) is folded into the next one kept. Every range asked reads the same tallies'
   totals as before.

What sampling cannot see: the requests a pod served between the last sample and its restart are lost
when samples are further apart than the scrape interval (a backfill, and a live tick every scrape
interval, see them all).

This module states rules 1 to 8 on plain values (dicts and tuples); :mod:`.book` applies them, keeps
the snapshots in a :class:`~canary.metrics.counting.store.ColumnStore` and compacts them (rule 9).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple, TypeVar, cast

from canary.evidence import Histogram, Tally
from canary.metrics.tick_queries import BUCKET_FIELD, COUNTER_FIELD, OOM_FIELD

__all__ = [
    "LATENCY",
    "Counter",
    "Key",
    "RevisionSample",
    "SeriesId",
    "bucket_measure",
    "clean_totals",
    "key_of",
    "split_oom",
    "standing_for",
    "start_index",
    "tally",
]

LATENCY = "latency"  # the measure under which the request latency histogram travels in a Tally
SERVER = "5xx"
CLIENT = "4xx"


class SeriesId(NamedTuple):
    """One counter series of a revision, as the counter query aggregates it."""

    kind: str  # COUNTER_FIELD, OOM_FIELD, BUCKET_FIELD or "bucket:<measure>"
    pod: str
    code_class: str  # "2xx", "5xx", ... or "" when unknown (the container, for restart counters)
    le: float = math.inf  # buckets only: the upper bound in seconds (+Inf for the total)


@dataclass(frozen=True, slots=True)
class RevisionSample:
    """A revision's raw counter values at one moment; ``invalid`` names a non-finite value seen."""

    values: Mapping[SeriesId, float]
    invalid: str = ""
    newest: float | None = None  # when its newest counter sample was taken (Unix seconds), if known


# What a total counts: ("", response class) for the request counters, (measure, le) for a bucket.
Key = tuple[str, str | float]
_T = TypeVar("_T")


def is_bucket(kind: object) -> bool:
    return isinstance(kind, str) and (kind == BUCKET_FIELD or kind.startswith(BUCKET_FIELD + ":"))


def bucket_measure(kind: str) -> str:
    """The latency measure a bucket series belongs to: ``bucket`` is the request latency,
    ``bucket:ttft`` / ``bucket:e2e-latency`` vLLM's histograms."""
    return kind.partition(":")[2] or LATENCY


def key_of(series: SeriesId) -> Key:
    """The total a series adds to."""
    if series.kind == COUNTER_FIELD:
        return ("", series.code_class)
    return (bucket_measure(series.kind), series.le)


def split_oom(values: Mapping[SeriesId, float]) -> tuple[Mapping[SeriesId, float], set[tuple[str, str]]]:
    """The counters of a sample, and the (pod, container) its OOM markers name (rule 6)."""
    if OOM_FIELD not in {series.kind for series in values}:  # only the restart counters have them
        return values, set()
    oom = {(series.pod, series.code_class) for series in values if series.kind == OOM_FIELD}
    return {series: value for series, value in values.items() if series.kind != OOM_FIELD}, oom


@dataclass(slots=True)
class Counter:
    """One revision's counting (rules 1 to 6): its clean totals, and what the rules remember of its
    series between samples. Feed it the revision's samples in order (:meth:`count`)."""

    from_birth: bool = False  # rule 1: the first sample counts whole
    keys: tuple[Key, ...] = ()  # in the order they appeared (those new in one sample sorted)
    totals: list[int] = field(default_factory=list)  # per key
    slots: dict[SeriesId, int] = field(default_factory=dict)  # each series' index in ``totals``
    oom_kills: int = 0  # rule 6
    last: dict[SeriesId, float] = field(default_factory=dict)  # each series' last raw value
    # The series of ``last`` missing from the latest sample, and when each was last present.
    absent: dict[SeriesId, datetime] = field(default_factory=dict)
    stale: dict[SeriesId, float] = field(default_factory=dict)  # restarted pods' series, unchanged since
    gone: set[SeriesId] = field(default_factory=set)  # restarted pods' series absent since

    def count(
        self, values: Mapping[SeriesId, float], oom: Collection[tuple[str, str]], previous: datetime | None
    ) -> None:
        """Count one sample (its counters and OOM markers, :func:`split_oom`); ``previous``: when the
        sample before it was taken, None for the revision's first."""
        if previous is None and not self.from_birth:
            self.last = dict(values)
            self._learn(values)  # rule 1: the baseline
            return
        if self.stale or self.gone or oom or not self._count_increases(values):
            self._count_restarts(values, oom)
        if previous is not None:
            self._note_absent(values, previous)

    def by_key(self) -> dict[Key, int]:
        """The clean totals, per key."""
        return dict(zip(self.keys, self.totals, strict=True))

    def forget(self, series: Iterable[SeriesId]) -> None:
        """Rule 5: these series are forgotten (their totals stay)."""
        for one in series:
            self.absent.pop(one, None)
            self.last.pop(one, None)
            self.stale.pop(one, None)
            self.gone.discard(one)

    def _count_increases(self, values: Mapping[SeriesId, float]) -> bool:
        """Rules 2 and 4 alone, which are all the rules while no pod restarts (every tick, for every
        revision): False, and nothing counted, when a series went down."""
        previous_of, slots = self.last.get, self.slots
        known: list[tuple[int, int]] = []  # (total's index, increment)
        new: list[tuple[SeriesId, int]] = []
        for series, value in values.items():
            previous = previous_of(series)
            if previous is None:
                new.append((series, round(value)))  # rule 4
            elif value < previous:
                return False
            else:
                known.append((slots[series], round(value - previous)))
        totals = self.totals
        for index, increment in known:
            totals[index] += increment
        if new:
            self._learn([series for series, _ in new])
            for series, increment in new:
                totals[slots[series]] += increment
        self.last.update(values)
        return True

    def _count_restarts(self, values: Mapping[SeriesId, float], oom: Collection[tuple[str, str]]) -> None:
        """Every rule, restarts (rule 3) and OOM kills (rule 6) included."""
        self._learn(values)
        last = self.last
        restarted = {
            (series.kind, series.pod)
            for series, value in values.items()
            if series in last
            and series not in self.stale
            and series not in self.gone
            and value < last[series]
        }
        for series, value in values.items():
            increment = self._increment(series, value, restarted)
            last[series] = value
            self.totals[self.slots[series]] += increment
            if series.kind == COUNTER_FIELD and (series.pod, series.code_class) in oom:
                self.oom_kills += increment
        for series in last:  # a restarted pod's series absent now counts whole when it comes back
            if series not in values and (series.kind, series.pod) in restarted:
                self.gone.add(series)
                self.stale.pop(series, None)

    def _increment(self, series: SeriesId, value: float, restarted: Collection[tuple[str, str]]) -> int:
        previous = self.last.get(series)
        if series in self.gone:
            self.gone.discard(series)
            return round(value)  # back after its pod's restart: all of it is new
        if series in self.stale:
            if value == self.stale[series]:
                return 0  # still the value from before the restart
            del self.stale[series]
            return round(value)  # counted from zero since the restart
        if previous is None:
            return round(value)  # rule 4
        if (series.kind, series.pod) in restarted:
            if value == previous:
                self.stale[series] = value
                return 0
            return round(value)
        return round(value - previous)

    def _learn(self, seen: Iterable[SeriesId]) -> None:
        """Give each series not known yet its total; keys new in this sample come after the others,
        sorted (one order, whatever order the answer listed them in)."""
        fresh = [series for series in seen if series not in self.slots]
        if not fresh:
            return
        position = {key: index for index, key in enumerate(self.keys)}
        added = sorted({key for key in map(key_of, fresh) if key not in position})
        if added:
            position.update((key, index) for index, key in enumerate(added, start=len(self.keys)))
            self.keys = _shared(self.keys + tuple(_shared(key) for key in added))
            self.totals.extend([0] * len(added))
        for series in fresh:
            self.slots[series] = position[key_of(series)]

    def _note_absent(self, values: Mapping[SeriesId, float], previous: datetime) -> None:
        """What was present in the sample before (taken at ``previous``) and is missing now was last
        present then."""
        if self.absent:
            for series in [series for series in self.absent if series in values]:
                del self.absent[series]
        if len(self.last) != len(values):  # ``last`` holds ``values`` and the ones missing
            for series in self.last:
                if series not in values and series not in self.absent:
                    self.absent[series] = previous


# One object for each key and each order of keys, which every revision's counter shares: the
# revisions of a thousand rollouts count the same few keys (at most this many: cleared when full).
_SHARED_MAX = 10_000
_SHARED: dict[object, object] = {}


def _shared(value: _T) -> _T:
    if len(_SHARED) >= _SHARED_MAX:
        _SHARED.clear()
    return cast(_T, _SHARED.setdefault(value, value))


def presence(values: Mapping[SeriesId, float]) -> tuple[int, frozenset[str]]:
    """What a snapshot records of its sample's series: how many (request counters, or all of them
    when it has none: buckets alone, restart counters) and their pods."""
    counters = sum(1 for series in values if series.kind == COUNTER_FIELD)
    return counters or len(values), frozenset(series.pod for series in values)


def clean_totals(
    samples: Iterable[tuple[datetime, Mapping[SeriesId, float]]], *, from_birth: bool = False
) -> list[tuple[datetime, dict[Key, int], int]]:
    """Rules 1 to 6 over one revision's samples: per sample, its time, its clean totals per key and
    the OOM kills counted so far."""
    counter = Counter(from_birth=from_birth)
    snapshots: list[tuple[datetime, dict[Key, int], int]] = []
    previous: datetime | None = None
    for at, values in samples:
        counter.count(*split_oom(values), previous)
        snapshots.append((at, counter.by_key(), counter.oom_kills))
        previous = at
    return snapshots


def tally(start: datetime, base: Mapping[Key, int], end: datetime, totals: Mapping[Key, int]) -> Tally:
    """Rule 7: the tally from the totals ``base`` at ``start`` to ``totals`` at ``end``."""
    change = {key: total - base.get(key, 0) for key, total in totals.items()}
    buckets: dict[str, dict[float, int]] = {}
    for (measure, bound), count in change.items():
        if measure:
            buckets.setdefault(measure, {})[float(bound)] = count
    return Tally(
        start,
        end,
        sum(count for (measure, _), count in change.items() if not measure),
        change.get(("", SERVER), 0),
        change.get(("", CLIENT), 0),
        {measure: histogram(at_most) for measure, at_most in buckets.items()},
    )


def histogram(at_most: Mapping[float, int]) -> Histogram:
    """A measure's histogram from its requests at most each bound: the ``+Inf`` bucket is the total
    (without it, the largest count)."""
    finite = sorted((bound, count) for bound, count in at_most.items() if bound != math.inf)
    counts = tuple(count for _, count in finite)
    total = at_most.get(math.inf)
    return Histogram(
        tuple(bound for bound, _ in finite), counts, max(counts, default=0) if total is None else total
    )


def start_index(times: Sequence[int], start: int, within: int, last: int) -> int:
    """Rule 8: the snapshot standing for a range's ``start`` among ``times[: last + 1]`` (ascending;
    any unit, ``within`` the tolerance in it)."""
    after = bisect.bisect_left(times, start)  # the first one not before start
    best: int | None = None
    for candidate in (after - 1, after):
        if 0 <= candidate <= last:
            distance = abs(times[candidate] - start)
            if distance <= within and (best is None or distance < abs(times[best] - start)):
                best = candidate
    if best is not None:
        return best
    return max(min(after - 1, last), 0)


def standing_for(times: Sequence[int], start: int, end: int, within: int) -> tuple[int, int] | None:
    """Rule 8: the indices of the snapshots standing for ``start`` and ``end``; None without one."""
    last = bisect.bisect_right(times, end + within) - 1
    if last < 0:
        return None
    return start_index(times, start, within, last), last
