"""What people did between two ticks: commands that need the full picture, and a percentage
someone else wrote (docs/design.md §2.4).

:func:`canary.rollout.commands.apply_command` records a command in the state; the tick carries it
out here, where it sees the InferenceService and the policy: ``resume`` returns a paused rollout to
where it was heading (restoring the controller's percentage after someone else's), ``promote``
skips the remaining analysis. A percentage in the spec that is neither the controller's known value
nor its intent pauses the rollout until a person says what was meant.
"""

from __future__ import annotations

from dataclasses import replace

from canary.policy.model import GateStage
from canary.rollout.draft import Draft, Final, Outcome, Tick, step_at_or_below, weight_text
from canary.rollout.gating import gated
from canary.rollout.intent import found_in_spec, heading_for
from canary.rollout.outcomes import pause, promote, wait
from canary.rollout.state import PauseKind, Phase, RolloutState, StepProgress, WeightRecord, describe_time
from canary.rollout.vocabulary import EventReason, Severity

__all__ = ["external_change", "promote_by_command", "resume"]


def resume(tick: Tick, draft: Draft) -> Draft:
    state = draft.state
    command = state.command
    assert command is not None
    draft = draft.resumed(command.by or "an operator")
    pause = state.pause
    if state.phase is not Phase.PAUSED or pause is None:
        return draft.with_state(replace(state, command=None))
    evaluation = replace(state.evaluation, no_data_clock_from=tick.now)
    state = replace(state, phase=pause.resume_phase, pause=None, command=None, evaluation=evaluation)
    draft = draft.noting(
        f"Resumed by {draft.resumed_by} (command at {describe_time(command.at)}) from: {pause.reason}"
    )
    return draft.with_state(_resumed_state(tick, state, pause.kind, pause.resume_phase))


def _resumed_state(tick: Tick, state: RolloutState, kind: PauseKind, target_phase: Phase) -> RolloutState:
    """The state a resume from a pause of ``kind`` heads for: the value the rollout had (an external
    change), the first step (an unexpected start value), the step at or below (a policy edit)."""
    if kind is PauseKind.EXTERNAL_CHANGE:
        # Restore the value the rollout had; the step's clock restarts once status shows it.
        before = state.intent or state.spec_weight
        state = replace(state, spec_weight=found_in_spec(tick.observed, tick.now))
        if target_phase is not Phase.IDLE and before is not None:
            state = heading_for(state, before.weight, tick.observed, tick.now)
    elif kind is PauseKind.UNEXPECTED_START_VALUE:
        first = tick.steps[0].weight
        state = replace(
            state, spec_weight=found_in_spec(tick.observed, tick.now), step=StepProgress(0, first)
        )
        if gated(tick, GateStage.PRE_ROLLOUT):
            # Pinned at 0 until the pre-rollout gate passes, as a fresh start would be.
            state = heading_for(replace(state, phase=Phase.PENDING), 0, tick.observed, tick.now)
        else:
            state = heading_for(state, first, tick.observed, tick.now)
    elif kind is PauseKind.HORIZON and state.step is not None:
        # Another horizon on fresh evidence: the step's clock restarts once status shows it.
        state = replace(state, step=StepProgress(state.step.index, state.step.weight))
    elif kind is PauseKind.POLICY_CHANGED and state.step is not None:
        index = step_at_or_below(tick.steps, state.step.weight)
        state = replace(state, step=StepProgress(index, tick.steps[index].weight))
        state = heading_for(state, tick.steps[index].weight, tick.observed, tick.now)
    return state


def promote_by_command(tick: Tick, draft: Draft) -> Outcome:
    state = draft.state
    command = state.command
    assert command is not None
    if state.underlying_phase in (Phase.PROMOTING, Phase.BAKING) or not state.rollout_active:
        return draft.with_state(replace(state, command=None))
    by = command.by or "an operator"
    if not tick.observed.canary_ready:
        return wait(
            tick,
            draft,
            f"Promotion of {state.revision} requested by {by}: waiting for it to be Ready (KServe would "
            "send 100% to the previous revision otherwise).",
            EventReason.CANARY_WAITING,
        )
    adopted = found_in_spec(tick.observed, tick.now)
    draft = draft.with_state(replace(state, command=None, pause=None, spec_weight=adopted))
    return promote(
        tick,
        draft,
        f"Promoting {state.revision} on command from {by} ({describe_time(command.at)}), skipping the "
        "remaining analysis: removing canaryTrafficPercent.",
    )


def external_change(tick: Tick, draft: Draft, observed_weight: int | None) -> Final:
    """Somebody else changed the percentage: pause (once; the same change again waits)."""
    state = draft.state
    written = (state.intent or state.spec_weight or WeightRecord(None, None, tick.now)).weight
    headline = (
        f"canaryTrafficPercent of {tick.policy.key} was changed by someone else: observed "
        f"{weight_text(observed_weight)}, the controller wrote {weight_text(written)}. Paused: nothing "
        "is written until `kserve-canary resume` (restores the controller's value), `abort` or `promote`."
    )
    paused = state.pause
    if state.phase is Phase.PAUSED and paused is not None:
        if paused.kind is PauseKind.EXTERNAL_CHANGE and paused.observed_weight == observed_weight:
            return wait(tick, draft, paused.reason, EventReason.EXTERNAL_TRAFFIC_CHANGE, Severity.WARNING)
        resume_phase = paused.resume_phase
    else:
        resume_phase = state.phase
    return pause(
        tick,
        draft,
        PauseKind.EXTERNAL_CHANGE,
        headline,
        resume_phase=resume_phase,
        observed_weight=observed_weight,
        event=EventReason.EXTERNAL_TRAFFIC_CHANGE,
    )
