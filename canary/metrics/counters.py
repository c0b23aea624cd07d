"""The counter book: per-tick samples of raw cumulative counters in, exact integer tallies out.

Pure, no I/O. :class:`PrometheusEvidenceSource` samples, once per tick and for every tracked revision
together, the raw cumulative request counters and latency buckets of the requests family
(:func:`~canary.metrics.catalog.render_counters`: one instant query, no ``rate``/``increase``); after a
restart it fills a revision's past once with a range query replayed through the same logic. This
module turns those samples into clean cumulative totals and those into
:class:`~canary.evidence.Tally` values:

* per series (pod x response class [x ``le``]) the increment between two samples is ``value -
  previous``; a series that went down means its pod's queue-proxy restarted, and then every series
  of that pod counts from zero (``value``), including one whose value looks unchanged: it is taken
  as stale (Prometheus' lookback still shows the old value) until it changes, and then it counts
  its whole value; one absent at the restart counts its whole value when it comes back;
* a series seen for the first time after the revision's first sample counts its whole value (a new
  pod, the first 5xx series appearing); at the revision's first sample everything is baseline;
* a tally between two snapshots is the difference of the clean totals: integers, no extrapolation,
  and consecutive tallies add up to the tally over the whole range.

What sampling cannot see: the requests a pod served between the last sample and its restart are lost
when samples are further apart than the scrape interval (the backfill and a live tick every scrape
interval see them all).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import operator
import threading
import weakref
from array import array
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from sys import intern
from typing import NamedTuple, overload

import msgspec

from canary.evidence import (
    REQUESTS,
    CountSeries,
    ErrorClass,
    EvidenceStatus,
    Histogram,
    Measurement,
    Tally,
)
from canary.metrics.catalog import (
    BUCKET_FIELD,
    CODE_CLASS_LABEL,
    COUNTER_FIELD,
    FIELD_LABEL,
    OOM_FIELD,
    RevisionKey,
)
from canary.metrics.client import QueryFailure, QueryOutcome, vector_decoder
from canary.policy.model import MetricKind
from canary.policy.units import Unit

__all__ = [
    "BackfillChunk",
    "CounterBook",
    "PeakBook",
    "PeakEntry",
    "PeakSample",
    "RevisionSample",
    "SeriesId",
    "Snapshot",
    "bucket_measure",
    "count_measurement",
    "interpolated_quantile",
    "parse_counter_matrix",
    "parse_counter_vector",
    "parse_peak_matrix",
    "parse_peaks",
    "plan_backfill",
]

LATENCY = "latency"  # the measure under which the request latency histogram travels in a Tally
_INF = math.inf
_SERVER = "5xx"
_CLIENT = "4xx"


class SeriesId(NamedTuple):
    """One counter series of a revision, as the counter query aggregates it."""

    kind: str  # COUNTER_FIELD or BUCKET_FIELD
    pod: str
    code_class: str  # "2xx", "5xx", ... or "" when unknown
    le: float = _INF  # buckets only: the upper bound in seconds (+Inf for the total)


def bucket_measure(kind: str) -> str:
    """The latency measure a bucket series belongs to: ``bucket`` is the request latency,
    ``bucket:ttft`` / ``bucket:e2e-latency`` vLLM's histograms."""
    return kind.partition(":")[2] or LATENCY


def _key_of(series: SeriesId) -> tuple[str, str | float]:
    """The key of a revision's layout a series adds to."""
    if series.kind == COUNTER_FIELD:
        return ("", series.code_class)
    return (bucket_measure(series.kind), series.le)


def _is_bucket(kind: object) -> bool:
    return isinstance(kind, str) and (kind == BUCKET_FIELD or kind.startswith(BUCKET_FIELD + ":"))


@dataclass(frozen=True, slots=True)
class RevisionSample:
    """A revision's raw counter values at one moment; ``invalid`` names a non-finite value seen."""

    values: Mapping[SeriesId, float]
    invalid: str = ""


_LayoutKey = tuple[str, str | float]  # ("", response class) or (measure, le)


class _Layout:
    """Which total sits at which index of a revision's snapshots: response classes and, per latency
    measure, bucket bounds, in the order they first appeared.

    Immutable and shared: a revision's snapshots hold their totals as rows over the keys known when
    each was taken (a key that came later is 0 in a row), and every revision whose keys appeared in
    the same order holds the same layout — the revisions of a thousand rollouts export the same
    response classes and buckets, and a layout each (its index, slots and memos) was about 11 MiB
    (tracemalloc, 2,000 revisions). A key that appears moves the revision to the layout with it
    added (:meth:`extended`); its earlier rows stay valid, being over a prefix of the keys."""

    __slots__ = ("__weakref__", "classes", "edges", "index", "keys", "measures", "readings")

    def __init__(self, keys: tuple[_LayoutKey, ...] = ()) -> None:
        self.keys = keys
        self.index: dict[_LayoutKey, int] = {key: position for position, key in enumerate(keys)}
        self.classes: list[tuple[str, int]] = []  # (class, index)
        self.measures: dict[str, list[tuple[float, int]]] = {}  # measure: [(le, index)], le ascending
        for position, (measure, bound) in enumerate(keys):
            if measure:
                self.measures.setdefault(measure, []).append((float(bound), position))
            else:
                self.classes.append((str(bound), position))
        for slots in self.measures.values():
            slots.sort()
        # Memos: every tally of every revision holding this layout asks the same.
        self.edges: dict[tuple[str, int], _Slots] = {}
        self.readings: dict[int, _Reading] = {}

    def extended(self, added: Iterable[_LayoutKey]) -> _Layout:
        """This layout with ``added`` (keys it lacks, that appeared together) after its keys: the
        one every revision whose keys came in this order holds. Keys that came together are put
        in one order (sorted), whatever order the answer listed them in."""
        keys = self.keys + tuple(sorted(added))
        with _LAYOUTS_LOCK:
            found = _LAYOUTS.get(keys)
            if found is None:
                found = _LAYOUTS[keys] = _Layout(keys)
        return found

    def histogram_slots(self, measure: str, known: int) -> _Slots:
        """For a snapshot holding the first ``known`` keys: the finite bounds of ``measure``, their
        indices, the +Inf index, and what picks the finite ones out of a sequence of totals
        (memoised: every tally of a revision asks the same)."""
        cached = self.edges.get((measure, known))
        if cached is None:
            present = [(le, index) for le, index in self.measures.get(measure, ()) if index < known]
            finite = [(le, index) for le, index in present if le != _INF]
            infinite = next((index for le, index in present if le == _INF), None)
            indices = tuple(index for _, index in finite)
            cached = _Slots(tuple(le for le, _ in finite), indices, infinite, _picker(indices))
            self.edges[(measure, known)] = cached
        return cached

    def reading(self, known: int) -> _Reading:
        """How a tally reads totals over the first ``known`` keys (memoised: every tally between two
        snapshots of a step knows the same keys)."""
        found = self.readings.get(known)
        if found is None:
            classes = tuple(index for _, index in self.classes if index < known)
            server, client = self.index.get(("", _SERVER)), self.index.get(("", _CLIENT))
            histograms = []
            buckets = []
            for measure in self.measures:
                edges, slots, infinite, pick = self.histogram_slots(measure, known)
                if slots or infinite is not None:  # else its first bucket came later
                    histograms.append((measure, edges, pick, infinite))
                    buckets.append((measure, slots, infinite))
            found = self.readings[known] = _Reading(
                _picker(classes) if classes else None,
                server if server is not None and server < known else None,
                client if client is not None and client < known else None,
                tuple(histograms),
                tuple(buckets),
            )
        return found


