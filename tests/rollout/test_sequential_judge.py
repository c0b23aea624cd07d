"""The judge of counted checks: one named test per cause of issue 13, each failing on the old judge.

The old judge read a value and a sample count (``increase()``, ``histogram_quantile``) and gated a
breach by a request count; these tests give the judge the raw counts the pipeline delivers and
check the statements it makes on them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, overload

import pytest

from canary.evidence import CountSeries, EvidenceStatus, Tally, tallies_since
from canary.policy.model import Check, PromotionPolicy
from canary.rollout import Action
from canary.rollout.horizon import Horizon
from canary.rollout.sampled import ErrorBudget, Totals, horizon_requests, judge_sampled
from canary.rollout.vocabulary import CheckVerdict

from .counts import OPENCENSUS_EDGES, CountingWorld, Revision, SteadyCounts, draw_tally, exact_tally, series
from .helpers import HEALTHY_EVIDENCE, T0, make_policy, progressing

P99 = {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "800ms"}
ERRORS = {"name": "errors", "metric": "error-rate", "max": "1%"}


def counted_policy(*checks: dict[str, Any], **spec: Any) -> PromotionPolicy:
    body: dict[str, Any] = {"checks": list(checks or (P99, ERRORS)), "window": "2m", "minRequests": 50}
    body.update(spec)
    return make_policy(**body)


def check_of(policy: PromotionPolicy, name: str) -> Check:
    return next(check for check in policy.spec.checks if check.name == name)


def judge(
    policy: PromotionPolicy,
    name: str,
    canary: list[Tally],
    stable: list[Tally] | None = None,
    *,
    step_start: Any = T0,
    final: bool = False,
    horizon: Horizon | None = None,
) -> Any:
    return judge_sampled(
        check_of(policy, name),
        series(canary),
        series(stable) if stable is not None else None,
        step_start=step_start,
        budget=ErrorBudget.of(policy),
        confidence=policy.spec.confidence,
        compare_with_stable=stable is not None,
        final_step=final,
        horizon=horizon,
    )


# -- cause 1: a quantile breach was failed on any size once 500 requests were seen ------------------


def test_cause_1_a_quantile_a_little_over_its_limit_on_600_requests_is_not_yet_a_failure() -> None:
    policy = counted_policy()
    # 8 of 600 requests slower than 800ms (1.3%): the estimate of p99 is above 800ms, but a canary
    # exactly at its limit shows that often. The old judge failed it (600 >= 500 requests).
    tally = exact_tally(T0, 120, 600, 0, {0.75: 9, 1.0: 8, 2.5: 0})
    result = judge(policy, "p99", [tally])
    assert result.verdict is CheckVerdict.NOT_YET
    assert result.value is not None and result.value > 0.8
    # 40 of 600 slower (6.7%) is a breach beyond doubt, whatever the shape inside the bucket.
    edges = OPENCENSUS_EDGES  # Knative <= 1.18 has an edge at 800ms: judged there exactly
    broken = judge(policy, "p99", [exact_tally(T0, 120, 600, 0, {0.8: 40, 2.0: 0}, edges=edges)])
    assert broken.verdict is CheckVerdict.FAIL
    assert broken.statement == (
        "p99 ≤ 800ms broken at 95%: 40 of 600 requests (6.67%) slower than 800ms this step, more than 1%"
    )


# -- cause 2: relative limits ignored the stable revision's own noise --------------------------------


def test_cause_2_a_relative_quantile_limit_is_held_against_a_bound_on_stables_quantile() -> None:
    policy = counted_policy({"name": "p99", "metric": "latency", "quantile": 0.99, "maxIncrease": "25%"})
    rng = random.Random(3)
    stable = Revision(rate=1.0, p50=0.2, p99=0.4)
    canary = Revision(rate=1.0, p50=0.2, p99=0.44)  # 10 % slower tail: inside +25 %
    false_fails = 0
    for _ in range(40):
        canary_tallies = [draw_tally(rng, canary, T0 + timedelta(seconds=15 * i), 15) for i in range(20)]
        stable_tallies = [draw_tally(rng, stable, T0 + timedelta(seconds=15 * i), 15) for i in range(20)]
        result = judge(policy, "p99", canary_tallies, stable_tallies)
        false_fails += result.verdict is CheckVerdict.FAIL
    # ~300 requests a side: the point estimates differ by more than 25 % often; the bounds do not.
    assert false_fails == 0
    # Stable known from few requests is no bound at all: the canary cannot be met against it yet.
    thin = judge(policy, "p99", canary_tallies, stable_tallies[:1])
    assert thin.verdict is CheckVerdict.NOT_YET


# -- cause 3: passing was not guarded, only failing --------------------------------------------------


def test_cause_3_a_p99_is_not_met_on_a_hundred_requests() -> None:
    policy = counted_policy()
    clean = exact_tally(T0, 120, 100, 0, {})  # nobody slower than the first edge
    result = judge(policy, "p99", [clean], final=True)
    assert result.verdict is CheckVerdict.NOT_YET
    assert "more needed" in result.statement
    assert result.needed is not None and result.needed > 100
    plenty = exact_tally(T0, 600, 3000, 0, {0.8: 3}, edges=OPENCENSUS_EDGES)
    met = judge(policy, "p99", [plenty], final=True)
    assert met.verdict is CheckVerdict.PASS
    # Met at the highest edge at or below the limit itself: 800ms.
    assert met.statement == ("p99 ≤ 800ms met at 95% (3,000 requests; slower than 800ms: 0.1%, allowed 1%)")


# -- cause 4: every look spent the error budget again -------------------------------------------------


def test_cause_4_two_errors_in_47_requests_do_not_break_a_1_percent_limit() -> None:
    policy = counted_policy()
    result = judge(policy, "errors", [exact_tally(T0, 60, 47, 2, {})])
    assert result.verdict is CheckVerdict.NOT_YET  # the old judge: "significantly" above 1% at 95%


# A simulation of 120 rollouts: the lines it runs are the other tests' here (no line or branch only it
# reaches, checked with coverage), and line tracing under `make test` made it 12 s of CPU instead of 4.
@pytest.mark.untraced
def test_cause_4_repeated_looks_keep_the_false_failure_rate_within_the_budget() -> None:
    # A canary exactly at the tolerance edge (errors 1% / 1.1), looked at every minute for 40 minutes
    # (the thousands-of-rollouts version is tests/fuzz/test_judge_error_rates.py).
    policy = counted_policy(ERRORS)
    good = Revision(rate=20.0, error_share=0.01 / 1.1)
    rng = random.Random(11)
    rollouts, failed = 120, 0
    for _ in range(rollouts):
        tallies: list[Tally] = []
        for index in range(160):
            tallies.append(draw_tally(rng, good, T0 + timedelta(seconds=15 * index), 15, latency=False))
            if index % 4 == 3 and judge(policy, "errors", tallies).verdict is CheckVerdict.FAIL:
                failed += 1
                break
    # The per-step fail budget is 5% / 1 check / 2 / 3 steps = 0.83%: 120 rollouts show at most a
    # handful (a binomial 0.83 % rate exceeds 5 of 120 with probability < 0.1 %).
    assert failed <= 5, f"{failed} of {rollouts} good canaries failed"


# -- cause 5 is tests/rollout/test_step_semantics.py::test_an_evaluation_without_the_failure_resets_... ---


# -- cause 6: windows restarted at every step; the promotion was decided on one step's ~100 requests ----


def test_cause_6_a_regression_that_appears_only_at_a_higher_share_is_caught_at_that_step() -> None:
    policy = counted_policy(P99, steps=[10, 30, 50, 100], window="2m", minRequests=20)
    harness = progressing(policy)
    healthy = Revision(rate=20.0, p50=0.2, p99=0.5)
    loaded = Revision(rate=20.0, p50=0.3, p99=1.6)  # the tail breaks 800ms at 50 % of the traffic
    world = CountingWorld(
        harness.sim, healthy, healthy, seed=5, canary_at=lambda w: loaded if w >= 50 else healthy
    )
    decision = harness.run(lambda d: d.action in (Action.ROLLBACK, Action.PROMOTE), every=15, evidence=world)
    assert decision.action is Action.ROLLBACK
    assert "p99 ≤ 800ms broken at 95%" in decision.summary
    assert [w for w in harness.writes() if w] == [10, 30, 50]


# -- cause 7: counts were extrapolated floats --------------------------------------------------------


def test_cause_7_counts_are_whole_numbers_and_say_so() -> None:
    policy = counted_policy()
    tallies = [exact_tally(T0 + timedelta(seconds=15 * i), 15, 83, 0, {}) for i in range(10)]
    result = judge(policy, "p99", tallies)
    assert isinstance(result.requests, int)
    assert result.requests == 830
    # Whole requests, said as such: "830 requests", never "832.13 requests".
    assert result.statement.startswith("p99 ≤ 800ms met at 95% (830 requests; slower than 750ms: 0%")
    errors = judge(policy, "errors", tallies)
    assert errors.statement == "error rate ≤ 1% met at 95% (830 requests; 0 errors, 0%)"


# -- cause 8: "p99: 3.67s ≤ 3.64s -> fail" read as a false statement ----------------------------------


def test_cause_8_a_verdict_is_a_true_sentence_with_its_numbers() -> None:
    policy = counted_policy()
    broken = judge(policy, "errors", [exact_tally(T0, 600, 2000, 80, {})])
    assert broken.verdict is CheckVerdict.FAIL
    assert broken.statement == ("error rate ≤ 1% broken at 95%: 80 errors in 2,000 requests (4%) this step")


# -- bucket resolution ----------------------------------------------------------------------------


def test_a_limit_far_from_every_bucket_edge_is_never_interpolated_by_a_test_only_at_the_horizon() -> None:
    policy = counted_policy({"name": "p99", "metric": "latency", "quantile": 0.99, "max": "350ms"})
    # OTel edges: 250ms, 500ms around 350ms. 2.5 % slower than 250ms, 0.5 % slower than 500ms: where
    # p99 lies inside the bucket no edge can tell, so neither test decides before the horizon...
    tally = exact_tally(T0, 600, 4000, 0, {0.25: 100, 0.5: 20})
    before = judge(policy, "p99", [tally], final=True, horizon=_horizon(reached=False))
    assert before.verdict is CheckVerdict.NOT_YET
    assert "interpolated" not in before.statement  # the tests read edges only
    assert "decided on the estimate by" in before.statement
    # ...and at the horizon the estimate decides, saying how it read the bucket and its own error.
    at = judge(policy, "p99", [tally], final=True, horizon=_horizon(reached=True))
    assert at.verdict is CheckVerdict.FAIL
    assert "at the horizon on the estimate" in at.statement
    assert "interpolated geometrically inside 250ms–500ms" in at.statement
    assert "the chance that the estimate is on the wrong side of the limit" in at.statement
    # OpenCensus has an edge at 350ms: exact.
    exact = judge(
        policy, "p99", [exact_tally(T0, 600, 4000, 0, {0.3: 200, 0.35: 100}, edges=OPENCENSUS_EDGES)]
    )
    assert exact.verdict is CheckVerdict.FAIL
    assert "slower than 350ms this step" in exact.statement


def test_the_reading_inside_a_bucket_does_not_depend_on_a_request_caught_in_the_far_tail() -> None:
    # Both revisions: log-normal, median 80ms, sigma 0.35 (p90 125ms); 26 % slower than 100ms and
    # 0.06 % slower than 250ms, the next OTel edge. The stable revision's 6,000 requests caught four
    # beyond 250ms, the canary's 700 none (a 66 % chance at that share). Read linearly when the upper
    # edge had none, the canary's p90 was 190ms against stable's 125ms + 50 % = 187ms: a healthy
    # canary rolled back at the horizon (seen end to end, tests/e2e/test_otel_overload.py).
    policy = counted_policy({"name": "p90", "metric": "latency", "quantile": 0.9, "maxIncrease": "50%"})
    canary = exact_tally(T0, 60, 700, 0, {0.075: 400, 0.1: 182, 0.25: 0})
    stable = exact_tally(T0, 60, 6000, 0, {0.075: 3420, 0.1: 1560, 0.25: 4})
    result = judge(policy, "p90", [canary], [stable], final=True, horizon=_horizon(reached=True))
    assert result.verdict is CheckVerdict.PASS, result.statement
    assert result.value is not None and result.stable_value is not None
    assert abs(result.value - result.stable_value) < 0.01  # the same latencies read the same way
    assert "interpolated geometrically inside 100ms–250ms" in result.statement


def _horizon(*, reached: bool) -> Horizon:
    length = timedelta(minutes=4)
    return Horizon(length, length if reached else length / 2, T0 + timedelta(minutes=10))


def test_no_series_is_no_data_and_a_failed_read_is_an_error() -> None:
    policy = counted_policy()
    check = check_of(policy, "p99")
    for status, verdict in (
        (EvidenceStatus.NO_DATA, CheckVerdict.NO_DATA),
        (EvidenceStatus.ERROR, CheckVerdict.ERROR),
    ):
        result = judge_sampled(
            check,
            CountSeries(status, detail="nothing"),
            None,
            step_start=T0,
            budget=ErrorBudget.of(policy),
            confidence=0.95,
            compare_with_stable=False,
            final_step=False,
        )
        assert result.verdict is verdict


def test_horizon_requests_follow_the_allowed_share_and_the_confidence() -> None:
    # k = 2 z^2 expected events at the allowed share: 6 at 95 %, 11 at 99 %.
    assert horizon_requests(counted_policy(P99, ERRORS)) == {"p99": 600, "errors": 600}
    assert horizon_requests(counted_policy(P99, confidence="99%"))["p99"] == 1100
    assert horizon_requests(counted_policy({**ERRORS, "max": "0.1%"}))["errors"] == 6000


# -- end to end through decide(): advance on exposure, promote on evidence ---------------------------


def test_a_healthy_canary_at_20_requests_per_second_is_promoted_on_evidence() -> None:
    policy = counted_policy(P99, ERRORS)
    harness = progressing(policy)
    healthy = Revision(rate=20.0, error_share=0.001, p50=0.2, p99=0.45)
    world = CountingWorld(harness.sim, healthy, healthy, seed=9)
    decision = harness.run(lambda d: d.action in (Action.ROLLBACK, Action.PROMOTE), every=15, evidence=world)
    assert decision.action is Action.PROMOTE, harness.timeline.render()
    assert any("p99 ≤ 800ms met at 95%" in reason for reason in decision.reasons), decision.reasons
    assert [w for w in harness.writes() if w is not None] == [10, 30, 50]


def test_invalid_counts_and_unreadable_stable_counts_hold_the_rollout() -> None:
    policy = counted_policy({**P99, "maxIncrease": "50%"})
    check = check_of(policy, "p99")
    budget = ErrorBudget.of(policy)

    def judged(canary: CountSeries, stable: CountSeries | None) -> CheckVerdict:
        return judge_sampled(
            check,
            canary,
            stable,
            step_start=T0,
            budget=budget,
            confidence=0.95,
            compare_with_stable=True,
            final_step=False,
        ).verdict

    # NaN/Inf in the canary's counters: a query problem, never data.
    assert judged(CountSeries(EvidenceStatus.INVALID_VALUE, detail="+Inf"), None) is CheckVerdict.ERROR
    healthy = series([exact_tally(T0, 600, 4000, 0, {})])
    broken = series([exact_tally(T0, 600, 600, 0, {0.75: 200, 1.0: 150, 2.5: 0})])
    # The stable revision unreadable: an error (a step must not advance on "not yet")...
    for status in (EvidenceStatus.ERROR, EvidenceStatus.INVALID_VALUE):
        assert judged(healthy, CountSeries(status, detail="down")) is CheckVerdict.ERROR
        # ...but a broken absolute limit still fails without it.
        assert judged(broken, CountSeries(status, detail="down")) is CheckVerdict.FAIL


def test_steady_counts_promote_a_healthy_canary_and_roll_back_a_slow_one() -> None:
    # The deterministic evidence the property tests draw from, checked to reach both outcomes.
    for maker, outcome in (
        (SteadyCounts(rate=20.0, measured=HEALTHY_EVIDENCE), Action.PROMOTE),
        (
            SteadyCounts(rate=20.0, slow_share=0.05, slow_above=1.0, measured=HEALTHY_EVIDENCE),
            Action.ROLLBACK,
        ),
    ):
        harness = progressing(make_policy())
        decision = harness.run(lambda d: d.action in (Action.PROMOTE, Action.ROLLBACK), evidence=maker)
        assert decision.action is outcome, harness.timeline.render()


def test_a_relative_latency_limit_below_the_first_bucket_or_min_stable_does_not_apply() -> None:
    relative_only = counted_policy(
        {"name": "p99", "metric": "latency", "quantile": 0.99, "maxIncrease": "20%"}
    )
    fast = [exact_tally(T0 + timedelta(seconds=15 * i), 15, 300, 0, {}) for i in range(40)]  # all under 5ms
    result = judge(relative_only, "p99", fast, fast, final=True)
    assert result.verdict is CheckVerdict.PASS
    assert "below the first bucket edge 5.00ms" in result.statement
    floor = counted_policy(
        {"name": "p99", "metric": "latency", "quantile": 0.99, "maxIncrease": "20%", "minStable": "1s"}
    )
    normal = [exact_tally(T0 + timedelta(seconds=15 * i), 15, 300, 0, {0.1: 30, 0.25: 1}) for i in range(40)]
    below_floor = judge(floor, "p99", normal, normal, final=True)
    assert below_floor.verdict is CheckVerdict.PASS
    assert "maxIncrease not applied" in below_floor.statement


def test_a_relative_error_limit_always_comes_to_a_decision() -> None:
    policy = counted_policy({"name": "errors", "metric": "error-rate", "maxIncrease": "50%"})

    def tallies(requests: int, errors: int, count: int) -> list[Tally]:
        return [exact_tally(T0 + timedelta(seconds=15 * i), 15, requests, errors, {}) for i in range(count)]

    # No error on either side: nothing to compare, met on the absolute limits (none here).
    quiet = judge(policy, "errors", tallies(100, 0, 40), tallies(400, 0, 40), final=True)
    assert quiet.verdict is CheckVerdict.PASS
    assert "no errors on either revision" in quiet.statement
    # A canary in the indifference zone (1.43 x stable's rate: between 1.5 / 1.1 and 1.5): the paired
    # tests may not decide, the horizon does — on the step's rate against 1.5 x stable's.
    canary, stable = tallies(1000, 10, 600), tallies(1000, 7, 600)
    zone = judge(policy, "errors", canary, stable, final=True, horizon=_horizon(reached=True))
    assert zone.verdict is CheckVerdict.PASS
    assert "met at the horizon on the estimate: error rate 1% (6,000 of 600,000 requests" in zone.statement


class _BuiltWhenRead(Sequence[Tally]):
    """Tallies as a counter book's series hands them over: built each time they are read."""

    def __init__(self, tallies: list[Tally]) -> None:
        self._tallies = tuple(tallies)
        self.reads = 0

    def __len__(self) -> int:
        return len(self._tallies)

    @overload
    def __getitem__(self, index: int) -> Tally: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Tally, ...]: ...

    def __getitem__(self, index: int | slice) -> Tally | tuple[Tally, ...]:
        self.reads += 1
        return self._tallies[index]

    def __iter__(self) -> Iterator[Tally]:
        self.reads += 1
        return iter(self._tallies)


