"""What the dashboard's JSON API says about rollouts: rows for the table, a rollout's full picture.

Everything here is read from the state ConfigMaps (``state.json``, ``explain.json``,
``command.json``, ``command-result.json``) as the CLI's ``status`` and ``explain`` read them, plus
two things the ConfigMap does not keep: the check values of every evaluation the dashboard has seen
since it started (:class:`EvaluationLog`; the controller keeps only the latest), and, when a
Prometheus URL is given, each check's canary and stable PromQL (the per-revision queries explain
shows) evaluated over the rollout as range queries.

Values go out already in the unit a person reads (ms, %, GiB), so the page only draws.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from canary.kserve.store import STATE_KEY, StoredState
from canary.metrics.client import PrometheusClient, PrometheusConfig
from canary.metrics.ranges import RangeQueryError, RangeReader
from canary.policy.units import format_value
from canary.report.charts import CANARY_COLOUR, LIMIT_COLOUR, MARKER_COLOURS, STABLE_COLOUR
from canary.report.rollout import display_unit, judged_limits
from canary.rollout.artefact import describe_artefact
from canary.rollout.commands import apply_command
from canary.rollout.records import CommandFormatError, ExplainCheck, ExplainDocument
from canary.rollout.state import CommandKind, HistoryEntry, RolloutState, StateFormatError

__all__ = [
    "EvaluationLog",
    "PrometheusSeries",
    "rollout_detail",
    "rollout_row",
]

# How many evaluations per rollout the dashboard remembers (at the default 60 s interval, 6 hours).
MAX_EVALUATIONS = 360
# A range query answers at most this many points per series: enough for a chart 900 pixels wide.
RANGE_POINTS = 240
# Prometheus is asked again for the same rollout no sooner than this: the page polls every 2 s.
RANGE_CACHE_SECONDS = 15.0

# The decisions that get a marker on the charts, by the history's action names.
_MARKED = {"start": "started", "advance": "advanced", "promote": "promoted", "rollback": "rolled-back"}


def _epoch(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class _Evaluation:
    decision_id: str
    at: float
    revision: str | None
    checks: tuple[ExplainCheck, ...]


class EvaluationLog:
    """Each rollout's evaluations as the dashboard saw them (``explain.json`` changes with every
    evaluation; the controller keeps only the latest), bounded, thread-safe."""

    def __init__(self, limit: int = MAX_EVALUATIONS) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._seen: dict[str, deque[_Evaluation]] = {}

    def record(self, key: str, document: ExplainDocument | None) -> None:
        if document is None:
            return
        entry = _Evaluation(document.decision_id, document.at.timestamp(), document.revision, document.checks)
        with self._lock:
            seen = self._seen.setdefault(key, deque(maxlen=self._limit))
            if seen and seen[-1].decision_id == entry.decision_id and seen[-1].at == entry.at:
                return
            seen.append(entry)

    def of(self, key: str, revision: str | None) -> list[_Evaluation]:
        with self._lock:
            return [entry for entry in self._seen.get(key, ()) if entry.revision == revision]


def _readable(stored: StoredState) -> tuple[RolloutState | None, str | None]:
    if stored.state_json is None:
        return None, f"the ConfigMap holds no {STATE_KEY}"
    try:
        return stored.state(), None
    except StateFormatError as error:
        return None, str(error)


def _explain(stored: StoredState) -> tuple[ExplainDocument | None, str | None]:
    try:
        return stored.explain(), None
    except StateFormatError as error:
        return None, str(error)


def _pending(stored: StoredState) -> dict[str, Any] | None:
    try:
        command = stored.command()
    except CommandFormatError:
        return {"command": "unreadable", "by": stored.command_issuer, "at": None}
    if command is None:
        return None
    return {
        "command": str(command.command),
        "by": stored.command_issuer or command.by,
        "at": _iso(command.at),
    }


def rollout_row(stored: StoredState) -> dict[str, Any]:
    """One rollout for the table (the columns of ``kserve-canary status``, plus the verdict)."""
    row: dict[str, Any] = {"namespace": stored.namespace, "name": stored.inference_service}
    state, problem = _readable(stored)
    if state is None:
        return {**row, "phase": "Unreadable", "problem": problem}
    last = state.history[-1] if state.history else None
    weight = state.spec_weight.weight if state.spec_weight else None
    step = state.step
    return {
        **row,
        "phase": str(state.phase),
        "pause": (
            {"kind": str(state.pause.kind), "reason": state.pause.reason} if state.pause is not None else None
        ),
        "revision": state.revision,
        "stableRevision": state.stable_revision,
        "artefacts": _artefacts(state),
        "weight": weight,
        "step": None if step is None else {"index": step.index, "weight": step.weight},
        "since": _iso(step.started_at if step is not None else state.started_at),
        "lastDecision": (
            None
            if last is None
            else {"at": _iso(last.at), "action": last.action, "reason": last.reason, "event": last.event}
        ),
        "verdict": str(state.evaluation.verdict) if state.evaluation.verdict else None,
        "pendingCommand": _pending(stored),
    }


def _artefacts(state: RolloutState) -> dict[str, Any]:
    """What the canary and the stable revision serve: the fields, and the line people read."""
    artefacts: dict[str, Any] = {}
    for role, revision in (("canary", state.revision), ("stable", state.stable_revision)):
        artefact = state.artefact_of(revision)
        artefacts[role] = {
            **(artefact.as_dict() if artefact else {}),
            "text": describe_artefact(artefact) if revision else None,
        }
    return artefacts


def _history_of_rollout(state: RolloutState) -> list[HistoryEntry]:
    """The decisions of the rollout in view (the history also holds earlier rollouts')."""
    if state.started_at is None:
        return list(state.history)
    return [entry for entry in state.history if entry.at >= state.started_at]


def _traffic(state: RolloutState, now: float) -> list[list[float]]:
    """The canary's share of traffic over the rollout, from the decisions that wrote it: a step
    function ending at the weight known to be in the spec now."""
    points: list[list[float]] = []
    start = _epoch(state.started_at)
    if start is not None:
        points.append([start, 0.0])
    for entry in _history_of_rollout(state):
        if entry.action in ("start", "advance") and entry.weight is not None:
            points.append([entry.at.timestamp(), float(entry.weight)])
        elif entry.action == "promote":
            points.append([entry.at.timestamp(), 100.0])
        elif entry.action == "rollback":
            points.append([entry.at.timestamp(), 0.0])
    if points:
        if state.spec_weight is not None and state.spec_weight.weight is not None:
            current = float(state.spec_weight.weight)
        else:
            current = points[-1][1]
        points.append([max(now, points[-1][0]), current])
    return points


def _markers(state: RolloutState) -> list[dict[str, Any]]:
    markers = []
    for entry in _history_of_rollout(state):
        action = _MARKED.get(entry.action) or ("paused" if entry.action == "pause" else None)
        if action is None:
            continue
        label = {"started": f"start {entry.weight}%", "advanced": f"{entry.weight}%"}.get(
            action, action.replace("-", " ")
        )
        markers.append({
            "at": entry.at.timestamp(),
            "label": label,
            "action": action,
            "colour": MARKER_COLOURS.get(action, "#555"),
            "detail": entry.reason,
        })  # fmt: skip
    return markers


def _check_row(check: ExplainCheck) -> dict[str, Any]:
    def shown(value: float | None) -> str | None:
        return None if value is None or not math.isfinite(value) else format_value(value, check.unit)

    return {
        "name": check.name,
        "verdict": check.verdict,
        "value": shown(check.value),
        "limit": check.limit,
        "stable": shown(check.stable),
        "bound": " and ".join(label for label, _ in check.bounds()) or None,
        "samples": check.samples,
        "critical": check.critical,
        "statement": check.detail,
        "query": check.query,
    }


class PrometheusSeries:
    """Each check's canary and stable queries (canary.metrics.explain_queries, as explain shows them)
    over the rollout, as range queries through the controller's Prometheus client; cached briefly."""

    def __init__(self, url: str, *, client: PrometheusClient | None = None) -> None:
        self.url = url.rstrip("/")
        self._client = client or PrometheusClient(PrometheusConfig(url=self.url))
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}

    def series(
        self, key: str, document: ExplainDocument, start: float, end: float
    ) -> dict[str, dict[str, Any]]:
        """Per check: ``{"revisions": {revision: [[t, v], ...]}}`` or ``{"error": why}``."""
        cache_key = (key, document.decision_id)
        with self._lock:
            cached = self._cache.get(cache_key)
            if cached is not None and time.monotonic() - cached[0] < RANGE_CACHE_SECONDS:
                return dict(cached[1])
        reader = RangeReader(self._client, start, end, max((end - start) / RANGE_POINTS, 5.0))
        answer: dict[str, dict[str, Any]] = {}
        for check in document.checks:
            drawn = _check_series(reader, document, check)
            if drawn is not None:
                answer[check.name] = drawn
        with self._lock:
            self._cache[cache_key] = (time.monotonic(), answer)
            if len(self._cache) > 256:  # the oldest go first; a handful of rollouts are in view
                for old in sorted(self._cache, key=lambda k: self._cache[k][0])[:128]:
                    del self._cache[old]
        return answer


