"""A PromotionPolicy's ``status`` as a projection of the rollout state (pure: no I/O, no clock).

The state ConfigMap stays the write-ahead store: a GitOps tool that replaces or prunes the object
erases its status, never the rollout's memory. The status is computed from what the controller
stored — the state (phase, revisions, step, the latest decision in its history) and the latest
evaluation (``explain.json``) — so it changes only when they do, and the controller writes it only
when the projection differs from the status last written (:mod:`canary.controller.status_writer`).

Conditions follow :mod:`canary.policy.status`: all seven are set on every projection, each message
names the canary revision, and ``lastTransitionTime`` moves only when a condition's status changes
(:func:`~canary.policy.status.set_condition` against the previous status).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from canary.policy import PolicyError, PromotionPolicy
from canary.policy.status import (
    ArtefactStatus,
    CheckStatus,
    CheckVerdict,
    Condition,
    ConditionType,
    DecisionAction,
    DecisionVerdict,
    GateOutcome,
    GateStatus,
    LastDecision,
    PolicyPhase,
    PromotionPolicyStatus,
    set_condition,
    step_text,
)
from canary.policy.units import format_value
from canary.rollout.artefact import Artefact
from canary.rollout.records import ExplainDocument
from canary.rollout.state import PauseKind, Phase, RolloutState

__all__ = ["PolicyView", "previous_status", "project_status", "status_unchanged"]

_MAX_MESSAGE = 4000  # a condition message for people; errors beyond this are in `validate`

# A pause that waits for a person fixing something (Stalled), and its kstatus reason.
_PROBLEM_PAUSES = {
    PauseKind.EXTERNAL_CHANGE: "ExternalTrafficChange",
    PauseKind.UNEXPECTED_START_VALUE: "UnexpectedStartValue",
    PauseKind.NO_DATA: "NoData",
    PauseKind.POLICY_CHANGED: "PolicyChanged",
}
_RUNNING = {Phase.PENDING, Phase.PROGRESSING, Phase.PROMOTING, Phase.BAKING}


@dataclass(frozen=True)
class PolicyView:
    """What is known about one PromotionPolicy object when its status is projected."""

    generation: int | None
    policy: PromotionPolicy | None  # the version that runs (None: none valid)
    errors: Sequence[PolicyError] = ()  # the current generation's problems (empty: valid)
    conflict: str | None = None  # why it does not govern: another policy claims its model
    state: RolloutState | None = None  # the rollout state, when this policy governs (or held) it
    explain: ExplainDocument | None = None
    inference_service_generation: int | None = None
    failure: str | None = None  # why its reconciles keep failing (canary.controller.failures), if they do


def previous_status(obj: dict[str, Any] | None) -> PromotionPolicyStatus | None:
    """The status an object carries (None: none, or one this controller cannot read)."""
    raw = (obj or {}).get("status")
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        return PromotionPolicyStatus.model_validate(raw)
    except ValidationError:
        return None


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


def _weight(state: RolloutState) -> int | None:
    phase = state.underlying_phase
    if phase in {Phase.PROMOTING, Phase.BAKING, Phase.SUCCEEDED}:
        return 100
    if phase is Phase.ROLLED_BACK:
        return 0
    if phase in {Phase.PENDING, Phase.PROGRESSING} and state.step is not None:
        return state.step.weight
    return None


def _step(state: RolloutState, policy: PromotionPolicy | None) -> str | None:
    if (
        policy is None
        or state.step is None
        or state.underlying_phase not in {Phase.PENDING, Phase.PROGRESSING}
    ):
        return None
    count = len(policy.spec.canary_steps)
    return step_text(state.step.index, count) if 0 <= state.step.index < count else None


def _last_decision(state: RolloutState) -> LastDecision | None:
    if not state.history:
        return None
    entry = state.history[-1]
    try:
        action = DecisionAction(entry.action)
    except ValueError:
        return None
    try:
        return LastDecision(
            action=action,
            verdict=_verdict(state),
            reason=entry.event,
            message=entry.reason or None,
            at=entry.at,
        )
    except ValidationError:
        return None


def _verdict(state: RolloutState) -> DecisionVerdict | None:
    """The latest evaluation's verdict (``kubectl get``'s Verdict column), if it is of this rollout."""
    evaluation = state.evaluation
    if evaluation.verdict is None or evaluation.at is None:
        return None
    if state.started_at is not None and evaluation.at < state.started_at:
        return None  # the previous rollout's
    return DecisionVerdict(str(evaluation.verdict))


def _checks(explain: ExplainDocument | None, state: RolloutState) -> list[CheckStatus]:
    if explain is None or explain.revision != state.revision:
        return []
    checks = []
    for check in explain.checks:
        try:
            verdict = CheckVerdict(check.verdict)
        except ValueError:
            continue
        checks.append(
            CheckStatus(
                name=check.name,
                verdict=verdict,
                value=format_value(check.value, check.unit) if check.value is not None else None,
                limit=check.limit or None,
                statement=check.detail or None,
            )
        )
    return checks


def _gates(state: RolloutState) -> list[GateStatus]:
    gates = []
    for gate in state.gates:
        if gate.passed_at is not None:
            outcome = GateOutcome.PASSED
        elif gate.deadline_passed_at is not None:
            outcome = GateOutcome.DEADLINE_PASSED
        else:
            outcome = GateOutcome.WAITING
        gates.append(
            GateStatus(
                name=gate.name,
                at=gate.stage.value,
                step=None if gate.weight is None else f"{gate.weight}%",
                result=outcome,
                attempts=gate.attempts,
                message=_clip(gate.describe_last()),
                since=gate.since,
            )
        )
    return gates


def _conditions(
    view: PolicyView, state: RolloutState, previous: Sequence[Condition], now: datetime
) -> list[Condition]:
    revision = state.revision
    about = f"revision {revision}" if revision else "no revision seen yet"
    found = [
        Condition.of(kind, status, reason, _clip(message), now, view.generation)
        for kind, status, reason, message in (
            *_spec_conditions(view, about),
            _promoted(state, about),
            _rolled_back(state, about),
            *_kstatus_conditions(view, state, about),
        )
    ]
    conditions = list(previous)
    for new in found:
        conditions = set_condition(conditions, new)
    order = [str(kind) for kind in ConditionType]
    return sorted((c for c in conditions if c.type in order), key=lambda c: order.index(c.type))


# A condition before it is stamped: its type, status, reason and message.
_Fact = tuple[ConditionType, bool, str, str]


def _spec_conditions(view: PolicyView, about: str) -> list[_Fact]:
    """PolicyValid and Conflict."""
    if view.errors:
        text = "; ".join(f"{e.field}: {e.message}" if e.field else e.message for e in view.errors)
        valid = (ConditionType.POLICY_VALID, False, "InvalidSpec", text)
    else:
        valid = (ConditionType.POLICY_VALID, True, "Valid", f"the spec is valid ({about})")
    if view.conflict:
        conflict = (ConditionType.CONFLICT, True, "TargetClaimed", f"{view.conflict} ({about})")
    else:
        conflict = (ConditionType.CONFLICT, False, "NoConflict", f"no other policy claims it ({about})")
    return [valid, conflict]


def _promoted(state: RolloutState, about: str) -> _Fact:
    """Promoted is about ``revision``: a new revision starts as Pending -> False at once."""
    phase, pause = state.phase, state.pause
    if phase is Phase.BAKING:
        promoted = (True, "Baking", f"{about} has 100% and is baking")
    elif phase is Phase.SUCCEEDED:
        promoted = (True, "Succeeded", f"{about} was promoted")
    elif phase is Phase.IDLE:
        promoted = (True, "NoRollout", f"{about} was already rolled out when the policy took it over")
    elif phase is Phase.ROLLED_BACK:
        promoted = (False, "RolledBack", f"{about} was rolled back")
    elif phase is Phase.PAUSED and pause is not None and pause.kind is PauseKind.APPROVAL:
        promoted = (False, "AwaitingApproval", f"{about} waits for approval: {pause.reason}")
    elif phase is Phase.PAUSED:
        promoted = (False, "Paused", f"{about} is paused: {pause.reason if pause else ''}".rstrip(": "))
    else:
        promoted = (False, "Progressing", f"{about} is being rolled out ({phase})")
    return (ConditionType.PROMOTED, *promoted)


def _rolled_back(state: RolloutState, about: str) -> _Fact:
    if state.phase is not Phase.ROLLED_BACK:
        return (ConditionType.ROLLED_BACK, False, "NotRolledBack", f"{about} is not rolled back")
    last = state.history[-1].event if state.history else "CanaryRolledBack"
    reason_text = state.history[-1].reason if state.history else ""
    return (ConditionType.ROLLED_BACK, True, last, f"{about} was rolled back: {reason_text}".rstrip(": "))


def _kstatus_conditions(view: PolicyView, state: RolloutState, about: str) -> list[_Fact]:
    """kstatus: Reconciling while it goes on by itself (or by an expected approval), Stalled when a
    person must fix something, Ready when neither."""
    phase = state.phase
    reconciling, stalled = _reconciling_or_stalled(view, state, about)
    idle = "Succeeded" if phase is Phase.SUCCEEDED else "Idle"
    facts: list[_Fact] = [
        (ConditionType.RECONCILING, True, *reconciling)
        if reconciling
        else (ConditionType.RECONCILING, False, idle, f"no rollout under way ({about})"),
        (ConditionType.STALLED, True, *stalled)
        if stalled
        else (ConditionType.STALLED, False, "NotStalled", f"nothing waits for a person ({about})"),
    ]
    if stalled or reconciling:
        reason, message = stalled or reconciling or ("", "")
        facts.append((ConditionType.READY, False, reason, message))
    else:
        facts.append((ConditionType.READY, True, idle, f"{about}: no rollout under way"))
    return facts


def _reconciling_or_stalled(
    view: PolicyView, state: RolloutState, about: str
) -> tuple[tuple[str, str] | None, tuple[str, str] | None]:
    """The reason and message of Reconciling, or of Stalled (at most one of them is set)."""
    phase, pause = state.phase, state.pause
    if view.errors and view.policy is None:
        return None, ("InvalidSpec", "the spec is invalid: no rollout runs under this policy")
    if view.errors:
        return None, ("InvalidSpec", f"the spec is invalid: the previous valid version still runs {about}")
    if view.conflict:
        return None, ("TargetClaimed", f"{view.conflict}: the rollout of {about} is held")
    if view.failure:
        return None, ("ReconcileFailed", f"the rollout of {about} cannot proceed: {view.failure}")
    if phase is Phase.ROLLED_BACK:
        return None, ("RolledBack", f"{about} was rolled back; Git asks for a revision that is not served")
    if phase is Phase.PAUSED and pause is not None and pause.kind in _PROBLEM_PAUSES:
        return None, (_PROBLEM_PAUSES[pause.kind], f"{about} is paused: {pause.reason}")
    if phase is Phase.PAUSED and pause is not None and pause.kind is PauseKind.APPROVAL:
        return ("AwaitingApproval", f"{about} waits for approval"), None
    if phase is Phase.PAUSED:
        return ("Paused", f"{about} is paused by an operator"), None
    if phase in _RUNNING:
        return (str(phase), f"{about} is {str(phase).lower()}"), None
    return None, None


def _artefact(artefact: Artefact | None) -> ArtefactStatus | None:
    if artefact is None:
        return None
    return ArtefactStatus(
        storage_uri=artefact.storage_uri,
        image=artefact.image,
        runtime=artefact.runtime,
        model_format=artefact.model_format,
    )


def project_status(
    view: PolicyView, previous: PromotionPolicyStatus | None, now: datetime
) -> PromotionPolicyStatus:
    """The status of one PromotionPolicy object; ``previous`` keeps transition times and the
    InferenceService generation the canary revision was first seen at."""
    state = view.state or RolloutState()
    runs = view.policy is not None and not view.conflict
    phase = PolicyPhase(str(state.phase)) if runs else PolicyPhase.INVALID
    target_generation = None
    if state.revision is not None and state.started_generation is not None:
        target_generation = state.started_generation  # recorded before the controller's first write
    elif state.revision is not None:
        # A state from before startedGeneration was recorded: the generation first seen with it.
        if previous is not None and previous.canary_revision == state.revision:
            target_generation = previous.target_generation
        else:
            target_generation = view.inference_service_generation
    return PromotionPolicyStatus(
        observed_generation=view.generation,
        phase=phase,
        canary_revision=state.revision,
        stable_revision=state.stable_revision,
        canary_artefact=_artefact(state.artefact_of(state.revision)),
        stable_artefact=_artefact(state.artefact_of(state.stable_revision)),
        target_generation=target_generation,
        weight=_weight(state) if runs else None,
        step=_step(state, view.policy) if runs else None,
        last_decision=_last_decision(state),
        checks=_checks(view.explain, state),
        gates=_gates(state),
        conditions=_conditions(view, state, previous.conditions if previous else (), now),
    )


def status_unchanged(status: PromotionPolicyStatus, body: dict[str, Any] | None) -> bool:
    """Whether ``status`` is what ``body`` (a status as written or read) already says."""
    return body is not None and status.to_api() == body
