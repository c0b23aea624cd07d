"""The other files of the state ConfigMap, as typed records: ``command.json``, ``command-result.json``
and ``explain.json``.

(``state.json`` is :class:`~canary.rollout.state.RolloutState`.) Each record is written by
``to_json`` and read by ``from_json`` and nowhere else: the store, the reconciler, the CLI and the
demo share them. Reading never crashes on what someone put into the ConfigMap — invalid JSON, a
document nested 100,000 deep, an array where an object belongs, a field of the wrong type: each
becomes a :class:`StateFormatError` subclass saying which file and why.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Annotated, Any, TypeVar

from pydantic import AwareDatetime, PlainSerializer, TypeAdapter, ValidationError

from canary.evidence import CanaryQuery, Evidence
from canary.policy.units import Unit, format_value
from canary.rollout.decision import Decision
from canary.rollout.horizon import evidence_until
from canary.rollout.judge import Judgement
from canary.rollout.state import JSON_CONFIG, CommandKind, StateFormatError, read_json_object

__all__ = [
    "COMMAND_TTL",
    "MAX_CANARY_QUERY_CHARS",
    "CommandFormatError",
    "CommandOutcome",
    "CommandRequest",
    "ExplainCheck",
    "ExplainDocument",
    "ExplainFormatError",
    "ExplainGate",
    "ExplainWindow",
]

# Written as Python's isoformat (``+00:00``), as the controller always has.
_Time = Annotated[AwareDatetime, PlainSerializer(datetime.isoformat, return_type=str)]


class CommandFormatError(StateFormatError):
    """``command.json`` cannot be read."""


class ExplainFormatError(StateFormatError):
    """``explain.json`` cannot be read."""


_T = TypeVar("_T")


def _validate(
    adapter: TypeAdapter[_T], document: dict[str, Any], what: str, error: type[StateFormatError]
) -> _T:
    try:
        return adapter.validate_python(document)
    except ValidationError as problem:
        first = problem.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        raise error(f"{what} is invalid at {where}: {first['msg']}") from None
    except RecursionError:
        raise error(f"{what} is nested too deeply to be read") from None


def _dump(adapter: TypeAdapter[_T], record: _T) -> str:
    return json.dumps(adapter.dump_python(record, mode="json", by_alias=True), separators=(",", ":"))


# A command older than this when the controller reads it is expired, whatever it says.
COMMAND_TTL = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class CommandRequest:
    """An operator's command waiting in ``command.json`` for the controller's next decision.

    It is bound to what it means (canary/rollout/SEMANTICS.md, "Commands"): ``revision`` and
    ``step`` (0-based index, None before the first step) are the rollout it was issued for, as the
    issuer read it at ``stateResourceVersion`` (the CLI writes the command under that
    resourceVersion, so it lands only on the state it was read from); ``at`` bounds its life
    (:data:`COMMAND_TTL`); ``id`` names the answer the controller writes (:class:`CommandOutcome`).
    ``by`` is informative only: the controller takes the issuer from the ``command-issuer`` key,
    which the admission policy checks against the Kubernetes identity that wrote it.
    """

    __pydantic_config__ = JSON_CONFIG

    command: CommandKind
    by: str | None = None
    at: _Time | None = None
    reason: str | None = None
    revision: str | None = None
    step: int | None = None
    state_resource_version: str | None = None
    id: str | None = None

    def to_json(self) -> str:
        return _dump(_COMMAND, self)

    @classmethod
    def from_json(cls, text: str | bytes) -> CommandRequest:
        """Raises :class:`CommandFormatError` for anything that is not a command."""
        what = "the operator command (command.json)"
        return _validate(_COMMAND, read_json_object(text, what, CommandFormatError), what, CommandFormatError)


@dataclass(frozen=True, slots=True)
class CommandOutcome:
    """The controller's answer to a command (``command-result.json``), which the CLI waits for.

    ``id`` is the command's own (None when the command could not be read at all).
    """

    __pydantic_config__ = JSON_CONFIG

    command: str
    accepted: bool
    message: str
    at: _Time
    id: str | None = None
    by: str | None = None
    revision: str | None = None

    def to_json(self) -> str:
        return _dump(_OUTCOME, self)

    @classmethod
    def from_json(cls, text: str | bytes) -> CommandOutcome:
        """Raises :class:`CommandFormatError` for anything that is not a command's result."""
        what = "the result of the last command (command-result.json)"
        return _validate(_OUTCOME, read_json_object(text, what, CommandFormatError), what, CommandFormatError)


@dataclass(frozen=True, slots=True)
class ExplainWindow:
    __pydantic_config__ = JSON_CONFIG

    start: _Time
    end: _Time


# A canary query longer than this is not kept in explain.json (a custom query can be long; the
# builtin ones are under 1,000 characters): the ConfigMap holds the state, explain and the record.
MAX_CANARY_QUERY_CHARS = 4096


