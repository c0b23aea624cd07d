"""Readiness (docs/design.md §2.1): Pending until Ready, a progress deadline, un-Ready canaries hold."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from canary.kserve.status_model import KServeSim
from canary.rollout import Action, EvaluationVerdict, EventReason, Phase, Severity, decide

from .helpers import HEALTHY_EVIDENCE, Harness, make_policy, progressing

OLD, NEW = "llama-predictor-00001", "llama-predictor-00002"


def started() -> Harness:
    harness = Harness(make_policy(), KServeSim.serving())
    assert harness.start_rollout().action is Action.START
    return harness


def test_a_canary_that_is_not_ready_is_pending() -> None:
    harness = started()
    for minute in range(1, 5):
        decision = harness.tick(60)
        assert decision.action is Action.WAIT
        assert decision.new_state.phase is Phase.PENDING
        assert decision.event_reason is EventReason.CANARY_PENDING
        assert f"{minute}m of progressDeadline 15m" in decision.summary
    # Meanwhile the stable revision serves everything: KServe routes latestRevision to the latest Ready one.
    assert harness.sim.observe().weight_of(OLD) == 100


def test_not_ready_by_the_progress_deadline_rolls_back_naming_the_deadline() -> None:
    harness = started()
    decision = harness.run(lambda d: d.action is not Action.WAIT)
    assert decision.action is Action.ROLLBACK
    assert decision.weight == 0
    assert decision.new_state.phase is Phase.ROLLED_BACK
    assert "did not become Ready within progressDeadline 15m" in decision.summary
    assert harness.now - harness.timeline.writes()[0].at >= timedelta(minutes=15)


def test_a_revision_knative_failed_is_rolled_back_at_once_with_knatives_reason() -> None:
    # A 70B model still loading when Knative's 600 s deadline passes: Knative fails the revision and
    # never retries it, so waiting out the policy's own 20 minutes would only delay the rollback.
    harness = Harness(make_policy(progressDeadline="20m"), KServeSim.serving())
    harness.start_rollout()
    for _ in range(10):
        assert harness.tick(60).action is Action.WAIT
    harness.sim.fail("Initial scale was never achieved")
    harness.sim.reconcile()
    decision = harness.tick(60)
    assert decision.action is Action.ROLLBACK
    assert decision.weight == 0
    assert decision.new_state.phase is Phase.ROLLED_BACK
    assert (
        f'RevisionFailed: Revision "{NEW}" failed with message: Initial scale was never achieved.'
        in decision.summary
    )
    assert "rolled back at once rather than at progressDeadline 20m" in decision.summary
    assert "serving.knative.dev/progress-deadline" in decision.summary
    assert harness.now - harness.timeline.writes()[0].at < timedelta(minutes=12)


def test_a_revision_failed_at_its_first_sight_is_rolled_back_without_a_first_step() -> None:
    harness = Harness(make_policy(), KServeSim.serving())
    harness.tick()
    harness.sim.change_model("s3://m/v2")
    harness.sim.reconcile()
    harness.sim.fail("Container failed with: CUDA error: out of memory")
    harness.sim.reconcile()
    decision = harness.tick(1)
    assert (decision.action, decision.weight) == (Action.ROLLBACK, 0)
    assert "CUDA error: out of memory" in decision.summary


def test_a_revision_failed_message_naming_another_revision_is_not_the_canarys_failure() -> None:
    harness = started()
    message = f'Revision "{OLD}" failed with message: Initial scale was never achieved.'
    observed = replace(
        harness.sim.observe(), predictor_ready=False, revision_failure=message, failed_revision=OLD
    )
    decision = decide(harness.policy, observed, harness.state, None, harness.now + timedelta(minutes=1))
    assert decision.action is Action.WAIT
    assert decision.new_state.phase is Phase.PENDING


def test_a_progress_deadline_beyond_knatives_is_warned_about_when_the_rollout_starts() -> None:
    harness = Harness(make_policy(progressDeadline="20m"), KServeSim.serving())
    decision = harness.start_rollout()
    assert decision.severity is Severity.WARNING
    (warning,) = [reason for reason in decision.reasons if "Knative's progress deadline" in reason]
    assert "progressDeadline 20m is longer than Knative's progress deadline" in warning
    assert "10m (Knative's default" in warning
    assert 'serving.knative.dev/progress-deadline: "1200s"' in warning
    pending = harness.tick(60)
    assert warning in pending.reasons  # and in every pending decision, for explain


def test_a_revision_annotated_with_a_long_enough_deadline_is_not_warned_about() -> None:
    sim = KServeSim.serving()
    harness = Harness(make_policy(progressDeadline="20m"), sim)
    harness.tick()
    sim.predictor["annotations"] = {"serving.knative.dev/progress-deadline": "25m"}
    sim.change_model("s3://m/v2")
    sim.reconcile()
    decision = harness.tick(1)
    assert decision.action is Action.START
    assert not any("Knative's progress deadline" in reason for reason in decision.reasons)
    deadline = sim.observe().knative_deadline
    assert deadline is not None and deadline.seconds == 1500


def test_a_critical_failure_while_pending_rolls_back_before_the_deadline() -> None:
    # A GPU model OOM-killed while loading shows up in kube-state-metrics long before the deadline.
    harness = started()
    decision = harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=1))
    assert decision.action is Action.ROLLBACK
    assert "Critical check failed: oom" in decision.summary
    request = harness.requests[-1]
    assert not request.compare_with_stable  # absolute limits only while not Ready
    assert request.stable_revision is None
    assert {check.name for check in request.checks} == {
        "p99",
        "errors",
        "oom",
        "restarts",
        "gpu-memory",
        "ttft-p95",
    }


def test_the_canary_becoming_ready_moves_pending_to_progressing() -> None:
    harness = started()
    harness.tick(60)
    harness.sim.make_ready()
    harness.sim.reconcile()
    decision = harness.tick(60)
    assert decision.new_state.phase is Phase.PROGRESSING
    assert any("became Ready 2m after its rollout started" in reason for reason in decision.reasons)


def test_unready_mid_rollout_holds_the_step() -> None:
    harness = progressing()
    for _ in range(9):
        harness.tick(60)
    harness.sim.crash()
    harness.sim.reconcile()
    for _ in range(5):
        decision = harness.tick(60)
        assert decision.action is Action.WAIT  # the window elapsed, yet nothing advances
        assert decision.severity is Severity.WARNING
        assert "is not Ready" in decision.summary
        assert "holding step 10%" in decision.summary
        step = decision.new_state.step
        assert step is not None
        assert step.passed_at is None  # a step never passes while its canary is un-Ready
    harness.sim.recover()
    harness.sim.reconcile()
    resumed = harness.tick(60)
    assert resumed.action is Action.ADVANCE
    assert any("is Ready again" in reason for reason in resumed.reasons)


def test_unready_mid_rollout_still_judges_evidence_and_rolls_back_on_failures() -> None:
    harness = progressing()
    harness.sim.crash()
    harness.sim.reconcile()
    decision = harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(restarts=3))
    assert decision.verdict is EvaluationVerdict.FAIL
    assert decision.action is Action.WAIT
    assert harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(restarts=4)).action is Action.ROLLBACK


def test_unready_mid_rollout_rolls_back_after_the_progress_deadline() -> None:
    harness = progressing()
    harness.tick(60)
    harness.sim.crash()
    harness.sim.reconcile()
    became_unready = harness.tick(60)
    assert became_unready.new_state.unready_since == harness.now
    decision = harness.run(lambda d: d.action is not Action.WAIT)
    assert decision.action is Action.ROLLBACK
    assert "has not been Ready for 15m" in decision.summary
    assert "beyond progressDeadline 15m" in decision.summary
    assert "CrashLoopBackOff" in decision.summary
