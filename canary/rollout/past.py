"""The record of past rollouts (``rollouts.json`` in the state ConfigMap): the last rollouts of one
InferenceService, each with its revisions, start and end, outcome, steps and decisions.

Pure, like the rest of :mod:`canary.rollout`. The shell calls :func:`record_after` with the state a
decision was made on, the decision's new state and the stored record; when the decision ends a rollout
it returns the record with that rollout added, and the shell writes it **in the same ConfigMap write as
the state** (no extra API write), otherwise it returns None and the stored text is written back as it
was. ``kserve-canary report --rollout`` and ``kserve-canary backtest --rollout`` read it.

When a rollout ends (the state before the decision has a rollout under way, the state after it not,
or a rollout of another revision):

=================  ===========================================================================
``promoted``        the canary reached ``Succeeded`` (promoted, and through ``bake`` if any)
``rolled-back``     ``RolledBack`` by the controller (a check, a progress deadline, un-Ready...)
``aborted``         ``RolledBack`` because an operator ran ``abort``
``superseded``      a newer revision replaced the canary before its rollout ended
=================  ===========================================================================

The format (JSON, camelCase, unknown fields ignored; ``schemaVersion`` 1)::

    {"schemaVersion": 1,
     "rollouts": [                              # oldest first
       {"id": "sentiment-predictor-00002@2026-11-29T22:31:15+00:00",   # revision@startedAt
        "inferenceServiceUid": "…", "revision": "sentiment-predictor-00002",
        "stableRevision": "sentiment-predictor-00001", "fingerprint": "…",
        "startedAt": "…", "endedAt": "…", "outcome": "promoted",
        "reason": "Promoting …: every step passed …",            # the ending decision's headline
        "steps": [{"index": 0, "weight": 10, "at": "…", "until": "…"}, …],   # as written
        "decisions": [{"at": "…", "action": "advance", "weight": 30, "phase": "Progressing",
                       "event": "CanaryAdvanced", "reason": "…", "id": "…"}, …],  # HistoryEntry
        "decisionsDropped": 0,
        "checks": [{"name": "p99", "verdict": "fail", "value": 0.494, "unit": "seconds",
                    "limit": "…", "stable": 0.286, "samples": 812.0, …}, …]}]}  # last evaluation

Identity: a rollout is ``revision@startedAt`` (:func:`rollout_id`). Adding an entry whose id is
already recorded replaces it, so a decision repeated after a crash cannot record a rollout twice.
``steps`` are rebuilt from the decisions that wrote a weight (``start``, ``advance``): the time the
controller wrote the step and the time the next write (or the end) left it. ``decisions`` are the
entries of the state's decision history from the rollout's start to its end (each with its reason, the
numbers included, cut at 200 characters); the history keeps the last 100 decisions of all rollouts, so a
very long rollout keeps only its latest ones. ``checks`` are the last evaluation's check results (the
PromQL text left out).

Bounds (a ConfigMap holds 1 MiB in all): at most :data:`MAX_ROLLOUTS` rollouts and
:data:`MAX_RECORD_BYTES` of JSON — the oldest rollouts are dropped first; one rollout is cut to
:data:`MAX_ROLLOUT_BYTES` by dropping its oldest decisions that wrote no weight (counted in
``decisionsDropped``). Reading never crashes: anything that is not a record raises
:class:`PastRolloutsFormatError` naming the file and the reason.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AwareDatetime, PlainSerializer, TypeAdapter, ValidationError

from canary.rollout.artefact import Artefact
from canary.rollout.decision import Decision
from canary.rollout.records import ExplainCheck, ExplainDocument
from canary.rollout.state import (
    JSON_CONFIG,
    CommandKind,
    HistoryEntry,
    Phase,
    RolloutState,
    StateFormatError,
    read_json_object,
)
from canary.rollout.vocabulary import Action

__all__ = [
    "MAX_RECORD_BYTES",
    "MAX_ROLLOUTS",
    "MAX_ROLLOUT_BYTES",
    "RECORD_SCHEMA_VERSION",
    "PastRollout",
    "PastRollouts",
    "PastRolloutsFormatError",
    "RolloutOutcome",
    "StepRecord",
    "ended_rollout",
    "ends_rollout",
    "record_after",
    "rollout_id",
]

RECORD_SCHEMA_VERSION = 1
MAX_ROLLOUTS = 10
# The state (under 64 KiB), explain.json and the rest share the ConfigMap's 1 MiB with this record.
MAX_RECORD_BYTES = 192 * 1024
MAX_ROLLOUT_BYTES = 48 * 1024

_Time = Annotated[AwareDatetime, PlainSerializer(datetime.isoformat, return_type=str)]
_WROTE_A_STEP = frozenset({Action.START.value, Action.ADVANCE.value})
_ENDS = frozenset({Action.PROMOTE.value, Action.ROLLBACK.value})


class PastRolloutsFormatError(StateFormatError):
    """``rollouts.json`` cannot be read."""


class RolloutOutcome(StrEnum):
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled-back"
    ABORTED = "aborted"
    SUPERSEDED = "superseded"


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step as the controller wrote it: its weight, when it was written and when the next write (or
    the end of the rollout) left it."""

    __pydantic_config__ = JSON_CONFIG

    index: int
    weight: int
    at: _Time
    until: _Time | None = None