class _Reading(NamedTuple):
    classes: Callable[[Sequence[int]], tuple[int, ...]] | None  # the response classes' totals
    server: int | None  # 5xx
    client: int | None  # 4xx
    histograms: tuple[
        tuple[str, tuple[float, ...], Callable[[Sequence[int]], tuple[int, ...]], int | None], ...
    ]
    buckets: tuple[tuple[str, tuple[int, ...], int | None], ...]  # which totals the histograms read


class _Slots(NamedTuple):
    edges: tuple[float, ...]
    indices: tuple[int, ...]
    infinite: int | None
    pick: Callable[[Sequence[int]], tuple[int, ...]]


# The layouts in use, by their keys; one is forgotten when no revision holds it any more.
_LAYOUTS: weakref.WeakValueDictionary[tuple[_LayoutKey, ...], _Layout] = weakref.WeakValueDictionary()
_LAYOUTS_LOCK = threading.Lock()
_NO_KEYS = _Layout()  # where every revision starts (held here: never forgotten)


def _picker(indices: tuple[int, ...]) -> Callable[[Sequence[int]], tuple[int, ...]]:
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
    oom_kills: int = (
        0  # restart counters: the restarts counted while the container's last reason was OOMKilled
    )
    # What the snapshots dropped just before this one saw (CounterBook._compact): their pods, and
    # whether any had request series. A range from a kept snapshot to another sees them all.
    pods_between: frozenset[str] = frozenset()
    series_between: bool = False

    def total(self, index: int | None) -> int:
        return self.totals[index] if index is not None and index < len(self.totals) else 0

    @property
    def by_class(self) -> dict[str, int]:
        """Requests per response class ("" for unknown)."""
        return {
            code_class: self.total(index)
            for code_class, index in self.layout.classes
            if index < len(self.totals)
        }

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


def _tally(first: Snapshot, last: Snapshot) -> Tally:
    return _tally_between(first.at, first.totals, last.at, last.totals, last.layout)


def _tally_between(
    start: datetime, base: Sequence[int], end: datetime, totals: Sequence[int], layout: _Layout
) -> Tally:
    """The tally from the totals ``base`` at ``start`` to ``totals`` at ``end`` (both over ``layout``;
    ``base`` may know fewer keys: those came later and were 0 in it)."""
    known = len(totals)
    if len(base) < known:
        base = [*base, *itertools.repeat(0, known - len(base))]
    reading = layout.reading(known)
    classes, server, client = reading.classes, reading.server, reading.client
    return Tally(
        start,
        end,
        sum(classes(totals)) - sum(classes(base)) if classes is not None else 0,
        totals[server] - base[server] if server is not None else 0,
        totals[client] - base[client] if client is not None else 0,
        {entry[0]: _histogram(entry, base, totals) for entry in reading.histograms},
    )


_MICROSECOND = timedelta(microseconds=1)
_WIDTHS = (("H", 1 << 16), ("I", 1 << 32))  # unsigned array types by the totals they hold


class _History:
    """A revision's snapshots, oldest first, held as columns.

    A step keeps a snapshot per revision per tick for the judge (120 in a 10-minute step at a 5 s
    tick, for both revisions of each rollout): as objects (a ``Snapshot``, its ``datetime``, its
    totals array, the tally from the one before) a thousand rollouts' steps grew the controller by
    about 8 MiB a minute. Here a tick costs its time (8 bytes), its totals in one array shared by all
    the revision's ticks (2 bytes a total while they stay below 65,536), and a few words; a
    ``Snapshot`` is built when one is read, and the tallies between consecutive ones when a range is
    asked for (:meth:`tallies`).

    Times are integer microseconds since the revision's first sample (``epoch``): exact, and
    compared without building a ``datetime``. Row ``i``'s totals are ``flat[bounds[i]:bounds[i + 1]]``
    (rows grow as keys appear: a key that came later is 0 in an earlier row). What is rare is kept by
    time: a non-finite value seen (``invalid``), and what compacted snapshots dropped before a kept one
    saw (``between``: their pods, and whether any had request series).
    """

    __slots__ = ("between", "bounds", "epoch", "flat", "invalid", "layout", "oom", "pods", "series", "times")

    def __init__(self, layout: _Layout) -> None:
        self.layout = layout
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

    def __bool__(self) -> bool:
        return bool(self.times)

    def micros(self, moment: datetime) -> int:
        """``moment`` on this history's time axis."""
        assert self.epoch is not None
        return (moment - self.epoch) // _MICROSECOND

    def at(self, index: int) -> datetime:
        assert self.epoch is not None
        return self.epoch + _MICROSECOND * self.times[index]

    def row(self, index: int) -> array[int]:
        if index < 0:
            index += len(self.times)
        return _row(self.flat, self.bounds, index)

    def bisect_right(self, moment: datetime) -> int:
        """How many snapshots are at or before ``moment``."""
        return bisect.bisect_right(self.times, self.micros(moment)) if self.times else 0

    def bisect_left(self, moment: datetime) -> int:
        """How many snapshots are before ``moment``."""
        return bisect.bisect_left(self.times, self.micros(moment)) if self.times else 0

    def has_series(self, index: int) -> bool:
        """Whether the sample of ``index`` had request series, or one compacted just before it."""
        return bool(self.series[index]) or self.between.get(self.times[index], _NOTHING_BETWEEN)[1]

    def __getitem__(self, index: int) -> Snapshot:
        if index < 0:
            index += len(self.times)
        if not 0 <= index < len(self.times):
            raise IndexError(index)
        time = self.times[index]
        pods_between, series_between = self.between.get(time, _NOTHING_BETWEEN)
        return Snapshot(
            self.at(index),
            self.row(index),
            self.layout,
            self.series[index],
            self.invalid.get(time, ""),
            self.pods[index],
            self.oom[index],
            pods_between,
            series_between,
        )

    def append(
        self, at: datetime, totals: list[int], series: int, invalid: str, pods: frozenset[str], oom: int
    ) -> None:
        if self.epoch is None:
            self.epoch = at
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

    def tallies(self, first: int, last: int) -> CountSeries:
        """The tallies between consecutive snapshots from ``first`` to ``last``, and what adds them
        up (``CountSeries.summed``).

        Each evaluation reads its step's tallies again, for both revisions: they are not kept, nor
        built here (:class:`_Tallies` builds them when read: a tick holds the evidence of every
        rollout it decides until their judgements are done). A range's total is the difference of
        its two end rows, not the sum of its tallies."""
        # The arrays as they are now: rows are only appended to them, and compaction or widening
        # builds new ones, so what is read later through them is what is read now. No row is kept
        # here: a step's rows for every rollout evaluated in a tick were megabytes at once.
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
            return _tally_between(
                epoch + _MICROSECOND * times[position],
                _row(flat, bounds, position),
                epoch + _MICROSECOND * times[last],
                _row(flat, bounds, last),
                layout,
            )

        return CountSeries(EvidenceStatus.OK, found, summed=summed)


