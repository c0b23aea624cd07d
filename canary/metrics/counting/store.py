"""The columnar snapshot store: a revision's snapshots (:mod:`.rules`) held as a few arrays.

A step keeps a snapshot per revision per tick for the judge (120 in a 10-minute step at a 5 s tick,
for both revisions of each rollout), so a snapshot is not an object here: a tick costs its time, its
totals in one array shared by all the revision's ticks (in the narrowest unsigned type that holds
them, widened when a total outgrows it) and a few words. A :class:`Snapshot` is built when one is
read, and the tallies between consecutive ones when they are read (:class:`_Tallies`).

Which total sits at which index is a :class:`_Layout`: immutable, and shared by every revision whose
keys appeared in the same order (the revisions of a thousand rollouts export the same response
classes and buckets). A revision's rows grow as keys appear: a key that came later is 0 in an
earlier row. The property test in ``tests/metrics/test_counting_rules.py`` checks what this store
answers against :mod:`.rules` on plain dicts.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import threading
import weakref
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple, overload

from canary.evidence import CountSeries, EvidenceStatus, Histogram, Tally
from canary.metrics.counting import rules
from canary.metrics.counting.rules import CLIENT, SERVER, Key

__all__ = ["ColumnStore", "Snapshot"]

_MICROSECOND = timedelta(microseconds=1)
_WIDTHS = (("H", 1 << 16), ("I", 1 << 32))  # unsigned array types by the totals they hold
_WIDTH_ORDER = {"H": 0, "I": 1, "q": 2}
NOTHING_BETWEEN: tuple[frozenset[str], bool] = (frozenset(), False)

_Picker = Callable[[Sequence[int]], tuple[int, ...]]
# A measure's histogram as a row is read: (measure, finite bounds, what picks their totals, +Inf's index)
_HistogramSlots = tuple[str, tuple[float, ...], _Picker, int | None]


class _Reading(NamedTuple):
    """How a tally reads rows of a given length (memoised per layout)."""

    classes: _Picker | None  # the response classes' totals
    server: int | None  # 5xx
    client: int | None  # 4xx
    histograms: tuple[_HistogramSlots, ...]
    buckets: tuple[tuple[str, tuple[int, ...], int | None], ...]  # which totals the histograms read


class _Layout:
    """Which total sits at which index of a revision's rows (the keys of :class:`.rules.Counter`, in
    its order), and how a tally reads rows over its first keys (memoised: every tally of every
    revision holding this layout asks the same)."""

    __slots__ = ("__weakref__", "classes", "index", "keys", "measures", "readings")

    def __init__(self, keys: tuple[Key, ...] = ()) -> None:
        self.keys = keys
        self.index: dict[Key, int] = {key: position for position, key in enumerate(keys)}
        self.classes: list[tuple[str, int]] = []  # (class, index)
        self.measures: dict[str, list[tuple[float, int]]] = {}  # measure: [(le, index)], le ascending
        for position, (measure, bound) in enumerate(keys):
            if measure:
                self.measures.setdefault(measure, []).append((float(bound), position))
            else:
                self.classes.append((str(bound), position))
        for slots in self.measures.values():
            slots.sort()
        self.readings: dict[int, _Reading] = {}

    def reading(self, known: int) -> _Reading:
        """How a tally reads rows over the first ``known`` keys."""
        found = self.readings.get(known)
        if found is None:
            classes = tuple(index for _, index in self.classes if index < known)
            server, client = self.index.get(("", SERVER)), self.index.get(("", CLIENT))
            histograms, buckets = [], []
            for measure, slots in self.measures.items():
                present = [(le, index) for le, index in slots if index < known]
                if not present:
                    continue  # its first bucket came later
                finite = tuple((le, index) for le, index in present if le != math.inf)
                infinite = next((index for le, index in present if le == math.inf), None)
                indices = tuple(index for _, index in finite)
                histograms.append((measure, tuple(le for le, _ in finite), _picker(indices), infinite))
                buckets.append((measure, indices, infinite))
            found = self.readings[known] = _Reading(
                _picker(classes) if classes else None,
                server if server is not None and server < known else None,
                client if client is not None and client < known else None,
                tuple(histograms),
                tuple(buckets),
            )
        return found


# The layouts in use, by their keys; one is forgotten when no revision holds it any more.
_LAYOUTS: weakref.WeakValueDictionary[tuple[Key, ...], _Layout] = weakref.WeakValueDictionary()
_LAYOUTS_LOCK = threading.Lock()
_NO_KEYS = _Layout()  # where every revision starts (held here: never forgotten)


def _layout_of(keys: tuple[Key, ...]) -> _Layout:
    with _LAYOUTS_LOCK:
        found = _LAYOUTS.get(keys)
        if found is None:
            found = _LAYOUTS[keys] = _Layout(keys)
    return found


def _picker(indices: tuple[int, ...]) -> _Picker:
    """``sequence -> tuple(sequence[i] for i in indices)``, in C for two indices or more."""
    if len(indices) >= 2:
        return operator.itemgetter(*indices)
    return lambda sequence: tuple(sequence[index] for index in indices)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Clean cumulative totals of one revision at ``at``, counted since the revision's first sample."""

    at: datetime
    totals: array[int]  # per key of ``layout``, the keys known at ``at``
    layout: _Layout
    series: int  # request series present in the sample (0: the revision had none)
    invalid: str = ""  # a non-finite value in the sample (those series were left out)
    pods: frozenset[str] = frozenset()  # the pods whose series were present
    oom_kills: int = 0  # restart counters: the restarts counted while the last reason was OOMKilled
    # What the snapshots compacted just before this one saw: their pods, and whether any had
    # request series. A range from a kept snapshot to another sees them all.
    pods_between: frozenset[str] = frozenset()
    series_between: bool = False

    def total(self, index: int | None) -> int:
        return self.totals[index] if index is not None and index < len(self.totals) else 0

    @property
    def by_class(self) -> dict[str, int]:
        """Requests per response class ("" for unknown)."""
        known = len(self.totals)
        return {code_class: self.totals[index] for code_class, index in self.layout.classes if index < known}

    @property
    def buckets(self) -> dict[str, dict[float, int]]:
        """Per latency measure ("latency", "ttft", "e2e-latency"): requests at most ``le`` seconds
        (``+Inf``: all the histogram saw)."""
        known = len(self.totals)
        shown: dict[str, dict[float, int]] = {}
        for measure, slots in self.layout.measures.items():
            present = {le: self.totals[index] for le, index in slots if index < known}
            if present:
                shown[measure] = present
        return shown


