"""No data and query errors (docs/design.md §3, §4): never a failure, never promoted, onNoData after a while."""

from __future__ import annotations

from datetime import timedelta

from canary.rollout import Action, EvaluationVerdict, EventReason, PauseKind, Phase, Severity, apply_command

from .helpers import (
    HEALTHY_EVIDENCE,
    EvidenceMaker,
    in_sequence,
    make_policy,
    no_data,
    progressing,
    query_error,
)

SILENT = HEALTHY_EVIDENCE.failing(p99=no_data())
PROMETHEUS_DOWN = EvidenceMaker(
    requests=5000, canary={name: query_error() for name in ("p99", "errors", "oom", "restarts", "gpu-memory")}
)


def test_no_data_holds_by_default_and_goes_on_when_data_arrives() -> None:
    harness = progressing()
    step_start = harness.now
    for minute in range(1, 20):
        decision = harness.tick(60, evidence=SILENT)
        assert decision.action is Action.WAIT
        assert decision.verdict is EvaluationVerdict.INCONCLUSIVE
        assert decision.event_reason is EventReason.CANARY_INCONCLUSIVE
        if minute < 15:
            assert decision.severity is Severity.INFO
            assert (
                f"No conclusive evidence for {minute}m; onNoData (hold) applies after 15m."
                in decision.reasons
            )
        else:
            assert decision.severity is Severity.WARNING
            assert decision.summary.endswith("holding the step and evaluating again (onNoData: hold).")
    advanced = harness.tick(60)
    assert advanced.action is Action.ADVANCE  # the window is long over; the first pass moves on
    assert harness.now - step_start == timedelta(minutes=20)


def test_no_data_pauses_after_on_no_data_after_with_action_pause() -> None:
    harness = progressing(make_policy(onNoData={"after": "5m", "action": "pause"}))
    decisions = [harness.tick(60, evidence=SILENT) for _ in range(5)]
    assert [d.action for d in decisions] == [Action.WAIT] * 4 + [Action.PAUSE]
    paused = decisions[-1]
    assert paused.new_state.pause is not None
    assert paused.new_state.pause.kind is PauseKind.NO_DATA
    assert "for 5m" in paused.summary
    assert paused.event_reason is EventReason.CANARY_INCONCLUSIVE
    # Paused stops until a person resumes: no more evidence is asked for.
    asked = len(harness.requests)
    assert harness.tick(60, evidence=SILENT).action is Action.WAIT
    assert len(harness.requests) == asked
    harness.state = apply_command(harness.state, "resume", harness.now, by="bob").state
    resumed = harness.tick(60, evidence=SILENT)
    assert resumed.new_state.phase is Phase.PROGRESSING
    assert any("Resumed by bob" in reason for reason in resumed.reasons)
    # The onNoData clock restarted at the resume: no immediate second pause.
    assert [harness.tick(60, evidence=SILENT).action for _ in range(3)] == [Action.WAIT] * 3


def test_no_data_rolls_back_after_on_no_data_after_with_action_rollback() -> None:
    harness = progressing(make_policy(onNoData={"after": "3m", "action": "rollback"}))
    decisions = [harness.tick(60, evidence=SILENT) for _ in range(3)]
    assert [d.action for d in decisions] == [Action.WAIT, Action.WAIT, Action.ROLLBACK]
    assert "onNoData rolls back" in decisions[-1].summary


def test_on_no_data_counts_from_the_last_conclusive_evaluation() -> None:
    harness = progressing(make_policy(onNoData={"after": "5m", "action": "rollback"}))
    fresh = EvidenceMaker(requests=6000)  # new requests since the previous evaluation, every check has data
    answers = in_sequence(SILENT, SILENT, SILENT, fresh, SILENT, SILENT, SILENT, SILENT, SILENT)
    actions = [harness.tick(60, evidence=answers).action for _ in range(9)]
    # The pass at minute 4 restarts the clock: the rollback comes 5 minutes after it, at minute 9.
    assert actions == [Action.WAIT] * 8 + [Action.ROLLBACK]


def test_no_new_requests_is_no_data_however_good_the_values() -> None:
    harness = progressing(make_policy(onNoData={"after": "4m", "action": "rollback"}))
    few = EvidenceMaker(requests=10)  # ten requests in the first minute, none after
    decisions = [harness.tick(60, evidence=few) for _ in range(5)]
    assert all(d.verdict is EvaluationVerdict.PASS for d in decisions)
    assert [d.action for d in decisions] == [Action.WAIT] * 4 + [Action.ROLLBACK]


def test_a_trickle_of_requests_below_min_requests_is_not_no_data() -> None:
    harness = progressing(make_policy(onNoData={"after": "4m", "action": "rollback"}))
    decisions = [harness.tick(60, evidence=EvidenceMaker(requests=5 * (minute + 1))) for minute in range(12)]
    assert all(d.action is Action.WAIT for d in decisions)
    assert all("No conclusive evidence" not in d.summary for d in decisions)


def test_query_errors_never_count_as_failures_and_never_trigger_on_no_data() -> None:
    harness = progressing(make_policy(onNoData={"after": "5m", "action": "rollback"}, failureLimit=1))
    for _ in range(30):
        decision = harness.tick(60, evidence=PROMETHEUS_DOWN)
        assert decision.action is Action.WAIT
        assert decision.verdict is EvaluationVerdict.INCONCLUSIVE
        assert decision.event_reason is EventReason.PROMETHEUS_UNAVAILABLE
        assert decision.severity is Severity.WARNING
        assert decision.new_state.evaluation.failure_streak == 0
        assert decision.new_state.evaluation.query_error
    assert any("query errors never count as failures" in reason for reason in decision.reasons)
    # Prometheus back, but the canary has no data: the no-data clock starts from the last error.
    after_outage = [harness.tick(60, evidence=SILENT).action for _ in range(5)]
    assert after_outage == [Action.WAIT] * 4 + [Action.ROLLBACK]


def test_a_failed_request_count_query_is_an_error() -> None:
    harness = progressing(make_policy(onNoData={"after": "2m", "action": "rollback"}))
    count_down = EvidenceMaker(requests=query_error("timeout"))
    decisions = [harness.tick(60, evidence=count_down) for _ in range(5)]
    assert all(d.action is Action.WAIT for d in decisions)
    assert all(d.event_reason is EventReason.PROMETHEUS_UNAVAILABLE for d in decisions)
    assert all(d.requests is None for d in decisions)