class _Tallies(Sequence[Tally]):
    """The tallies between consecutive rows ``first`` to ``last`` of a history's arrays, built when
    read, and not kept.

    A tick holds the evidence of every rollout it decides until their judgements are done. Built at
    once, that was a tally per tick of every due rollout's step, for both revisions: at 1,000
    rollouts near the end of a 10-minute step, about 40,000 tallies (~10 MiB) alive at once in
    every tick, and more with longer windows. An evaluation builds them once, when its judge reads
    them (:class:`~canary.rollout.sampled.Totals`), and lets them go when it is done. Equal to a
    tuple of the same tallies."""

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
        requests = sum(reading.classes(base)) if reading.classes is not None else 0
        errors = base[reading.server] if reading.server is not None else 0
        client = base[reading.client] if reading.client is not None else 0
        previous = epoch + _MICROSECOND * times[first]
        for index in range(first + 1, self._first + stop + 1):
            totals = _row(flat, bounds, index)
            known = len(totals)
            if len(base) < known:  # keys that came after ``base`` were 0 in it
                reading = layout.reading(known)
            now_requests = sum(reading.classes(totals)) if reading.classes is not None else 0
            now_errors = totals[reading.server] if reading.server is not None else 0
            now_client = totals[reading.client] if reading.client is not None else 0
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


def _row(flat: array[int], bounds: array[int], index: int) -> array[int]:
    """Row ``index`` of a history's totals, read from the arrays given (not the history's current
    ones: a tally reads the arrays of when it was built)."""
    return flat[bounds[index] : bounds[index + 1]]


def _same_buckets(layout: _Layout, lengths: set[int]) -> bool:
    """Whether rows of these lengths read each latency measure from the same buckets, or not at
    all (it came later): a range's histograms are then the difference of its end rows, as adding
    its tallies up gives. A response class that came later is 0 before it, in both ways."""
    last = layout.reading(max(lengths)).buckets
    return all(all(bucket in last for bucket in layout.reading(known).buckets) for known in lengths)


def _histogram(
    entry: tuple[str, tuple[float, ...], Callable[[Sequence[int]], tuple[int, ...]], int | None],
    base: Sequence[int],
    totals: Sequence[int],
) -> Histogram:
    """One measure's histogram (an entry of ``_Reading.histograms``) from ``base`` to ``totals``
    (``base`` as long as ``totals``)."""
    _, edges, pick, infinite = entry
    at_most = tuple(map(operator.sub, pick(totals), pick(base)))
    whole = totals[infinite] - base[infinite] if infinite is not None else max(at_most, default=0)
    return Histogram(edges, at_most, whole)


class _TickHistograms(Mapping[str, Histogram]):
    """A per-tick tally's histograms, read from its two rows (``index - 1`` and ``index`` of the
    history's arrays) when asked for. The rows are not kept; the last histogram read is (a
    latency check reads a canary's tick at each of its limits)."""

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


_WIDTH_ORDER = {"H": 0, "I": 1, "q": 2}
_NOTHING_BETWEEN: tuple[frozenset[str], bool] = (frozenset(), False)


@dataclass(slots=True)
class _Track:
    """Everything the book keeps about one revision."""

    last: dict[SeriesId, float] = field(default_factory=dict)  # the last raw value of each series
    # The series of ``last`` missing from the latest sample, and when each was last present (a
    # series in the latest sample was present then). Not a time per series per tick: 4,000
    # revisions' series are in every sample, and a dict of them per revision was megabytes.
    absent: dict[SeriesId, datetime] = field(default_factory=dict)
    stale: dict[SeriesId, float] = field(default_factory=dict)  # reset pods' series not yet re-counted
    gone: set[SeriesId] = field(default_factory=set)  # reset pods' series absent since the restart
    layout: _Layout = _NO_KEYS  # replaced as keys appear (_Layout.extended)
    snapshots: _History = field(init=False)
    totals: list[int] = field(default_factory=list)  # the running totals, per key of ``layout``
    slots: dict[SeriesId, int] = field(default_factory=dict)  # each series' total in ``totals``
    oom_kills: int = 0
    # Counted from birth (CounterBook.asked(born=True), a canary's restart counters): the first
    # sample counts every series whole instead of as the baseline, and ``born_at`` is its time.
    from_birth: bool = False
    born_at: datetime | None = None
    asks: dict[Hashable, tuple[datetime, datetime]] = field(default_factory=dict)  # who: (from, when)
    backfilled_from: datetime | None = None
    # Compaction (CounterBook.prune): the evaluation times asked and not yet settled, each asker's
    # range starts and evaluation interval, and the time up to which snapshots are compacted.
    ends: list[datetime] = field(default_factory=list)
    anchors: dict[Hashable, tuple[datetime, ...]] = field(default_factory=dict)
    grains: dict[Hashable, float] = field(default_factory=dict)
    settled: datetime | None = None

    def __post_init__(self) -> None:
        self.snapshots = _History(self.layout)