def _check_series(
    reader: RangeReader, document: ExplainDocument, check: ExplainCheck
) -> dict[str, Any] | None:
    """One check's curves per revision from its canary and stable queries (None: it has none)."""
    asked = [(document.revision, check.canary_query), (document.stable_revision, check.stable_query)]
    revisions: dict[str, list[list[float]]] = {}
    for revision, promql in asked:
        if revision is None or not promql:
            continue
        try:
            results = reader.query(promql)
        except RangeQueryError as error:
            return {"error": str(error)[:300]}
        revisions[revision] = sorted([t, v] for _, points in results for t, v in points)
    return {"revisions": revisions} if revisions else None


def _check_chart(
    check: ExplainCheck,
    state: RolloutState,
    seen: Sequence[_Evaluation],
    prometheus: Mapping[str, Any] | None,
) -> dict[str, Any]:
    unit, factor = display_unit(check.unit)
    canary_points: list[list[float]] = []
    stable_points: list[list[float]] = []
    source = "evaluations seen by the dashboard"
    revisions = (prometheus or {}).get("revisions")
    if revisions:
        source = "Prometheus range queries of the check's canary and stable PromQL"
        canary_points = [[t, v * factor] for t, v in revisions.get(state.revision or "", [])]
        stable_points = [[t, v * factor] for t, v in revisions.get(state.stable_revision or "", [])]
    else:
        for evaluation in seen:
            for past in evaluation.checks:
                if past.name != check.name:
                    continue
                if past.value is not None and math.isfinite(past.value):
                    canary_points.append([evaluation.at, past.value * factor])
                if past.stable is not None and math.isfinite(past.stable):
                    stable_points.append([evaluation.at, past.stable * factor])
    limits = [{"label": label, "value": value * factor} for label, value in judged_limits(check)]
    series = [
        {"label": f"stable · {state.stable_revision}", "colour": STABLE_COLOUR, "points": stable_points},
        {"label": f"canary · {state.revision}", "colour": CANARY_COLOUR, "points": canary_points},
    ]
    return {
        "title": check.name,
        "unit": unit,
        "source": source,
        "prometheusError": (prometheus or {}).get("error"),
        "series": [item for item in series if item["points"]],
        "limits": limits,
        "limitColour": LIMIT_COLOUR,
    }


