"""The semantics of a step (docs/design.md §4): its clock, its evaluations, when it passes, when it fails."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from canary.evidence import Evidence
from canary.kserve.status_model import KServeSim
from canary.rollout import (
    Action,
    EvaluationVerdict,
    EventReason,
    PauseKind,
    Phase,
    Severity,
    apply_command,
    decide,
    evidence_request,
)
from canary.rollout.bookkeeping import TIMER_SLACK

from .helpers import (
    HEALTHY_EVIDENCE,
    EvidenceMaker,
    Harness,
    in_sequence,
    make_policy,
    no_data,
    progressing,
    query_error,
)

NEW = "llama-predictor-00002"
SLOW = HEALTHY_EVIDENCE.failing(p99=0.95)  # above max 800ms
SILENT = HEALTHY_EVIDENCE.failing(p99=no_data())


def test_step_clock_starts_when_its_percentage_is_observed_in_status_traffic_not_when_patched() -> None:
    harness = progressing()
    while harness.tick(60, reconcile=False).action is not Action.ADVANCE:
        pass
    patched_at = harness.now
    # KServe is slow: for five minutes the status still shows 10%.
    for _ in range(5):
        waiting = harness.tick(60, reconcile=False)
        assert waiting.action is Action.WAIT
        assert "Waiting for status traffic to show 30%" in waiting.summary
        step = waiting.new_state.step
        assert step is not None
        assert step.started_at is None
    harness.sim.reconcile()
    started = harness.tick(60)
    step = started.new_state.step
    assert step is not None
    assert step.started_at == patched_at + timedelta(minutes=6)
    assert "started: status traffic shows it" in started.summary
    advanced = harness.run(lambda d: d.action is Action.ADVANCE)
    assert advanced.weight == 50
    assert harness.now - step.started_at >= timedelta(minutes=10)  # the full window from observation


def test_evaluations_cover_the_step_start_to_now_every_interval() -> None:
    harness = progressing()
    step_start = harness.now
    for _ in range(4):
        harness.tick(30)
    requests = harness.requests
    assert [request.at - step_start for request in requests] == [timedelta(minutes=1), timedelta(minutes=2)]
    assert all(request.window_start == step_start for request in requests)
    assert all(request.canary_revision == NEW for request in requests)
    assert all(request.stable_revision == "llama-predictor-00001" for request in requests)
    assert all(request.compare_with_stable for request in requests)
    assert requests[-1].window_seconds == 120
    assert len(requests[-1].checks) == 6


def test_an_evaluation_is_due_once_more_when_the_window_ends_between_two_intervals() -> None:
    harness = progressing(make_policy(interval="4m", window="10m"))
    step_start = harness.now
    advanced = harness.run(lambda d: d.action is Action.ADVANCE, every=60)
    offsets = [request.at - step_start for request in harness.requests]
    assert offsets == [timedelta(minutes=4), timedelta(minutes=8), timedelta(minutes=10)]
    assert harness.now - step_start == timedelta(minutes=10)  # not 12: the window's end is evaluated
    assert advanced.weight == 30


def test_step_passes_when_window_elapsed_min_requests_reached_and_latest_evaluation_passes() -> None:
    harness = progressing()
    step_start = harness.now
    decision = harness.run(lambda d: d.action is Action.ADVANCE)
    assert decision.weight == 30
    assert harness.now - step_start == timedelta(minutes=10)
    assert decision.verdict is EvaluationVerdict.PASS
    assert decision.requests == 5000
    assert decision.summary == "Advancing llama-predictor-00002 from 10% to 30%."
    assert decision.reasons[1].startswith("Step 10% passed: held 10m (window 10m), 5000 canary requests")
    assert decision.new_state.intent is not None
    assert decision.new_state.intent.weight == 30


def test_a_step_does_not_pass_before_min_requests_are_reached() -> None:
    harness = progressing()
    step_start = harness.now
    # A trickle of 6 requests a minute: the window is held at 10m, minRequests (100) at minute 17.
    for minute in range(1, 17):
        decision = harness.tick(60, evidence=EvidenceMaker(requests=6 * minute))
        assert decision.action is Action.WAIT
        assert any(f"{6 * minute} of 100 canary requests" in reason for reason in decision.reasons)
        # Requests are flowing: that is not silence, onNoData (15m) never speaks.
        assert "No conclusive evidence" not in decision.summary
    advanced = harness.tick(60, evidence=EvidenceMaker(requests=6 * 17))
    assert advanced.action is Action.ADVANCE
    assert harness.now - step_start == timedelta(minutes=17)


def test_no_new_requests_is_no_data_even_below_min_requests() -> None:
    harness = progressing()
    stuck = EvidenceMaker(requests=60)  # the window's count never grows: nobody sends requests
    for _ in range(16):
        decision = harness.tick(60, evidence=stuck)
        assert decision.action is Action.WAIT
    # Counted from the last evaluation that saw new requests (the first one, at minute 1).
    assert decision.summary.startswith("No conclusive evidence for 10% of llama-predictor-00002 for 15m")
    assert decision.severity is Severity.WARNING


def test_a_step_does_not_pass_when_the_latest_evaluation_is_not_a_pass() -> None:
    harness = progressing()
    for _ in range(9):
        harness.tick(60)
    at_window_end = harness.tick(60, evidence=SILENT)
    assert at_window_end.action is Action.WAIT
    assert at_window_end.verdict is EvaluationVerdict.INCONCLUSIVE
    step = at_window_end.new_state.step
    assert step is not None
    assert step.passed_at is None
    advanced = harness.tick(60)
    assert advanced.action is Action.ADVANCE


def test_failure_limit_consecutive_failed_evaluations_roll_back() -> None:
    harness = progressing()
    first = harness.tick(60, evidence=SLOW)
    assert first.action is Action.WAIT
    assert first.verdict is EvaluationVerdict.FAIL
    assert first.event_reason is EventReason.CANARY_CHECK_FAILED
    assert first.severity is Severity.WARNING
    assert first.summary.startswith(
        "Evaluation failed (1 of failureLimit 2 in a row): p99: 950ms is above max 800ms"
    )
    second = harness.tick(60, evidence=SLOW)
    assert second.action is Action.ROLLBACK
    assert second.weight == 0
    assert second.new_state.phase is Phase.ROLLED_BACK
    assert "2 consecutive failed evaluations (failureLimit 2)" in second.summary
    assert harness.sim.observe().weight_of("llama-predictor-00001") == 100


def test_a_passing_evaluation_resets_the_failure_streak() -> None:
    harness = progressing()
    answers = in_sequence(SLOW, HEALTHY_EVIDENCE, SLOW, HEALTHY_EVIDENCE, SLOW)
    streaks = []
    for _ in range(5):
        decision = harness.tick(60, evidence=answers)
        assert decision.action is Action.WAIT
        streaks.append(decision.new_state.evaluation.failure_streak)
    assert streaks == [1, 0, 1, 0, 1]


def test_an_evaluation_without_the_failure_resets_the_streak_but_a_query_error_keeps_it() -> None:
    # Cause 5 of issue 13: fail / no data / fail used to roll back on what is nearly one look.
    harness = progressing()
    answers = in_sequence(SLOW, SILENT, SLOW)
    streaks = [harness.tick(60, evidence=answers).new_state.evaluation.failure_streak for _ in range(3)]
    assert streaks == [1, 0, 1]
    assert harness.state.phase is Phase.PROGRESSING
    # An outage between two failures is no evidence either way: the streak stays, the next one rolls back.
    outage = EvidenceMaker(canary={name: query_error() for name in ("p99", "errors", "oom", "restarts")})
    assert harness.tick(60, evidence=outage).new_state.evaluation.failure_streak == 1
    assert harness.tick(60, evidence=SLOW).action is Action.ROLLBACK


def test_a_critical_check_failure_rolls_back_at_once() -> None:
    harness = progressing(make_policy(failureLimit=5))
    decision = harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=1))
    assert decision.action is Action.ROLLBACK
    assert decision.summary.startswith(
        "Rolling back llama-predictor-00002: Critical check failed: oom: 1 is above max 0"
    )
    assert decision.severity is Severity.WARNING
    assert decision.event_reason is EventReason.CANARY_ROLLED_BACK
    judged = {judgement.name: judgement for judgement in decision.judgements}
    assert judged["oom"].verdict.value == "fail"
    assert judged["p99"].verdict.value == "pass"
    assert decision.new_state.was_rolled_back(NEW)


def test_evidence_for_another_revision_window_or_time_is_ignored() -> None:
    harness = progressing()
    harness.now += timedelta(minutes=1)
    observed = harness.sim.observe()
    request = evidence_request(harness.policy, observed, harness.state, harness.now)
    assert request is not None
    failing = SLOW(request)
    judged = decide(harness.policy, observed, harness.state, failing, harness.now)
    assert judged.verdict is EvaluationVerdict.FAIL
    stale_cases = {
        "another revision": replace(request, canary_revision="llama-predictor-00009"),
        "another window": replace(request, window_start=request.window_start - timedelta(minutes=1)),
        "another stable": replace(request, stable_revision="llama-predictor-00000"),
        "absolute only": replace(request, compare_with_stable=False),
        "from the future": replace(request, at=harness.now + timedelta(seconds=1)),
        "not due yet": replace(request, at=harness.now - timedelta(seconds=30)),
    }
    for case, other in stale_cases.items():
        evidence = Evidence(request=other, canary=failing.canary, stable=failing.stable)
        decision = decide(harness.policy, observed, harness.state, evidence, harness.now)
        assert decision.verdict is None, case
        assert decision.new_state.evaluation == harness.state.evaluation, case


def test_evidence_already_judged_is_not_judged_again() -> None:
    harness = progressing()
    harness.now += timedelta(minutes=1)
    observed = harness.sim.observe()
    request = evidence_request(harness.policy, observed, harness.state, harness.now)
    assert request is not None
    evidence = SLOW(request)
    once = decide(harness.policy, observed, harness.state, evidence, harness.now)
    twice = decide(harness.policy, observed, once.new_state, evidence, harness.now + timedelta(seconds=5))
    assert once.new_state.evaluation.failure_streak == 1
    assert twice.verdict is None
    assert twice.new_state.evaluation.failure_streak == 1


def test_a_due_evaluation_without_evidence_is_said() -> None:
    harness = progressing()
    decision = harness.tick(60, evidence=None)
    assert decision.action is Action.WAIT
    assert "An evaluation is due but no evidence was supplied." in decision.reasons


def test_per_step_window_and_min_requests_override_the_defaults() -> None:
    policy = make_policy(steps=[{"weight": 10, "window": "3m", "minRequests": 10}, 50, 100])
    harness = progressing(policy)
    step_start = harness.now
    advanced = harness.run(lambda d: d.action is Action.ADVANCE, evidence=EvidenceMaker(requests=20))
    assert harness.now - step_start == timedelta(minutes=3)
    assert advanced.weight == 50


def test_an_edited_policy_applies_from_the_next_decision() -> None:
    harness = progressing()
    harness.tick(60)
    # 10% is still a step, now the second one of four: the index follows the weight.
    harness.policy = make_policy(steps=[5, 10, 30, 50, 100])
    moved = harness.tick(60)
    assert moved.action is Action.WAIT
    step = moved.new_state.step
    assert step is not None
    assert (step.index, step.weight) == (1, 10)
    assert "The policy was edited: 10% is now step 2 of 4." in moved.reasons


def test_a_weight_that_is_no_longer_a_step_pauses_and_resume_continues_from_the_step_below() -> None:
    harness = progressing()
    harness.tick(60)
    harness.policy = make_policy(steps=[5, 25, 50, 100])
    paused = harness.tick(60)
    assert paused.action is Action.PAUSE
    assert paused.new_state.pause is not None
    assert paused.new_state.pause.kind is PauseKind.POLICY_CHANGED
    assert "10% is no longer one of its steps (5%, 25%, 50%)" in paused.summary
    assert harness.tick(60).action is Action.WAIT
    harness.state = apply_command(harness.state, "resume", harness.now).state
    resumed = harness.tick(1)
    assert (resumed.action, resumed.weight) == (Action.START, 5)
    assert resumed.new_state.phase is Phase.PROGRESSING


def test_a_tick_firing_just_before_the_interval_ends_evaluates_then_not_a_tick_later() -> None:
    """Timers fire a little late, by a different amount each time: the tick an interval after an
    evaluation may come a few milliseconds early. Up to TIMER_SLACK early it evaluates; earlier not."""
    harness = progressing()
    harness.tick(60)
    asked = len(harness.requests)
    harness.tick(60 - TIMER_SLACK.total_seconds() / 2)
    assert len(harness.requests) == asked + 1, "half the slack early: evaluated now"
    harness.tick(60 - 2 * TIMER_SLACK.total_seconds())
    assert len(harness.requests) == asked + 1, "twice the slack early: not yet"


def test_the_canary_warm_up_is_counted_while_it_is_pending_and_in_its_first_step_only() -> None:
    """EvidenceRequest.canary_born: until the first step's window ends, the canary's restarts and OOM
    kills count from the rollout's start (a GPU model OOM-killed while loading, before it was Ready);
    later steps and the bake count their own window only (the warm-up was judged in the first)."""
    harness = Harness(make_policy(bake="5m"), KServeSim.serving())
    harness.start_rollout()
    started = harness.state.started_at
    assert started is not None
    for _ in range(3):  # not Ready yet: absolute checks are evaluated while it is pending
        harness.tick(60)
    assert harness.state.phase is Phase.PENDING
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.run(lambda decision: decision.new_state.phase is Phase.SUCCEEDED)
    first_step = min(request.window_start for request in harness.requests if request.compare_with_stable)
    seen: dict[str, set[object]] = {}
    for request in harness.requests:
        if request.compare_with_stable:
            kind = "first step" if request.window_start == first_step else "later steps"
        else:
            kind = "pending" if request.window_start == started else "bake"
        seen.setdefault(kind, set()).add(request.canary_born)
    assert seen == {"pending": {started}, "first step": {started}, "later steps": {None}, "bake": {None}}