class CounterBook:
    """Clean cumulative counter totals per revision, one snapshot per sample (see the module docstring).

    :param tolerance: how far a snapshot may be from a wanted moment and still stand for it (half the
        scrape interval: the samples of one tick need not share the exact same ``at``).
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
        self.tolerance = tolerance
        self.idle = idle
        self.max_snapshots = max_snapshots
        self.per_tick = per_tick
        self._tracks: dict[RevisionKey, _Track] = {}

    # -- what is tracked ------------------------------------------------------------------------

    def tracked(self) -> set[RevisionKey]:
        return set(self._tracks)

    def is_tracked(self, revision: RevisionKey) -> bool:
        return revision in self._tracks

    def snapshots(self, revision: RevisionKey) -> tuple[Snapshot, ...]:
        track = self._tracks.get(revision)
        if track is None:
            return ()
        return tuple(track.snapshots[index] for index in range(len(track.snapshots)))

    def asked(
        self,
        revision: RevisionKey,
        asker: Hashable,
        counts_start: datetime,
        at: datetime,
        *,
        starts: Iterable[datetime] = (),
        interval: float | None = None,
        born: bool = False,
    ) -> None:
        """``asker`` (a rollout) wants ``revision``'s counts from ``counts_start``, asked at ``at``
        (an evaluation); ``starts``: the other range starts it reads (its step's start);
        ``interval``: its evaluation interval in seconds (the grain the past is kept at).

        ``born``: every count the revision's series hold is its own (a canary's pods were all
        created for its rollout): a revision not sampled yet counts its first sample whole, and a
        range that starts before that sample counts from zero (:meth:`tally`, :meth:`oom_kills`).
        """
        track = self._tracks.setdefault(revision, _Track())
        if born and not track.snapshots:
            track.from_birth = True
        track.asks[asker] = (counts_start, at)
        track.anchors[asker] = (counts_start, *starts)
        if not track.ends or at > track.ends[-1]:
            track.ends.append(at)
        if interval is not None and interval > 0:
            track.grains[asker] = interval

    def needs_backfill(self, revision: RevisionKey, counts_start: datetime) -> bool:
        """Whether the book lacks ``revision``'s past from ``counts_start`` and has not filled it yet."""
        track = self._tracks.get(revision)
        if track is None:
            return True
        if track.backfilled_from is not None and track.backfilled_from <= counts_start + self.tolerance:
            return False
        return not track.snapshots or track.snapshots.at(0) > counts_start + self.tolerance

    # -- recording ------------------------------------------------------------------------------

    def record(self, revision: RevisionKey, at: datetime, sample: RevisionSample) -> bool:
        """Add the sample taken at ``at``; False (ignored) when it is not newer than the last one."""
        track = self._tracks.setdefault(revision, _Track())
        history = track.snapshots
        if history and at <= history.at(-1):
            return False
        # OOM markers are not counters: they say which containers' increments are OOM kills.
        values = sample.values
        oom: Collection[tuple[str, str]] = ()
        if OOM_FIELD in {series.kind for series in values}:  # only the restart counters have them
            oom = {(series.pod, series.code_class) for series in values if series.kind == OOM_FIELD}
            values = {series: value for series, value in values.items() if series.kind != OOM_FIELD}
        if not track.snapshots and track.from_birth:
            track.born_at = at
            self._advance(track, values, oom)  # nothing known before: every series counts whole
        elif not track.snapshots:
            track.last = dict(values)
            # Everything is baseline: the totals start at zero.
            self._learn(track, values)
        else:
            self._advance(track, values, oom)
            self._note_absent(track, values, history.at(-1))
        present = sum(1 for series in values if series.kind == COUNTER_FIELD) or len(values)
        pods = frozenset(series.pod for series in values)
        if history and history.pods[-1] == pods:
            pods = history.pods[-1]  # one set for a revision's snapshots while its pods stay
        history.append(at, track.totals, present, sample.invalid, pods, track.oom_kills)
        if len(history) > self.max_snapshots:
            history.drop_before(len(history) - self.max_snapshots)
        return True

    def replay(self, revision: RevisionKey, samples: Iterable[tuple[datetime, RevisionSample]]) -> None:
        """Fill ``revision`` from samples of the past (a backfill): its earlier history is replaced."""
        old = self._tracks.get(revision)
        track = _Track()
        if old is not None:  # who asked, and how (compaction), stays
            track.asks, track.anchors, track.grains = dict(old.asks), dict(old.anchors), dict(old.grains)
            track.ends = list(old.ends)
            track.from_birth = old.from_birth
        self._tracks[revision] = track
        for at, sample in sorted(samples, key=lambda item: item[0]):
            self.record(revision, at, sample)

    def mark_backfilled(self, revision: RevisionKey, start: datetime) -> None:
        track = self._tracks.setdefault(revision, _Track())
        track.backfilled_from = start

    def _advance(
        self,
        track: _Track,
        values: Mapping[SeriesId, float],
        oom: Collection[tuple[str, str]] = frozenset(),
    ) -> None:
        # The common case, every tick for every revision: no pod restarted now or recently, no OOM
        # marker. The same rules as below with the branches that cannot apply left out (a thousand
        # rollouts sample a hundred thousand series a tick): the increments are found first, and
        # only when no series went down are they added.
        if not track.stale and not track.gone and not oom:
            previous_of, slots = track.last.get, track.slots
            known: list[tuple[int, int]] = []  # (total's index, increment)
            born: list[tuple[SeriesId, int]] = []  # series born after the baseline: counted whole
            for series, value in values.items():
                previous = previous_of(series)
                if previous is None:
                    born.append((series, round(value)))  # a new pod, a first 5xx
                elif value < previous:
                    break  # a pod restarted: the rules below
                else:  # a series with a last value has its total (_add gave it one)
                    known.append((slots[series], round(value - previous)))
            else:
                totals = track.totals
                for index, increment in known:
                    totals[index] += increment
                if born:
                    self._learn(track, [series for series, _ in born])
                for series, increment in born:
                    self._add(track, series, increment)
                track.last.update(values)
                return
        self._learn(track, values)
        reset_pods = {
            (series.kind, series.pod)
            for series, value in values.items()
            if series in track.last
            and series not in track.stale
            and series not in track.gone
            and value < track.last[series]
        }
        for series, value in values.items():
            previous = track.last.get(series)
            if series in track.gone:
                increment = round(value)  # back after its pod's restart: all of it is new
                track.gone.discard(series)
            elif series in track.stale:
                if value == track.stale[series]:
                    increment = 0  # still the value from before the restart (stale)
                else:
                    increment = round(value)  # re-counted from zero since the restart
                    del track.stale[series]
            elif previous is None:
                increment = round(value)  # a series born after the baseline: all of it is new
            elif (series.kind, series.pod) in reset_pods:
                if value == previous:
                    increment = 0
                    track.stale[series] = value
                else:
                    increment = round(value)
            else:
                increment = round(value - previous)
            track.last[series] = value
            self._add(track, series, increment)
            if (series.pod, series.code_class) in oom and series.kind == COUNTER_FIELD:
                track.oom_kills += increment
        # Series of a restarted pod that are absent now count from zero when they come back.
        for series in track.last:
            if series not in values and (series.kind, series.pod) in reset_pods:
                track.gone.add(series)
                track.stale.pop(series, None)

    @staticmethod
    def _learn(track: _Track, seen: Iterable[SeriesId]) -> None:
        """Give each series in ``seen`` that ``track`` does not know yet its total. The keys the
        revision lacks are added to its layout at once, in one order: one shared layout for the keys
        of a sample, not a layout per key."""
        slots = track.slots
        fresh = [series for series in seen if series not in slots]
        if not fresh:
            return
        index = track.layout.index
        added = {key: None for key in map(_key_of, fresh) if key not in index}
        if added:
            track.layout = track.snapshots.layout = track.layout.extended(added)
            track.totals.extend(itertools.repeat(0, len(added)))
            index = track.layout.index
        for series in fresh:
            slots[series] = index[_key_of(series)]

    @staticmethod
    def _add(track: _Track, series: SeriesId, increment: int) -> None:
        index = track.slots.get(series)
        if index is None:
            CounterBook._learn(track, (series,))
            index = track.slots[series]
        track.totals[index] += increment

    # -- reading --------------------------------------------------------------------------------

    def _span(self, track: _Track, start: datetime, end: datetime) -> tuple[int, int] | None:
        """Indices of the snapshots standing for ``start`` and ``end``; None without a snapshot.

        ``end``: the last one at most a tolerance after it. ``start``: among those up to that one,
        the nearest within a tolerance (the earlier of two as near), else the last one before it,
        else the first. By bisection: every evaluation of every rollout reads two revisions' spans
        from a step of snapshots."""
        snapshots = track.snapshots
        last = snapshots.bisect_right(end + self.tolerance) - 1
        if last < 0:
            return None
        return _start_index(snapshots, start, self.tolerance, last), last

    def count_series(
        self, revision: RevisionKey, start: datetime, end: datetime, *, query: str = ""
    ) -> CountSeries:
        """The tallies between consecutive snapshots from the one standing for ``start`` to ``end``."""
        track = self._tracks.get(revision)
        span = self._span(track, start, end) if track is not None else None
        if track is None or span is None:
            return CountSeries(EvidenceStatus.NO_DATA, detail=_NO_SERIES, query=query)
        first, last = span
        history = track.snapshots
        invalid = history.invalid.get(history.times[last]) if history.invalid else None
        if invalid:
            return CountSeries(EvidenceStatus.INVALID_VALUE, detail=invalid, query=query)
        if not _any_series(history, first, last):
            return CountSeries(EvidenceStatus.NO_DATA, detail=_NO_SERIES, query=query)
        return replace(history.tallies(first, last), query=query)

    def tally(
        self, revision: RevisionKey, start: datetime, end: datetime, *, from_birth: bool = False
    ) -> tuple[Tally | None, Snapshot | None]:
        """The whole tally over [start, end] (None when nothing is known), and its last snapshot.

        ``from_birth``: everything since the revision's birth up to ``end`` when it is counted from
        birth (``asked(born=True)`` before its first sample), whatever ``start`` and whatever
        snapshots were pruned since."""
        track = self._tracks.get(revision)
        span = self._span(track, start, end) if track is not None else None
        if track is None or span is None:
            return None, None
        first, last = span
        history = track.snapshots
        final = history[last]
        if not _any_series(history, first, last):
            return None, final
        base = self._born(track, start) if from_birth else None
        return _tally(base or history[first], final), final

    def oom_kills(
        self, revision: RevisionKey, start: datetime, end: datetime, *, from_birth: bool = False
    ) -> int:
        """Restarts counted in [start, end] while the container's last termination was an OOM kill
        (``from_birth``: as in :meth:`tally`)."""
        track = self._tracks.get(revision)
        span = self._span(track, start, end) if track is not None else None
        if track is None or span is None:
            return 0
        first, last = span
        history = track.snapshots
        base = self._born(track, start) if from_birth else None
        return history.oom[last] - (base.oom_kills if base is not None else history.oom[first])

    def new_oom_kills(self, revision: RevisionKey) -> int:
        """OOM kills counted in the latest sample of ``revision`` (since the one before it; for a
        revision counted from birth, its first sample's)."""
        track = self._tracks.get(revision)
        if track is None or not track.snapshots:
            return 0
        history = track.snapshots
        if len(history) == 1:
            return history.oom[0] if track.born_at == history.at(0) else 0
        return history.oom[-1] - history.oom[-2]

    @staticmethod
    def _born(track: _Track, start: datetime) -> Snapshot | None:
        """Zero, standing at ``start``, for a revision counted from birth (every snapshot's totals
        hold everything since its birth, whichever snapshots pruning left); None otherwise."""
        if track.born_at is None:
            return None
        return Snapshot(min(start, track.snapshots.at(0)), array("q"), track.layout, 0)

    def pods_seen(self, revision: RevisionKey, start: datetime, end: datetime) -> int:
        """How many pods had series in the snapshots standing for [start, end]."""
        track = self._tracks.get(revision)
        span = self._span(track, start, end) if track is not None else None
        if track is None or span is None:
            return 0
        first, last = span
        snapshots = track.snapshots
        # The first one's own pods: what was dropped before it lies before the range. Consecutive
        # snapshots share one set while a revision's pods stay (record): each set is added once,
        # not once per tick (a step's 120 ticks, per revision, per evaluation).
        pods, between, times = snapshots.pods, snapshots.between, snapshots.times
        previous = pods[first]
        seen = set(previous)
        for index in range(first + 1, last + 1):
            if pods[index] is not previous:
                previous = pods[index]
                seen.update(previous)
            if between:
                seen.update(between.get(times[index], _NOTHING_BETWEEN)[0])
        return len(seen)

    # -- forgetting -----------------------------------------------------------------------------

    def prune(self, now: datetime) -> None:
        """Forget what no range asked for can need any more (in sample time ``now``)."""
        for revision in list(self._tracks):
            track = self._tracks[revision]
            track.asks = {who: ask for who, ask in track.asks.items() if ask[1] >= now - self.idle}
            if not track.asks:
                del self._tracks[revision]
                continue
            oldest = min(start for start, _ in track.asks.values())
            # The last one at least a tolerance before the oldest start stays: it, or one after it,
            # stands for that start.
            keep_from = track.snapshots.bisect_right(oldest - self.tolerance) - 1
            if keep_from > 0:
                track.snapshots.drop_before(keep_from)
            track.anchors = {who: starts for who, starts in track.anchors.items() if who in track.asks}
            track.grains = {who: grain for who, grain in track.grains.items() if who in track.asks}
            self._compact(track)
            # A series absent for ``idle`` is forgotten (all of them when the latest sample is that old).
            if track.snapshots and track.snapshots.at(-1) < now - self.idle:
                idle = list(track.last)
            else:
                idle = [series for series, when in track.absent.items() if when < now - self.idle]
            for series in idle:
                track.absent.pop(series, None)
                track.last.pop(series, None)
                track.stale.pop(series, None)
                track.gone.discard(series)

    @staticmethod
    def _note_absent(track: _Track, values: Mapping[SeriesId, float], previous: datetime) -> None:
        """Keep ``absent`` true after a sample whose values are ``values``, the one before it taken at
        ``previous`` (what was present in it and is missing now was last present then)."""
        if track.absent:
            for series in [series for series in track.absent if series in values]:
                del track.absent[series]
        if len(track.last) != len(values):  # ``last`` holds ``values`` and the ones missing
            for series in track.last:
                if series not in values and series not in track.absent:
                    track.absent[series] = previous

    def _compact(self, track: _Track) -> None:
        """Keep the past steps at the grain of evaluations, not of ticks.

        Snapshots before every asker's current step are settled: no later range can start inside
        them (a step starts after the evaluation that advanced it). Of those, the ones kept are the
        snapshot standing for each evaluation, the one standing for each range start (as
        :meth:`_span` picks it), and, where evaluations are further apart than one and a half
        evaluation intervals (a backfill after a restart, an outage), one per interval. Every range
        asked for reads the same totals as before, and the current step keeps its per-tick
        tallies; the past steps' consecutive tallies are per evaluation interval. Without this the
        book grew with a rollout's age: an hour into it, 720 snapshots per revision at a 5 s tick.
        """
        snapshots = track.snapshots
        if len(snapshots) < 3 or not track.asks:
            return
        if self.per_tick:
            # Settled: what lies before every asker's current step (the latest of its range starts).
            # The current step stays at the resolution it was sampled at, as its own evidence is judged.
            horizon = min(
                min(max(track.anchors.get(who, ()), default=start), at)
                for who, (start, at) in track.asks.items()
            )
        else:
            # Nothing is read tick by tick: what lies before every asker's latest evaluation is
            # settled (a step's start is seen after the evaluation that moved the traffic, and
            # becomes a range start only at the next one), except the last two (new_oom_kills).
            horizon = min(*(at for _, at in track.asks.values()), snapshots.at(-2))
        if track.settled is not None and horizon <= track.settled:
            return  # no evaluation since the last compaction
        first = 1  # the oldest snapshot always stays (it stands for the oldest start)
        if track.settled is not None:
            # Per tick, what was compacted stays as it is; without per-tick tallies the last settled
            # one is looked at again (it stayed only as the boundary), or every tick would stay.
            again = 0 if self.per_tick else 1
            first = max(first, snapshots.bisect_right(track.settled) - again)
        # The last settled one always stays (the next tally starts from it), and so does everything
        # after the horizon (a step that starts there may read from any of them), and the last two
        # whatever the horizon: new_oom_kills reads the latest sample against the one before it (a
        # step starting at the latest sample made a dropped one-before repeat an alarm).
        last = min(snapshots.bisect_right(horizon) - 1, len(snapshots) - 2)
        if last < first:
            return
        tolerance = self.tolerance
        keep: set[int] = {last}
        for end in track.ends:  # the snapshot standing for each evaluation, as _span picks it
            for moment in (end, end + tolerance):
                index = snapshots.bisect_right(moment) - 1
                if first <= index <= last:
                    keep.add(index)
        for starts in track.anchors.values():  # the one standing for each range start
            for start in starts:
                index = _start_index(snapshots, start, tolerance)
                if first <= index <= last:
                    keep.add(index)
        # The past at the grain of evaluations is for count_series, which a book without per-tick
        # tallies never answers.
        grain = (min(track.grains.values(), default=0.0) if self.per_tick else 0.0) * 1_000_000
        micro_tolerance = tolerance // _MICROSECOND
        times, pods, between = snapshots.times, snapshots.pods, snapshots.between
        kept: list[int] = list(range(first))
        joined: dict[int, tuple[frozenset[str], bool]] = {}  # what the dropped ones saw, by kept index
        dropped: list[int] = []  # since the last one kept
        for index in range(first, last + 1):
            if index not in keep and grain:
                # Far from the next evaluation (a backfilled past, an outage): one per interval.
                following = min((i for i in keep if i > index), default=last)
                wide = times[following] - times[kept[-1]] > grain * 1.5
                if wide and times[index] - times[kept[-1]] >= grain - micro_tolerance:
                    keep.add(index)
            if index not in keep:
                dropped.append(index)
                continue
            if dropped:
                own_pods, own_series = between.get(times[index], _NOTHING_BETWEEN)
                seen = [(pods[gone], *between.get(times[gone], _NOTHING_BETWEEN)) for gone in dropped]
                pods_between = own_pods.union(*(own | saw for own, saw, _ in seen))
                series_between = (
                    own_series
                    or any(snapshots.series[gone] for gone in dropped)
                    or any(had for _, _, had in seen)
                )
                if pods_between == pods[index]:
                    pods_between = pods[index]  # one set while the pods stay, as record() shares it
                joined[index] = (pods_between or _NO_PODS, series_between)
                dropped = []
            kept.append(index)
        kept.extend(range(last + 1, len(snapshots)))
        settled = snapshots.at(last)
        snapshots.keep(kept, joined)
        track.settled = settled
        track.ends = [end for end in track.ends if end > track.settled]


