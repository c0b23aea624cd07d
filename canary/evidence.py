"""The vocabulary between the evidence layer (``canary.metrics``) and the decision core (``canary.rollout``).

The core says *what* it needs to know (:class:`EvidenceRequest`: which revisions, over which window,
for which checks); an :class:`EvidenceSource` answers with :class:`Evidence`. Both are plain values,
so the same core runs against a live Prometheus, recorded data in a backtest, or a simulation.

Three outcomes per measurement, never confused with each other:

* ``ok`` — a finite or infinite value the check can be judged on;
* ``no-data`` — nothing to judge yet (no requests, too few, no pods): the step cannot pass;
* ``error`` — *we* could not ask (Prometheus down, slow, bad query): never a failed check and never
  counted towards ``onNoData``; the rollout holds and the evaluation is retried.

and a fourth, treated like ``error`` by the judge:

* ``invalid-value`` — Prometheus answered a number no limit can be judged on (``NaN``, ``+Inf``,
  ``-Inf``: a division by zero, an overflowing counter, a broken exporter): never a pass, never a fail,
  never counted as no-data; the rollout holds and the reason names the check and the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from canary.policy.model import Check, PromotionPolicy
from canary.policy.units import Unit

__all__ = [
    "FRACTION_SUFFIX",
    "REQUESTS",
    "ErrorClass",
    "Evidence",
    "EvidenceRequest",
    "EvidenceSource",
    "EvidenceStatus",
    "Measurement",
    "fraction_key",
]

# The name under which the canary's request count (minRequests) travels in Evidence.
REQUESTS = "request-count"
FRACTION_SUFFIX = ":fraction"


def fraction_key(check: Check | str) -> str:
    """Where gpu-memory-peak's used/total fraction (judged against ``maxFraction``) travels in Evidence.

    Check names cannot contain ``:``, so the key never collides with a check's own.
    """
    return (check if isinstance(check, str) else check.name) + FRACTION_SUFFIX


class EvidenceStatus(StrEnum):
    OK = "ok"
    NO_DATA = "no-data"
    ERROR = "error"
    INVALID_VALUE = "invalid-value"  # NaN or ±Inf from Prometheus: judged like a query problem


class ErrorClass(StrEnum):
    """Why a query could not be answered — always the controller's problem, not the canary's."""

    UNREACHABLE = "unreachable"  # connection refused, DNS, TLS
    TIMEOUT = "timeout"  # client timeout or Prometheus' own 503 timeout
    BAD_QUERY = "bad-query"  # HTTP 400 bad_data: a malformed (custom) query
    EXECUTION = "execution"  # HTTP 422: the query could not be executed
    UNEXPECTED_RESULT = "unexpected-result"  # several series or a matrix where one value was expected
    SERVER = "server"  # any other non-2xx answer
    UNAVAILABLE = "unavailable"  # Prometheus (or its proxy) answered that it cannot serve: 503, 502, 429
    MALFORMED_RESPONSE = "malformed-response"  # not a Prometheus answer: not JSON, truncated, HTML, no data


@dataclass(frozen=True, slots=True)
class Measurement:
    """One value for one revision, with everything needed to explain a decision made on it."""

    status: EvidenceStatus
    value: float | None = None  # canonical unit (seconds, fraction, bytes, count); None unless ok
    unit: Unit = Unit.NONE
    samples: float | None = None  # requests (or pods, or scrape samples) behind the value
    query: str = ""  # the resolved PromQL
    duration: float = 0.0  # seconds spent asking
    error_class: ErrorClass | None = None
    detail: str = ""  # why there is no data, or what failed

    @classmethod
    def ok(
        cls, value: float, unit: Unit, *, samples: float | None = None, query: str = "", duration: float = 0.0
    ) -> Measurement:
        return cls(EvidenceStatus.OK, value, unit, samples, query, duration)

    @classmethod
    def no_data(
        cls,
        detail: str,
        unit: Unit = Unit.NONE,
        *,
        samples: float | None = None,
        query: str = "",
        duration: float = 0.0,
    ) -> Measurement:
        return cls(EvidenceStatus.NO_DATA, None, unit, samples, query, duration, None, detail)

    @classmethod
    def error(
        cls,
        error_class: ErrorClass,
        detail: str,
        unit: Unit = Unit.NONE,
        *,
        query: str = "",
        duration: float = 0.0,
    ) -> Measurement:
        return cls(EvidenceStatus.ERROR, None, unit, None, query, duration, error_class, detail)

    @classmethod
    def invalid(
        cls,
        detail: str,
        unit: Unit = Unit.NONE,
        *,
        samples: float | None = None,
        query: str = "",
        duration: float = 0.0,
    ) -> Measurement:
        """A value Prometheus answered that cannot be judged (NaN, ±Inf); ``detail`` names it."""
        return cls(EvidenceStatus.INVALID_VALUE, None, unit, samples, query, duration, None, detail)


@dataclass(frozen=True, slots=True)
class EvidenceRequest:
    """What the core wants measured: the checks, for the canary (and stable revision), over [start, at]."""

    namespace: str
    inference_service: str
    canary_revision: str
    stable_revision: str | None  # None when there is nothing to compare with (e.g. while baking)
    window_start: datetime
    at: datetime  # evaluation time T: every query is evaluated at T with its window ending at T
    checks: tuple[Check, ...]
    compare_with_stable: bool = True  # False while baking: absolute limits only

    @property
    def window_seconds(self) -> float:
        return (self.at - self.window_start).total_seconds()


@dataclass(frozen=True, slots=True)
class Evidence:
    """The answer to an :class:`EvidenceRequest`.

    ``canary`` and ``stable`` map a check name (and :data:`REQUESTS`) to its measurement; a check
    without relative limits has no stable measurement.
    """

    request: EvidenceRequest
    canary: Mapping[str, Measurement]
    stable: Mapping[str, Measurement] = field(default_factory=dict)
    queries: int = 0  # HTTP round trips it took
    profile: Mapping[str, str] = field(default_factory=dict)  # metric family -> profile used


class EvidenceSource(Protocol):
    """Anything that can answer evidence requests: a Prometheus, recorded data, a simulation."""

    def collect(self, policy: PromotionPolicy, request: EvidenceRequest) -> Evidence: ...
