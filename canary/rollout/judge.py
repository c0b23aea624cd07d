"""Judging checks: the canary's evidence against absolute limits and against the stable revision.

Each check gets one of five verdicts (docs/design.md §4), never confused with each other:

* ``fail`` — a limit is broken (a failure always wins: a broken absolute limit is a failure even
  when the stable revision's value could not be read);
* ``error`` — a query failed: the controller's problem, never the canary's;
* ``no-data`` — nothing to judge (no requests, no pods, the stable revision has no value);
* ``not-yet`` — counted checks only: requests are flowing, but neither the breach nor the limit
  being met is shown at the policy's confidence yet;
* ``pass`` — every limit that applies is met.

Two kinds of checks:

* **counted** — error rates and latency quantiles of the builtin metrics, estimated from a sample of
  requests: judged on the revisions' raw counts (``Evidence.counts``) by the sequential tests of
  :mod:`canary.rollout.sampled`, with the rollout's error budget. A significant breach fails at once;
  a limit is met on the evidence pooled over the steps;
* **measured** — gauges, counts of events (OOM kills, restarts), warm-up, custom PromQL and query
  overrides, and any check without counts: the value as measured against its limits; a failure
  counts towards ``failureLimit``.

An evaluation fails if any check fails, passes if every check passes, and is inconclusive
otherwise. Every :class:`Judgement` keeps the value, the limit, the stable value, the samples and
the query, so every decision can be explained with its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from canary.evidence import REQUESTS, CountSeries, EvidenceStatus, Measurement, fraction_key
from canary.policy.model import Check
from canary.policy.units import Unit, format_value
from canary.rollout.horizon import Horizon, HorizonOutcome
from canary.rollout.limits import limit_text, percent, relative_bound_text
from canary.rollout.memo import IdentityMemo
from canary.rollout.sampled import ErrorBudget, Totals, is_sampled, judge_sampled
from canary.rollout.state import EvaluationVerdict
from canary.rollout.vocabulary import CheckVerdict

__all__ = [
    "CheckVerdict",
    "CountContext",
    "Evaluation",
    "Judgement",
    "fraction_key",
    "has_absolute_limit",
    "judge_check",
    "judge_evidence",
]


class Judgement(NamedTuple):
    """One check as judged in one evaluation, with the numbers behind the verdict.

    (A NamedTuple rather than a frozen dataclass: equally immutable, four times cheaper to build,
    and six are built per evaluation.)
    """

    name: str
    verdict: CheckVerdict
    value: float | None  # the canary's value, canonical unit
    unit: Unit
    limit: str  # the condition, comparator first: "≤ 800ms and ≤ +20% vs stable (≤ 468ms)"
    stable_value: float | None = None
    samples: float | None = None  # what the value rests on (requests, pods), when known
    critical: bool = False
    detail: str = ""  # which limit broke, why there is no data, what failed
    query: str = ""
    max_allowed: float | None = None  # the effective upper bound (tightest of max and relative)
    min_allowed: float | None = None
    fraction: float | None = None  # gpu-memory-peak: used / total, when maxFraction is judged
    counted: bool = False  # judged on counts by a sequential test (detail is its statement)
    horizon: HorizonOutcome = HorizonOutcome.NONE  # decided (or undecidable) at the step's horizon

    def describe(self) -> str:
        """``p99: pass — p99 ≤ 800ms met at 95% (1,204 requests; …)`` for a counted check,
        ``oom: 0, limit ≤ 0 (3 pods) -> pass`` for a measured one."""
        if self.counted and self.detail:
            return f"{self.name}: {self.verdict} — {self.detail}"
        value = "no value" if self.value is None else format_value(self.value, self.unit)
        extras = []
        if self.stable_value is not None:
            extras.append(f"stable {format_value(self.stable_value, self.unit)}")
        if self.samples is not None:
            extras.append(f"{self.samples:,.0f} samples")
        suffix = f" ({', '.join(extras)})" if extras else ""
        detail = f": {self.detail}" if self.detail and self.verdict is not CheckVerdict.PASS else ""
        return f"{self.name}: {value}, limit {self.limit}{suffix} -> {self.verdict}{detail}"


class Evaluation(NamedTuple):
    """The verdict over all checks, with the canary's request count in the window."""

    verdict: EvaluationVerdict
    judgements: tuple[Judgement, ...]
    requests: float | None  # None: the request count could not be read (query error)
    requests_detail: str = ""
    failures: tuple[Judgement, ...] = ()  # the judgements that failed
    has_error: bool = False  # a query failed — for a check or for the request count
    # No check failed, errored or lacks data, and every check is met or (counted) not yet decided:
    # what a step below the highest one needs to advance ("advance on exposure").
    advance_ok: bool = False
    horizon: Horizon | None = None  # where the step stood against its horizon (counted checks)

    @property
    def critical_failures(self) -> tuple[Judgement, ...]:
        """Failures that roll back at once: critical checks, and counted checks (a sequential test
        that rejected "good" already holds its error budget; repeating it would spend it again)."""
        return tuple(judgement for judgement in self.failures if judgement.critical or judgement.counted)

    @property
    def measured_failures(self) -> tuple[Judgement, ...]:
        """Failures of measured checks, which count towards failureLimit."""
        return tuple(judgement for judgement in self.failures if not judgement.counted)

    def summary(self) -> str:
        """One line: ``fail (p99, errors); 1234 requests``."""
        if self.verdict is EvaluationVerdict.FAIL:
            details = [j.name for j in self.failures]
        else:
            details = [
                j.name for j in self.judgements if j.verdict in (CheckVerdict.NO_DATA, CheckVerdict.ERROR)
            ]
        named = f" ({', '.join(details)})" if details else ""
        requests = "request count unavailable" if self.requests is None else f"{self.requests:.0f} requests"
        return f"{self.verdict}{named}; {requests}"


