"""An invalid value (NaN, ±Inf from Prometheus) is judged like a query problem for its check: never a
pass, never a fail, never no-data (so never onNoData); the rollout holds and says which value."""

from __future__ import annotations

from canary.evidence import REQUESTS, Measurement
from canary.policy.units import Unit
from canary.rollout import Action, EvaluationVerdict, EventReason
from canary.rollout.judge import CheckVerdict, judge_evidence

from .helpers import HEALTHY_EVIDENCE, EvidenceMaker, make_policy, progressing

INF = Measurement.invalid("Prometheus answered +Inf, which no limit can be judged on", Unit.SECONDS)


def test_an_invalid_value_is_an_error_verdict_naming_check_and_value() -> None:
    policy = make_policy(checks=[{"name": "p99", "metric": "latency", "quantile": 0.99, "max": "800ms"}])
    canary = {REQUESTS: Measurement.ok(5000, Unit.COUNT), "p99": INF}
    evaluation = judge_evidence(policy.spec.checks, canary, {}, compare_with_stable=False)
    (judgement,) = evaluation.judgements
    assert judgement.verdict is CheckVerdict.ERROR
    assert evaluation.verdict is EvaluationVerdict.INCONCLUSIVE
    assert evaluation.has_error
    assert evaluation.failures == ()
    assert judgement.describe().startswith("p99: ")
    assert "+Inf" in judgement.describe()


def test_an_invalid_request_count_is_an_unknown_count() -> None:
    policy = make_policy(checks=[{"name": "oom", "metric": "oom-kills", "max": 0}])
    canary = {
        REQUESTS: Measurement.invalid("Prometheus answered +Inf for the request count", Unit.COUNT),
        "oom": Measurement.ok(0, Unit.COUNT),
    }
    evaluation = judge_evidence(policy.spec.checks, canary, {}, compare_with_stable=False)
    assert evaluation.requests is None
    assert evaluation.has_error
    assert "+Inf" in evaluation.requests_detail


def test_the_rollout_holds_on_an_invalid_value_and_never_rolls_back_for_it() -> None:
    harness = progressing(make_policy(onNoData={"after": "2m", "action": "rollback"}, failureLimit=1))
    invalid = HEALTHY_EVIDENCE.failing(p99=INF)
    for _ in range(10):
        decision = harness.tick(60, evidence=invalid)
        assert decision.action is Action.WAIT
        assert decision.verdict is EvaluationVerdict.INCONCLUSIVE
        assert decision.event_reason is EventReason.PROMETHEUS_UNAVAILABLE
        assert decision.new_state.evaluation.failure_streak == 0
        assert decision.new_state.evaluation.query_error
    assert any(reason.startswith("p99: ") and "+Inf" in reason for reason in decision.reasons)
    # An invalid stable value holds a relative check the same way.
    stable_invalid = EvidenceMaker(stable={"p99": INF})
    assert harness.tick(60, evidence=stable_invalid).action is Action.WAIT
