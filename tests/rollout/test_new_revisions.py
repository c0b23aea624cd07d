"""New revisions during and after rollouts (docs/design.md §2.3): restart, never retry a rolled-back revision."""

from __future__ import annotations

from canary.kserve.status_model import KServeSim
from canary.rollout import Action, EventReason, Phase, RolloutState, Severity, decide
from canary.rollout.state import RolledBackRevision

from .helpers import HEALTHY_EVIDENCE, T0, make_policy, progressing

OLD, CANARY, NEWER = (f"llama-predictor-{n:05d}" for n in range(1, 4))


def test_a_new_canary_revision_mid_rollout_starts_a_new_rollout_from_the_first_step() -> None:
    harness = progressing()
    harness.run(lambda d: d.action is Action.ADVANCE)  # at 30%
    harness.tick(60)
    harness.sim.change_model("s3://m/v3")
    harness.sim.reconcile()
    restarted = harness.tick(60)
    assert (restarted.action, restarted.weight) == (Action.START, 10)
    assert restarted.new_state.revision == NEWER
    assert restarted.new_state.phase is Phase.PENDING
    step = restarted.new_state.step
    assert step is not None
    assert (step.index, step.weight, step.started_at) == (0, 10, None)
    assert restarted.new_state.evaluation.at is None  # nothing of the old analysis carries over
    assert any(f"{NEWER} replaces {CANARY}" in reason for reason in restarted.reasons)
    assert any(
        "the controller's own value from the previous rollout" in reason for reason in restarted.reasons
    )
    # The new canary starts its own analysis; the stable revision is still the old one.
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.tick(60)
    harness.tick(60)
    assert harness.requests[-1].canary_revision == NEWER
    assert harness.requests[-1].stable_revision == OLD


def test_a_rolled_back_revision_is_never_retried() -> None:
    harness = progressing()
    harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=1))
    assert harness.state.phase is Phase.ROLLED_BACK
    for _ in range(30):
        decision = harness.tick(60)
        assert decision.action is Action.WAIT
        assert decision.new_state.phase is Phase.ROLLED_BACK
    assert "it is not retried" in decision.summary
    assert harness.writes() == [10, 0]


def test_a_rolled_back_revision_seen_again_is_not_retried() -> None:
    # Should KServe ever report a revision that was rolled back (e.g. state from before a re-creation),
    # it is not analysed again.
    sim = KServeSim.serving()
    sim.change_model("s3://m/v2")
    sim.reconcile()
    state = RolloutState(
        phase=Phase.SUCCEEDED,
        revision=OLD,
        fingerprint="sha256:other",
        rolled_back=(RolledBackRevision(CANARY, T0),),
    )
    decision = decide(make_policy(), sim.observe(), state, None, T0)
    assert decision.action is Action.WAIT
    assert decision.event_reason is EventReason.REVISION_NOT_RETRIED
    assert decision.new_state.phase is Phase.ROLLED_BACK
    assert decision.new_state.revision == CANARY


def test_a_new_revision_after_a_rollback_starts_a_new_rollout_once_ready() -> None:
    harness = progressing()
    harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=1))
    harness.tick(60)
    harness.sim.change_model("s3://m/v3")  # the fix, pushed through Git
    harness.sim.reconcile()
    # The spec still holds the 0 of the rollback: the new revision is dark until Ready, so the
    # rolled-back revision (still latest Ready) gets nothing meanwhile.
    pending = harness.tick(60)
    assert pending.action is Action.WAIT
    assert pending.new_state.phase is Phase.PENDING
    assert pending.new_state.revision == NEWER
    assert harness.sim.observe().weight_of(CANARY) == 0
    harness.sim.make_ready()
    harness.sim.reconcile()
    started = harness.tick(60)
    assert (started.action, started.weight) == (Action.START, 10)
    assert started.new_state.was_rolled_back(CANARY)  # remembered across rollouts
    harness.run(lambda d: d.new_state.phase is Phase.SUCCEEDED)
    assert harness.sim.latest_rolledout == NEWER


def test_after_a_rollback_during_bake_the_next_rollout_splits_with_the_revision_before_it() -> None:
    harness = progressing(make_policy(bake="15m"))
    harness.run(lambda d: d.new_state.phase is Phase.BAKING)
    harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=1))
    assert harness.state.phase is Phase.ROLLED_BACK
    # The 0 after the promotion: KServe's PropagateStatus rolls latestRolledoutRevision back to
    # previousRolledoutRevision (kserve pkg/apis/serving/v1beta1/inference_service_status.go at
    # 0217bdab, lines 542-553), and createKnativeService routes the rest there (ksvc_reconciler.go
    # at 279fb1e5, line 104).
    assert (harness.sim.latest_rolledout, harness.sim.previous_rolledout) == (OLD, OLD)
    assert harness.sim.observe().weight_of(OLD) == 100
    harness.sim.change_model("s3://m/v3")
    harness.sim.reconcile()
    harness.sim.make_ready()
    harness.sim.reconcile()
    decision = harness.tick(60)
    assert decision.new_state.stable_revision == OLD
    assert not any("which was rolled back earlier" in reason for reason in decision.reasons)


def test_a_fix_pushed_before_kserve_saw_the_bake_rollback_warns_that_the_stable_was_rolled_back() -> None:
    harness = progressing(make_policy(bake="15m"))
    harness.run(lambda d: d.new_state.phase is Phase.BAKING)
    harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=1), reconcile=False)
    assert harness.state.phase is Phase.ROLLED_BACK
    # The fix lands before KServe reconciles the 0: latestReadyRevision != latestCreatedRevision, so
    # PropagateStatus keeps the rolled-back canary as latestRolledoutRevision (kserve
    # inference_service_status.go at 0217bdab, line 545) and it keeps the rest of the traffic.
    harness.sim.change_model("s3://m/v3")
    harness.sim.reconcile()
    assert harness.sim.latest_rolledout == CANARY
    harness.sim.make_ready()
    harness.sim.reconcile()
    decision = harness.tick(60)
    assert decision.new_state.stable_revision == CANARY
    assert decision.severity is Severity.WARNING
    assert any("which was rolled back earlier" in reason for reason in decision.reasons)


def test_consecutive_rollouts_each_start_from_the_first_step() -> None:
    harness = progressing()
    harness.run(lambda d: d.new_state.phase is Phase.SUCCEEDED)
    harness.sim.change_model("s3://m/v3")
    harness.sim.reconcile()
    second = harness.tick(60)
    assert (second.action, second.weight) == (Action.START, 10)
    assert second.new_state.stable_revision == CANARY
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.run(lambda d: d.new_state.phase is Phase.SUCCEEDED)
    assert harness.writes() == [10, 30, 50, None, 10, 30, 50, None]


def test_a_rollout_records_the_generation_the_authors_change_produced_not_the_controllers_writes() -> None:
    harness = progressing()
    harness.run(lambda d: d.action is Action.ADVANCE)  # at 30%: the controller wrote twice
    harness.sim.change_model("s3://m/v3")  # the author's apply
    authored = harness.sim.generation
    harness.sim.reconcile()
    restarted = harness.tick(60)
    assert restarted.action is Action.START
    assert restarted.new_state.started_generation == authored
    harness.sim.make_ready()
    harness.sim.reconcile()
    advanced = harness.run(lambda d: d.action is Action.ADVANCE)
    assert harness.sim.generation > authored  # the controller's own writes moved the generation
    assert advanced.new_state.started_generation == authored  # and not what the rollout records