def _any_series(history: _History, first: int, last: int) -> bool:
    """Whether any sample in the range from ``first`` to ``last`` had request series (the first
    one's own only: what was dropped before it lies before the range)."""
    return bool(history.series[first]) or any(
        history.has_series(index) for index in range(first + 1, last + 1)
    )


def _start_index(history: _History, start: datetime, tolerance: timedelta, last: int | None = None) -> int:
    """The snapshot standing for a range's ``start`` among those up to ``last`` (all by default), as
    :meth:`CounterBook._span` picks it: the nearest within ``tolerance`` (the earlier of two as
    near), else the last one before, else the first."""
    last = len(history) - 1 if last is None else last
    after = history.bisect_left(start)  # the first one not before start
    moment, times, within = history.micros(start), history.times, tolerance // _MICROSECOND
    best: int | None = None
    for candidate in (after - 1, after):
        if 0 <= candidate <= last:
            distance = abs(times[candidate] - moment)
            if distance <= within and (best is None or distance < abs(times[best] - moment)):
                best = candidate
    if best is not None:
        return best
    return max(min(after - 1, last), 0)


_NO_SERIES = "no request series"
_NO_PODS: frozenset[str] = frozenset()


# ---------------------------------------------------------------------------------------------
# Reading the counter query's answers