@dataclass(frozen=True, slots=True)
class ExplainCheck:
    """One check of the latest evaluation, with its numbers and the PromQL behind them.

    ``query`` is the PromQL the value came from, as the controller ran it (for builtin metrics a
    grouped query over several revisions, or the per-tick counter sample); ``canary_query``
    (``canaryQuery``) one that returns the canary's value alone over the evaluated window, evaluated
    at the window's end, and ``canary_query_note`` why Prometheus' answer to it can differ slightly
    from ``value`` (canary.metrics.explain_queries). None in records written before it existed.
    ``stable_query`` (``stableQuery``) is the same query for the stable revision (the dashboard
    draws both over the rollout); None without a stable revision or when too long to keep.
    """

    __pydantic_config__ = JSON_CONFIG

    name: str
    verdict: str
    value: float | None = None
    unit: Unit = Unit.NONE
    limit: str = ""
    stable: float | None = None
    samples: float | None = None
    critical: bool = False
    detail: str = ""
    query: str = ""
    canary_query: str | None = None
    canary_query_note: str = ""
    stable_query: str | None = None
    # The bounds the judge compared the canary with (the tightest of the absolute and the relative
    # limits, a relative one from the stable revision's bound, not its estimate); None: not known.
    max_allowed: float | None = None
    min_allowed: float | None = None

    def bounds(self) -> list[tuple[str, float]]:
        """The judge's bounds as ``("≤ 481ms", 0.481)``: what explain, the dashboard and the report
        show as the limit applied."""
        drawn = []
        for sign, value in (("≤", self.max_allowed), ("≥", self.min_allowed)):
            if value is not None and math.isfinite(value):
                drawn.append((f"{sign} {format_value(value, self.unit)}", value))
        return drawn


@dataclass(frozen=True, slots=True)
class ExplainGate:
    """One gate of the rollout at one call point (canary/rollout/gates.py), as the state records it."""

    __pydantic_config__ = JSON_CONFIG

    name: str
    at: str  # pre-rollout, step, pre-promotion
    since: _Time  # first called: the deadline counts from here
    weight: int | None = None  # the step's (step gates)
    passed_at: _Time | None = None
    attempts: int = 0  # failed attempts
    last_at: _Time | None = None
    last_status: int | None = None
    last_detail: str = ""
    deadline_passed_at: _Time | None = None