class ColumnStore:
    """A revision's snapshots, oldest first, held as columns (a :class:`.book.SnapshotStore`).

    Times are integer microseconds since the revision's first sample (``epoch``): exact, and
    compared without building a ``datetime``. Row ``i``'s totals are ``flat[bounds[i]:bounds[i + 1]]``.
    What is rare is kept by time: a non-finite value seen (``invalid``), and what compacted
    snapshots dropped before a kept one saw (``between``: their pods, and whether any had request
    series).
    """

    __slots__ = ("between", "bounds", "epoch", "flat", "invalid", "layout", "oom", "pods", "series", "times")

    def __init__(self) -> None:
        self.layout = _NO_KEYS
        self.epoch: datetime | None = None
        self.times = array("q")
        self.flat: array[int] = array("H")
        self.bounds = array("I", [0])
        self.series = array("I")
        self.oom = array("q")
        self.pods: list[frozenset[str]] = []
        self.invalid: dict[int, str] = {}
        self.between: dict[int, tuple[frozenset[str], bool]] = {}

    def __len__(self) -> int:
        return len(self.times)

    def micros(self, moment: datetime) -> int:
        """``moment`` on this store's time axis."""
        assert self.epoch is not None
        return (moment - self.epoch) // _MICROSECOND

    def at(self, index: int) -> datetime:
        assert self.epoch is not None
        return self.epoch + _MICROSECOND * self.times[index]

    def bisect_right(self, moment: datetime) -> int:
        """How many snapshots are at or before ``moment``."""
        return bisect.bisect_right(self.times, self.micros(moment)) if self.times else 0

    def __getitem__(self, index: int) -> Snapshot:
        if index < 0:
            index += len(self.times)
        if not 0 <= index < len(self.times):
            raise IndexError(index)
        time = self.times[index]
        pods_between, series_between = self.between.get(time, NOTHING_BETWEEN)
        return Snapshot(
            self.at(index),
            _row(self.flat, self.bounds, index),
            self.layout,
            self.series[index],
            self.invalid.get(time, ""),
            self.pods[index],
            self.oom[index],
            pods_between,
            series_between,
        )

    def append(
        self,
        at: datetime,
        keys: tuple[Key, ...],
        totals: list[int],
        series: int,
        invalid: str,
        pods: frozenset[str],
        oom: int,
    ) -> None:
        """A snapshot: the totals per key of ``keys`` (those of the snapshot before and maybe more)."""
        if self.epoch is None:
            self.epoch = at
        if len(keys) != len(self.layout.keys):
            self.layout = _layout_of(keys)
        if self.pods and self.pods[-1] == pods:
            pods = self.pods[-1]  # one set for a revision's snapshots while its pods stay
        time = self.micros(at)
        self._fit(totals)
        self.times.append(time)
        self.flat.extend(totals)
        self.bounds.append(len(self.flat))
        self.series.append(series)
        self.oom.append(oom)
        self.pods.append(pods)
        if invalid:
            self.invalid[time] = invalid

    def _fit(self, totals: list[int]) -> None:
        """Widen ``flat`` when ``totals`` do not fit its type (a total past 65,535, then 2**32)."""
        low, high = min(totals, default=0), max(totals, default=0)
        typecode = "q"
        if low >= 0:
            typecode = next((code for code, limit in _WIDTHS if high < limit), "q")
        if _WIDTH_ORDER[typecode] > _WIDTH_ORDER[self.flat.typecode]:
            self.flat = array(typecode, self.flat)

    def keep(self, indices: Sequence[int], between: Mapping[int, tuple[frozenset[str], bool]]) -> None:
        """Keep the snapshots at ``indices`` (ascending), with what the ones dropped before each saw
        (``between``, by index: replaces what that snapshot had)."""
        times, flat, bounds = self.times, self.flat, self.bounds
        kept_flat = array(flat.typecode)
        kept_bounds = array("I", [0])
        for index in indices:
            kept_flat.extend(flat[bounds[index] : bounds[index + 1]])
            kept_bounds.append(len(kept_flat))
        kept_times = array("q", (times[index] for index in indices))
        old_between = self.between
        self.between = {}
        for index in indices:
            time = times[index]
            seen = between.get(index, old_between.get(time))
            if seen is not None and (seen[0] or seen[1]):
                self.between[time] = seen
        present = set(kept_times)
        self.invalid = {time: text for time, text in self.invalid.items() if time in present}
        self.series = array("I", (self.series[index] for index in indices))
        self.oom = array("q", (self.oom[index] for index in indices))
        self.pods = [self.pods[index] for index in indices]
        self.times, self.flat, self.bounds = kept_times, kept_flat, kept_bounds

    def drop_before(self, count: int) -> None:
        """Forget the ``count`` oldest snapshots."""
        if count > 0:
            self.keep(range(count, len(self.times)), {})

    def tally(self, first: int, last: int, *, since: datetime | None = None) -> Tally:
        """The tally from snapshot ``first`` to ``last``; ``since``: from zero at that moment instead
        (a revision counted from birth)."""
        base = array("q") if since is not None else _row(self.flat, self.bounds, first)
        start = since if since is not None else self.at(first)
        return _tally(self.layout, start, base, self.at(last), _row(self.flat, self.bounds, last))

    def tallies(self, first: int, last: int) -> CountSeries:
        """The tallies between consecutive snapshots from ``first`` to ``last``, and what adds them
        up (``CountSeries.summed``).

        Each evaluation reads its step's tallies again, for both revisions: they are built when read
        (:class:`_Tallies`), and not kept. A range's total is the difference of its two end rows, not
        the sum of its tallies."""
        # The arrays as they are now: rows are only appended to them, and compaction or widening
        # builds new ones, so what is read later through them is what is read now.
        layout, flat, bounds, times, epoch = self.layout, self.flat, self.bounds, self.times, self.epoch
        assert epoch is not None
        found = _Tallies(layout, flat, bounds, times, epoch, first, last)

        def summed(start: datetime | None) -> Tally | None:
            # The tallies from the first one beginning at or after ``start`` to the last.
            position = first
            if start is not None:  # times are whole microseconds, as ``start - epoch`` is
                position = bisect.bisect_left(times, (start - epoch) // _MICROSECOND, lo=first, hi=last)
            if position >= last:
                return None
            lengths = {bounds[index + 1] - bounds[index] for index in range(position, last + 1)}
            if len(lengths) > 1 and not _same_buckets(layout, lengths):
                # A measure's buckets came one by one in between: its tallies have other edges
                # before the last came, and are added one by one (CountSeries.total merges them).
                return CountSeries.total(found[position - first :])
            start_at, end_at = epoch + _MICROSECOND * times[position], epoch + _MICROSECOND * times[last]
            return _tally(layout, start_at, _row(flat, bounds, position), end_at, _row(flat, bounds, last))

        return CountSeries(EvidenceStatus.OK, found, summed=summed)


def _tally(
    layout: _Layout, start: datetime, base: Sequence[int], end: datetime, totals: Sequence[int]
) -> Tally:
    """Rule 7 between two rows over ``layout`` (``base`` may know fewer keys: those came later)."""
    before = dict(zip(layout.keys, base, strict=False))
    return rules.tally(start, before, end, dict(zip(layout.keys, totals, strict=False)))


def _row(flat: array[int], bounds: array[int], index: int) -> array[int]:
    """Row ``index`` of a store's totals, read from the arrays given (not the store's current ones: a
    tally reads the arrays of when it was built)."""
    return flat[bounds[index] : bounds[index + 1]]


def _same_buckets(layout: _Layout, lengths: set[int]) -> bool:
    """Whether rows of these lengths read each latency measure from the same buckets, or not at
    all (it came later): a range's histograms are then the difference of its end rows, as adding
    its tallies up gives. A response class that came later is 0 before it, in both ways."""
    last = layout.reading(max(lengths)).buckets
    return all(all(bucket in last for bucket in layout.reading(known).buckets) for known in lengths)


class _Tallies(Sequence[Tally]):
    """The tallies between consecutive rows ``first`` to ``last`` of a store's arrays, built when
    read, and not kept (a tick holds the evidence of every rollout it decides until their
    judgements are done). Equal to a tuple of the same tallies."""

    __slots__ = ("_bounds", "_epoch", "_first", "_flat", "_last", "_layout", "_times")

    def __init__(
        self,
        layout: _Layout,
        flat: array[int],
        bounds: array[int],
        times: array[int],
        epoch: datetime,
        first: int,
        last: int,
    ) -> None:
        self._layout, self._flat, self._bounds, self._times = layout, flat, bounds, times
        self._epoch, self._first, self._last = epoch, first, last

    def __len__(self) -> int:
        return max(0, self._last - self._first)

    @overload
    def __getitem__(self, index: int) -> Tally: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Tally, ...]: ...

    def __getitem__(self, index: int | slice) -> Tally | tuple[Tally, ...]:
        length = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(length)
            if step != 1:
                return tuple(self)[index]
            return tuple(self._built(start, stop)) if start < stop else ()
        if index < 0:
            index += length
        if not 0 <= index < length:
            raise IndexError(index)
        return next(self._built(index, index + 1))

    def __iter__(self) -> Iterator[Tally]:
        return self._built(0, len(self)) if len(self) else iter(())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Tallies | tuple | list):
            return tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))

    def _built(self, start: int, stop: int) -> Iterator[Tally]:
        """The tallies ``start`` to ``stop`` (positions): each row's requests, 5xx and 4xx are read
        once (a row is the end of one tally and the start of the next); a key a row lacks is 0 in it."""
        layout, flat, bounds, times, epoch = self._layout, self._flat, self._bounds, self._times, self._epoch
        first = self._first + start
        base = _row(flat, bounds, first)
        reading = layout.reading(len(base))
        requests, errors, client = _counts(reading, base)
        previous = epoch + _MICROSECOND * times[first]
        for index in range(first + 1, self._first + stop + 1):
            totals = _row(flat, bounds, index)
            if len(base) < len(totals):  # keys that came after ``base`` were 0 in it
                reading = layout.reading(len(totals))
            now_requests, now_errors, now_client = _counts(reading, totals)
            moment = epoch + _MICROSECOND * times[index]
            yield Tally(
                previous,
                moment,
                now_requests - requests,
                now_errors - errors,
                now_client - client,
                _TickHistograms(flat, bounds, index, reading) if reading.histograms else {},
            )
            base, requests, errors, client, previous = totals, now_requests, now_errors, now_client, moment