def _le_seconds(text: str, divisor: float) -> float | None:
    try:
        bound = float(text)
    except ValueError:
        return None
    return bound if math.isinf(bound) else bound / divisor


def _shown(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


# The one key object of each revision identified, and the one identity object of each series: the
# typed reading of a sample (by the raw text of its labels, _TYPED_IDENTITIES) and the generic one (a
# backfill's range answers, read once per series) share these, and a pod's thirty series share its
# interned name instead of keeping thirty copies of it, and of its revision's and namespace's.
_IDENTITIES_MAX = 500_000
_REVISIONS: dict[RevisionKey, RevisionKey] = {}
_KEPT: dict[tuple[RevisionKey, SeriesId], tuple[RevisionKey, SeriesId]] = {}


def _series_id(labels: Mapping[str, object], divisor: float) -> tuple[RevisionKey, SeriesId] | str:
    """The identity of a series read from its labels as a dict (the generic reading). Not cached by
    its labels: the live tick reads the typed answer, and a range answer reads each series once for
    all its points (a cache by label values held every series of every backfill, about 10 MiB at
    1,000 rollouts, for nothing)."""
    identified = _read_series_id(labels, divisor)
    return identified if isinstance(identified, str) else _kept(identified)


def _kept(identified: tuple[RevisionKey, SeriesId]) -> tuple[RevisionKey, SeriesId]:
    """An identity as the caches keep it: one key object per revision, which its series share, and
    interned label values."""
    found = _KEPT.get(identified)
    if found is not None:
        return found  # read before, by the other reading (typed or generic) or another divisor
    revision, series = identified
    if len(_REVISIONS) >= _IDENTITIES_MAX:
        _REVISIONS.clear()
    if len(_KEPT) >= _IDENTITIES_MAX:
        _KEPT.clear()
    kept = (
        _REVISIONS.setdefault(revision, revision),
        series._replace(
            kind=intern(series.kind), pod=intern(series.pod), code_class=intern(series.code_class)
        ),
    )
    _KEPT[kept] = kept
    return kept


def _read_series_id(labels: Mapping[str, object], divisor: float) -> tuple[RevisionKey, SeriesId] | str:
    namespace, revision = labels.get("namespace"), labels.get("revision")
    if not isinstance(namespace, str) or not isinstance(revision, str):
        return f"a counter series without namespace/revision: {_brief(labels)}"
    kind = labels.get(FIELD_LABEL)
    pod = labels.get("pod", "")
    code = labels.get(CODE_CLASS_LABEL, "")
    known = kind in (COUNTER_FIELD, OOM_FIELD) or _is_bucket(kind)
    if not known or not isinstance(pod, str) or not isinstance(code, str):
        return f"an unexpected counter series: {_brief(labels)}"
    le = _INF
    if _is_bucket(kind):
        # Only the request latency is in the profile's unit (OpenCensus: ms); vLLM's are seconds.
        parsed = _le_seconds(str(labels.get("le", "")), divisor if kind == BUCKET_FIELD else 1.0)
        if parsed is None:
            return f"a bucket series without a readable le: {_brief(labels)}"
        le = parsed
    return RevisionKey(namespace, revision), SeriesId(str(kind), pod, code, le)


def _brief(value: object, limit: int = 120) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class CounterSeries(msgspec.Struct, gc=False):
    """One series of a counter query's instant answer: its labels as the answer wrote them (raw
    JSON, decoded only the first time they are seen) and ``[time, "value"]``."""

    metric: msgspec.Raw
    value: tuple[float, str]


# The typed reading of a counter sample (PrometheusClient.instant(typed=...)): a series' labels are
# looked up by their raw text, not decoded into a dict of strings each tick — a thousand rollouts'
# sample is a hundred thousand series every tick, and decoding them was most of the controller's time.
COUNTER_VECTOR = vector_decoder(CounterSeries)

# Identities by the raw text of their labels, per ``le`` divisor (an identity whose labels Prometheus
# wrote another way is read again, never misread).
_TYPED_IDENTITIES: dict[float, dict[bytes, tuple[RevisionKey, SeriesId]]] = {}


def _typed_series_id(
    raw: bytes, divisor: float, known: dict[bytes, tuple[RevisionKey, SeriesId]]
) -> tuple[RevisionKey, SeriesId] | str:
    labels = json.loads(raw)  # valid JSON: the typed decoder read it; read as the generic path does
    if not isinstance(labels, dict):
        return f"an unreadable series: {_brief(raw.decode(errors='replace'))}"
    identified = _read_series_id(labels, divisor)
    if isinstance(identified, str):
        return identified
    identified = _kept(identified)
    if len(known) >= _IDENTITIES_MAX:
        known.clear()
    known[raw] = identified
    return identified


class _Collector:
    def __init__(self) -> None:
        self.values: dict[RevisionKey, dict[SeriesId, float]] = {}
        self.invalid: dict[RevisionKey, str] = {}

    def add(self, key: RevisionKey, series: SeriesId, text: object, metric: str) -> str | None:
        try:
            value = float(str(text))
        except ValueError:
            return f"an unreadable sample: {_brief(text)}"
        values = self.values.setdefault(key, {})
        if not math.isfinite(value):
            what = "request counter" if series.kind == COUNTER_FIELD else "latency bucket"
            self.invalid.setdefault(
                key, f"Prometheus answered {_shown(value)} for a {what} series of {metric}"
            )
            return None
        if series in values:
            return f"two series for {key.namespace}/{key.revision} {tuple(series)}"
        values[series] = value
        return None

    def sample(self, key: RevisionKey) -> RevisionSample:
        return RevisionSample(self.values.get(key, {}), self.invalid.get(key, ""))


def _labels(series: object) -> Mapping[str, object] | None:
    if not isinstance(series, dict):
        return None
    labels = series.get("metric", {})
    return labels if isinstance(labels, dict) else None


def parse_counter_vector(
    outcome: QueryOutcome, revisions: Collection[RevisionKey], *, divisor: float = 1.0, metric: str = ""
) -> dict[RevisionKey, RevisionSample] | QueryFailure:
    """Per revision asked for, its raw counter values (an empty sample: no series)."""
    if outcome.failure is not None:
        return outcome.failure
    answer = outcome.answer
    if answer is None or answer.result_type != "vector" or not isinstance(answer.result, list):
        kind = answer.result_type if answer is not None else "nothing"
        return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"expected an instant vector, got a {kind}")
    wanted = set(revisions)
    collector = _Collector()
    if answer.result and isinstance(answer.result[0], CounterSeries):
        return _parse_typed_vector(answer.result, wanted, collector, divisor, metric)
    for series in answer.result:
        labels = _labels(series)
        pair = series.get("value") if isinstance(series, dict) else None
        if labels is None or not isinstance(pair, list) or len(pair) != 2:
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable series: {_brief(series)}")
        identified = _series_id(labels, divisor)
        if isinstance(identified, str):
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, identified)
        key, series_id = identified
        if key not in wanted:
            continue  # a namespace x revision combination nobody asked for
        problem = collector.add(key, series_id, pair[1], metric)
        if problem is not None:
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, problem)
    return {key: collector.sample(key) for key in wanted}


