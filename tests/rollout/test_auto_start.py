"""How a rollout starts (docs/design.md §2.2): auto-start, unguarded rollouts, Git-set percentages."""

from __future__ import annotations

from canary.kserve.status_model import KServeSim
from canary.rollout import Action, EventReason, PauseKind, Phase, Severity, apply_command

from .helpers import Harness, make_policy

OLD, NEW = "llama-predictor-00001", "llama-predictor-00002"


def watching(**policy: object) -> Harness:
    harness = Harness(make_policy(**policy), KServeSim.serving())
    adopted = harness.tick()
    assert adopted.new_state.phase is Phase.IDLE
    assert adopted.event_reason is EventReason.CANARY_IDLE
    return harness


def test_new_revision_not_ready_with_field_absent_starts_at_the_first_step_at_once() -> None:
    harness = watching()
    harness.sim.change_model("s3://m/v2")
    harness.sim.reconcile()
    decision = harness.tick(1)
    assert decision.action is Action.START
    assert decision.weight == 10
    assert decision.patch == {"spec": {"predictor": {"canaryTrafficPercent": 10}}}
    assert decision.new_state.phase is Phase.PENDING
    assert decision.event_reason is EventReason.CANARY_STARTED
    assert decision.new_state.intent is not None
    assert decision.new_state.intent.weight == 10  # write-ahead: the intent is in the stored state
    # When the canary becomes Ready it receives only the first step, never 100%.
    harness.sim.make_ready()
    harness.sim.reconcile()
    observed = harness.sim.observe()
    assert observed.weight_of(NEW) == 10
    assert observed.weight_of(OLD) == 90


def test_new_revision_found_ready_at_100_percent_starts_at_once_and_flags_an_unguarded_rollout() -> None:
    harness = watching()
    harness.sim.change_model("s3://m/v2")
    harness.sim.reconcile()
    harness.sim.make_ready()
    harness.sim.reconcile()  # the controller was too slow: KServe switched 100% and recorded it
    assert harness.sim.latest_rolledout == NEW
    decision = harness.tick(1)
    assert decision.action is Action.START
    assert decision.weight == 10
    assert decision.event_reason is EventReason.UNGUARDED_ROLLOUT
    assert decision.severity is Severity.WARNING
    assert decision.new_state.unguarded
    assert decision.new_state.stable_revision == OLD  # the previous rolled-out revision
    assert any("Unguarded rollout" in reason and "status shows 100%" in reason for reason in decision.reasons)
    # The first step pins 90% back to the previous revision while its pods still exist.
    assert harness.sim.observe().weight_of(OLD) == 90
    assert harness.sim.observe().weight_of(NEW) == 10


def test_git_set_value_equal_to_the_first_step_is_accepted_without_a_write() -> None:
    harness = watching()
    harness.sim.change_model("s3://m/v2", percent=10)
    harness.sim.reconcile()
    decision = harness.tick(1)
    assert decision.action is Action.WAIT
    assert decision.event_reason is EventReason.CANARY_STARTED
    assert decision.new_state.phase is Phase.PENDING
    assert "set with the spec" in decision.summary
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.tick(60)
    progressing = harness.tick(60)
    assert progressing.new_state.phase is Phase.PROGRESSING
    assert harness.writes() == []  # nothing written: Git's value is the first step


def test_dark_launch_at_0_starts_at_the_first_step_once_ready() -> None:
    harness = watching()
    harness.sim.change_model("s3://m/v2", percent=0)
    harness.sim.reconcile()
    decision = harness.tick(1)
    assert decision.action is Action.WAIT
    assert decision.new_state.phase is Phase.PENDING
    assert "dark launch" in decision.summary
    still_pending = harness.tick(60)
    assert still_pending.action is Action.WAIT
    harness.sim.make_ready()
    harness.sim.reconcile()
    started = harness.tick(60)
    assert started.action is Action.START
    assert started.weight == 10
    assert started.new_state.phase is Phase.PROGRESSING


def test_dark_launch_found_already_ready_starts_at_once() -> None:
    harness = watching()
    harness.sim.change_model("s3://m/v2", percent=0)
    harness.sim.reconcile()
    harness.sim.make_ready()
    harness.sim.reconcile()
    decision = harness.tick(1)
    assert (decision.action, decision.weight) == (Action.START, 10)
    assert decision.event_reason is EventReason.CANARY_STARTED
    assert not decision.new_state.unguarded  # at 0% it was never exposed


def test_any_other_git_set_value_pauses_with_the_reason_and_writes_nothing() -> None:
    harness = watching()
    harness.sim.change_model("s3://m/v2", percent=40)
    harness.sim.reconcile()
    decision = harness.tick(1)
    assert decision.action is Action.PAUSE
    assert decision.severity is Severity.WARNING
    pause = decision.new_state.pause
    assert pause is not None
    assert pause.kind is PauseKind.UNEXPECTED_START_VALUE
    assert "canaryTrafficPercent 40" in decision.summary
    assert "first step (10)" in decision.summary
    assert harness.sim.percent == 40
    assert harness.tick(60).action is Action.WAIT  # stays paused, writes nothing
    assert harness.writes() == []


def test_resume_after_an_unexpected_start_value_starts_from_the_first_step() -> None:
    harness = watching()
    harness.sim.change_model("s3://m/v2", percent=40)
    harness.sim.reconcile()
    harness.tick(1)
    result = apply_command(harness.state, "resume", harness.now, by="alice")
    assert result.accepted
    harness.state = result.state
    decision = harness.tick(1)
    assert (decision.action, decision.weight) == (Action.START, 10)
    assert decision.new_state.phase is Phase.PENDING
    assert harness.sim.percent == 10


def test_auto_start_off_with_the_field_absent_writes_nothing_and_warns() -> None:
    harness = watching(autoStart=False)
    harness.sim.change_model("s3://m/v2")
    harness.sim.reconcile()
    decision = harness.tick(1)
    assert decision.action is Action.WAIT
    assert decision.event_reason is EventReason.UNGUARDED_ROLLOUT
    assert decision.severity is Severity.WARNING
    assert decision.new_state.phase is Phase.IDLE
    assert harness.writes() == []


def test_auto_start_off_still_accepts_a_git_set_first_step() -> None:
    harness = watching(autoStart=False)
    harness.sim.change_model("s3://m/v2", percent=10)
    harness.sim.reconcile()
    decision = harness.tick(1)
    assert decision.new_state.phase is Phase.PENDING
    assert decision.event_reason is EventReason.CANARY_STARTED


def test_a_canary_found_under_way_on_first_sight_is_started() -> None:
    # The controller's first look at this InferenceService: a new revision is already being created.
    sim = KServeSim.serving()
    sim.change_model("s3://m/v2")
    sim.reconcile()
    harness = Harness(make_policy(), sim)
    decision = harness.tick()
    assert (decision.action, decision.weight) == (Action.START, 10)
    assert decision.new_state.revision == NEW