@dataclass(frozen=True, slots=True)
class ExplainDocument:
    """The latest evaluation in full (``explain.json``), for ``kserve-canary explain`` and the demo."""

    __pydantic_config__ = JSON_CONFIG

    at: _Time
    decision_id: str
    revision: str | None = None
    stable_revision: str | None = None
    action: str = ""
    verdict: str | None = None
    requests: float | None = None
    reasons: tuple[str, ...] = ()
    window: ExplainWindow | None = None
    profiles: dict[str, str] = field(default_factory=dict)
    queries: int = 0
    checks: tuple[ExplainCheck, ...] = ()
    gates: tuple[ExplainGate, ...] = ()
    # How far the canary's evidence reached (its newest sample as Prometheus held it), when the
    # evidence said; the window's end minus this is how old the evidence was.
    evidence_until: _Time | None = None

    @property
    def evidence_behind(self) -> timedelta | None:
        """How far behind the evaluation the canary's evidence reached (None: not known)."""
        if self.evidence_until is None or self.window is None:
            return None
        return max(self.window.end - self.evidence_until, timedelta(0))

    @classmethod
    def of(cls, decision: Decision, evidence: Evidence | None, now: datetime) -> ExplainDocument:
        """The record of ``decision``, judged on ``evidence`` at ``now``."""
        canary_queries = evidence.canary_queries if evidence is not None else {}
        stable_queries = evidence.stable_queries if evidence is not None else {}
        return cls(
            at=now,
            decision_id=decision.id,
            revision=decision.revision,
            stable_revision=decision.stable_revision,
            action=str(decision.action),
            verdict=str(decision.verdict) if decision.verdict else None,
            requests=decision.requests,
            reasons=tuple(dict.fromkeys(decision.reasons)),  # one reason per decision, never repeated
            window=(
                ExplainWindow(evidence.request.window_start, evidence.request.at)
                if evidence is not None
                else None
            ),
            profiles=dict(evidence.profile) if evidence is not None else {},
            evidence_until=_reach(evidence),
            queries=evidence.queries if evidence is not None else 0,
            checks=tuple(
                _check(judgement, canary_queries.get(judgement.name), stable_queries.get(judgement.name))
                for judgement in decision.judgements
            ),
            gates=tuple(
                ExplainGate(
                    name=gate.name,
                    at=gate.stage.value,
                    since=gate.since,
                    weight=gate.weight,
                    passed_at=gate.passed_at,
                    attempts=gate.attempts,
                    last_at=gate.last_at,
                    last_status=gate.last_status,
                    last_detail=gate.last_detail,
                    deadline_passed_at=gate.deadline_passed_at,
                )
                for gate in decision.new_state.gates
            ),
        )

    def to_json(self) -> str:
        return _dump(_EXPLAIN, self)

    def without_queries(self) -> ExplainDocument:
        """This evaluation without its checks' PromQL: what comparing evaluations and a status
        read. The queries are most of a stored evaluation (three checks' grouped queries are about
        7 of its 8 kB), and the controller keeps one evaluation per rollout it drives."""
        return replace(
            self,
            checks=tuple(
                replace(check, query="", canary_query=None, canary_query_note="", stable_query=None)
                for check in self.checks
            ),
        )

    def fitted_json(self, max_bytes: int) -> str:
        """This evaluation as JSON of at most ``max_bytes``, shortened as little as it takes and saying
        what it left out: first the grouped queries, then every query, then checks, passing ones first.
        The verdict, the reasons and the failing and critical checks go last."""
        text = self.to_json()
        if len(text.encode()) <= max_bytes:
            return text
        grouped = tuple(replace(check, query="") for check in self.checks)
        bare = tuple(
            replace(check, query="", canary_query=None, canary_query_note="", stable_query=None)
            for check in grouped
        )
        for what, checks in (("the grouped queries", grouped), ("every query", bare)):
            text = self._noted(checks, f"{what} of {len(checks)} checks")
            if len(text.encode()) <= max_bytes:
                return text
        # Keep the most important checks that fit: failing and critical ones first, then in order.
        important = [check.verdict == "fail" or check.critical for check in bare]
        ranked = sorted(range(len(bare)), key=lambda i: (not important[i], i))
        low, high, best = 0, len(ranked), self._noted((), f"every check ({len(bare)})")
        while low < high:  # the largest number of checks that fits
            middle = (low + high + 1) // 2
            keep = sorted(ranked[:middle])
            left = len(bare) - middle
            text = self._noted(tuple(bare[i] for i in keep), f"every query and {left} of {len(bare)} checks")
            if len(text.encode()) <= max_bytes:
                low, best = middle, text
            else:
                high = middle - 1
        return best

    def _noted(self, checks: tuple[ExplainCheck, ...], left_out: str) -> str:
        note = f"This record was shortened to fit the state ConfigMap: {left_out} left out."
        return replace(self, checks=checks, reasons=(*self.reasons, note)).to_json()

    def to_dict(self) -> dict[str, Any]:
        """The JSON form as Python values (``kserve-canary explain --format json``)."""
        document: dict[str, Any] = _EXPLAIN.dump_python(self, mode="json", by_alias=True)
        return document

    @classmethod
    def from_json(cls, text: str | bytes) -> ExplainDocument:
        """Raises :class:`ExplainFormatError` for anything that is not an evaluation record."""
        what = "the latest evaluation (explain.json)"
        return _validate(_EXPLAIN, read_json_object(text, what, ExplainFormatError), what, ExplainFormatError)


def _reach(evidence: Evidence | None) -> datetime | None:
    """How far the canary's counts reach, when they say (CountSeries.newest)."""
    if evidence is None:
        return None
    series = evidence.counts.get("canary")
    if series is None or series.newest is None:
        return None
    return evidence_until(series, evidence.request.at)


def _kept(query: CanaryQuery | None) -> str | None:
    return query.promql if query is not None and len(query.promql) <= MAX_CANARY_QUERY_CHARS else None


def _check(judgement: Judgement, canary: CanaryQuery | None, stable: CanaryQuery | None) -> ExplainCheck:
    canary_query: str | None = None
    note = ""
    if canary is not None and len(canary.promql) > MAX_CANARY_QUERY_CHARS:
        note = (
            f"the canary's query is not kept: {len(canary.promql):,} characters, "
            f"over {MAX_CANARY_QUERY_CHARS:,}"
        )
    elif canary is not None:
        canary_query, note = canary.promql, canary.note
    return ExplainCheck(
        name=judgement.name,
        verdict=str(judgement.verdict),
        value=judgement.value,
        unit=judgement.unit,
        limit=judgement.limit,
        stable=judgement.stable_value,
        samples=judgement.samples,
        critical=judgement.critical,
        detail=judgement.detail,
        query=judgement.query,
        canary_query=canary_query,
        canary_query_note=note,
        stable_query=_kept(stable),
        max_allowed=judgement.max_allowed,
        min_allowed=judgement.min_allowed,
    )


_COMMAND: TypeAdapter[CommandRequest] = TypeAdapter(CommandRequest)
_OUTCOME: TypeAdapter[CommandOutcome] = TypeAdapter(CommandOutcome)
_EXPLAIN: TypeAdapter[ExplainDocument] = TypeAdapter(ExplainDocument)
