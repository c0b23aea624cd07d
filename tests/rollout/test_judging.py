"""Judging checks: absolute limits, limits relative to the stable revision, critical checks."""

from __future__ import annotations

import math
from typing import Any

import pytest

from canary.evidence import REQUESTS, ErrorClass, Measurement
from canary.policy.model import Check
from canary.policy.units import Unit
from canary.rollout.judge import (
    CheckVerdict,
    Judgement,
    fraction_key,
    has_absolute_limit,
    judge_check,
    judge_evidence,
)
from canary.rollout.state import EvaluationVerdict

from .helpers import GIB


def check(**fields: Any) -> Check:
    return Check.model_validate({"name": "c", **fields})


def ok(value: float, unit: Unit = Unit.SECONDS, samples: float | None = 500.0) -> Measurement:
    return Measurement.ok(value, unit, samples=samples, query="the-query")


def judge(
    the_check: Check,
    canary: Measurement | None,
    stable: Measurement | None = None,
    *,
    compare: bool = True,
    extra: dict[str, Measurement] | None = None,
) -> Judgement:
    canary_map = {} if canary is None else {the_check.name: canary}
    canary_map.update(extra or {})
    stable_map = {} if stable is None else {the_check.name: stable}
    return judge_check(the_check, canary_map, stable_map, compare_with_stable=compare)


P99 = check(metric="latency", max="800ms", maxIncrease="20%")


def test_absolute_max_passes_at_the_limit_and_fails_above() -> None:
    latency = check(metric="latency", max="800ms")
    at_limit = judge(latency, ok(0.8))
    assert at_limit.verdict is CheckVerdict.PASS
    above = judge(latency, ok(0.81))
    assert above.verdict is CheckVerdict.FAIL
    assert above.detail == "810ms is above max 800ms"
    assert above.max_allowed == pytest.approx(0.8)


def test_absolute_min_fails_below() -> None:
    throughput = check(promql="sum(rate(x[{{ window }}]))", unit="none", min=10)
    assert judge(throughput, ok(10, Unit.NONE)).verdict is CheckVerdict.PASS
    below = judge(throughput, ok(9.5, Unit.NONE))
    assert below.verdict is CheckVerdict.FAIL
    assert below.min_allowed == 10
    assert "below min 10" in below.detail


def test_relative_limit_is_canary_at_most_one_plus_increase_times_stable() -> None:
    # maxIncrease 20%: canary <= 1.2 x stable (0.5 s -> 600 ms allowed), tighter than max 800 ms.
    passing = judge(P99, ok(0.6), ok(0.5))
    assert passing.verdict is CheckVerdict.PASS
    assert passing.max_allowed == pytest.approx(0.6)
    assert passing.stable_value == 0.5
    failing = judge(P99, ok(0.61), ok(0.5))
    assert failing.verdict is CheckVerdict.FAIL
    assert failing.detail == "610ms is above 1.2 × stable 500ms = 600ms"
    assert failing.limit == "≤ 800ms and ≤ +20% vs stable"


def test_relative_limit_is_not_applied_while_stable_is_below_min_stable() -> None:
    errors = check(metric="error-rate", max="1%", maxIncrease="50%", minStable="0.1%")
    # Stable 0.05% is under the 0.1% floor: 0.5% for the canary is judged by max only.
    below_floor = judge(errors, ok(0.005, Unit.RATIO), ok(0.0005, Unit.RATIO))
    assert below_floor.verdict is CheckVerdict.PASS
    assert "maxIncrease not applied: stable 0.05% is below minStable 0.1%" in below_floor.detail
    assert below_floor.max_allowed == pytest.approx(0.01)
    # Stable 0.2% is above the floor: 0.5% > 1.5 x 0.2% = 0.3% fails (measured over enough requests).
    above_floor = judge(errors, ok(0.005, Unit.RATIO, samples=100_000), ok(0.002, Unit.RATIO))
    assert above_floor.verdict is CheckVerdict.FAIL
    assert "1.5 × stable 0.2% = 0.3%" in above_floor.detail


def test_relative_limit_without_stable_value_is_no_data_but_an_absolute_failure_still_fails() -> None:
    no_stable = judge(P99, ok(0.5), Measurement.no_data("no requests to the stable revision"))
    assert no_stable.verdict is CheckVerdict.NO_DATA
    assert no_stable.detail == "no data for the stable revision: no requests to the stable revision"
    broken_max = judge(P99, ok(0.9), Measurement.no_data("none"))
    assert broken_max.verdict is CheckVerdict.FAIL