@dataclass(frozen=True, slots=True)
class PastRollout:
    """One finished rollout."""

    __pydantic_config__ = JSON_CONFIG

    id: str
    revision: str
    outcome: RolloutOutcome
    ended_at: _Time
    started_at: _Time | None = None
    stable_revision: str | None = None
    fingerprint: str | None = None
    inference_service_uid: str | None = None
    reason: str = ""
    artefact: Artefact | None = None  # what ``revision`` served (None: not recorded)
    stable_artefact: Artefact | None = None
    steps: tuple[StepRecord, ...] = ()
    decisions: tuple[HistoryEntry, ...] = ()
    decisions_dropped: int = 0
    checks: tuple[ExplainCheck, ...] = ()

    def to_json(self) -> str:
        return _dump(_ROLLOUT, self)


@dataclass(frozen=True, slots=True)
class PastRollouts:
    """The bounded record of one InferenceService's finished rollouts, oldest first."""

    __pydantic_config__ = JSON_CONFIG

    rollouts: tuple[PastRollout, ...] = ()

    def with_rollout(self, rollout: PastRollout) -> PastRollouts:
        """This record with ``rollout`` added (replacing an entry of the same id, in its place), then
        bounded: at most :data:`MAX_ROLLOUTS` entries and :data:`MAX_RECORD_BYTES`, oldest dropped first."""
        rollout = _fit(rollout)
        if any(entry.id == rollout.id for entry in self.rollouts):
            kept = tuple(rollout if entry.id == rollout.id else entry for entry in self.rollouts)
        else:
            kept = (*self.rollouts, rollout)
        kept = kept[-MAX_ROLLOUTS:]
        while len(kept) > 1 and len(PastRollouts(kept).to_json().encode()) > MAX_RECORD_BYTES:
            kept = kept[1:]
        return PastRollouts(kept)

    def select(self, selector: str) -> PastRollout | None:
        """A rollout by number (``1`` the latest, ``2`` the one before, ...), by revision (its latest
        rollout) or by id; None when none matches."""
        if selector.isdigit():
            number = int(selector)
            return self.rollouts[-number] if 1 <= number <= len(self.rollouts) else None
        for entry in reversed(self.rollouts):
            if selector in (entry.revision, entry.id):
                return entry
        return None

    def to_json(self) -> str:
        body = _RECORD.dump_python(self, mode="json", by_alias=True)
        return json.dumps({"schemaVersion": RECORD_SCHEMA_VERSION, **body}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> PastRollouts:
        """Raises :class:`PastRolloutsFormatError` for anything that is not a record of rollouts."""
        what = "the record of past rollouts (rollouts.json)"
        document = read_json_object(text, what, PastRolloutsFormatError)
        version = document.pop("schemaVersion", None)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise PastRolloutsFormatError(f"{what} has no valid schemaVersion (found {version!r})")
        if version > RECORD_SCHEMA_VERSION:
            raise PastRolloutsFormatError(
                f"{what} was written by a newer kserve-canary (schemaVersion {version}; this one reads "
                f"{RECORD_SCHEMA_VERSION})"
            )
        try:
            record = _RECORD.validate_python(document)
        except ValidationError as problem:
            first = problem.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the top level"
            raise PastRolloutsFormatError(f"{what} is invalid at {where}: {first['msg']}") from None
        except RecursionError:
            raise PastRolloutsFormatError(f"{what} is nested too deeply to be read") from None
        return PastRollouts(record.rollouts[-MAX_ROLLOUTS:])


def rollout_id(revision: str, started_at: datetime | None) -> str:
    """The identity of a rollout: its canary revision and when it started."""
    return f"{revision}@{started_at.isoformat()}" if started_at is not None else revision


def ends_rollout(before: RolloutState, decision: Decision) -> bool:
    """Whether ``decision`` (made on ``before``) ends a rollout: cheap, so the shell reads the stored
    record only when there is something to add to it."""
    after = decision.new_state
    if before.revision is None or not before.rollout_active:
        return False
    return after.revision != before.revision or not after.rollout_active


def ended_rollout(
    before: RolloutState,
    decision: Decision,
    now: datetime,
    *,
    latest_evaluation: ExplainDocument | None = None,
) -> PastRollout | None:
    """The rollout that ``decision`` ends (made on ``before`` at ``now``), or None when it ends none.

    ``latest_evaluation`` (the stored ``explain.json``) gives the checks when the ending decision
    evaluated nothing itself (a promotion after the last step passed, an abort).
    """
    after = decision.new_state
    revision = before.revision
    if revision is None or not ends_rollout(before, decision):
        return None
    if after.revision != revision:
        outcome = RolloutOutcome.SUPERSEDED
        history = before.history
    elif after.underlying_phase is Phase.SUCCEEDED:
        outcome, history = RolloutOutcome.PROMOTED, after.history
    elif after.underlying_phase is Phase.ROLLED_BACK:
        aborted = before.command is not None and before.command.kind is CommandKind.ABORT
        outcome = RolloutOutcome.ABORTED if aborted else RolloutOutcome.ROLLED_BACK
        history = after.history
    else:  # another way out of a rollout (none today): say what it became
        outcome, history = RolloutOutcome.SUPERSEDED, after.history
    started = before.started_at
    decisions = tuple(entry for entry in history if started is None or entry.at >= started)
    if outcome is RolloutOutcome.SUPERSEDED:
        reason = (
            f"{after.revision} replaced {revision} at {before.phase}"
            if after.revision
            else f"{revision} left its rollout at {before.phase}"
        )
    else:
        reason = decision.summary
    if decision.judgements and outcome is not RolloutOutcome.SUPERSEDED:
        checks = ExplainDocument.of(decision, None, now).checks
    elif latest_evaluation is not None and latest_evaluation.revision == revision:
        checks = latest_evaluation.checks
    else:
        checks = ()
    return PastRollout(
        id=rollout_id(revision, started),
        revision=revision,
        outcome=outcome,
        ended_at=now,
        started_at=started,
        stable_revision=before.stable_revision,
        fingerprint=before.fingerprint,
        inference_service_uid=before.inference_service_uid,
        reason=reason[:400],
        artefact=before.artefact_of(revision),
        stable_artefact=before.artefact_of(before.stable_revision),
        steps=_steps(decisions, now),
        decisions=decisions,
        checks=tuple(replace(check, query="") for check in checks),
    )


def record_after(
    before: RolloutState,
    decision: Decision,
    record: PastRollouts,
    now: datetime,
    *,
    latest_evaluation: ExplainDocument | None = None,
) -> PastRollouts | None:
    """The record to store with ``decision``'s state — None when the decision ends no rollout (the
    stored record is then written back unchanged)."""
    ended = ended_rollout(before, decision, now, latest_evaluation=latest_evaluation)
    return record.with_rollout(ended) if ended is not None else None


def _steps(decisions: Sequence[HistoryEntry], end: datetime) -> tuple[StepRecord, ...]:
    steps: list[StepRecord] = []
    for entry in decisions:
        if entry.action in _WROTE_A_STEP and entry.weight is not None:
            if steps and steps[-1].weight == entry.weight:
                continue  # the same step written again (a re-issued intent)
            if steps:
                steps[-1] = replace(steps[-1], until=entry.at)
            steps.append(StepRecord(len(steps), entry.weight, entry.at))
        elif entry.action in _ENDS and steps and steps[-1].until is None:
            steps[-1] = replace(steps[-1], until=entry.at)
    if steps and steps[-1].until is None:
        steps[-1] = replace(steps[-1], until=end)
    return tuple(steps)


def _fit(rollout: PastRollout) -> PastRollout:
    """``rollout`` within :data:`MAX_ROLLOUT_BYTES`: its oldest decisions that wrote no weight go first,
    then (a pathological record) the oldest of the others."""
    if len(rollout.to_json().encode()) <= MAX_ROLLOUT_BYTES:
        return rollout
    decisions = list(rollout.decisions)
    dropped = rollout.decisions_dropped
    while decisions:
        index = next((i for i, entry in enumerate(decisions) if entry.action not in _WROTE_A_STEP | _ENDS), 0)
        del decisions[index]
        dropped += 1
        trimmed = replace(rollout, decisions=tuple(decisions), decisions_dropped=dropped)
        if len(trimmed.to_json().encode()) <= MAX_ROLLOUT_BYTES:
            return trimmed
    return replace(rollout, decisions=(), decisions_dropped=dropped, checks=(), reason=rollout.reason[:200])


def _dump(adapter: TypeAdapter[Any], record: object) -> str:
    return json.dumps(adapter.dump_python(record, mode="json", by_alias=True), separators=(",", ":"))


_ROLLOUT: TypeAdapter[PastRollout] = TypeAdapter(PastRollout)
_RECORD: TypeAdapter[PastRollouts] = TypeAdapter(PastRollouts)
