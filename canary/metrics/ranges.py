"""Range queries for people (the dashboard's charts, the HTML report), through the controller's
:class:`~canary.metrics.client.PrometheusClient`: the same bounded answers, no redirects followed,
its retry habits and its error classes (:class:`~canary.evidence.ErrorClass`).

One interval, one step; each answer is a list of ``(labels, [(t, v), ...])`` with the values that are
not finite (``NaN`` gaps, ``±Inf``) left out. A failure raises :class:`RangeQueryError`, which says
the error class and Prometheus' detail (secrets already scrubbed by the client).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from canary.evidence import ErrorClass
from canary.metrics.client import PrometheusClient, PrometheusConfig, QueryFailure

__all__ = ["RangeQueryError", "RangeReader", "Series", "probe"]

Series = tuple[dict[str, str], list[tuple[float, float]]]


class RangeQueryError(Exception):
    """A range query that Prometheus did not answer: its error class and detail."""

    def __init__(self, failure: QueryFailure) -> None:
        self.error_class: ErrorClass = failure.error_class
        self.detail = failure.detail
        super().__init__(f"{failure.error_class}: {failure.detail}")


class RangeReader:
    """``/api/v1/query_range`` over [start, end] every ``step`` seconds (epoch seconds)."""

    def __init__(self, client: PrometheusClient, start: float, end: float, step: float) -> None:
        self._client = client
        self._start = datetime.fromtimestamp(start, UTC)
        self._end = datetime.fromtimestamp(end, UTC)
        self._step = step

    @classmethod
    def at(cls, url: str, start: float, end: float, step: float, *, timeout: float = 30.0) -> RangeReader:
        """A reader with its own client for ``url`` (the report's one-shot use)."""
        return cls(PrometheusClient(PrometheusConfig(url=url, timeout=timeout)), start, end, step)

    def query(self, promql: str) -> list[Series]:
        outcome = self._client.range_query(promql, self._start, self._end, self._step)
        if outcome.failure is not None:
            raise RangeQueryError(outcome.failure)
        assert outcome.answer is not None
        if outcome.answer.result_type != "matrix":
            raise RangeQueryError(
                QueryFailure(ErrorClass.UNEXPECTED_RESULT, f"a {outcome.answer.result_type}, not a matrix")
            )
        return [_series(item) for item in outcome.answer.result]


def _series(item: Any) -> Series:
    points = [(float(t), float(v)) for t, v in item.get("values", ())]
    return dict(item.get("metric", {})), [(t, v) for t, v in points if math.isfinite(v)]


def probe(client: PrometheusClient, at: datetime) -> QueryFailure | None:
    """One cheap instant query (``1``): None when Prometheus answers, else why not."""
    return client.instant("1", at).failure