def test_stable_query_error_is_an_error_not_a_failure() -> None:
    judged = judge(P99, ok(0.5), Measurement.error(ErrorClass.TIMEOUT, "timed out after 10s"))
    assert judged.verdict is CheckVerdict.ERROR
    assert judged.detail == "query for the stable revision failed: timed out after 10s"


def test_without_comparison_only_absolute_limits_apply() -> None:
    judged = judge(P99, ok(0.7), ok(0.1), compare=False)
    assert judged.verdict is CheckVerdict.PASS
    assert judged.stable_value is None
    assert judged.limit == "≤ 800ms"


def test_canary_no_data_error_and_missing_measurements() -> None:
    no_data = judge(P99, Measurement.no_data("no requests in the window", samples=0))
    assert (no_data.verdict, no_data.detail, no_data.samples) == (
        CheckVerdict.NO_DATA,
        "no data for the canary: no requests in the window",
        0,
    )
    error = judge(P99, Measurement.error(ErrorClass.BAD_QUERY, "parse error at char 3"))
    assert error.verdict is CheckVerdict.ERROR
    assert error.detail == "query for the canary failed: parse error at char 3"
    missing = judge(P99, None)
    assert (missing.verdict, missing.detail) == (CheckVerdict.NO_DATA, "no measurement for the canary")
    nan = judge(P99, ok(math.nan))
    assert nan.verdict is CheckVerdict.NO_DATA
    error_without_detail = judge(P99, Measurement.error(ErrorClass.UNREACHABLE, ""))
    assert error_without_detail.detail == "query for the canary failed: unreachable"


def test_gpu_memory_max_fraction_is_judged_from_the_fraction_measurement() -> None:
    gpu = check(metric="gpu-memory-peak", maxFraction=0.9)
    used = Measurement.ok(70 * GIB, Unit.BYTES)
    fits = judge(gpu, used, extra={fraction_key(gpu): Measurement.ok(0.875, Unit.RATIO)})
    assert (fits.verdict, fits.fraction, fits.value) == (CheckVerdict.PASS, 0.875, 70 * GIB)
    too_full = judge(gpu, used, extra={fraction_key(gpu): Measurement.ok(0.95, Unit.RATIO)})
    assert too_full.verdict is CheckVerdict.FAIL
    assert too_full.detail == "GPU memory 95% of the device is above maxFraction 90%"
    no_fraction = judge(gpu, used)
    assert no_fraction.verdict is CheckVerdict.NO_DATA
    assert no_fraction.detail == "no measurement for the GPU memory fraction"
    fraction_error = judge(gpu, used, extra={fraction_key(gpu): Measurement.error(ErrorClass.SERVER, "500")})
    assert fraction_error.verdict is CheckVerdict.ERROR


def test_an_error_outranks_no_data_within_a_check() -> None:
    gpu = check(metric="gpu-memory-peak", maxFraction=0.9, maxIncrease="10%")
    judged = judge(
        gpu,
        Measurement.ok(10 * GIB, Unit.BYTES),
        Measurement.error(ErrorClass.TIMEOUT, "slow"),
        extra={fraction_key(gpu): Measurement.no_data("no DCGM series")},
    )
    assert judged.verdict is CheckVerdict.ERROR
    reverse = judge(
        gpu,
        Measurement.ok(10 * GIB, Unit.BYTES),
        Measurement.no_data("no stable pods"),
        extra={fraction_key(gpu): Measurement.error(ErrorClass.TIMEOUT, "slow")},
    )
    assert reverse.verdict is CheckVerdict.ERROR


def test_every_judgement_records_value_limit_stable_samples_query_and_verdict() -> None:
    judged = judge(P99, ok(0.55, samples=1234), ok(0.5))
    assert judged == Judgement(
        name="c",
        verdict=CheckVerdict.PASS,
        value=0.55,
        unit=Unit.SECONDS,
        limit="≤ 800ms and ≤ +20% vs stable",
        stable_value=0.5,
        samples=1234,
        critical=False,
        detail="",
        query="the-query",
        max_allowed=pytest.approx(0.6),
        min_allowed=None,
        fraction=None,
    )
    # The value, then the limit it is held against: never "3.67s ≤ 3.64s", which reads as a claim.
    assert judged.describe() == (
        "c: 550ms, limit ≤ 800ms and ≤ +20% vs stable (stable 500ms, 1,234 samples) -> pass"
    )


def test_critical_flag_is_carried() -> None:
    oom = check(metric="oom-kills", max=0, critical=True)
    judged = judge(oom, ok(1, Unit.COUNT))
    assert judged.critical
    assert judged.verdict is CheckVerdict.FAIL
    assert judged.describe() == "c: 1, limit ≤ 0 (500 samples) -> fail: 1 is above max 0"