def has_absolute_limit(check: Check) -> bool:
    """Whether the check can be judged without the stable revision (while pending or baking)."""
    return check.max is not None or check.min is not None or check.max_fraction is not None


@dataclass(frozen=True, slots=True)
class CountContext:
    """What judging counted checks needs besides the evidence: where the step began, the error
    budget, whether this is the highest step, and where the step stands against its horizon."""

    step_start: datetime
    budget: ErrorBudget
    confidence: float
    final_step: bool = False
    horizon: Horizon | None = None


def judge_evidence(
    checks: Sequence[Check],
    canary: Mapping[str, Measurement],
    stable: Mapping[str, Measurement],
    *,
    compare_with_stable: bool,
    counts: Mapping[str, CountSeries] | None = None,
    context: CountContext | None = None,
) -> Evaluation:
    """Judge every check; without ``compare_with_stable`` only absolute limits apply.

    Counted checks use ``counts`` (``"canary"``, ``"stable"``) when they are given with a
    ``context``; without them every check is judged as measured.
    """
    canary_counts = counts.get("canary") if counts is not None and context is not None else None
    memo = Totals()
    judgements = tuple(
        _judge_counted(check, canary_counts, counts, context, compare_with_stable, memo)
        if canary_counts is not None and context is not None and is_sampled(check)
        else judge_check(check, canary, stable, compare_with_stable=compare_with_stable)
        for check in checks
    )
    verdicts = {judgement.verdict for judgement in judgements}
    requests, requests_detail = _request_count(canary.get(REQUESTS))
    if canary_counts is not None and context is not None:
        requests, requests_detail = _counted_requests(canary_counts, context.step_start)
    if CheckVerdict.FAIL in verdicts:
        verdict = EvaluationVerdict.FAIL
        failures = tuple(judgement for judgement in judgements if judgement.verdict is CheckVerdict.FAIL)
    elif verdicts - {CheckVerdict.PASS}:
        verdict, failures = EvaluationVerdict.INCONCLUSIVE, ()
    else:
        verdict, failures = EvaluationVerdict.PASS, ()
    has_error = requests is None or CheckVerdict.ERROR in verdicts
    advance_ok = not has_error and verdicts <= {CheckVerdict.PASS, CheckVerdict.NOT_YET}
    horizon = context.horizon if context is not None else None
    return Evaluation(
        verdict, judgements, requests, requests_detail, failures, has_error, advance_ok, horizon
    )


def _counted_requests(series: CountSeries, step_start: datetime) -> tuple[float | None, str]:
    if series.status is EvidenceStatus.ERROR:
        return None, f"request counts failed: {series.detail or series.error_class}"
    if series.status is EvidenceStatus.INVALID_VALUE:
        return None, f"request counts are not numbers to judge: {series.detail}"
    if series.status is not EvidenceStatus.OK:
        return 0.0, series.detail or "no request series"
    total = series.total_since(step_start)
    return (float(total.requests) if total is not None else 0.0), ""


