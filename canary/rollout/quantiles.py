"""Latency quantiles judged on bucket counts.

``p_q <= x`` is the same as "at most ``1 - q`` of the requests are slower than ``x``", so a quantile
limit is a share test on the counts slower than a bucket edge (:mod:`canary.rollout.histograms`):

* the **fail test** (the step's own counts) looks at the lowest edge at or above ``L / (1 + t)``:
  more than ``1 - q`` slower than it shows the canary is not good;
* the **pass test** (the counts pooled over the steps) looks at the highest edge at or below ``L``:
  at most ``1 - q`` slower than it shows the limit met;
* neither ever interpolates inside a bucket, so both hold whatever the shape of the latencies; where
  no edge serves, the test does not decide and the horizon's estimate does, saying it interpolated.

A relative limit (``maxIncrease``) is held against bounds on the stable revision's quantile from its
own counts (the edges where its share slower is shown below / above ``1 - q``, each edge's test with
the bound's budget divided across the edges): the canary fails against ``(1 + maxIncrease)`` times
the upper bound and is met against ``(1 + maxIncrease)`` times the lower one. At the horizon the
canary's estimate is judged against ``(1 + maxIncrease)`` times the stable revision's estimate over
the same step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from canary.evidence import Histogram, Tally
from canary.policy.model import Check
from canary.policy.units import Unit, format_value
from canary.rollout.counted import (
    Context,
    Counts,
    Outcome,
    SampledResult,
    Sides,
    Terminal,
    finish,
    needed,
    no_requests,
    phi_text,
    requests_text,
    stable_missing,
    test_of,
    too_few_for_estimate,
)
from canary.rollout.histograms import density, estimate_quantile, fail_edge, pass_edge, slower_estimate
from canary.rollout.horizon import HorizonOutcome, chance_text, requests_needed, share_variance, wrong_side
from canary.rollout.limits import percent
from canary.rollout.sequential import Direction, dispersion
from canary.rollout.vocabulary import CheckVerdict

__all__ = ["judge_quantile"]


def _ms(seconds: float) -> str:
    return format_value(seconds, Unit.SECONDS)


def _name(check: Check) -> str:
    quantile = check.effective_quantile
    assert quantile is not None
    return f"p{quantile * 100:g}"


@dataclass
class _Limits:
    """The limits in force for one evaluation of a quantile check."""

    fail: list[tuple[float, str]] = field(default_factory=list)  # (limit, label) a step must not break
    passing: list[float | None] = field(default_factory=list)  # None: not known yet (stable unbounded)
    notes: list[str] = field(default_factory=list)
    relative: bool = False  # a relative limit is in force (its tests share the budget with a bound)
    horizon: float | None = None  # the limit the step's estimate is judged against at the horizon
    horizon_text: str = ""
    horizon_spread: float = 0.0  # its standard error (seconds): the stable revision's sampling error
    stable_requests: float | None = None  # what a relative horizon limit rests on


def judge_quantile(context: Context, sides: Sides) -> SampledResult:
    check, step = context.check, sides.step
    histogram = step.histogram
    if histogram is None or histogram.total == 0:
        return no_requests(sides.pooled)
    quantile = check.effective_quantile
    assert quantile is not None
    limits = _limits(context, sides)
    failed = _fail_tests(context, step, histogram, limits)
    outcome = _pass_test(context, sides, limits)
    stable_value = estimate_quantile(sides.stable_step.histogram if sides.stable_step else None, quantile)
    horizon = context.horizon
    terminal = None
    if horizon is not None and (horizon.reached or horizon.window_ended):
        terminal = _at_horizon(context, step, histogram, limits)
    return finish(
        context,
        sides,
        Outcome(
            failed="; ".join(failed) if failed else None,
            met=outcome.met,
            met_text=outcome.met_text,
            waiting="not yet: "
            + "; ".join(limits.notes or [f"{_name(check)} not shown within its limit yet"]),
            needed=outcome.needed,
            value=estimate_quantile(histogram, quantile),
            stable_value=stable_value,
            max_allowed=min((limit for limit, _ in limits.fail), default=check.max),
            terminal=terminal,
        ),
    )


def _limits(context: Context, sides: Sides) -> _Limits:
    check = context.check
    name = _name(check)
    limits = _Limits()
    if check.max is not None:
        limits.fail.append((check.max, f"{name} ≤ {_ms(check.max)}"))
        limits.passing.append(check.max)
        limits.horizon, limits.horizon_text = check.max, _ms(check.max)
    if check.max_increase is not None and context.compare:
        _relative_limits(context, sides, limits)
    return limits


def _relative_limits(context: Context, sides: Sides, limits: _Limits) -> None:
    check = context.check
    assert check.max_increase is not None
    quantile = check.effective_quantile
    assert quantile is not None
    name, increase = _name(check), check.max_increase
    stable = sides.stable_pooled.histogram if sides.stable_pooled else None
    if stable is None or stable.total == 0:
        limits.notes.append(f"vs stable: {stable_missing(sides.stable)}")
        limits.passing.append(None)  # cannot be met before the stable revision is known
        return
    low, high = _stable_bounds(stable, quantile, context)
    estimate = estimate_quantile(stable, quantile)
    if low is None and high is not None and high <= stable.edges[0]:
        # Below the first bucket edge no bucket tells stable's quantile from the canary's: the relative
        # limit cannot be judged (as below minStable); absolute limits apply.
        limits.notes.append(
            f"maxIncrease not applied: stable {name} is below the first bucket edge {_ms(high)}"
        )
        return
    if check.min_stable is not None and estimate is not None and estimate < check.min_stable:
        floor = _ms(check.min_stable)
        limits.notes.append(
            f"maxIncrease not applied: stable {name} {_ms(estimate)} is below minStable {floor}"
        )
        return
    limits.relative = True
    if high is not None:
        allowed = (1.0 + increase) * high
        label = f"{name} ≤ +{percent(increase)} vs stable (≤ {_ms(allowed)}; stable's {name} ≤ {_ms(high)})"
        limits.fail.append((allowed, label))
    limits.passing.append((1.0 + increase) * low if low is not None else None)
    if low is None:
        limits.notes.append(f"the stable revision's {name} is not bounded from below yet")
    _relative_horizon(check, sides, limits)


def _relative_horizon(check: Check, sides: Sides, limits: _Limits) -> None:
    """The relative limit for the estimate: ``1 + maxIncrease`` times the stable revision's estimate
    pooled over the rollout, with that estimate's standard error (its share's, through the density)."""
    quantile = check.effective_quantile
    assert quantile is not None
    assert check.max_increase is not None
    histogram = sides.stable_pooled.histogram if sides.stable_pooled else None
    stable = estimate_quantile(histogram, quantile)
    if stable is None or histogram is None:
        return
    allowed = (1.0 + check.max_increase) * stable
    if limits.horizon is None or allowed < limits.horizon:
        share = 1.0 - quantile
        height = density(histogram, stable)
        spread = math.sqrt(share_variance(share, histogram.total)) / height if height > 0 else math.inf
        limits.horizon, limits.horizon_spread = allowed, (1.0 + check.max_increase) * spread
        limits.stable_requests = histogram.total
        limits.horizon_text = (
            f"{_ms(allowed)} (+{percent(check.max_increase)} of stable's {_name(check)} ≈ {_ms(stable)} "
            f"over {requests_text(histogram.total)})"
        )


def _stable_bounds(
    histogram: Histogram, quantile: float, context: Context
) -> tuple[float | None, float | None]:
    """(lower, upper) edges bounding the stable revision's quantile, from its counts.

    Upper: the lowest edge with fewer than ``1 - q`` of stable's requests shown slower; lower: the
    highest edge with more shown slower. Each edge's test gets the bound's budget divided by the
    number of edges (a union bound over them)."""
    share, ratio = 1.0 - quantile, 1.0 + context.check.tolerance
    edges, total = histogram.edges, float(histogram.total)
    budget = context.budget
    upper_test = test_of(share, Direction.BELOW, budget.fail_per_step(True) / len(edges), share, ratio)
    lower_test = test_of(share, Direction.ABOVE, budget.passing(True) / len(edges), share, ratio)
    upper = next(
        (
            edge
            for index, edge in enumerate(edges)
            if upper_test.rejects(float(histogram.slower_than(index)), total)
        ),
        None,
    )
    lower = next(
        (
            edges[index]
            for index in range(len(edges) - 1, -1, -1)
            if lower_test.rejects(float(histogram.slower_than(index)), total)
        ),
        None,
    )
    return lower, upper


def _fail_tests(context: Context, step: Counts, histogram: Histogram, limits: _Limits) -> list[str]:
    check = context.check
    quantile = check.effective_quantile
    assert quantile is not None
    share, ratio = 1.0 - quantile, 1.0 + check.tolerance
    budget = context.budget.fail_per_step(limits.relative) / max(1, len(limits.fail))
    failures = []
    for limit, label in limits.fail:
        index = fail_edge(histogram.edges, limit / ratio)
        if index is None:  # no edge at or above "good": only the horizon's estimate can tell
            continue
        edge, slower = histogram.edges[index], float(histogram.slower_than(index))
        phi = _dispersion(step.intervals, check, edge)
        if test_of(share, Direction.ABOVE, budget, share, ratio).rejects(slower, float(histogram.total), phi):
            failures.append(
                f"{label} broken at {percent(context.confidence)}: {slower:,.0f} of "
                f"{requests_text(histogram.total)} ({percent(slower / histogram.total)}) slower than "
                f"{_ms(edge)} this step, more than {percent(share)}" + phi_text(phi)
            )
    return failures


@dataclass(frozen=True, slots=True)
class _Passing:
    met: bool = False
    met_text: str = ""
    needed: int | None = None


def _pass_test(context: Context, sides: Sides, limits: _Limits) -> _Passing:
    check, pooled = context.check, sides.pooled
    histogram = pooled.histogram
    if not limits.passing:  # only a relative limit, and it does not apply (minStable, below the buckets)
        return _Passing(True, "; ".join(limits.notes))
    known = [limit for limit in limits.passing if limit is not None]
    if histogram is None or len(known) < len(limits.passing):
        return _Passing()
    target = min(known)
    index = pass_edge(histogram.edges, target)
    if index is None:
        limits.notes.append(f"no bucket edge at or below {_ms(target)} to show it met")
        return _Passing()
    quantile = check.effective_quantile
    assert quantile is not None
    share, ratio = 1.0 - quantile, 1.0 + check.tolerance
    edge, total = histogram.edges[index], float(histogram.total)
    slower = float(histogram.slower_than(index))
    phi = _dispersion(pooled.intervals, check, edge)
    test = test_of(share, Direction.BELOW, context.budget.passing(limits.relative), share, ratio)
    name = _name(check)
    if check.max is not None and target == check.max:
        limit_text = _ms(check.max)
    else:  # the relative limit is the tighter: say what it is in terms of stable
        assert check.max_increase is not None
        limit_text = f"+{percent(check.max_increase)} vs stable (≥ {_ms(target)} shown)"
    if test.rejects(slower, total, phi):
        return _Passing(
            True,
            f"{name} ≤ {limit_text} met at {percent(context.confidence)} ({requests_text(total)}; slower "
            f"than {_ms(edge)}: {percent(slower / total)}, allowed {percent(share)})",
        )
    limits.notes.append(
        f"{name}: {percent(slower / total)} of {total:,.0f} pooled requests slower than {_ms(edge)}, at most "
        f"{percent(share)} allowed"
    )
    return _Passing(needed=needed(test, slower, total, phi))


def _at_horizon(context: Context, step: Counts, histogram: Histogram, limits: _Limits) -> Terminal:
    """The step's estimate against the limit in force (see :mod:`canary.rollout.horizon`)."""
    check = context.check
    name = _name(check)
    quantile = check.effective_quantile
    assert quantile is not None
    share, total = 1.0 - quantile, float(histogram.total)
    limit = limits.horizon
    if limit is None:
        text = f"at the horizon: {name} cannot be judged against stable, which has no requests yet"
        return Terminal(CheckVerdict.NOT_YET, text, HorizonOutcome.UNJUDGEABLE)
    slower, how, judgeable = slower_estimate(histogram, limit)
    phi = _dispersion(step.intervals, check, limit)
    enough = requests_needed(share, context.confidence, phi)
    if total < enough:
        return too_few_for_estimate(step, enough, phi)
    if limits.stable_requests is not None and limits.stable_requests < enough:
        return too_few_for_estimate(step, enough, phi, side="the stable revision")
    if not judgeable:
        return Terminal(
            CheckVerdict.NOT_YET,
            f"at the horizon: {name} ≤ {limits.horizon_text} cannot be judged: {slower:,.0f} of "
            f"{requests_text(total)} are slower than the last bucket edge, {how}; name a histogram whose "
            "edges reach past the limit (metrics.queries, or the model server's own)",
            HorizonOutcome.UNJUDGEABLE,
        )
    estimate = slower / total
    moved = density(histogram, limit) * limits.horizon_spread
    variance = share_variance(estimate, total, phi) + (moved * moved if math.isfinite(moved) else math.inf)
    chance = wrong_side(estimate, share, variance)
    value = estimate_quantile(histogram, quantile)
    shown = f"{name} ≈ {_ms(value)}" if value is not None else name
    return Terminal(
        CheckVerdict.FAIL if estimate > share else CheckVerdict.PASS,
        f"{shown} against {limits.horizon_text} ({requests_text(total)} this step; {percent(estimate)} "
        f"slower than {_ms(limit)}, {percent(share)} allowed" + (f", {how}" if how else "") + "); the "
        f"chance that the estimate is on the wrong side of the limit: {chance_text(chance)}",
        chance=chance,
    )


def _dispersion(intervals: Sequence[Tally], check: Check, point: float) -> float:
    """The dispersion of the per-interval shares slower than ``point``."""
    assert check.metric is not None
    measure = check.metric.value
    counts = []
    for tally in intervals:
        histogram = tally.histograms.get(measure)
        if histogram is not None and histogram.total > 0:
            counts.append((slower_estimate(histogram, point)[0], float(histogram.total)))
    return dispersion(counts)