def evaluation_of(*verdicts: str, requests: Measurement | None = None) -> EvaluationVerdict:
    checks = [check(name=f"c{i}", metric="latency", max="1s") for i in range(len(verdicts))]
    values = {"pass": ok(0.5), "fail": ok(2.0), "no-data": Measurement.no_data("none")}
    values["error"] = Measurement.error(ErrorClass.TIMEOUT, "slow")
    canary = {f"c{i}": values[verdict] for i, verdict in enumerate(verdicts)}
    if requests is not None:
        canary[REQUESTS] = requests
    return judge_evidence(checks, canary, {}, compare_with_stable=True).verdict


@pytest.mark.parametrize(
    ("verdicts", "expected"),
    [
        (("pass", "pass"), EvaluationVerdict.PASS),
        (("pass", "fail"), EvaluationVerdict.FAIL),
        (("fail", "no-data", "error"), EvaluationVerdict.FAIL),
        (("pass", "no-data"), EvaluationVerdict.INCONCLUSIVE),
        (("pass", "error"), EvaluationVerdict.INCONCLUSIVE),
        (("no-data", "error"), EvaluationVerdict.INCONCLUSIVE),
    ],
)
def test_evaluation_fails_if_any_check_fails_inconclusive_if_any_lacks_data_else_passes(
    verdicts: tuple[str, ...], expected: EvaluationVerdict
) -> None:
    assert evaluation_of(*verdicts) is expected


def test_request_count_outcomes() -> None:
    checks = [check(metric="latency", max="1s")]

    def requests_of(measurement: Measurement | None) -> tuple[float | None, bool]:
        canary = {"c": ok(0.5)}
        if measurement is not None:
            canary[REQUESTS] = measurement
        evaluation = judge_evidence(checks, canary, {}, compare_with_stable=True)
        return evaluation.requests, evaluation.has_error

    assert requests_of(Measurement.ok(321, Unit.COUNT)) == (321, False)
    assert requests_of(Measurement.no_data("no requests")) == (0.0, False)
    assert requests_of(None) == (0.0, False)
    assert requests_of(Measurement.ok(math.nan, Unit.COUNT)) == (0.0, False)
    assert requests_of(Measurement.error(ErrorClass.TIMEOUT, "slow")) == (None, True)


def test_evaluation_summary_names_the_failing_checks() -> None:
    checks = [check(name="p99", metric="latency", max="1s"), check(name="ttft", metric="ttft", max="1s")]
    canary = {"p99": ok(2.0), "ttft": Measurement.no_data("none"), REQUESTS: Measurement.ok(50, Unit.COUNT)}
    evaluation = judge_evidence(checks, canary, {}, compare_with_stable=True)
    assert evaluation.summary() == "fail (p99); 50 requests"
    assert [j.name for j in evaluation.failures] == ["p99"]
    assert evaluation.critical_failures == ()
    canary["p99"] = ok(0.5)
    canary[REQUESTS] = Measurement.error(ErrorClass.TIMEOUT, "slow")
    inconclusive = judge_evidence(checks, canary, {}, compare_with_stable=True)
    assert inconclusive.summary() == "inconclusive (ttft); request count unavailable"


def test_absolute_limit_detection() -> None:
    assert has_absolute_limit(check(metric="latency", max="1s"))
    assert has_absolute_limit(check(metric="gpu-memory-peak", maxFraction=0.9))
    assert not has_absolute_limit(check(metric="latency", maxIncrease="20%"))


def test_without_counts_a_rate_or_quantile_is_judged_as_measured() -> None:
    # Overrides and custom queries give a value, not counts: no sequential test can be run on it, so
    # the value stands as measured and failureLimit (not a significance test) guards against noise.
    errors = check(name="errors", metric="error-rate", max="1%")
    assert judge(errors, ok(1 / 40, Unit.RATIO, samples=40)).verdict is CheckVerdict.FAIL
    p99 = check(name="p99", metric="latency", quantile=0.99, max="800ms")
    assert judge(p99, ok(1.2, samples=200)).verdict is CheckVerdict.FAIL
    assert judge(p99, ok(0.7, samples=200)).verdict is CheckVerdict.PASS


def test_breaches_without_a_sample_count_or_of_gauges_stand_as_measured() -> None:
    errors = check(name="errors", metric="error-rate", max="1%")
    assert judge(errors, ok(0.02, Unit.RATIO, samples=None)).verdict is CheckVerdict.FAIL
    assert judge(errors, ok(math.inf, Unit.RATIO, samples=3)).verdict is CheckVerdict.FAIL
    kv = check(name="kv", metric="kv-cache-usage", max="95%")
    assert judge(kv, ok(0.97, Unit.RATIO, samples=1)).verdict is CheckVerdict.FAIL