def _judge_counted(
    check: Check,
    canary: CountSeries,
    counts: Mapping[str, CountSeries] | None,
    context: CountContext,
    compare_with_stable: bool,
    memo: Totals,
) -> Judgement:
    plan = _plan(check)
    stable = counts.get("stable") if counts is not None else None
    result = judge_sampled(
        check,
        canary,
        stable,
        step_start=context.step_start,
        budget=context.budget,
        confidence=context.confidence,
        compare_with_stable=compare_with_stable and plan.max_increase is not None,
        final_step=context.final_step,
        horizon=context.horizon,
        memo=memo,
    )
    condition = (
        plan.relative_limit_text if compare_with_stable and plan.max_increase else plan.absolute_limit_text
    )
    return Judgement(
        plan.name,
        result.verdict,
        result.value,
        plan.unit,
        condition,
        result.stable_value,
        float(result.requests),
        plan.critical,
        result.statement,
        canary.query,
        result.max_allowed,
        plan.min,
        None,
        counted=True,
        horizon=result.horizon,
    )


def _request_count(measurement: Measurement | None) -> tuple[float | None, str]:
    # No requests in the window is a count of zero (the step cannot pass); a failed query is an
    # unknown count (None), which the core treats as a query error.
    if measurement is None:
        return 0.0, "no request count was supplied"
    if measurement.status is EvidenceStatus.ERROR:
        return None, f"request count query failed: {measurement.detail or measurement.error_class}"
    if measurement.status is EvidenceStatus.INVALID_VALUE:  # NaN/±Inf: unknown, like a query error
        return None, f"request count is not a number to judge: {measurement.detail}"
    if measurement.status is EvidenceStatus.NO_DATA or measurement.value is None:
        return 0.0, measurement.detail or "no requests"
    if math.isnan(measurement.value):
        return 0.0, "request count is NaN"
    return measurement.value, ""


@dataclass(frozen=True, slots=True)
class _CheckPlan:
    """What judging a check needs that depends only on the check: derived once, not per evaluation.

    (``Check.comparable_to_stable`` scans a custom query with a regex, and the limit texts format
    numbers: at thousands of decisions per second that is most of the cost.)
    """

    name: str
    unit: Unit
    max: float | None
    min: float | None
    max_fraction: float | None
    fraction_key: str
    max_increase: float | None  # None also when the check cannot be compared with the stable revision
    min_stable: float | None
    critical: bool
    absolute_limit_text: str
    relative_limit_text: str

    @classmethod
    def of(cls, check: Check) -> _CheckPlan:
        unit = check.value_unit
        comparable = check.max_increase is not None and check.comparable_to_stable
        return cls(
            name=check.name,
            unit=unit,
            max=check.max,
            min=check.min,
            max_fraction=check.max_fraction,
            fraction_key=fraction_key(check),
            max_increase=check.max_increase if comparable else None,
            min_stable=check.min_stable,
            critical=check.critical,
            absolute_limit_text=limit_text(check, relative=False),
            relative_limit_text=limit_text(check, relative=comparable),
        )


# Derived once per (immutable) Check object: see canary.rollout.memo.
_plan = IdentityMemo(_CheckPlan.of, capacity=4096)


def judge_check(
    check: Check,
    canary: Mapping[str, Measurement],
    stable: Mapping[str, Measurement],
    *,
    compare_with_stable: bool,
) -> Judgement:
    plan = _plan(check)
    unit = plan.unit
    max_increase = plan.max_increase if compare_with_stable else None
    condition = plan.relative_limit_text if max_increase is not None else plan.absolute_limit_text
    measurement = canary.get(plan.name)
    value = _value_of(measurement)
    if value is None:
        verdict, detail = _unusable(measurement, "the canary")
        samples = measurement.samples if measurement is not None else None
        query = measurement.query if measurement is not None else ""
        return Judgement(
            plan.name, verdict, None, unit, condition, None, samples, plan.critical, detail, query
        )
    assert measurement is not None
    failures = _absolute_failures(plan, value)
    fraction, missing = _fraction(plan, canary, failures)
    relative = _Relative(None, False, plan.max)
    if max_increase is not None:
        relative = _relative(plan, stable.get(plan.name), value, max_increase, failures)
        missing = _worse(missing, relative.missing) if relative.missing else missing
    if failures:
        verdict, detail = CheckVerdict.FAIL, "; ".join(failures)
    elif missing is not None:
        verdict, detail = missing
    else:
        verdict, detail = CheckVerdict.PASS, ""
    if relative.below_floor:
        assert relative.stable_value is not None
        assert plan.min_stable is not None
        note = (
            f"maxIncrease not applied: stable {format_value(relative.stable_value, unit)} is below minStable "
            f"{format_value(plan.min_stable, unit)}"
        )
        detail = f"{detail}; {note}" if detail else note
    return Judgement(
        plan.name, verdict, value, unit, condition, relative.stable_value, measurement.samples, plan.critical,
        detail, measurement.query, relative.max_allowed, plan.min, fraction,
    )  # fmt: skip