def _counts(reading: _Reading, totals: Sequence[int]) -> tuple[int, int, int]:
    """A row's requests, 5xx and 4xx."""
    return (
        sum(reading.classes(totals)) if reading.classes is not None else 0,
        totals[reading.server] if reading.server is not None else 0,
        totals[reading.client] if reading.client is not None else 0,
    )


def _histogram(entry: _HistogramSlots, base: Sequence[int], totals: Sequence[int]) -> Histogram:
    """One measure's histogram from ``base`` to ``totals`` (``base`` as long as ``totals``)."""
    _, edges, pick, infinite = entry
    at_most = tuple(map(operator.sub, pick(totals), pick(base)))
    whole = totals[infinite] - base[infinite] if infinite is not None else max(at_most, default=0)
    return Histogram(edges, at_most, whole)


class _TickHistograms(Mapping[str, Histogram]):
    """A per-tick tally's histograms, read from its two rows (``index - 1`` and ``index`` of the
    store's arrays) when asked for. The rows are not kept; the last histogram read is (a latency
    check reads a canary's tick at each of its limits)."""

    __slots__ = ("_bounds", "_flat", "_index", "_last", "_reading")

    def __init__(self, flat: array[int], bounds: array[int], index: int, reading: _Reading) -> None:
        self._flat, self._bounds, self._index, self._reading = flat, bounds, index, reading
        self._last: tuple[str, Histogram] | None = None

    def __getitem__(self, measure: str) -> Histogram:
        last = self._last
        if last is not None and last[0] == measure:
            return last[1]
        for entry in self._reading.histograms:
            if entry[0] == measure:
                totals = _row(self._flat, self._bounds, self._index)
                base = _row(self._flat, self._bounds, self._index - 1)
                if len(base) < len(totals):  # keys that came after ``base`` were 0 in it
                    base.extend(itertools.repeat(0, len(totals) - len(base)))
                found = _histogram(entry, base, totals)
                self._last = (measure, found)
                return found
        raise KeyError(measure)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _, _, _ in self._reading.histograms)

    def __len__(self) -> int:
        return len(self._reading.histograms)
