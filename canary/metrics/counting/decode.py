"""Reading the counter query's answers: per revision asked for, its raw counter values.

At a thousand rollouts a sample is one answer of about a hundred thousand series, every tick. It is
read with a typed decoder (:data:`COUNTER_VECTOR`): each series' labels stay raw JSON, looked up by
their text among the identities already read (decoded only the first time), so no dict or label
string is made per series. An answer that does not fit the type is read generically, and means the
same. Both readings keep one :class:`~canary.metrics.catalog.RevisionKey` object per revision, which
its series share, and interned label values: a pod's thirty series share its name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping, Sequence
from sys import intern

import msgspec

from canary.evidence import ErrorClass
from canary.metrics.answers import brief, labels_of, result_of, shown
from canary.metrics.catalog import FIELD_LABEL, NAMESPACE_LABEL, POD_LABEL, REVISION_LABEL, RevisionKey
from canary.metrics.client import QueryFailure, QueryOutcome, vector_decoder
from canary.metrics.counting.rules import RevisionSample, SeriesId, is_bucket
from canary.metrics.tick_queries import BUCKET_FIELD, CODE_CLASS_LABEL, COUNTER_FIELD, NEWEST_FIELD, OOM_FIELD

__all__ = ["COUNTER_VECTOR", "CounterSeries", "parse_counter_matrix", "parse_counter_vector"]

Identity = tuple[RevisionKey, SeriesId]
NEWEST = SeriesId(NEWEST_FIELD, "", "")  # a revision's newest counter sample time (the query's own)

# The identities kept, shared by both readings (at most this many: cleared when full).
_IDENTITIES_MAX = 500_000
_REVISIONS: dict[RevisionKey, RevisionKey] = {}
_KEPT: dict[Identity, Identity] = {}


def _series_id(labels: Mapping[str, object], divisor: float) -> Identity | str:
    """The identity of a series read from its labels as a dict (the generic reading). Not cached by
    its labels: the live tick reads the typed answer, and a range answer reads each series once for
    all its points."""
    identified = _read_series_id(labels, divisor)
    return identified if isinstance(identified, str) else _kept(identified)


def _kept(identified: Identity) -> Identity:
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


def _read_series_id(labels: Mapping[str, object], divisor: float) -> Identity | str:
    """A series' identity from its labels, or what is wrong with them."""
    namespace, revision = labels.get(NAMESPACE_LABEL), labels.get(REVISION_LABEL)
    if not isinstance(namespace, str) or not isinstance(revision, str):
        return f"a counter series without namespace/revision: {brief(labels)}"
    kind = labels.get(FIELD_LABEL)
    pod = labels.get(POD_LABEL, "")
    code = labels.get(CODE_CLASS_LABEL, "")
    known = kind in (COUNTER_FIELD, OOM_FIELD, NEWEST_FIELD) or is_bucket(kind)
    if not known or not isinstance(pod, str) or not isinstance(code, str):
        return f"an unexpected counter series: {brief(labels)}"
    le = math.inf
    if is_bucket(kind):
        # Only the request latency is in the profile's unit (OpenCensus: ms); vLLM's are seconds.
        parsed = _le_seconds(str(labels.get("le", "")), divisor if kind == BUCKET_FIELD else 1.0)
        if parsed is None:
            return f"a bucket series without a readable le: {brief(labels)}"
        le = parsed
    return RevisionKey(namespace, revision), SeriesId(str(kind), pod, code, le)


def _le_seconds(text: str, divisor: float) -> float | None:
    try:
        bound = float(text)
    except ValueError:
        return None
    return bound if math.isinf(bound) else bound / divisor


class CounterSeries(msgspec.Struct, gc=False):
    """One series of a counter query's instant answer: its labels as the answer wrote them (raw
    JSON, decoded only the first time they are seen) and ``[time, "value"]``."""

    metric: msgspec.Raw
    value: tuple[float, str]


# The typed reading of a counter sample (PrometheusClient.instant(typed=...)).
COUNTER_VECTOR = vector_decoder(CounterSeries)

# Identities by the raw text of their labels, per ``le`` divisor (an identity whose labels Prometheus
# wrote another way is read again, never misread).
_TYPED_IDENTITIES: dict[float, dict[bytes, Identity]] = {}


def _typed_series_id(raw: bytes, divisor: float, known: dict[bytes, Identity]) -> Identity | str:
    labels = json.loads(raw)  # valid JSON: the typed decoder read it; read as the generic path does
    if not isinstance(labels, dict):
        return f"an unreadable series: {brief(raw.decode(errors='replace'))}"
    identified = _read_series_id(labels, divisor)
    if isinstance(identified, str):
        return identified
    identified = _kept(identified)
    if len(known) >= _IDENTITIES_MAX:
        known.clear()
    known[raw] = identified
    return identified


