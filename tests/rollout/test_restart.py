"""Restarts (docs/design.md §4): a reloaded state resumes exactly where it was."""

from __future__ import annotations

from datetime import timedelta

from canary.rollout import Action, Phase, RolloutState, decide, evidence_request

from .helpers import HEALTHY_EVIDENCE, EvidenceMaker, in_sequence, progressing

SLOW = HEALTHY_EVIDENCE.failing(p99=0.95)


def test_a_restart_with_the_same_now_gives_the_same_decision_at_every_tick() -> None:
    harness = progressing()
    answers = in_sequence(*([HEALTHY_EVIDENCE] * 12 + [SLOW] + [HEALTHY_EVIDENCE] * 40))
    compared = 0
    while harness.state.phase is not Phase.SUCCEEDED:
        harness.now += timedelta(seconds=45)
        observed = harness.sim.observe()
        request = evidence_request(harness.policy, observed, harness.state, harness.now)
        reloaded = RolloutState.from_json(harness.state.to_json())
        assert evidence_request(harness.policy, observed, reloaded, harness.now) == request
        evidence = answers(request) if request else None
        before = decide(harness.policy, observed, harness.state, evidence, harness.now)
        after_restart = decide(harness.policy, observed, reloaded, evidence, harness.now)
        assert after_restart == before
        harness.state = before.new_state
        if before.action.writes:
            harness.sim.set_percent(before.weight)
        harness.sim.reconcile()
        compared += 1
    assert compared > 30


def test_a_restart_never_shortens_a_window_or_evaluates_early() -> None:
    harness = progressing()
    step_start = harness.now
    harness.tick(60)
    last_evaluation = harness.now
    # The controller restarts 20 seconds later and ticks at once: nothing is due yet.
    harness.state = RolloutState.from_json(harness.state.to_json())
    asked = len(harness.requests)
    restarted = harness.tick(20)
    assert restarted.action is Action.WAIT
    assert len(harness.requests) == asked
    harness.tick(40)
    assert harness.requests[-1].at == last_evaluation + timedelta(minutes=1)
    advanced = harness.run(lambda d: d.action is Action.ADVANCE, every=20)
    assert harness.now - step_start >= timedelta(minutes=10)
    assert advanced.weight == 30


def test_a_crash_between_storing_and_patching_neither_skips_nor_repeats_a_step() -> None:
    harness = progressing()
    while harness.tick(60, patch=False).action is not Action.ADVANCE:
        pass
    harness.state = RolloutState.from_json(harness.state.to_json())  # the new process
    retried = harness.tick(10)
    assert (retried.action, retried.weight) == (Action.ADVANCE, 30)  # the same step, not 50
    second_step_start = harness.tick(10).new_state.step
    assert second_step_start is not None
    assert second_step_start.weight == 30
    harness.run(lambda d: d.action is Action.ADVANCE)
    assert harness.writes() == [10, 30, 30, 50]  # 30 written twice (idempotent), never skipped


def test_a_crash_after_patching_does_not_write_again() -> None:
    harness = progressing()
    while harness.tick(60).action is not Action.ADVANCE:
        pass
    harness.state = RolloutState.from_json(harness.state.to_json())
    following = [harness.tick(10).action for _ in range(5)]
    assert Action.ADVANCE not in following
    assert harness.writes() == [10, 30]


def test_a_decision_applied_twice_at_the_same_now_changes_nothing_more() -> None:
    harness = progressing()
    answers = in_sequence(HEALTHY_EVIDENCE, SLOW, EvidenceMaker(requests=3), HEALTHY_EVIDENCE)
    while harness.state.phase is not Phase.SUCCEEDED:
        harness.now += timedelta(seconds=60)
        observed = harness.sim.observe()
        request = evidence_request(harness.policy, observed, harness.state, harness.now)
        evidence = answers(request) if request else None
        first = decide(harness.policy, observed, harness.state, evidence, harness.now)
        again = decide(harness.policy, observed, first.new_state, evidence, harness.now)
        assert again.new_state == first.new_state
        if again.action.writes:  # only ever the same write again, never another one
            assert (again.action, again.weight, again.id) == (first.action, first.weight, first.id)
        harness.state = first.new_state
        if first.action.writes:
            harness.sim.set_percent(first.weight)
        harness.sim.reconcile()
