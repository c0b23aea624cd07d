"""Checks estimated from a sample of requests, judged on counts: error rates and latency quantiles.

What a check means (canary/rollout/SEMANTICS.md "How it decides"):

* a canary is **bad** for a limit ``L`` when its value is at or above ``L``, **good** when it is at
  or below ``L / (1 + tolerance)``; in between either decision is right;
* the check **fails** when the step's own evidence shows the canary is not good (the fail test
  rejects "good" at its share of the error budget) — at every step, whatever earlier steps showed;
* the check is **met** when the evidence pooled over the rollout's steps shows it is not bad (the
  pass test rejects "bad");
* otherwise it is **not yet** decided, with how many more requests it needs and the time by which it
  will be decided: at the step's horizon (:mod:`canary.rollout.horizon`) the step's own estimate
  decides, and says so with its error.

Quantiles: :mod:`canary.rollout.quantiles`; rates: :mod:`canary.rollout.rates`; what they share:
:mod:`canary.rollout.counted`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from canary.evidence import CountSeries, EvidenceStatus
from canary.policy.model import Check, MetricKind, PromotionPolicy
from canary.rollout.counted import (
    SAMPLED_METRICS,
    Context,
    ErrorBudget,
    SampledResult,
    Sides,
    Totals,
    counted_checks,
    counts_of,
    is_sampled,
    minutes_text,
    stable_missing,
)
from canary.rollout.horizon import Horizon, requests_needed
from canary.rollout.quantiles import judge_quantile
from canary.rollout.rates import judge_rate
from canary.rollout.vocabulary import CheckVerdict

__all__ = [
    "SAMPLED_METRICS",
    "ErrorBudget",
    "SampledResult",
    "Totals",
    "horizon_requests",
    "is_sampled",
    "judge_sampled",
    "minutes_text",
]


def judge_sampled(
    check: Check,
    canary: CountSeries,
    stable: CountSeries | None,
    *,
    step_start: datetime,
    budget: ErrorBudget,
    confidence: float,
    compare_with_stable: bool,
    final_step: bool,
    horizon: Horizon | None = None,
    memo: Totals | None = None,
) -> SampledResult:
    """Judge one counted check: the step's evidence for failing, the pooled evidence for passing, the
    step's estimate at the horizon. ``memo`` (one per evaluation) shares totals between checks."""
    unusable = _unusable(canary)
    if unusable is not None:
        return unusable
    assert check.metric is not None
    measure = check.metric.value
    stable_ok = compare_with_stable and stable is not None and stable.status is EvidenceStatus.OK
    sides = Sides(
        counts_of(canary, step_start, memo, measure),
        counts_of(canary, None, memo, measure),
        counts_of(stable, step_start, memo, measure) if stable_ok and stable is not None else None,
        counts_of(stable, None, memo, measure) if stable_ok and stable is not None else None,
        stable,
    )
    context = Context(check, budget, final_step, compare_with_stable, confidence, horizon)
    judged = judge_rate if check.metric is MetricKind.ERROR_RATE else judge_quantile
    result = judged(context, sides)
    unreadable = stable is not None and stable.status in (EvidenceStatus.ERROR, EvidenceStatus.INVALID_VALUE)
    if (
        compare_with_stable
        and check.max_increase is not None
        and unreadable
        and result.verdict is not CheckVerdict.FAIL
    ):
        # The stable revision's counts could not be read: a query problem holds the rollout (a broken
        # absolute limit still fails); it is never "not yet" that lets a step advance.
        return replace(result, verdict=CheckVerdict.ERROR, statement=stable_missing(stable))
    return result


def _unusable(canary: CountSeries) -> SampledResult | None:
    if canary.status is EvidenceStatus.ERROR:
        detail = canary.detail or str(canary.error_class or "the counts could not be read")
        return SampledResult(CheckVerdict.ERROR, None, None, 0, 0, f"counts for the canary failed: {detail}")
    if canary.status is EvidenceStatus.INVALID_VALUE:  # NaN/±Inf in a counter: held like a query problem
        detail = canary.detail or "not a number"
        return SampledResult(CheckVerdict.ERROR, None, None, 0, 0, f"invalid value for the canary: {detail}")
    if canary.status is not EvidenceStatus.OK:
        detail = canary.detail or "no series"
        return SampledResult(CheckVerdict.NO_DATA, None, None, 0, 0, f"no data for the canary: {detail}")
    return None


def horizon_requests(policy: PromotionPolicy) -> dict[str, int | None]:
    """Per counted check, the step requests a horizon estimate rests on (``validate`` prints them);
    None for a relative error-rate limit, whose allowed rate is the stable revision's."""
    sizes: dict[str, int | None] = {}
    for check in counted_checks(policy):
        if check.metric is MetricKind.ERROR_RATE:
            usable = check.max is not None and 0 < check.max < 1
            sizes[check.name] = (
                requests_needed(check.max, policy.spec.confidence) if usable and check.max else None
            )
        else:
            quantile = check.effective_quantile
            assert quantile is not None
            sizes[check.name] = requests_needed(1.0 - quantile, policy.spec.confidence)
    return sizes
