"""Gates in the pure core (canary/rollout/gates.py): results are inputs of decide(), like evidence.

The harness below plays the shell's gate runner: every gate call a decision asks for is answered
one second later (pass, fail with a status, or no answer), and the answer goes into the next
decision. The state is stored as JSON between decisions, as the controller does, so every test is
also a restart test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from canary.kserve.status_model import KServeSim
from canary.policy.model import GateStage, PromotionPolicy
from canary.rollout import (
    Action,
    Decision,
    EventReason,
    Phase,
    RolloutState,
    Severity,
    decide,
    evidence_request,
)
from canary.rollout.gates import GATE_REQUEST_KIND, GateCall, GateResult, gate_key, record_gate_result
from canary.rollout.ledger import RollbackLedger, ledger_after
from canary.rollout.state import GateProgress

from .helpers import HEALTHY_EVIDENCE, T0, Harness, make_policy

# What a gate answers: True passes (200), an int is that status, None is no answer (a timeout).
Answer = bool | int | None
Receiver = Callable[[GateCall], Answer]


def gate(at: str, *, deadline: str = "15m", failure: str = "hold", name: str | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "at": at,
        "webhook": {"urlFrom": {"env": "GATE_URL"}, "secretFrom": {"env": "GATE_KEY"}, "timeout": "10s"},
        "deadline": deadline,
        "failurePolicy": failure,
    }
    if name is not None:
        entry["name"] = name
    return entry


def always(answer: Answer) -> Receiver:
    return lambda call: answer


class GateHarness(Harness):
    """A :class:`Harness` whose decisions get the results of the gate calls the previous one asked for."""

    def __init__(self, policy: PromotionPolicy, sim: KServeSim, receiver: Receiver) -> None:
        super().__init__(policy, sim)
        self.receiver = receiver
        self.calls: list[GateCall] = []
        self.pending: list[GateResult] = []

    def tick(self, after: float = 0.0, **kwargs: Any) -> Decision:  # type: ignore[override]
        self.now += timedelta(seconds=after)
        evidence = kwargs.get("evidence", HEALTHY_EVIDENCE)
        observed = self.sim.observe()
        results = tuple(result for result in self.pending if result.at <= self.now)
        request = evidence_request(self.policy, observed, self.state, self.now, gates=results)
        answer = evidence(request) if request is not None and evidence is not None else None
        decision = decide(self.policy, observed, self.state, answer, self.now, gates=results)
        self.state = RolloutState.from_json(decision.new_state.to_json())
        if decision.action.writes:
            self.sim.set_percent(decision.weight)
        self.sim.reconcile()
        self.timeline.record(decision, self.now)
        self.decisions.append(decision)
        self.pending = []
        for call in decision.gate_calls:
            self.calls.append(call)
            answered = self.receiver(call)
            at = self.now + timedelta(seconds=1)
            if answered is True:
                result = GateResult(call.revision, call.key, True, at, 200, "OK")
            elif answered is None or answered is False:
                result = GateResult(call.revision, call.key, False, at, None, "timed out after 10s")
            else:
                result = GateResult(call.revision, call.key, 200 <= answered < 300, at, answered, "answered")
            self.pending.append(result)
        return decision


def started(policy: PromotionPolicy, receiver: Receiver) -> GateHarness:
    """Adopted, then a new spec without a percentage (the GitOps way)."""
    harness = GateHarness(policy, KServeSim.serving(), receiver)
    harness.start_rollout()
    return harness


PRE = make_policy(gates=[gate("pre-rollout", name="smoke")])


# -- policy ------------------------------------------------------------------------------------


def test_gate_fields_are_validated_with_their_reason() -> None:
    with pytest.raises(ValidationError, match="at most 5m"):
        make_policy(gates=[{**gate("step"), "webhook": {"urlFrom": {"env": "U"}, "timeout": "10m"}}])
    with pytest.raises(ValidationError, match="reference it instead"):
        make_policy(gates=[{**gate("step"), "webhook": {"url": "https://x.example/hook"}}])
    with pytest.raises(ValidationError, match="gate name 'step-1' is used twice"):
        make_policy(gates=[gate("step"), gate("pre-rollout", name="step-1")])
    with pytest.raises(ValidationError, match="failurePolicy|failure_policy"):
        make_policy(gates=[gate("step", failure="pause")])
    policy = make_policy(gates=[gate("step"), gate("pre-promotion", name="load-test")])
    assert [policy.spec.gate_name(i) for i in range(2)] == ["step-1", "load-test"]
    assert policy.spec.gates[0].webhook.timeout == 10.0
    assert policy.spec.gates[0].deadline == 900.0


# -- pre-rollout ---------------------------------------------------------------------------------


def test_a_pre_rollout_gate_pins_0_at_once_and_the_first_step_waits_for_its_pass() -> None:
    answers = iter([503, None, True])
    harness = started(PRE, lambda call: next(answers))
    first = harness.decisions[-1]
    assert (first.action, first.weight) == (Action.START, 0), first.summary
    assert "no traffic before its pre-rollout gate smoke passes" in first.summary
    assert first.gate_calls == ()  # not Ready yet: nothing to smoke-test
    assert harness.sim.percent == 0
    harness.sim.make_ready()
    harness.sim.reconcile()
    held = harness.tick(10)
    assert held.action is Action.WAIT and held.event_reason is EventReason.GATE_WAITING
    assert [call.key for call in held.gate_calls] == ["pre-rollout/0"]
    assert held.new_state.gates[0].since == harness.now
    refused = harness.tick(10)  # 503
    assert refused.action is Action.WAIT
    assert "1 failed attempt, latest answered 503" in refused.summary
    timed_out = harness.tick(10)  # no answer
    assert timed_out.action is Action.WAIT
    assert "2 failed attempts, latest no answer" in timed_out.summary
    passed = harness.tick(10)
    assert (passed.action, passed.weight) == (Action.START, 10), passed.reasons
    assert (
        passed.summary
        == "Pre-rollout gate smoke passed: moving llama-predictor-00002 from 0% to the first step 10%."
    )
    assert any("Gate smoke (pre-rollout) passed: answered 200" in reason for reason in passed.reasons)
    assert harness.writes() == [0, 10]
    assert len(harness.calls) == 3


def test_a_dark_launch_with_a_pre_rollout_gate_writes_nothing_until_the_gate_passes() -> None:
    gate_open = False
    harness = GateHarness(PRE, KServeSim.serving(), lambda call: gate_open)
    harness.tick()
    harness.sim.change_model("s3://m/v2", percent=0)
    harness.sim.reconcile()
    harness.sim.make_ready()
    harness.sim.reconcile()
    for _ in range(5):
        waiting = harness.tick(30)
        assert waiting.action is Action.WAIT
    assert harness.writes() == []
    gate_open = True
    harness.tick(30)
    assert harness.tick(30).weight == 10
    assert harness.writes() == [10]


def test_a_spec_with_the_first_step_is_pinned_at_0_too() -> None:
    harness = GateHarness(PRE, KServeSim.serving(), always(True))
    harness.tick()
    harness.sim.change_model("s3://m/v2", percent=10)
    harness.sim.reconcile()
    pinned = harness.tick(1)
    assert (pinned.action, pinned.weight) == (Action.START, 0)


def test_a_pinned_0_written_again_after_a_crash_is_a_start_never_a_rollback() -> None:
    harness = GateHarness(PRE, KServeSim.serving(), always(True))
    harness.tick()
    harness.sim.change_model("s3://m/v2")
    harness.sim.reconcile()
    lost = harness.tick(1)
    harness.sim.set_percent(None)  # the patch never landed
    assert lost.weight == 0
    again = decide(PRE, harness.sim.observe(), harness.state, None, harness.now + timedelta(seconds=5))
    assert (again.action, again.weight, again.event_reason) == (Action.START, 0, EventReason.CANARY_STARTED)
    assert ledger_after(again, RollbackLedger(), harness.sim.observe().uid) is None


# -- deadlines and failurePolicy --------------------------------------------------------------


def test_past_its_deadline_a_gate_with_failure_policy_rollback_rolls_back() -> None:
    policy = make_policy(gates=[gate("pre-rollout", deadline="5m", failure="rollback")])
    harness = started(policy, always(500))
    harness.sim.make_ready()
    harness.sim.reconcile()
    first_asked = None
    for _ in range(20):
        decision = harness.tick(60)
        if first_asked is None and harness.state.gates:
            first_asked = harness.state.gates[0].since
        if decision.action is not Action.WAIT:
            break
    assert decision.action is Action.ROLLBACK, decision.summary
    assert first_asked is not None and harness.now - first_asked == timedelta(minutes=5)
    assert "gate pre-rollout-1 (pre-rollout) did not pass within its deadline 5m" in decision.summary
    assert "latest answered 500" in decision.summary
    assert decision.new_state.phase is Phase.ROLLED_BACK
    assert harness.writes() == [0, 0]


def test_past_its_deadline_a_gate_with_failure_policy_hold_keeps_holding_and_calling() -> None:
    gate_open = False
    policy = make_policy(gates=[gate("pre-rollout", deadline="5m", failure="hold")])
    harness = started(policy, lambda call: gate_open)
    harness.sim.make_ready()
    harness.sim.reconcile()
    decisions = [harness.tick(60) for _ in range(10)]
    assert all(d.action is Action.WAIT for d in decisions)
    late = [d for d in decisions if d.event_reason is EventReason.GATE_FAILED]
    assert late and all(d.severity is Severity.WARNING for d in late)
    assert all(d.gate_calls for d in decisions), "still called after the deadline"
    assert "failurePolicy hold" in late[0].summary
    assert harness.state.gates[0].deadline_passed_at is not None
    gate_open = True
    harness.tick(60)
    assert harness.tick(60).weight == 10


def test_a_restart_neither_repeats_a_passed_gate_nor_shortens_a_deadline() -> None:
    policy = make_policy(gates=[gate("pre-rollout", deadline="5m", failure="rollback"), gate("step")])
    harness = started(policy, always(503))
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.tick(60)
    since = harness.state.gates[0].since
    # A restart 4 minutes later: the state read back, no gate result in memory.
    stored = RolloutState.from_json(harness.state.to_json())
    later = harness.now + timedelta(minutes=4)
    restarted = decide(policy, harness.sim.observe(), stored, None, later)
    assert restarted.action is Action.WAIT
    assert restarted.new_state.gates[0].since == since, "the deadline counts from the first call"
    at_deadline = decide(policy, harness.sim.observe(), stored, None, since + timedelta(minutes=5))
    assert at_deadline.action is Action.ROLLBACK
    # A passed gate, restarted: never asked for again.
    passing = started(policy, always(True))
    passing.sim.make_ready()
    passing.sim.reconcile()
    passing.run(lambda d: d.action is Action.START and d.weight == 10, every=10)
    asked = len(passing.calls)
    passing.pending = []  # the restarted shell has no results
    after = passing.tick(10)
    assert not any(call.stage is GateStage.PRE_ROLLOUT for call in after.gate_calls)
    assert len(passing.calls) == asked


def test_results_of_another_revision_or_another_call_point_change_nothing() -> None:
    harness = started(PRE, always(503))
    harness.sim.make_ready()
    harness.sim.reconcile()
    held = harness.tick(10)
    call = held.gate_calls[0]
    at = harness.now + timedelta(seconds=1)
    foreign = (
        GateResult("llama-predictor-00001", call.key, True, at, 200),
        GateResult(call.revision, gate_key(GateStage.STEP, 0, 10), True, at, 200),
    )
    again = decide(PRE, harness.sim.observe(), harness.state, None, at + timedelta(seconds=1), gates=foreign)
    assert again.action is Action.WAIT
    assert again.new_state.gates[0].passed_at is None


# -- step and pre-promotion gates ---------------------------------------------------------------


def test_a_step_gate_holds_a_passed_step_and_its_body_carries_the_step_and_the_evidence() -> None:
    policy = make_policy(steps=[10, 50, 100], gates=[gate("step", name="acceptance")])
    gate_open = False
    harness = started(policy, lambda call: gate_open)
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.run(lambda d: bool(d.gate_calls))
    held = harness.decisions[-1]
    assert held.event_reason is EventReason.GATE_WAITING
    assert "at 10%: the step passed" in held.summary
    body = json.loads(held.gate_calls[0].body)
    assert body["kind"] == GATE_REQUEST_KIND and body["apiVersion"] == "kserve-canary.dev/v1alpha1"
    assert body["gate"] == {"name": "acceptance", "at": "step", "index": 0}
    assert body["step"] == {"index": 0, "weight": 10, "of": 2}
    assert body["revisions"] == {"canary": "llama-predictor-00002", "stable": "llama-predictor-00001"}
    assert body["evidence"]["verdict"] == "pass" and body["evidence"]["requests"] == 5000
    assert body["id"] == held.gate_calls[0].id
    for _ in range(5):
        assert harness.tick(60).action is Action.WAIT
    assert harness.writes() == [10]
    gate_open = True
    harness.tick(60)
    advanced = harness.tick(60)
    assert (advanced.action, advanced.weight) == (Action.ADVANCE, 50), advanced.summary
    # The gate at 50% is another call point: asked afresh.
    gate_open = False
    harness.run(lambda d: bool(d.gate_calls))
    assert harness.decisions[-1].gate_calls[0].key == "step@50%/0"


def test_a_failure_while_a_step_gate_holds_still_rolls_back() -> None:
    policy = make_policy(gates=[gate("step")])
    harness = started(policy, always(503))
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.run(lambda d: bool(d.gate_calls))
    rolled_back = harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=1))
    assert rolled_back.action is Action.ROLLBACK


def test_a_pre_promotion_gate_holds_the_promotion_only() -> None:
    policy = make_policy(steps=[10, 50, 100], gates=[gate("pre-promotion")])
    gate_open = False
    harness = started(policy, lambda call: gate_open)
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.run(lambda d: bool(d.gate_calls))
    assert harness.writes() == [10, 50], "no gate before the steps"
    held = harness.decisions[-1]
    assert held.gate_calls[0].stage is GateStage.PRE_PROMOTION
    assert json.loads(held.gate_calls[0].body)["step"]["weight"] == 50
    gate_open = True
    harness.tick(60)
    promoted = harness.tick(60)
    assert promoted.action is Action.PROMOTE
    assert harness.writes() == [10, 50, None]


def test_a_promote_command_skips_the_gates() -> None:
    from canary.rollout import apply_command

    policy = make_policy(gates=[gate("step")])
    harness = started(policy, always(503))
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.run(lambda d: bool(d.gate_calls))
    state = harness.state
    harness.state = apply_command(state, "promote", harness.now, by="carol").state
    assert harness.tick(5).action is Action.PROMOTE


# -- the property ---------------------------------------------------------------------------------

ANSWERS = st.lists(st.sampled_from([True, 503, None, 404]), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers=ANSWERS, spacing=st.lists(st.integers(1, 400), min_size=40, max_size=40))
def test_no_traffic_step_is_written_before_its_gate_passed(answers: list[Answer], spacing: list[int]) -> None:
    policy = make_policy(
        steps=[10, 50, 100],
        window="2m",
        interval="30s",
        gates=[gate("pre-rollout", deadline="20m"), gate("step", deadline="20m", failure="rollback")],
    )
    replies = iter(answers)
    harness = started(policy, lambda call: next(replies, True))
    harness.sim.make_ready()
    harness.sim.reconcile()
    passed: dict[str, Any] = {}
    for seconds in spacing:
        results = list(harness.pending)
        decision = harness.tick(seconds)
        for result in results:
            if result.passed and result.at <= harness.now:
                passed.setdefault(result.key, result.at)
        if decision.action in (Action.START, Action.ADVANCE) and decision.weight:
            # The first step only after the pre-rollout gate passed; each next step only after the
            # previous step's gate passed.
            needed = "pre-rollout/0" if decision.weight == 10 else "step@10%/1"
            assert needed in passed, (decision.summary, passed)
        if decision.action is Action.PROMOTE:
            assert "step@50%/1" in passed
        if decision.action is Action.ROLLBACK:
            assert "deadline" in decision.summary
            break
        # Deciding again with the stored state at the same moment changes nothing more.
        same = decide(policy, harness.sim.observe(), harness.state, None, harness.now)
        assert all(progress in same.new_state.gates for progress in harness.state.gates)


def test_an_attempt_is_taken_in_once_and_never_from_before_its_call_point_was_reached() -> None:
    since = T0 + timedelta(minutes=5)
    progress = GateProgress(key="step@10%/0", name="step-1", stage=GateStage.STEP, since=since, weight=10)
    early = GateResult("r2", "step@10%/0", True, since - timedelta(seconds=1), 200)
    assert record_gate_result(progress, early) == progress, "an answer from before it was asked"
    failed = GateResult("r2", "step@10%/0", False, since + timedelta(seconds=3), 500, "HTTP 500")
    once = record_gate_result(progress, failed)
    assert (once.attempts, once.last_status) == (1, 500)
    assert record_gate_result(once, failed) == once, "the same attempt twice counts once"
    passed = record_gate_result(once, GateResult("r2", "step@10%/0", True, since + timedelta(seconds=9), 204))
    assert passed.passed_at == since + timedelta(seconds=9)
    later = GateResult("r2", "step@10%/0", False, since + timedelta(seconds=20), 500)
    assert record_gate_result(passed, later) == passed, "a passed gate stays passed"
    assert record_gate_result(passed, replace(later, key="other")) == passed


def test_a_revision_already_serving_everything_is_pinned_back_to_0_with_a_warning() -> None:
    harness = GateHarness(PRE, KServeSim.serving(), always(True))
    harness.tick()
    harness.sim.change_model("s3://m/v2")
    harness.sim.reconcile()
    harness.sim.make_ready()
    harness.sim.reconcile()  # KServe sent it 100% before the controller saw it
    pinned = harness.tick(1)
    assert (pinned.action, pinned.weight, pinned.severity) == (Action.START, 0, Severity.WARNING)
    assert any("0% pins all traffic back to llama-predictor-00001" in reason for reason in pinned.reasons)


def test_a_step_gate_and_a_manual_approval_both_hold_the_step() -> None:
    from canary.rollout import apply_command

    policy = make_policy(steps=[{"weight": 10, "approval": "manual"}, 50, 100], gates=[gate("step")])
    gate_open = False
    harness = started(policy, lambda call: gate_open)
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.run(lambda d: bool(d.gate_calls))
    gate_open = True
    harness.tick(60)
    paused = harness.tick(60)
    assert paused.action is Action.PAUSE and paused.event_reason is EventReason.CANARY_AWAITING_APPROVAL
    harness.state = apply_command(harness.state, "approve", harness.now, by="carol").state
    assert harness.tick(5).weight == 50


def test_resuming_an_unexpected_start_value_pins_0_until_the_pre_rollout_gate_passes() -> None:
    from canary.rollout import apply_command

    gate_open = False
    harness = GateHarness(PRE, KServeSim.serving(), lambda call: gate_open)
    harness.tick()
    harness.sim.change_model("s3://m/v2", percent=40)
    harness.sim.reconcile()
    paused = harness.tick(1)
    assert paused.action is Action.PAUSE
    harness.state = apply_command(harness.state, "resume", harness.now, by="carol").state
    resumed = harness.tick(5)
    assert (resumed.action, resumed.weight) == (Action.START, 0), resumed.summary
    harness.sim.make_ready()
    harness.sim.reconcile()
    assert harness.tick(5).gate_calls, "the gate is called once the canary is Ready"
    assert harness.writes() == [0]
    gate_open = True
    harness.tick(5)
    assert harness.tick(5).weight == 10
    assert harness.writes() == [0, 10]