def rollout_detail(
    stored: StoredState,
    log: EvaluationLog,
    prometheus: PrometheusSeries | None,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """One rollout in full: the row, the decisions with their numbers, the latest evaluation's checks
    against their limits, the charts, the pending command and the answer to the last one."""
    moment = time.time() if now is None else now
    detail = rollout_row(stored)
    state, _ = _readable(stored)
    document, explain_problem = _explain(stored)
    log.record(stored.key, document)
    detail["lastCommandResult"] = _command_result(stored)
    detail["actions"] = _actions(state, moment)
    if state is None:
        return detail
    detail["decisions"] = [_decision(entry) for entry in reversed(state.history)]
    detail["evaluation"] = {
        "at": _iso(state.evaluation.at),
        "verdict": str(state.evaluation.verdict) if state.evaluation.verdict else None,
        "requests": state.evaluation.requests,
        "failedChecks": list(state.evaluation.failed_checks),
        "failureStreak": state.evaluation.failure_streak,
    }
    detail["explainProblem"] = explain_problem
    detail["explain"] = None if document is None else _explain_detail(document)
    detail["charts"] = _charts(stored, state, document, log, prometheus, moment)
    return detail


def _actions(state: RolloutState | None, moment: float) -> dict[str, dict[str, Any]]:
    """Each operator command: whether the state would take it now, and if not, why (the core's own
    rules; the controller stays the authority and answers what the dashboard cannot know)."""
    now = datetime.fromtimestamp(moment, UTC)
    actions: dict[str, dict[str, Any]] = {}
    for kind in CommandKind:
        if state is None:
            actions[str(kind)] = {"allowed": False, "reason": "no rollout state to act on"}
            continue
        verdict = apply_command(state, kind, now)
        actions[str(kind)] = {
            "allowed": verdict.accepted,
            "reason": "" if verdict.accepted else verdict.message,
        }
    return actions


def _command_result(stored: StoredState) -> dict[str, Any] | None:
    """The controller's answer to the last command, if it can be read."""
    outcome = stored.readable_command_result()
    if outcome is None:
        return None
    return {
        "command": outcome.command,
        "accepted": outcome.accepted,
        "message": outcome.message,
        "at": _iso(outcome.at),
        "by": outcome.by,
        "id": outcome.id,
    }


def _decision(entry: HistoryEntry) -> dict[str, Any]:
    return {
        "at": _iso(entry.at),
        "action": entry.action,
        "weight": entry.weight,
        "phase": str(entry.phase),
        "event": entry.event,
        "reason": entry.reason,
        "id": entry.id,
    }


def _explain_detail(document: ExplainDocument) -> dict[str, Any]:
    """The latest evaluation as ``explain.json`` records it, each check with its numbers."""
    return {
        "at": _iso(document.at),
        "decisionId": document.decision_id,
        "revision": document.revision,
        "stableRevision": document.stable_revision,
        "action": document.action,
        "verdict": document.verdict,
        "requests": document.requests,
        "reasons": list(document.reasons),
        "checks": [_check_row(check) for check in document.checks],
    }


def _charts(
    stored: StoredState,
    state: RolloutState,
    document: ExplainDocument | None,
    log: EvaluationLog,
    prometheus: PrometheusSeries | None,
    moment: float,
) -> dict[str, Any]:
    """The traffic chart and a chart per check of the latest evaluation, since the rollout's start
    (the checks' curves from Prometheus when it is given, else from the evaluations seen)."""
    start = _epoch(state.started_at) or _epoch(state.evidence_since) or moment - 3600
    ranges: dict[str, dict[str, Any]] = {}
    if prometheus is not None and document is not None and document.revision == state.revision:
        ranges = prometheus.series(stored.key, document, start, moment)
    seen = log.of(stored.key, state.revision)
    checks = document.checks if document is not None and document.revision == state.revision else ()
    return {
        "from": start,
        "to": moment,
        "markers": _markers(state),
        "traffic": _traffic_chart(state, moment),
        "checks": [_check_chart(check, state, seen, ranges.get(check.name)) for check in checks],
        "prometheus": prometheus.url if prometheus is not None else None,
    }


def _traffic_chart(state: RolloutState, moment: float) -> dict[str, Any]:
    return {
        "title": "Traffic to the canary",
        "unit": "%",
        "yMax": 100,
        "series": [
            {
                "label": f"canary · {state.revision}",
                "colour": CANARY_COLOUR,
                "points": _traffic(state, moment),
                "step": True,
            }
        ],
        "limits": [],
    }
