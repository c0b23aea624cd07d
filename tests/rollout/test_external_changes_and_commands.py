"""Who changed the percentage (docs/design.md §2.4), and operator commands as state transitions."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from canary.rollout import (
    Action,
    CommandKind,
    EventReason,
    PauseKind,
    Phase,
    RolloutState,
    Severity,
    apply_command,
)
from canary.rollout.state import PendingCommand

from .helpers import T0, make_policy, progressing

NEW = "llama-predictor-00002"


def test_a_write_that_did_not_land_before_a_crash_is_reissued_with_the_same_id() -> None:
    harness = progressing()
    # The advance is decided and its state stored, then the controller dies before patching.
    while (advance := harness.tick(60, patch=False)).action is not Action.ADVANCE:
        pass
    assert harness.sim.percent == 10
    reissued = harness.tick(30)
    assert (reissued.action, reissued.weight) == (Action.ADVANCE, 30)
    assert reissued.id == advance.id  # a notification for it is de-duplicated
    assert reissued.summary.startswith("Writing canaryTrafficPercent 30% for llama-predictor-00002")
    # The numbers behind the write are those of the evaluation that decided it (stored with the
    # intent), not those of the reconcile that re-issues it: the log line, Event and notification of
    # a re-issued write still say why it was made.
    assert advance.verdict is not None and advance.requests is not None
    assert (reissued.verdict, reissued.requests) == (advance.verdict, advance.requests)
    assert reissued.evaluated_at == advance.evaluated_at
    assert (
        f"decided on a {advance.verdict} evaluation with {advance.requests:,.0f} requests" in reissued.summary
    )
    assert harness.sim.percent == 30
    after = harness.tick(30)
    assert after.action is Action.WAIT
    assert after.new_state.intent is None
    assert after.new_state.spec_weight is not None
    assert after.new_state.spec_weight.weight == 30


def test_the_controllers_own_write_is_recognised_after_a_crash() -> None:
    harness = progressing()
    while harness.tick(60, reconcile=False).action is not Action.ADVANCE:
        pass
    # The patch landed, the process died before anything else: the intent is still pending.
    assert harness.state.intent is not None
    harness.sim.reconcile()
    decision = harness.tick(5)
    assert decision.action is Action.WAIT
    assert decision.new_state.phase is Phase.PROGRESSING
    assert decision.new_state.intent is None


def test_a_percentage_the_controller_did_not_write_pauses_with_the_observed_value() -> None:
    harness = progressing()
    harness.tick(60)
    harness.sim.set_percent(40)  # kubectl edit
    harness.sim.reconcile()
    paused = harness.tick(60)
    assert paused.action is Action.PAUSE
    assert paused.weight is None
    assert paused.patch is None
    assert paused.event_reason is EventReason.EXTERNAL_TRAFFIC_CHANGE
    assert paused.severity is Severity.WARNING
    assert "changed by someone else: observed 40%, the controller wrote 10%" in paused.summary
    pause = paused.new_state.pause
    assert pause is not None
    assert (pause.kind, pause.observed_weight, pause.resume_phase) == (
        PauseKind.EXTERNAL_CHANGE,
        40,
        Phase.PROGRESSING,
    )
    for _ in range(5):
        still = harness.tick(60)
        assert still.action is Action.WAIT
        assert still.event_reason is EventReason.EXTERNAL_TRAFFIC_CHANGE
    assert harness.sim.percent == 40  # nothing written
    harness.sim.set_percent(45)  # changed again: said again
    assert harness.tick(60).action is Action.PAUSE


def test_resume_restores_the_controllers_value_and_restarts_the_step_clock() -> None:
    harness = progressing()
    for _ in range(8):
        harness.tick(60)
    harness.sim.set_percent(40)
    harness.sim.reconcile()
    harness.tick(60)
    harness.state = apply_command(harness.state, CommandKind.RESUME, harness.now, by="erin").state
    restored = harness.tick(60)
    assert (restored.action, restored.weight) == (Action.START, 10)
    assert any("Resumed by erin" in reason for reason in restored.reasons)
    assert harness.sim.percent == 10
    restart = harness.tick(60)
    step = restart.new_state.step
    assert step is not None
    assert step.started_at == harness.now  # a fresh window: the 40% period is not evidence for 10%
    advanced = harness.run(lambda d: d.action is Action.ADVANCE)
    assert harness.now - step.started_at == timedelta(minutes=10)
    assert advanced.weight == 30


def test_the_gitops_trap_after_promotion_pauses_instead_of_fighting_git() -> None:
    harness = progressing()
    harness.run(lambda d: d.new_state.phase is Phase.SUCCEEDED)
    harness.sim.set_percent(10)  # Argo CD re-applies the manifest that still carries the field
    harness.sim.reconcile()
    paused = harness.tick(60)
    assert paused.action is Action.PAUSE
    assert "observed 10%, the controller wrote unset (field absent)" in paused.summary
    assert paused.new_state.pause is not None
    assert paused.new_state.pause.resume_phase is Phase.SUCCEEDED


def test_abort_rolls_back_on_the_next_decision() -> None:
    harness = progressing()
    result = apply_command(harness.state, "abort", harness.now, by="frank")
    assert result.accepted
    assert result.state.phase is Phase.PROGRESSING  # nothing happens until the next decision
    harness.state = result.state
    decision = harness.tick(1)
    assert (decision.action, decision.weight) == (Action.ROLLBACK, 0)
    assert "aborted by frank" in decision.summary
    assert decision.new_state.command is None
    assert decision.new_state.was_rolled_back(NEW)


def test_abort_overrides_a_pause() -> None:
    harness = progressing()
    harness.state = apply_command(harness.state, "pause", harness.now).state
    harness.state = apply_command(harness.state, "abort", harness.now).state
    assert harness.tick(1).action is Action.ROLLBACK


def test_promote_on_command_promotes_on_the_next_decision_once_ready() -> None:
    harness = progressing()
    harness.state = apply_command(harness.state, "promote", harness.now, by="gina").state
    promoted = harness.tick(1)
    assert promoted.action is Action.PROMOTE
    assert "on command from gina" in promoted.summary
    assert promoted.new_state.phase is Phase.PROMOTING
    assert harness.run(lambda d: d.new_state.phase is Phase.SUCCEEDED).action is Action.WAIT


def test_a_reissued_command_write_claims_no_evaluation_it_was_not_decided_on() -> None:
    harness = progressing()
    harness.tick(60)  # an evaluation, stored in the state, before the command
    harness.state = apply_command(harness.state, "abort", harness.now, by="frank").state
    aborted = harness.tick(1, patch=False)  # decided and stored; the patch is lost
    assert (aborted.action, aborted.verdict) == (Action.ROLLBACK, None)
    reissued = harness.tick(5)
    assert (reissued.action, reissued.weight, reissued.id) == (Action.ROLLBACK, 0, aborted.id)
    assert harness.state.evaluation.at is not None  # an earlier evaluation is on record ...
    # ... and is not the basis of the abort's write.
    assert (reissued.verdict, reissued.requests, reissued.evaluated_at) == (None, None, None)
    assert "decided on" not in reissued.summary


def test_promote_on_command_waits_for_a_ready_canary() -> None:
    harness = progressing()
    harness.sim.crash()
    harness.sim.reconcile()
    harness.state = apply_command(harness.state, "promote", harness.now).state
    waiting = harness.tick(1)
    assert waiting.action is Action.WAIT
    assert "waiting for it to be Ready" in waiting.summary
    harness.sim.recover()
    harness.sim.reconcile()
    assert harness.tick(1).action is Action.PROMOTE


def test_promote_on_command_after_an_external_change() -> None:
    harness = progressing()
    harness.sim.set_percent(40)
    harness.sim.reconcile()
    assert harness.tick(60).action is Action.PAUSE
    harness.state = apply_command(harness.state, "promote", harness.now).state
    assert harness.tick(1).action is Action.PROMOTE
    assert harness.tick(1).new_state.phase is Phase.SUCCEEDED


def test_pause_stops_the_rollout_and_resume_continues_it() -> None:
    harness = progressing()
    result = apply_command(harness.state, "pause", harness.now, by="hal")
    assert result.accepted
    assert result.state.phase is Phase.PAUSED
    assert result.state.pause is not None
    assert result.state.pause.kind is PauseKind.MANUAL
    assert result.state.history[-1].action == "command:pause"
    harness.state = result.state
    asked = len(harness.requests)
    for _ in range(3):
        assert harness.tick(60).action is Action.WAIT
    assert len(harness.requests) == asked  # paused: nothing evaluated, nothing written
    harness.state = apply_command(harness.state, "resume", harness.now).state
    resumed = harness.tick(60)
    assert resumed.new_state.phase is Phase.PROGRESSING
    assert resumed.event_reason is EventReason.CANARY_RESUMED
    assert resumed.verdict is not None  # evaluations go on over [step start, now]


def test_after_a_long_pause_the_window_includes_the_time_the_canary_kept_serving() -> None:
    harness = progressing()
    harness.state = apply_command(harness.state, "pause", harness.now).state
    for _ in range(20):
        assert harness.tick(60).action is Action.WAIT
    harness.state = apply_command(harness.state, "resume", harness.now, by="hal").state
    # The canary served 10% throughout: the evaluation over the whole 21 minutes is real evidence.
    resumed = harness.tick(60)
    assert (resumed.action, resumed.weight) == (Action.ADVANCE, 30)
    assert any("Resumed by hal" in reason for reason in resumed.reasons)


def test_pause_then_cancelling_a_pending_resume() -> None:
    harness = progressing()
    paused = apply_command(harness.state, "pause", harness.now).state
    resuming = apply_command(paused, "resume", harness.now).state
    cancelled = apply_command(resuming, "pause", harness.now)
    assert cancelled.accepted
    assert cancelled.message == "the pending resume was cancelled"
    assert cancelled.state.command is None
    assert cancelled.state.phase is Phase.PAUSED


@pytest.mark.parametrize(
    ("phase", "command", "message"),
    [
        (Phase.IDLE, "pause", "no rollout in progress (phase Idle)"),
        (Phase.SUCCEEDED, "abort", "no rollout in progress (phase Succeeded)"),
        (Phase.ROLLED_BACK, "promote", "no rollout in progress (phase RolledBack)"),
        (Phase.PROGRESSING, "resume", "the rollout is not paused (phase Progressing)"),
        (Phase.PROMOTING, "promote", "already promoted (phase Promoting)"),
        (Phase.BAKING, "approve", "no step waits for approval (phase Baking)"),
    ],
)
def test_commands_that_make_no_sense_are_refused_and_change_nothing(
    phase: Phase, command: str, message: str
) -> None:
    state = RolloutState(phase=phase, revision=NEW)
    result = apply_command(state, command, T0)
    assert not result.accepted
    assert message in result.message
    assert result.state is state


def test_a_second_pause_and_commands_after_an_abort_are_refused() -> None:
    harness = progressing()
    paused = apply_command(harness.state, "pause", T0).state
    assert "already paused" in apply_command(paused, "pause", T0).message
    aborting = apply_command(harness.state, "abort", T0, by="ivy").state
    refused = apply_command(aborting, "promote", T0)
    assert not refused.accepted
    assert refused.message == "an abort requested by ivy is already pending"


def test_unknown_commands_raise() -> None:
    with pytest.raises(ValueError, match="explode"):
        apply_command(RolloutState(), "explode", T0)


@pytest.mark.parametrize("kind", [CommandKind.ABORT, CommandKind.PROMOTE, CommandKind.RESUME])
def test_stale_commands_are_dropped_when_no_rollout_is_active(kind: CommandKind) -> None:
    harness = progressing(make_policy())
    harness.run(lambda d: d.new_state.phase is Phase.SUCCEEDED)
    harness.state = replace(harness.state, command=PendingCommand(kind, harness.now))
    decision = harness.tick(1)
    assert decision.action is Action.WAIT
    assert decision.new_state.command is None