def _parse_typed_vector(
    result: Sequence[CounterSeries],
    wanted: Collection[RevisionKey],
    collector: _Collector,
    divisor: float,
    metric: str,
) -> dict[RevisionKey, RevisionSample] | QueryFailure:
    """parse_counter_vector over an answer read by :data:`COUNTER_VECTOR`: the same rules."""
    known = _TYPED_IDENTITIES.setdefault(divisor, {})
    # Per revision seen (by the identity of its key, which the identities share): its values, or
    # None when nobody asked for it. RevisionKey hashes in Python; this is the loop of the sample.
    revisions: dict[int, tuple[RevisionKey, dict[SeriesId, float] | None]] = {}
    for series in result:
        raw = bytes(series.metric)
        identified = known.get(raw) or _typed_series_id(raw, divisor, known)
        if isinstance(identified, str):
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, identified)
        key, series_id = identified
        seen = revisions.get(id(key))
        if seen is None:  # the key stays referenced here: its id is not reused within the loop
            seen = revisions[id(key)] = (key, collector.values.setdefault(key, {}) if key in wanted else None)
        values = seen[1]
        if values is None:
            continue  # a namespace x revision combination nobody asked for
        text = series.value[1]
        try:
            value = float(text)
        except ValueError:
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable sample: {_brief(text)}")
        if not math.isfinite(value) or series_id in values:  # the rare cases, by the collector's rules
            problem = collector.add(key, series_id, text, metric)
            if problem is not None:
                return QueryFailure(ErrorClass.UNEXPECTED_RESULT, problem)
            continue
        values[series_id] = value
    return {key: collector.sample(key) for key in wanted}


def parse_counter_matrix(
    outcome: QueryOutcome, revisions: Collection[RevisionKey], *, divisor: float = 1.0, metric: str = ""
) -> dict[float, dict[RevisionKey, RevisionSample]] | QueryFailure:
    """A range query's answer per evaluation time (Unix seconds), per revision asked for."""
    if outcome.failure is not None:
        return outcome.failure
    answer = outcome.answer
    if answer is None or answer.result_type != "matrix" or not isinstance(answer.result, list):
        kind = answer.result_type if answer is not None else "nothing"
        return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"expected a range vector, got a {kind}")
    wanted = set(revisions)
    collectors: dict[float, _Collector] = {}
    for series in answer.result:
        labels = _labels(series)
        points = series.get("values") if isinstance(series, dict) else None
        if labels is None or not isinstance(points, list):
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable series: {_brief(series)}")
        identified = _series_id(labels, divisor)
        if isinstance(identified, str):
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, identified)
        key, series_id = identified
        if key not in wanted:
            continue
        for point in points:
            if not isinstance(point, list) or len(point) != 2:
                return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable point: {_brief(point)}")
            try:
                moment = float(point[0])
            except (TypeError, ValueError):
                return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable time: {_brief(point)}")
            problem = collectors.setdefault(moment, _Collector()).add(key, series_id, point[1], metric)
            if problem is not None:
                return QueryFailure(ErrorClass.UNEXPECTED_RESULT, problem)
    return {moment: {key: c.sample(key) for key in wanted} for moment, c in sorted(collectors.items())}


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
    revisions = sorted(series)
    groups: list[tuple[list[RevisionKey], int]] = []  # revisions, points per chunk
    current: list[RevisionKey] = []
    current_series = 0
    points = min(total_points, max_points)
    for revision in revisions:
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
    chunks = []
    for members, per_chunk in groups:
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
        if measure in {MetricKind.RESTARTS.value, MetricKind.OOM_KILLS.value}:
            detail = f"kube-state-metrics shows no pods of {_where(revision)} in the window"
        elif measure == REQUESTS:
            detail = (
                f"no request series for {_where(revision)} in the window "
                "(no requests yet, or its metrics are not scraped)"
            )
        elif measure == MetricKind.ERROR_RATE.value:
            detail = f"no request series for {_where(revision)} in the window: an error rate needs requests"
        else:
            detail = f"no latency series for {_where(revision)} in the window"
        return Measurement.no_data(detail, unit, query=query, duration=duration)
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


# ---------------------------------------------------------------------------------------------
# Gauge peaks: per tick, the peak of each series over the time since the previous tick