def _summed(tallies: list[Tally]) -> Callable[[datetime | None], Tally | None]:
    # A book adds a range up from its two end rows, without the tallies.
    return lambda start: CountSeries.total(tallies if start is None else tallies_since(tallies, start))


def test_an_evaluation_reads_each_series_tallies_once_for_all_its_checks() -> None:
    # Both checks read both revisions over the step and pooled: the tallies are built once per
    # series for the evaluation (its memo), and the verdicts are the ones judged without it.
    policy = counted_policy(
        P99, {**ERRORS, "maxIncrease": "50%"}, P99 | {"name": "p99-vs-stable", "maxIncrease": "20%"}
    )
    step_start = T0 + timedelta(minutes=3)
    canary = [exact_tally(T0 + timedelta(minutes=i), 60, 300, i % 2, {0.8: 1}) for i in range(6)]
    stable = [exact_tally(T0 + timedelta(minutes=i), 60, 900, 1, {0.8: 2}) for i in range(6)]
    canary_read, stable_read = _BuiltWhenRead(canary), _BuiltWhenRead(stable)
    canary_series = CountSeries(EvidenceStatus.OK, canary_read, summed=_summed(canary))
    stable_series = CountSeries(EvidenceStatus.OK, stable_read, summed=_summed(stable))
    memo = Totals()  # one per evaluation
    shared = []
    for check in policy.spec.checks:
        shared.append(
            judge_sampled(
                check,
                canary_series,
                stable_series,
                step_start=step_start,
                budget=ErrorBudget.of(policy),
                confidence=policy.spec.confidence,
                compare_with_stable=True,
                final_step=False,
                memo=memo,
            )
        )
    assert (canary_read.reads, stable_read.reads) == (1, 1)
    alone = [judge(policy, check.name, canary, stable, step_start=step_start) for check in policy.spec.checks]
    assert shared == alone
    assert {result.requests for result in shared} == {900}  # the step's own: 3 of the 6 minutes