class _Collector:
    """A sample's values per revision, and the first non-finite value each had."""

    def __init__(self) -> None:
        self.values: dict[RevisionKey, dict[SeriesId, float]] = {}
        self.invalid: dict[RevisionKey, str] = {}

    def add(self, key: RevisionKey, series: SeriesId, text: object, metric: str) -> str | None:
        try:
            value = float(str(text))
        except ValueError:
            return f"an unreadable sample: {brief(text)}"
        values = self.values.setdefault(key, {})
        if not math.isfinite(value):
            what = "request counter" if series.kind == COUNTER_FIELD else "latency bucket"
            self.invalid.setdefault(
                key, f"Prometheus answered {shown(value)} for a {what} series of {metric}"
            )
            return None
        if series in values:
            return f"two series for {key.namespace}/{key.revision} {tuple(series)}"
        values[series] = value
        return None

    def sample(self, key: RevisionKey) -> RevisionSample:
        values = self.values.get(key, {})
        # The time of the revision's newest sample travels beside its counters, not as one.
        newest = values.pop(NEWEST, None) if values else None
        return RevisionSample(values, self.invalid.get(key, ""), newest)


def _unexpected(detail: str) -> QueryFailure:
    return QueryFailure(ErrorClass.UNEXPECTED_RESULT, detail)


def parse_counter_vector(
    outcome: QueryOutcome, revisions: Collection[RevisionKey], *, divisor: float = 1.0, metric: str = ""
) -> dict[RevisionKey, RevisionSample] | QueryFailure:
    """Per revision asked for, its raw counter values (an empty sample: no series)."""
    result = result_of(outcome, "vector")
    if isinstance(result, QueryFailure):
        return result
    wanted = set(revisions)
    collector = _Collector()
    if result and isinstance(result[0], CounterSeries):
        return _parse_typed_vector(result, wanted, collector, divisor, metric)
    for series in result:
        labels = labels_of(series)
        pair = series.get("value") if isinstance(series, dict) else None
        if labels is None or not isinstance(pair, list) or len(pair) != 2:
            return _unexpected(f"an unreadable series: {brief(series)}")
        identified = _series_id(labels, divisor)
        if isinstance(identified, str):
            return _unexpected(identified)
        key, series_id = identified
        if key not in wanted:
            continue  # a namespace x revision combination nobody asked for
        problem = collector.add(key, series_id, pair[1], metric)
        if problem is not None:
            return _unexpected(problem)
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
            return _unexpected(identified)
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
            return _unexpected(f"an unreadable sample: {brief(text)}")
        if not math.isfinite(value) or series_id in values:  # the rare cases, by the collector's rules
            problem = collector.add(key, series_id, text, metric)
            if problem is not None:
                return _unexpected(problem)
            continue
        values[series_id] = value
    return {key: collector.sample(key) for key in wanted}


def parse_counter_matrix(
    outcome: QueryOutcome, revisions: Collection[RevisionKey], *, divisor: float = 1.0, metric: str = ""
) -> dict[float, dict[RevisionKey, RevisionSample]] | QueryFailure:
    """A range query's answer per evaluation time (Unix seconds), per revision asked for."""
    result = result_of(outcome, "matrix")
    if isinstance(result, QueryFailure):
        return result
    wanted = set(revisions)
    collectors: dict[float, _Collector] = {}
    for series in result:
        labels = labels_of(series)
        points = series.get("values") if isinstance(series, dict) else None
        if labels is None or not isinstance(points, list):
            return _unexpected(f"an unreadable series: {brief(series)}")
        identified = _series_id(labels, divisor)
        if isinstance(identified, str):
            return _unexpected(identified)
        key, series_id = identified
        if key not in wanted:
            continue
        for point in points:
            problem = _add_point(collectors, key, series_id, point, metric)
            if problem is not None:
                return _unexpected(problem)
    return {moment: {key: c.sample(key) for key in wanted} for moment, c in sorted(collectors.items())}


def _add_point(
    collectors: dict[float, _Collector], key: RevisionKey, series: SeriesId, point: object, metric: str
) -> str | None:
    """One ``[time, "value"]`` of a range answer added to its time's sample; or what is wrong with it."""
    moment = point_time(point)
    if isinstance(moment, str):
        return moment
    assert isinstance(point, list)
    return collectors.setdefault(moment, _Collector()).add(key, series, point[1], metric)


def point_time(point: object) -> float | str:
    """The time of a ``[time, "value"]`` point of a range answer, or what is wrong with the point."""
    if not isinstance(point, list) or len(point) != 2:
        return f"an unreadable point: {brief(point)}"
    try:
        return float(point[0])
    except (TypeError, ValueError):
        return f"an unreadable time: {brief(point)}"