@dataclass(frozen=True, slots=True)
class PeakSample:
    """One revision's per-series peaks over one span: series -> {evidence_field: value}."""

    values: Mapping[frozenset[tuple[str, str]], Mapping[str, float]]


@dataclass(frozen=True, slots=True)
class PeakEntry:
    """The peaks of one revision's series in ``(start, end]``."""

    start: datetime
    end: datetime
    fields: Mapping[str, float]  # evidence_field -> the maximum over the revision's series
    series: frozenset[frozenset[tuple[str, str]]]


def _maximum(values: Iterable[float]) -> float | None:
    """``max_over_time``'s rule: NaN only when everything is NaN."""
    numbers = list(values)
    if not numbers:
        return None
    real = [value for value in numbers if not math.isnan(value)]
    return max(real) if real else math.nan


@dataclass(slots=True)
class _PeakTrack:
    entries: list[PeakEntry] = field(default_factory=list)
    asks: dict[Hashable, tuple[datetime, datetime]] = field(default_factory=dict)
    backfilled_from: datetime | None = None


class PeakBook:
    """Per revision, the peaks of its gauge series tick by tick; a window's peak is the maximum of
    the entries inside it, and the series behind it are those seen in any of them."""

    def __init__(self, *, tolerance: timedelta, idle: timedelta = timedelta(minutes=15)) -> None:
        self.tolerance = tolerance
        self.idle = idle
        self._tracks: dict[RevisionKey, _PeakTrack] = {}

    def tracked(self) -> set[RevisionKey]:
        return set(self._tracks)

    def asked(self, revision: RevisionKey, asker: Hashable, start: datetime, at: datetime) -> None:
        self._tracks.setdefault(revision, _PeakTrack()).asks[asker] = (start, at)

    def entries(self, revision: RevisionKey) -> tuple[PeakEntry, ...]:
        track = self._tracks.get(revision)
        return tuple(track.entries) if track is not None else ()

    def last_end(self, revision: RevisionKey) -> datetime | None:
        track = self._tracks.get(revision)
        return track.entries[-1].end if track is not None and track.entries else None

    def needs_backfill(self, revision: RevisionKey, start: datetime) -> bool:
        track = self._tracks.get(revision)
        if track is None:
            return True
        if track.backfilled_from is not None and track.backfilled_from <= start + self.tolerance:
            return False
        return not track.entries or track.entries[0].start > start + self.tolerance

    def record(self, revision: RevisionKey, start: datetime, end: datetime, sample: PeakSample) -> bool:
        track = self._tracks.setdefault(revision, _PeakTrack())
        if end <= start or (track.entries and end <= track.entries[-1].end):
            return False
        names = {name for fields in sample.values.values() for name in fields}
        maxima = {
            name: value
            for name in names
            if (value := _maximum(f[name] for f in sample.values.values() if name in f)) is not None
        }
        track.entries.append(PeakEntry(start, end, maxima, frozenset(sample.values)))
        return True

    def replay(
        self, revision: RevisionKey, entries: Iterable[tuple[datetime, datetime, PeakSample]], start: datetime
    ) -> None:
        old = self._tracks.get(revision)
        self._tracks[revision] = _PeakTrack(asks=dict(old.asks) if old is not None else {})
        for entry_start, entry_end, sample in sorted(entries, key=lambda item: item[1]):
            self.record(revision, entry_start, entry_end, sample)
        self._tracks[revision].backfilled_from = start

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
        series = frozenset().union(*(entry.series for entry in inside)) if inside else frozenset()
        names = {name for entry in inside for name in entry.fields}
        maxima = {
            name: value
            for name in names
            if (value := _maximum(e.fields[name] for e in inside if name in e.fields)) is not None
        }
        return maxima, len(series)

    def prune(self, now: datetime) -> None:
        for revision in list(self._tracks):
            track = self._tracks[revision]
            track.asks = {who: ask for who, ask in track.asks.items() if ask[1] >= now - self.idle}
            if not track.asks:
                del self._tracks[revision]
                continue
            oldest = min(start for start, _ in track.asks.values()) - self.tolerance
            track.entries = [entry for entry in track.entries if entry.start >= oldest or entry.end > oldest]


def parse_peaks(
    outcome: QueryOutcome, revisions: Collection[RevisionKey]
) -> dict[RevisionKey, PeakSample] | QueryFailure:
    """A peak query's instant answer, per revision asked for."""
    if outcome.failure is not None:
        return outcome.failure
    answer = outcome.answer
    if answer is None or answer.result_type != "vector" or not isinstance(answer.result, list):
        kind = answer.result_type if answer is not None else "nothing"
        return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"expected an instant vector, got a {kind}")
    found = _peak_series(
        [(series, series.get("value") if isinstance(series, dict) else None) for series in answer.result],
        revisions,
    )
    if isinstance(found, QueryFailure):
        return found
    return {key: PeakSample(found.get(key, {})) for key in revisions}


def parse_peak_matrix(
    outcome: QueryOutcome, revisions: Collection[RevisionKey]
) -> dict[float, dict[RevisionKey, PeakSample]] | QueryFailure:
    """A peak query's range answer, per evaluation time, per revision asked for."""
    if outcome.failure is not None:
        return outcome.failure
    answer = outcome.answer
    if answer is None or answer.result_type != "matrix" or not isinstance(answer.result, list):
        kind = answer.result_type if answer is not None else "nothing"
        return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"expected a range vector, got a {kind}")
    by_time: dict[float, list[tuple[object, object]]] = {}
    for series in answer.result:
        points = series.get("values") if isinstance(series, dict) else None
        if not isinstance(points, list):
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable series: {_brief(series)}")
        for point in points:
            if not isinstance(point, list) or len(point) != 2:
                return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable point: {_brief(point)}")
            try:
                moment = round(float(point[0]), 3)
            except (TypeError, ValueError):
                return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable time: {_brief(point)}")
            by_time.setdefault(moment, []).append((series, point))
    result: dict[float, dict[RevisionKey, PeakSample]] = {}
    for moment, pairs in sorted(by_time.items()):
        found = _peak_series(pairs, revisions)
        if isinstance(found, QueryFailure):
            return found
        result[moment] = {key: PeakSample(found.get(key, {})) for key in revisions}
    return result


def _peak_series(
    pairs: Sequence[tuple[object, object]], revisions: Collection[RevisionKey]
) -> dict[RevisionKey, dict[frozenset[tuple[str, str]], dict[str, float]]] | QueryFailure:
    wanted = set(revisions)
    found: dict[RevisionKey, dict[frozenset[tuple[str, str]], dict[str, float]]] = {}
    for series, pair in pairs:
        labels = _labels(series)
        if labels is None or not isinstance(pair, list) or len(pair) != 2:
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable series: {_brief(series)}")
        namespace, revision, kind = labels.get("namespace"), labels.get("revision"), labels.get(FIELD_LABEL)
        if not isinstance(namespace, str) or not isinstance(revision, str) or not isinstance(kind, str):
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unexpected peak series: {_brief(labels)}")
        key = RevisionKey(namespace, revision)
        if key not in wanted:
            continue
        try:
            value = float(str(pair[1]))
        except ValueError:
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable sample: {_brief(pair)}")
        identity = frozenset((str(name), str(text)) for name, text in labels.items() if name != FIELD_LABEL)
        found.setdefault(key, {}).setdefault(identity, {})[kind] = value
    return found
