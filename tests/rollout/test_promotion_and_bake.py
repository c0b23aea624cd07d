"""Promotion (docs/design.md §2.3): the final 100 is the promotion; bake; Succeeded once KServe records it."""

from __future__ import annotations

from datetime import timedelta

from canary.rollout import Action, EvaluationVerdict, EventReason, Phase

from .helpers import HEALTHY_EVIDENCE, make_policy, no_data, progressing, query_error

OLD, NEW = "llama-predictor-00001", "llama-predictor-00002"


def test_the_step_before_a_final_100_passing_promotes_by_removing_the_field() -> None:
    harness = progressing()
    promoted = harness.run(lambda d: d.action is Action.PROMOTE)
    assert harness.writes() == [10, 30, 50, None]
    assert promoted.weight is None
    assert promoted.patch == {"spec": {"predictor": {"canaryTrafficPercent": None}}}
    assert promoted.new_state.phase is Phase.PROMOTING
    assert promoted.event_reason is EventReason.CANARY_PROMOTED
    assert promoted.verdict is EvaluationVerdict.PASS  # promoted on the evaluation that passed the step
    assert promoted.reasons[1].startswith("Step 50% passed")
    assert harness.sim.percent is None


def test_a_policy_without_a_final_100_promotes_after_its_last_step() -> None:
    harness = progressing(make_policy(steps=[10, 60], window="2m"))
    harness.run(lambda d: d.action is Action.PROMOTE)
    assert harness.writes() == [10, 60, None]


def test_succeeded_once_status_shows_the_canary_as_latest_rolled_out_revision() -> None:
    harness = progressing()
    while harness.tick(60, reconcile=False).action is not Action.PROMOTE:
        harness.sim.reconcile()
    # KServe has not reconciled the removal yet.
    waiting = harness.tick(5, reconcile=False)
    assert waiting.new_state.phase is Phase.PROMOTING
    assert "Waiting for KServe to record the promotion" in waiting.summary
    harness.sim.reconcile()
    succeeded = harness.tick(5)
    assert succeeded.new_state.phase is Phase.SUCCEEDED
    assert succeeded.event_reason is EventReason.CANARY_SUCCEEDED
    assert harness.sim.latest_rolledout == NEW
    assert harness.sim.previous_rolledout == OLD
    assert harness.tick(60).action is Action.WAIT  # nothing more happens


def test_bake_keeps_evaluating_absolute_checks_after_promotion_and_rolls_back_on_failure() -> None:
    harness = progressing(make_policy(bake="15m"))
    harness.run(lambda d: d.action is Action.PROMOTE)
    baking = harness.tick(60)
    assert baking.new_state.phase is Phase.BAKING
    assert baking.event_reason is EventReason.CANARY_BAKING
    healthy = harness.tick(60)
    assert healthy.verdict is EvaluationVerdict.PASS
    request = harness.requests[-1]
    assert not request.compare_with_stable
    assert request.stable_revision is None
    assert request.window_start == baking.new_state.bake_started_at
    # maxIncrease-only parts are not judged: the stable revision now gets no traffic.
    assert {j.limit for j in healthy.judgements if j.name == "p99"} == {"≤ 800ms"}
    rolled_back = harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=1))
    assert rolled_back.action is Action.ROLLBACK
    assert rolled_back.new_state.phase is Phase.ROLLED_BACK
    # 0 on the promoted spec pins the traffic back to the previous rolled-out revision.
    assert harness.sim.observe().weight_of(OLD) == 100


def test_bake_succeeds_once_the_bake_period_ends_without_a_failure() -> None:
    harness = progressing(make_policy(bake="5m"))
    harness.run(lambda d: d.action is Action.PROMOTE)
    bake_start = harness.tick(60).new_state.bake_started_at
    assert bake_start is not None
    phases = [harness.tick(60).new_state.phase for _ in range(5)]
    assert phases == [Phase.BAKING] * 4 + [Phase.SUCCEEDED]
    assert harness.now - bake_start == timedelta(minutes=5)


def test_bake_does_not_end_on_a_query_error_but_ends_on_no_data() -> None:
    harness = progressing(make_policy(bake="2m"))
    harness.run(lambda d: d.action is Action.PROMOTE)
    harness.tick(60)
    harness.tick(60)
    broken = HEALTHY_EVIDENCE.failing(oom=query_error())
    held = harness.tick(60, evidence=broken)
    assert held.new_state.phase is Phase.BAKING
    assert held.event_reason is EventReason.PROMETHEUS_UNAVAILABLE
    ended = harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(p99=no_data()))
    assert ended.new_state.phase is Phase.SUCCEEDED


def test_bake_failure_limit_counts_consecutive_failures() -> None:
    harness = progressing(make_policy(bake="30m", failureLimit=3))
    harness.run(lambda d: d.action is Action.PROMOTE)
    harness.tick(60)
    slow = HEALTHY_EVIDENCE.failing(p99=2.0)
    actions = [harness.tick(60, evidence=slow).action for _ in range(3)]
    assert actions == [Action.WAIT, Action.WAIT, Action.ROLLBACK]
