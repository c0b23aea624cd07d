"""Reading Prometheus' answers: the shape an answer must have, and the grouped and one-value ones.

Every reader of an answer (:mod:`canary.metrics.plan`'s grouped and custom queries, the counter and
peak samples of :mod:`canary.metrics.counting`) names what it did not expect in the same words: a
detail quotes at most a short piece of the answer (:func:`brief`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from canary.evidence import ErrorClass
from canary.metrics.catalog import FIELD_LABEL, NAMESPACE_LABEL, REVISION_LABEL, RevisionKey
from canary.metrics.client import QueryFailure, QueryOutcome

__all__ = [
    "VALUE_FIELD",
    "GroupedAnswer",
    "brief",
    "labels_of",
    "parse_grouped",
    "parse_single",
    "result_of",
    "shown",
]

VALUE_FIELD = "value"  # where a GroupedAnswer keeps a revision's value


def brief(value: object, limit: int = 120) -> str:
    """A piece of Prometheus' answer quoted in a detail: labels can be any length, a detail is short."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def shown(value: float) -> str:
    """A non-finite value as Prometheus writes it."""
    if math.isnan(value):
        return "NaN"
    return "+Inf" if value > 0 else "-Inf"


def result_of(outcome: QueryOutcome, result_type: str) -> list[Any] | QueryFailure:
    """The series of an answer of ``result_type`` (``vector`` or ``matrix``), or why there are none."""
    if outcome.failure is not None:
        return outcome.failure
    answer = outcome.answer
    if answer is None or answer.result_type != result_type or not isinstance(answer.result, list):
        kind = answer.result_type if answer is not None else "nothing"
        expected = "an instant vector" if result_type == "vector" else "a range vector"
        return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"expected {expected}, got a {kind}")
    return answer.result


def labels_of(series: object) -> Mapping[str, object] | None:
    """A series' labels; None when the series or its labels are not objects."""
    if not isinstance(series, dict):
        return None
    labels = series.get("metric", {})
    return labels if isinstance(labels, dict) else None


@dataclass(frozen=True, slots=True)
class GroupedAnswer:
    """A grouped query's answer: per revision, the value and its companion fields; and the revisions
    whose part of a split query failed (:mod:`canary.metrics.split`), with why."""

    values: Mapping[RevisionKey, Mapping[str, float]]
    failures: Mapping[RevisionKey, QueryFailure] = field(default_factory=dict)


def parse_grouped(outcome: QueryOutcome) -> GroupedAnswer | QueryFailure:
    result = result_of(outcome, "vector")
    if isinstance(result, QueryFailure):
        return result
    values: dict[RevisionKey, dict[str, float]] = {}
    for series in result:
        labels = series.get("metric", {}) if isinstance(series, dict) else {}
        if not isinstance(labels, dict):  # Prometheus' labels are an object of strings
            return QueryFailure(
                ErrorClass.UNEXPECTED_RESULT, f"a series whose labels are not an object: {brief(labels)}"
            )
        namespace, revision = labels.get(NAMESPACE_LABEL), labels.get(REVISION_LABEL)
        if not isinstance(namespace, str) or not isinstance(revision, str):
            return QueryFailure(
                ErrorClass.UNEXPECTED_RESULT, f"a series without namespace/revision: {brief(labels)}"
            )
        field = labels.get(FIELD_LABEL, VALUE_FIELD)
        if not isinstance(field, str):
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"a series whose {FIELD_LABEL} is not a string")
        fields = values.setdefault(RevisionKey(namespace, revision), {})
        if field in fields:
            return QueryFailure(
                ErrorClass.UNEXPECTED_RESULT,
                f"several series for {brief(namespace)}/{brief(revision)} ({brief(field)})",
            )
        parsed = _sample_value(series)
        if parsed is None:
            return QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"an unreadable sample: {brief(series)}")
        fields[field] = parsed
    return GroupedAnswer(values)


def parse_single(outcome: QueryOutcome) -> float | QueryFailure | None:
    """One value, ``None`` for an empty answer, or why the answer is not one value."""
    if outcome.failure is not None:
        return outcome.failure
    answer = outcome.answer
    if answer is None:
        return QueryFailure(ErrorClass.UNEXPECTED_RESULT, "no answer")
    if answer.result_type == "scalar":
        value = (
            _number(answer.result[1]) if isinstance(answer.result, list) and len(answer.result) == 2 else None
        )
        return (
            value if value is not None else QueryFailure(ErrorClass.UNEXPECTED_RESULT, "an unreadable scalar")
        )
    if answer.result_type != "vector":
        return QueryFailure(
            ErrorClass.UNEXPECTED_RESULT,
            f"expected one value (an instant vector or a scalar), got a {answer.result_type}"
            + (
                ": a range selector [..] needs an *_over_time function"
                if answer.result_type == "matrix"
                else ""
            ),
        )
    result = answer.result if isinstance(answer.result, list) else []
    if not result:
        return None
    if len(result) > 1:
        quoted = ", ".join(
            brief(series.get("metric", {})) for series in result[:3] if isinstance(series, dict)
        )
        return QueryFailure(
            ErrorClass.UNEXPECTED_RESULT,
            f"{len(result)} series where one was expected ({quoted}{', ...' if len(result) > 3 else ''}); "
            "aggregate it, e.g. sum(...) or max(...)",
        )
    value = _sample_value(result[0])
    return value if value is not None else QueryFailure(ErrorClass.UNEXPECTED_RESULT, "an unreadable sample")


def _sample_value(series: object) -> float | None:
    if not isinstance(series, dict):
        return None
    pair = series.get("value")
    if not isinstance(pair, list) or len(pair) != 2:
        return None
    return _number(pair[1])


def _number(text: object) -> float | None:
    # Prometheus sends numbers as strings: "1e-07", "NaN", "+Inf", "-Inf".
    try:
        return float(str(text))
    except ValueError:
        return None