def _absolute_failures(plan: _CheckPlan, value: float) -> list[str]:
    unit, failures = plan.unit, []
    if plan.max is not None and value > plan.max:
        failures.append(f"{format_value(value, unit)} is above max {format_value(plan.max, unit)}")
    if plan.min is not None and value < plan.min:
        failures.append(f"{format_value(value, unit)} is below min {format_value(plan.min, unit)}")
    return failures


def _fraction(
    plan: _CheckPlan, canary: Mapping[str, Measurement], failures: list[str]
) -> tuple[float | None, tuple[CheckVerdict, str] | None]:
    """The GPU memory fraction against ``maxFraction`` (a failure is appended to ``failures``)."""
    if plan.max_fraction is None:
        return None, None
    measurement = canary.get(plan.fraction_key)
    fraction = _value_of(measurement)
    if fraction is None:
        return None, _unusable(measurement, "the GPU memory fraction")
    if fraction > plan.max_fraction:
        failures.append(
            f"GPU memory {percent(fraction)} of the device is above maxFraction {percent(plan.max_fraction)}"
        )
    return fraction, None


class _Relative(NamedTuple):
    stable_value: float | None
    below_floor: bool  # below minStable the relative limit is noise: only the absolute ones apply
    max_allowed: float | None  # the tightest upper limit, absolute or relative
    missing: tuple[CheckVerdict, str] | None = None


def _relative(
    plan: _CheckPlan, measurement: Measurement | None, value: float, increase: float, failures: list[str]
) -> _Relative:
    """The canary against ``(1 + maxIncrease)`` × the stable value (a failure appended to ``failures``)."""
    stable_value = _value_of(measurement)
    if stable_value is None:
        return _Relative(None, False, plan.max, _unusable(measurement, "the stable revision"))
    if plan.min_stable is not None and stable_value < plan.min_stable:
        return _Relative(stable_value, True, plan.max)
    allowed = stable_value * (1.0 + increase)
    if value > allowed:
        failures.append(
            f"{format_value(value, plan.unit)} is above "
            + relative_bound_text(increase, stable_value, allowed, plan.unit)
        )
    return _Relative(stable_value, False, allowed if plan.max is None else min(plan.max, allowed))


def _value_of(measurement: Measurement | None) -> float | None:
    """The value of a usable measurement: ok and not NaN (the only value unequal to itself)."""
    if measurement is None or measurement.status is not EvidenceStatus.OK:
        return None
    value = measurement.value
    return value if value is not None and value == value else None  # noqa: PLR0124 - the NaN test


def _unusable(measurement: Measurement | None, whose: str) -> tuple[CheckVerdict, str]:
    """Why a measurement cannot be judged (it has no usable value)."""
    if measurement is None:
        return CheckVerdict.NO_DATA, f"no measurement for {whose}"
    if measurement.status is EvidenceStatus.ERROR:
        cause = measurement.detail or (measurement.error_class or "unknown error")
        return CheckVerdict.ERROR, f"query for {whose} failed: {cause}"
    if measurement.status is EvidenceStatus.INVALID_VALUE:  # NaN/±Inf: held like a query problem
        return CheckVerdict.ERROR, f"invalid value for {whose}: {measurement.detail}"
    if measurement.status is EvidenceStatus.NO_DATA or measurement.value is None:
        return CheckVerdict.NO_DATA, f"no data for {whose}" + (
            f": {measurement.detail}" if measurement.detail else ""
        )
    # NaN is 0/0 in PromQL: nothing was measured (a defensive check; the evidence layer maps it).
    return CheckVerdict.NO_DATA, f"no data for {whose}: the value is NaN"


def _worse(
    current: tuple[CheckVerdict, str] | None, new: tuple[CheckVerdict, str]
) -> tuple[CheckVerdict, str]:
    if current is None or (new[0] is CheckVerdict.ERROR and current[0] is not CheckVerdict.ERROR):
        return new
    return current
