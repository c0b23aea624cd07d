"""Operator commands as pure state transitions: pause, resume, approve, abort, promote.

``pause`` and ``approve`` take effect at once: they need nothing but the state. ``resume``,
``abort`` and ``promote`` are recorded in the state and carried out by the next
:func:`canary.rollout.core.decide`, which sees the InferenceService and the policy: an abort
rolls back, a promote removes the percentage (only once the canary is Ready), a resume restores
what the pause interrupted (for a pause caused by someone else's change, the controller's own value).
A command that makes no sense in the current phase is refused with a message, and the state is
returned unchanged.

An operator's command comes as its record (:class:`~canary.rollout.records.CommandRequest`) and is
bound to what it means before anything else: it is refused when it names another revision than the
rollout's, when the rollout has moved to another step since it was issued (stale), or when it is
older than :data:`~canary.rollout.records.COMMAND_TTL` (expired). A bare command kind is the
controller's own (a pause when a policy is removed) and is not bound.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from canary.rollout.records import COMMAND_TTL, CommandRequest
from canary.rollout.state import (
    MAX_HISTORY,
    CommandKind,
    HistoryEntry,
    Pause,
    PauseKind,
    PendingCommand,
    Phase,
    RolloutState,
    StepProgress,
    describe_time,
)
from canary.rollout.vocabulary import EventReason, decision_id

__all__ = ["CommandResult", "apply_command", "binding_refusal"]


@dataclass(frozen=True, slots=True)
class CommandResult:
    state: RolloutState
    accepted: bool
    message: str


# A command "issued" further in the future than this is refused: clocks disagree, or it was forged
# to outlive COMMAND_TTL.
CLOCK_SKEW = timedelta(minutes=5)


def apply_command(
    state: RolloutState,
    command: CommandRequest | CommandKind | str,
    now: datetime,
    *,
    by: str | None = None,
    approval_steps: Collection[int] | None = None,
) -> CommandResult:
    """Apply an operator command to ``state``. Raises ValueError for an unknown command name.

    For a :class:`CommandRequest`, ``by`` defaults to the record's and :func:`binding_refusal` is
    checked first. ``approval_steps``, the weights of the policy's ``approval: manual`` steps, refuses
    an approve of any other step (None: the caller does not know the policy, only the controller does).
    """
    if isinstance(command, CommandRequest):
        refusal = binding_refusal(state, command, now)
        if refusal is not None:
            return _refuse(state, refusal)
        kind = command.command
        by = by if by is not None else command.by
    else:
        kind = CommandKind(command)
    who = by or "an operator"
    phase = state.phase
    pending = state.command
    if pending is not None and pending.kind is CommandKind.ABORT:
        return _refuse(state, f"an abort requested by {pending.by or 'an operator'} is already pending")
    if kind is CommandKind.PAUSE:
        return _pause(state, now, who)
    if kind is CommandKind.RESUME:
        if phase is not Phase.PAUSED or state.pause is None:
            return _refuse(state, f"the rollout is not paused (phase {phase})")
        if state.pause.kind is PauseKind.APPROVAL:
            return _refuse(
                state, "the rollout waits for approval of a step: use approve (resume does not approve)"
            )
        return _pending(state, kind, now, by, who, "resume")
    if kind is CommandKind.APPROVE:
        return _approve(state, now, who, approval_steps)
    # abort and promote
    underlying = state.underlying_phase
    if not state.rollout_active:
        return _refuse(state, f"no rollout in progress (phase {underlying})")
    if kind is CommandKind.PROMOTE and underlying in (Phase.PROMOTING, Phase.BAKING):
        return _refuse(state, f"{state.revision} is already promoted (phase {underlying})")
    return _pending(state, kind, now, by, who, str(kind))


def _pause(state: RolloutState, now: datetime, who: str) -> CommandResult:
    phase, pending, kind = state.phase, state.command, CommandKind.PAUSE
    if phase is Phase.PAUSED and pending is not None and pending.kind is CommandKind.RESUME:
        return _accept(replace(state, command=None), kind, now, who, "the pending resume was cancelled")
    if phase is Phase.PAUSED:
        # A stored state may say Paused without saying why (someone edited the ConfigMap).
        return _refuse(state, "already paused" + (f": {state.pause.reason}" if state.pause else ""))
    if not state.rollout_active:
        return _refuse(state, f"no rollout in progress (phase {state.underlying_phase})")
    paused = replace(
        state,
        phase=Phase.PAUSED,
        pause=Pause(PauseKind.MANUAL, f"Paused by {who} at {describe_time(now)}.", now, resume_phase=phase),
    )
    return _accept(paused, kind, now, who, f"rollout of {state.revision} paused")


def _approve(
    state: RolloutState, now: datetime, who: str, approval_steps: Collection[int] | None
) -> CommandResult:
    phase, step, kind = state.phase, state.step, CommandKind.APPROVE
    approvable = phase in (Phase.PENDING, Phase.PROGRESSING) or (
        phase is Phase.PAUSED
        and state.pause is not None
        and state.pause.resume_phase in (Phase.PENDING, Phase.PROGRESSING)
    )
    if step is None or not approvable:
        return _refuse(state, f"no step waits for approval (phase {phase})")
    if approval_steps is not None and step.weight not in approval_steps:
        manual = ", ".join(f"{weight}%" for weight in sorted(approval_steps)) or "none"
        return _refuse(
            state,
            f"step {step.weight}% does not wait for approval: the policy's steps with approval: manual "
            f"are {manual}",
        )
    waiting = phase is Phase.PAUSED and state.pause is not None and state.pause.kind is PauseKind.APPROVAL
    if step.weight in state.approvals and not waiting:
        return _refuse(state, f"step {step.weight}% is already approved")
    approvals = state.approvals if step.weight in state.approvals else (*state.approvals, step.weight)
    approved = replace(state, approvals=approvals)
    if waiting:
        assert state.pause is not None
        approved = replace(approved, phase=state.pause.resume_phase, pause=None)
    return _accept(approved, kind, now, who, f"step {step.weight}% of {state.revision} approved")


def binding_refusal(state: RolloutState, command: CommandRequest, now: datetime) -> str | None:
    """Why ``command`` does not apply to ``state`` whatever the phase, or None when it is bound to it.

    Refused, in this order: no issue time; older than :data:`COMMAND_TTL` (expired) or issued more
    than :data:`CLOCK_SKEW` in the future; no revision named, or another revision than the state's;
    issued at another step than the state's current one (stale: the rollout moved since).
    """
    verb = str(command.command)
    if command.at is None:
        return f"{verb} carries no issue time (at): refused"
    if now - command.at > COMMAND_TTL:
        return (
            f"{verb} was issued at {describe_time(command.at)}, more than {_hours(COMMAND_TTL)} before "
            "the controller read it: expired, refused"
        )
    if command.at - now > CLOCK_SKEW:
        return f"{verb} was issued at {describe_time(command.at)}, in the future: check the clocks; refused"
    if command.revision is None:
        return f"{verb} names no revision it is meant for: refused"
    if command.revision != state.revision:
        now_of = f"the rollout is now of {state.revision}" if state.revision else "no rollout is known now"
        return f"{verb} was issued for {command.revision}, {now_of}: refused"
    current = state.step.index if state.step is not None else None
    if command.step != current:
        return (
            f"{verb} was issued at {_step_text(command.step, None)} of {command.revision}, the rollout has "
            f"moved to {_step_text(current, state.step)} since: stale, refused"
        )
    return None


def _step_text(index: int | None, step: StepProgress | None) -> str:
    if index is None:
        return "no step"
    return f"step {index + 1}" + (f" ({step.weight}%)" if step is not None else "")


def _hours(delta: timedelta) -> str:
    hours = delta.total_seconds() / 3600
    return f"{hours:g} h"


def _pending(
    state: RolloutState, kind: CommandKind, now: datetime, by: str | None, who: str, verb: str
) -> CommandResult:
    recorded = replace(state, command=PendingCommand(kind, now, by))
    return _accept(
        recorded, kind, now, who, f"{verb} of {state.revision} requested; the next decision carries it out"
    )


def _accept(after: RolloutState, kind: CommandKind, now: datetime, who: str, message: str) -> CommandResult:
    entry = HistoryEntry(
        at=now,
        action=f"command:{kind.value}",
        weight=None,
        phase=after.phase,
        event=_EVENTS[kind].value,
        reason=f"{message} (by {who})",
        id=decision_id(after.revision, "command", kind.value, repr(now.timestamp())),
    )
    return CommandResult(replace(after, history=(*after.history, entry)[-MAX_HISTORY:]), True, message)


def _refuse(state: RolloutState, message: str) -> CommandResult:
    return CommandResult(state, False, message)


_EVENTS = {
    CommandKind.PAUSE: EventReason.CANARY_PAUSED,
    CommandKind.RESUME: EventReason.CANARY_RESUMED,
    CommandKind.APPROVE: EventReason.CANARY_APPROVED,
    CommandKind.ABORT: EventReason.CANARY_ABORTED,
    CommandKind.PROMOTE: EventReason.CANARY_PROMOTED,
}
