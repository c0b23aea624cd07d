"""KServe's status trails the spec (docs/design.md §2.1): never act on a status that may predate the spec."""

from __future__ import annotations

from datetime import timedelta

from canary.rollout import Action, EventReason, Phase, Severity

from .helpers import HEALTHY_EVIDENCE, progressing

OLD, CANARY, NEWER = "llama-predictor-00001", "llama-predictor-00002", "llama-predictor-00003"


def test_spec_changed_but_status_still_shows_the_previous_revision_waits_and_judges_nothing() -> None:
    harness = progressing()
    harness.tick(60)
    evaluations_before = len(harness.requests)
    harness.sim.change_model("s3://m/v3")  # KServe has not reconciled yet
    for _ in range(3):
        decision = harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=5), reconcile=False)
        assert decision.action is Action.WAIT
        assert decision.event_reason is EventReason.SPEC_CHANGE_PENDING
        assert decision.verdict is None  # even a critical failure of the old canary is not judged
        assert decision.new_state.revision == CANARY
        assert "still reports llama-predictor-00002" in decision.summary
    assert len(harness.requests) == evaluations_before  # no evidence was even asked for
    harness.sim.reconcile()
    restarted = harness.tick(1)
    # The spec still carries the first step the controller wrote for the previous canary.
    assert restarted.action is Action.WAIT
    assert restarted.event_reason is EventReason.CANARY_STARTED
    assert "first step 10% (left from the previous rollout)" in restarted.summary
    assert restarted.new_state.revision == NEWER
    assert restarted.new_state.phase is Phase.PENDING


def test_the_old_canary_is_never_promoted_once_the_spec_changed() -> None:
    harness = progressing()
    # Hold the last step until one tick before it would pass.
    while True:
        decision = harness.tick(60, reconcile=False)
        step = decision.new_state.step
        assert step is not None
        if step.weight == 50 and step.started_at is not None and harness.now - step.started_at >= _minutes(9):
            break
        if decision.action.writes:
            harness.sim.reconcile()
    harness.sim.change_model("s3://m/v3")
    for _ in range(5):
        decision = harness.tick(60, reconcile=False)
        assert decision.action is Action.WAIT
        assert decision.new_state.phase is Phase.PROGRESSING
    assert None not in harness.writes()  # no promotion was written


def test_a_spec_change_that_kserve_never_turns_into_a_revision_warns_after_the_deadline() -> None:
    harness = progressing()
    harness.sim.change_model("s3://m/v3")
    first = harness.tick(60, reconcile=False)
    assert first.severity is Severity.INFO
    late = harness.tick(15 * 60, reconcile=False)
    assert late.severity is Severity.WARNING
    assert any("KServe has created no revision for the changed spec for 15m" in r for r in late.reasons)


def test_a_spec_reverted_before_kserve_acted_continues_the_rollout() -> None:
    harness = progressing()
    harness.sim.change_model("s3://m/v3")
    assert harness.tick(60, reconcile=False).event_reason is EventReason.SPEC_CHANGE_PENDING
    harness.sim.change_model("s3://m/v2")  # back to the canary's spec
    resumed = harness.tick(60, reconcile=False)
    assert resumed.event_reason is not EventReason.SPEC_CHANGE_PENDING
    assert resumed.new_state.spec_change_seen_at is None
    assert resumed.new_state.revision == CANARY


def test_a_spec_change_in_a_steady_state_waits_for_the_revision_then_starts() -> None:
    harness = progressing()
    harness.run(lambda d: d.new_state.phase is Phase.SUCCEEDED)
    harness.sim.change_model("s3://m/v3")
    waiting = harness.tick(5, reconcile=False)
    assert waiting.event_reason is EventReason.SPEC_CHANGE_PENDING
    harness.sim.reconcile()
    started = harness.tick(5)
    assert (started.action, started.weight, started.new_state.revision) == (Action.START, 10, NEWER)
    assert started.new_state.stable_revision == CANARY


def _minutes(count: int) -> timedelta:
    return timedelta(minutes=count)
