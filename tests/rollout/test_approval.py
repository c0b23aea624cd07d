"""``approval: manual`` (docs/design.md §4): pause before leaving the step until a person approves."""

from __future__ import annotations

from datetime import timedelta

from canary.rollout import Action, EventReason, PauseKind, Phase, Severity, apply_command

from .helpers import HEALTHY_EVIDENCE, make_policy, progressing

MANUAL = make_policy(steps=[{"weight": 10, "approval": "manual"}, 50, 100])


def test_manual_approval_pauses_before_leaving_the_step() -> None:
    harness = progressing(MANUAL)
    step_start = harness.now
    paused = harness.run(lambda d: d.action is not Action.WAIT)
    assert paused.action is Action.PAUSE
    assert harness.now - step_start == timedelta(minutes=10)  # the step itself passed first
    assert paused.event_reason is EventReason.CANARY_AWAITING_APPROVAL
    assert paused.severity is Severity.INFO
    pause = paused.new_state.pause
    assert pause is not None
    assert pause.kind is PauseKind.APPROVAL
    assert "`kserve-canary approve ml/llama`" in paused.summary
    for _ in range(30):  # it waits as long as it takes, writing nothing
        waiting = harness.tick(60)
        assert waiting.action is Action.WAIT
        assert waiting.event_reason is EventReason.CANARY_AWAITING_APPROVAL
    assert harness.writes() == [10]


def test_approve_releases_the_pause_and_the_rollout_leaves_the_step() -> None:
    harness = progressing(MANUAL)
    harness.run(lambda d: d.action is Action.PAUSE)
    result = apply_command(harness.state, "approve", harness.now, by="carol")
    assert result.accepted
    assert result.message == "step 10% of llama-predictor-00002 approved"
    assert result.state.phase is Phase.PROGRESSING
    assert result.state.approvals == (10,)
    harness.state = result.state
    advanced = harness.tick(5)
    assert (advanced.action, advanced.weight) == (Action.ADVANCE, 50)


def test_evaluations_continue_while_awaiting_approval_and_a_failure_rolls_back() -> None:
    harness = progressing(MANUAL)
    harness.run(lambda d: d.action is Action.PAUSE)
    failing = HEALTHY_EVIDENCE.failing(oom=2)
    rolled_back = harness.tick(60, evidence=failing)
    assert rolled_back.action is Action.ROLLBACK


def test_an_approval_after_a_non_passing_evaluation_waits_for_the_next_pass() -> None:
    harness = progressing(MANUAL)
    harness.run(lambda d: d.action is Action.PAUSE)
    slow = harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(p99=2.0))
    assert slow.action is Action.WAIT
    harness.state = apply_command(harness.state, "approve", harness.now).state
    not_yet = harness.tick(5)
    assert not_yet.action is Action.WAIT
    assert harness.tick(60).action is Action.ADVANCE


def test_resume_does_not_approve() -> None:
    harness = progressing(MANUAL)
    harness.run(lambda d: d.action is Action.PAUSE)
    result = apply_command(harness.state, "resume", harness.now)
    assert not result.accepted
    assert "use approve" in result.message
    assert result.state == harness.state


def test_a_step_can_be_approved_before_it_passes() -> None:
    harness = progressing(MANUAL)
    harness.state = apply_command(harness.state, "approve", harness.now, by="dave").state
    advanced = harness.run(lambda d: d.action is not Action.WAIT)
    assert (advanced.action, advanced.weight) == (Action.ADVANCE, 50)
    again = apply_command(advanced.new_state, "approve", harness.now)
    assert again.accepted  # the next step is a different one
    assert not apply_command(again.state, "approve", harness.now).accepted  # ... but only once


def test_approve_is_refused_for_a_step_the_policy_does_not_hold_for_approval() -> None:
    harness = progressing(MANUAL)
    manual = frozenset({10})
    approved = apply_command(harness.state, "approve", harness.now, approval_steps=manual)
    assert approved.accepted
    harness.state = approved.state
    advanced = harness.run(lambda d: d.action is not Action.WAIT)
    assert (advanced.action, advanced.weight) == (Action.ADVANCE, 50)
    refused = apply_command(advanced.new_state, "approve", harness.now, approval_steps=manual)
    assert not refused.accepted
    assert refused.message.endswith(
        "step 50% does not wait for approval: the policy's steps with approval: manual are 10%"
    ), refused.message
    assert refused.state == advanced.new_state
    without_any = apply_command(progressing(make_policy()).state, "approve", harness.now, approval_steps=())
    assert not without_any.accepted
    assert "the policy's steps with approval: manual are none" in without_any.message
