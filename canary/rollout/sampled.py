"""Checks estimated from a sample of requests, judged on counts: error rates and latency quantiles.

What a check means (docs/design.md §3.4; canary/rollout/SEMANTICS.md "How it decides"):

* a canary is **bad** for a limit ``L`` when its value is at or above ``L``, **good** when it is at
  or below ``L / (1 + tolerance)``; in between either decision is right;
* the check **fails** when the step's own evidence shows the canary is not good (the fail test
  rejects "good" at its share of the error budget) — at every step, whatever earlier steps showed;
* the check is **met** when the evidence pooled over the rollout's steps shows it is not bad (the
  pass test rejects "bad"), the highest step shows no breach and carries its share of the requests;
* otherwise it is **not yet** decided, with how many more requests it needs at the current rate —
  until the pooled requests reach the test's truncation, where it is decided on the estimate.

Latency quantiles are tested as shares: ``p_q <= x`` is the same as "at most ``1 - q`` of the
requests are slower than ``x``". The fail test counts requests slower than the lowest bucket edge at
or above ``L``; the pass test those slower than the highest edge at or below ``L / (1 + t)``: both
sound whatever the shape of the latency distribution inside a bucket. When no edge lies within one
tolerance factor of where it is needed (bucket layouts are coarse), the count is interpolated inside
the bucket, as ``histogram_quantile`` does, and the statement says so.

Relative limits are two-sample. Error rates: the canary's share of both revisions' errors in each
interval, given their requests (:func:`canary.rollout.sequential.paired_log_ratios`). Quantiles: the
stable revision's quantile is bounded from its own counts (a confidence bound with its own share of
the budget) and the canary is tested against ``(1 + maxIncrease)`` times the bound.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from functools import lru_cache

from canary.evidence import CountSeries, EvidenceStatus, Histogram, Tally, tallies_since
from canary.policy.model import Check, MetricKind, PromotionPolicy
from canary.policy.units import Unit, format_value
from canary.rollout.limits import percent
from canary.rollout.sequential import (
    GRID_POINTS,
    Direction,
    MixtureTest,
    cut,
    dispersion,
    paired_log_ratios,
    truncation,
)
from canary.rollout.vocabulary import CheckVerdict

__all__ = [
    "SAMPLED_METRICS",
    "ErrorBudget",
    "SampledResult",
    "Totals",
    "is_sampled",
    "judge_sampled",
    "worst_case_requests",
]

SAMPLED_METRICS = frozenset(
    {MetricKind.ERROR_RATE, MetricKind.LATENCY, MetricKind.TTFT, MetricKind.E2E_LATENCY}
)


def is_sampled(check: Check) -> bool:
    """Whether the check is estimated from a sample of requests (and so judged on counts)."""
    return check.metric in SAMPLED_METRICS


def _counted(policy: PromotionPolicy) -> list[Check]:
    overrides = policy.spec.metrics.queries
    return [
        check
        for check in policy.spec.checks
        if is_sampled(check) and check.metric is not None and check.metric.value not in overrides
    ]


@dataclass(frozen=True, slots=True)
class ErrorBudget:
    """One rollout's error budget, split (docs/design.md §3.4).

    ``alpha`` (a good canary rolled back) is split evenly across the counted checks, then half to the
    per-step fail tests (each step's share equal) and half to the truncated decision; ``beta`` (a bad
    canary promoted) is not split across checks — a canary that breaks one limit is promoted only if
    *that* check's pass test errs — half to the sequential pass test, half to the truncated one.
    A relative latency limit gives half of its shares to the bound on the stable revision's quantile.
    """

    alpha: float
    beta: float
    checks: int
    steps: int

    @classmethod
    def of(cls, policy: PromotionPolicy) -> ErrorBudget:
        risk = 1.0 - policy.spec.confidence
        return cls(risk, risk, max(1, len(_counted(policy))), max(1, len(policy.spec.canary_steps)))

    @property
    def per_check(self) -> float:
        return self.alpha / self.checks

    def fail_per_step(self, relative_quantile: bool = False) -> float:
        share = self.per_check / 2.0 / self.steps
        return share / 2.0 if relative_quantile else share

    def fail_truncated(self) -> float:
        return self.per_check / 2.0

    def passing(self, relative_quantile: bool = False) -> float:
        return self.beta / 4.0 if relative_quantile else self.beta / 2.0

    def pass_truncated(self) -> float:
        return self.beta / 2.0


@dataclass(frozen=True, slots=True)
class SampledResult:
    """A counted check's verdict with the numbers behind it."""

    verdict: CheckVerdict
    value: float | None  # the step's estimate (rate, or quantile in seconds)
    stable_value: float | None
    requests: int  # the step's requests
    pooled_requests: int
    statement: str  # the verdict as a sentence with its numbers
    max_allowed: float | None = None  # the effective upper limit applied
    needed: int | None = None  # not yet: about how many more pooled requests
    interpolated: str = ""  # which bucket an interpolation happened in


# ---------------------------------------------------------------------------------------------
# Counts


@dataclass(frozen=True, slots=True)
class _Counts:
    requests: int
    errors: int
    histogram: Histogram | None
    intervals: tuple[Tally, ...]


class Totals:
    """What the checks of one evaluation share: the totals already added up, by (series identity,
    start) (p99 and errors of one revision over the same range), and each series' tallies, built
    once (a counter book's series builds them when read, and they are let go with the evaluation).
    """

    __slots__ = ("tallies", "totals")

    def __init__(self) -> None:
        self.totals: dict[tuple[int, datetime | None], Tally | None] = {}
        self.tallies: dict[int, tuple[Tally, ...]] = {}


def _range(series: CountSeries, start: datetime | None, memo: Totals | None) -> _Range:
    if memo is None:
        every, total = tuple(series.tallies), series.total_since(start)
    else:
        found = memo.tallies.get(id(series))
        if found is None:
            found = memo.tallies[id(series)] = tuple(series.tallies)
        every = found
        key = (id(series), start)
        if key not in memo.totals:
            memo.totals[key] = series.total_since(start)
        total = memo.totals[key]
    return _Range(every if start is None else tallies_since(every, start), total)


@dataclass(frozen=True, slots=True)
class _Range:
    tallies: tuple[Tally, ...]
    total: Tally | None


def _counts(selected: _Range, measure: str) -> _Counts:
    tallies, total = selected.tallies, selected.total
    if total is None:
        return _Counts(0, 0, None, ())
    histogram = total.histograms.get(measure)
    requests = total.requests if measure == MetricKind.LATENCY.value or histogram is None else histogram.total
    return _Counts(requests, total.errors, histogram, tallies)


def _slower(histogram: Histogram, point: float) -> tuple[float, str]:
    """Requests slower than ``point``, and how they were found: exact at an edge, else interpolated
    inside its bucket ("interpolated inside 250ms–500ms")."""
    slower, bucket = _slower_count(histogram, point)
    if bucket is None:
        return slower, ""
    low, high = bucket
    if math.isinf(high):
        return slower, "beyond the last bucket"
    return slower, f"interpolated inside {_ms(low)}–{_ms(high)}"


def _slower_count(histogram: Histogram, point: float) -> tuple[float, tuple[float, float] | None]:
    """Requests slower than ``point`` and the bucket interpolated in (None: exact at an edge)."""
    edges = histogram.edges
    upper = bisect.bisect_left(edges, point * (1 - 1e-9))
    if upper < len(edges) and math.isclose(edges[upper], point, rel_tol=1e-9):
        return float(histogram.slower_than(upper)), None
    upper = bisect.bisect_right(edges, point)
    if upper >= len(edges):
        # Beyond the last finite edge: only "slower than the last edge" is known, a lower bound.
        count = float(histogram.slower_than(len(edges) - 1)) if edges else 0.0
        return count, (edges[-1] if edges else 0.0, math.inf)
    low_edge = edges[upper - 1] if upper > 0 else 0.0
    low_count = histogram.at_most[upper - 1] if upper > 0 else 0
    high_count = histogram.at_most[upper]
    at_most = low_count + (high_count - low_count) * (point - low_edge) / (edges[upper] - low_edge)
    return histogram.total - at_most, (low_edge, edges[upper])


def _ms(seconds: float) -> str:
    return format_value(seconds, Unit.SECONDS)


def _fail_point(edges: Sequence[float], limit: float, tolerance: float) -> float:
    """The lowest edge at or above ``limit`` when one lies within a tolerance factor, else the limit."""
    above = [edge for edge in edges if edge >= limit * (1 - 1e-9)]
    if above and above[0] <= limit * (1.0 + tolerance) * (1 + 1e-9):
        return above[0]
    return limit


def _pass_point(edges: Sequence[float], target: float, tolerance: float) -> float:
    """The highest edge at or below ``target`` when one lies within a tolerance factor, else the target."""
    below = [edge for edge in edges if edge <= target * (1 + 1e-9)]
    if below and below[-1] >= target / (1.0 + tolerance) * (1 - 1e-9):
        return below[-1]
    return target


def estimate_quantile(histogram: Histogram | None, quantile: float) -> float | None:
    """The quantile by linear interpolation inside its bucket (``histogram_quantile``'s estimate)."""
    if histogram is None or histogram.total <= 0 or not histogram.edges:
        return None
    rank = quantile * histogram.total
    previous_edge, previous_count = 0.0, 0
    for edge, count in zip(histogram.edges, histogram.at_most, strict=True):
        if count >= rank:
            if count == previous_count:
                return edge
            return previous_edge + (edge - previous_edge) * (rank - previous_count) / (count - previous_count)
        previous_edge, previous_count = edge, count
    return histogram.edges[-1]  # in the +Inf bucket: the highest finite edge, a lower bound


# ---------------------------------------------------------------------------------------------
# Tests, built once per (boundary, budget, tolerance)


@lru_cache(maxsize=4096)
def _test(boundary: float, direction: str, budget: float, start: float, ratio: float) -> MixtureTest:
    return MixtureTest(boundary, direction, budget, start, ratio)


def _dispersion_of(intervals: Sequence[tuple[float, float]]) -> float:
    return dispersion(intervals)


# ---------------------------------------------------------------------------------------------
# Judging one counted check


@dataclass(frozen=True, slots=True)
class _Context:
    check: Check
    budget: ErrorBudget
    final_step: bool
    share_needed: float  # the highest step's fair share of the pooled requests
    compare: bool
    confidence: float


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
    share_needed: float,
    memo: Totals | None = None,
) -> SampledResult:
    """Judge one counted check: the step's evidence for failing, the pooled evidence for passing.

    ``memo`` (one per evaluation) keeps the totals the other checks of the evaluation add up too."""
    if canary.status is EvidenceStatus.ERROR:
        detail = canary.detail or str(canary.error_class or "the counts could not be read")
        return SampledResult(CheckVerdict.ERROR, None, None, 0, 0, f"counts for the canary failed: {detail}")
    if canary.status is EvidenceStatus.INVALID_VALUE:  # NaN/±Inf in a counter: held like a query problem
        return SampledResult(
            CheckVerdict.ERROR,
            None,
            None,
            0,
            0,
            f"invalid value for the canary: {canary.detail or 'not a number'}",
        )
    if canary.status is not EvidenceStatus.OK:
        return SampledResult(
            CheckVerdict.NO_DATA, None, None, 0, 0, f"no data for the canary: {canary.detail or 'no series'}"
        )
    assert check.metric is not None
    measure = check.metric.value
    step = _counts(_range(canary, step_start, memo), measure)
    pooled = _counts(_range(canary, None, memo), measure)
    stable_step: _Counts | None = None
    stable_pooled: _Counts | None = None
    if compare_with_stable and stable is not None and stable.status is EvidenceStatus.OK:
        stable_step = _counts(_range(stable, step_start, memo), measure)
        stable_pooled = _counts(_range(stable, None, memo), measure)
    context = _Context(check, budget, final_step, share_needed, compare_with_stable, confidence)
    if check.metric is MetricKind.ERROR_RATE:
        result = _judge_rate(context, step, pooled, stable_step, stable_pooled, stable)
    else:
        result = _judge_quantile(context, step, pooled, stable_step, stable_pooled, stable)
    unreadable = stable is not None and stable.status in (EvidenceStatus.ERROR, EvidenceStatus.INVALID_VALUE)
    if (
        compare_with_stable
        and check.max_increase is not None
        and unreadable
        and result.verdict is not CheckVerdict.FAIL
    ):
        # The stable revision's counts could not be read: a query problem holds the rollout (a broken
        # absolute limit still fails, above); it is never "not yet" that lets a step advance.
        assert stable is not None
        return replace(result, verdict=CheckVerdict.ERROR, statement=_stable_missing(stable))
    return result


def _no_requests(step: _Counts, pooled: _Counts) -> SampledResult:
    return SampledResult(
        CheckVerdict.NO_DATA,
        None,
        None,
        0,
        pooled.requests,
        "no canary requests in this step yet",
    )


def _stable_missing(stable: CountSeries | None) -> str:
    if stable is None:
        return "no counts for the stable revision"
    if stable.status is EvidenceStatus.ERROR:
        return f"counts for the stable revision failed: {stable.detail or stable.error_class}"
    if stable.status is EvidenceStatus.INVALID_VALUE:
        return f"invalid value for the stable revision: {stable.detail or 'not a number'}"
    return f"no data for the stable revision: {stable.detail or 'no series'}"


def _requests_text(requests: int) -> str:
    return f"{requests:,} request" + ("" if requests == 1 else "s")


def _finish(
    context: _Context,
    step: _Counts,
    pooled: _Counts,
    *,
    failed: str | None,
    met: bool,
    met_text: str,
    waiting: str,
    truncated: tuple[int, bool] | None,
    needed: int | None,
    value: float | None,
    stable_value: float | None,
    max_allowed: float | None,
    interpolated: str,
) -> SampledResult:
    """The verdict from the tests' outcomes, with the share rule for the highest step."""
    if failed is not None:
        return SampledResult(
            CheckVerdict.FAIL, value, stable_value, step.requests, pooled.requests, failed, max_allowed,
            interpolated=interpolated,
        )  # fmt: skip
    share_ok = pooled.requests == 0 or step.requests >= math.ceil(context.share_needed * pooled.requests)
    if not share_ok:
        short = math.ceil(context.share_needed * pooled.requests) - step.requests
        text = (
            f"not yet: this step has {_requests_text(step.requests)} of {pooled.requests:,} pooled; the "
            f"highest step must carry at least {percent(context.share_needed)} of the evidence "
            f"(about {short:,} more)"
        )
        return SampledResult(
            CheckVerdict.NOT_YET, value, stable_value, step.requests, pooled.requests, text, max_allowed,
            short, interpolated,
        )  # fmt: skip
    if met:
        return SampledResult(
            CheckVerdict.PASS, value, stable_value, step.requests, pooled.requests, met_text, max_allowed,
            interpolated=interpolated,
        )  # fmt: skip
    if truncated is not None:
        size, passes = truncated
        if pooled.requests >= size:
            verdict = CheckVerdict.PASS if passes else CheckVerdict.FAIL
            text = (
                f"decided on the estimate after {pooled.requests:,} pooled requests (the test's limit "
                f"is {size:,}): " + ("within the limit" if passes else "above the cut between good and bad")
            )
            return SampledResult(
                verdict, value, stable_value, step.requests, pooled.requests, text, max_allowed,
                interpolated=interpolated,
            )  # fmt: skip
    return SampledResult(
        CheckVerdict.NOT_YET, value, stable_value, step.requests, pooled.requests, waiting, max_allowed,
        needed, interpolated,
    )  # fmt: skip


def _needed_text(needed: int | None, pooled: _Counts) -> str:
    if needed is None:
        return "more requests are needed (the estimate is too close to the limit to say how many)"
    seconds = _elapsed(pooled.intervals)
    rate = pooled.requests / seconds if seconds > 0 else 0.0
    eta = f" (~{_minutes(needed / rate)} at this rate)" if rate > 0 else ""
    return f"about {needed:,} more needed{eta}"


def _elapsed(intervals: Sequence[Tally]) -> float:
    if not intervals:
        return 0.0
    return (intervals[-1].end - intervals[0].start).total_seconds()


def _minutes(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))}s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def _needed(test: MixtureTest, events: float, trials: float, phi: float) -> int | None:
    """More trials the test needs at the observed share: evidence grows about linearly in requests."""
    if trials <= 0:
        return None
    share = min(max(events / trials, 1e-12), 1 - 1e-12)
    drift = max(
        (share * math.log(alt / test.boundary) + (1 - share) * math.log((1 - alt) / (1 - test.boundary)))
        / max(phi, 1.0)
        for alt in test.alternatives
    )
    if drift <= 0:
        return None
    total = (test.threshold + math.log(GRID_POINTS)) / drift
    return max(1, math.ceil(total - trials))


# -- error rates ------------------------------------------------------------------------------


def _judge_rate(
    context: _Context,
    step: _Counts,
    pooled: _Counts,
    stable_step: _Counts | None,
    stable_pooled: _Counts | None,
    stable: CountSeries | None,
) -> SampledResult:
    check = context.check
    tolerance = check.tolerance
    ratio = 1.0 + tolerance
    budget = context.budget
    value = step.errors / step.requests if step.requests else None
    stable_value = (
        stable_step.errors / stable_step.requests
        if stable_step is not None and stable_step.requests
        else None
    )
    if step.requests == 0:
        return _no_requests(step, pooled)
    failures: list[str] = []
    passes: list[bool] = []
    passing_texts: list[str] = []
    waiting: list[str] = []
    needed: list[int] = []
    truncated: tuple[int, bool] | None = None
    max_allowed = check.max
    step_phi = _dispersion_of([(tally.errors, tally.requests) for tally in step.intervals])
    pooled_phi = _dispersion_of([(tally.errors, tally.requests) for tally in pooled.intervals])
    confidence = percent(context.confidence)
    limit = check.max
    if limit is not None and limit <= 0.0:
        # max 0: any error breaks it; none among the pooled requests meets it.
        if step.errors > 0:
            failures.append(f"{step.errors:,} errors in {_requests_text(step.requests)}; max 0")
        passes.append(True)
        passing_texts.append(f"no errors in {_requests_text(pooled.requests)}")
    elif limit is not None and limit < 1.0:
        good, bad = limit / ratio, limit
        fail_test = _test(good, Direction.ABOVE, budget.fail_per_step(), bad, ratio)
        pass_test = _test(bad, Direction.BELOW, budget.passing(), good, ratio)
        if fail_test.rejects(step.errors, step.requests, step_phi):
            failures.append(
                f"error rate ≤ {percent(limit)} broken at {confidence}: {step.errors:,} errors in "
                f"{_requests_text(step.requests)} ({percent(step.errors / step.requests)}) this step"
                + _phi_text(step_phi)
            )
        met = pass_test.rejects(pooled.errors, pooled.requests, pooled_phi)
        passes.append(met)
        if met:
            passing_texts.append(
                f"error rate ≤ {percent(limit)} met at {confidence} ({_requests_text(pooled.requests)}; "
                f"{pooled.errors:,} errors, {percent(pooled.errors / max(pooled.requests, 1))})"
            )
        else:
            more = _needed(pass_test, pooled.errors, pooled.requests, pooled_phi)
            if more is not None:
                needed.append(more)
            waiting.append(f"error rate ≤ {percent(limit)}: {pooled.errors:,} errors in {pooled.requests:,}")
        alpha_t, beta_t = budget.fail_truncated(), budget.pass_truncated()
        size = truncation(good, bad, alpha_t, beta_t, pooled_phi)
        estimate = pooled.errors / pooled.requests if pooled.requests else 0.0
        truncated = (size, estimate <= cut(good, bad, alpha_t, beta_t))
    if check.max_increase is not None and context.compare:
        relative = _relative_rate(context, step, pooled, stable_step, stable_pooled, stable)
        if not relative.applies:  # below minStable: only the absolute limit applies
            passing_texts.append(relative.text)
        else:
            if relative.failure:
                failures.append(relative.failure)
            passes.append(relative.met)
            if relative.met:
                passing_texts.append(relative.text)
            else:
                waiting.append(relative.text)
            if relative.allowed is not None:
                max_allowed = relative.allowed if max_allowed is None else min(max_allowed, relative.allowed)
            truncated = None  # the paired test has no fixed-sample fallback on the estimate
    met = all(passes)
    more = max(needed) if needed else None
    waiting_text = "not yet: " + "; ".join(waiting) + f" — {_needed_text(more, pooled)}"
    return _finish(
        context,
        step,
        pooled,
        failed="; ".join(failures) if failures else None,
        met=met,
        met_text="; ".join(passing_texts),
        waiting=waiting_text,
        truncated=truncated,
        needed=more,
        value=value,
        stable_value=stable_value,
        max_allowed=max_allowed,
        interpolated="",
    )


def _phi_text(phi: float) -> str:
    return f"; bursty: each request counted as 1/{phi:.1f}" if phi > 1.0 else ""


@dataclass(frozen=True, slots=True)
class _Relative:
    failure: str
    met: bool
    text: str
    allowed: float | None
    applies: bool = True


# Consecutive intervals paired into one block: the conditioning on each block's errors still cancels
# what both revisions share at that resolution (a minute at 15 s scrapes), at a quarter of the cost.
_PAIR_BLOCK = 4


def _pairs(canary: _Counts, stable: _Counts) -> list[tuple[int, int, int, int]]:
    by_window = {(tally.start, tally.end): tally for tally in stable.intervals}
    pairs: list[tuple[int, int, int, int]] = []
    block = [0, 0, 0, 0]
    filled = 0
    for tally in canary.intervals:
        other = by_window.get((tally.start, tally.end))
        if other is None:
            continue
        block[0] += tally.errors
        block[1] += tally.requests
        block[2] += other.errors
        block[3] += other.requests
        filled += 1
        if filled == _PAIR_BLOCK:
            pairs.append((block[0], block[1], block[2], block[3]))
            block, filled = [0, 0, 0, 0], 0
    if filled:
        pairs.append((block[0], block[1], block[2], block[3]))
    return pairs


def _relative_rate(
    context: _Context,
    step: _Counts,
    pooled: _Counts,
    stable_step: _Counts | None,
    stable_pooled: _Counts | None,
    stable: CountSeries | None,
) -> _Relative:
    check = context.check
    assert check.max_increase is not None
    increase = check.max_increase
    ratio = 1.0 + check.tolerance
    if stable_step is None or stable_pooled is None or stable_pooled.requests == 0:
        return _Relative("", False, f"vs stable: {_stable_missing(stable)}", None)
    stable_rate = stable_pooled.errors / stable_pooled.requests
    allowed = stable_rate * (1.0 + increase)
    if check.min_stable is not None and stable_rate < check.min_stable:
        note = (
            f"maxIncrease not applied: stable {percent(stable_rate)} is below minStable "
            f"{percent(check.min_stable)}"
        )
        return _Relative("", True, note, None, applies=False)
    bad_ratio, good_ratio = 1.0 + increase, (1.0 + increase) / ratio
    budget = context.budget
    fail_budget = budget.fail_per_step()
    pass_budget = budget.passing()
    step_pairs = _pairs(step, stable_step)
    pooled_pairs = _pairs(pooled, stable_pooled)
    fail_evidence = _paired_evidence(step_pairs, good_ratio, bad_ratio, ratio, above=True)
    failure = ""
    if fail_evidence >= math.log(1.0 / fail_budget):
        failure = (
            f"error rate ≤ +{percent(increase)} vs stable broken at {percent(context.confidence)}: canary "
            f"{percent(step.errors / max(step.requests, 1))} ({step.errors:,} of {step.requests:,}) against "
            f"stable {percent(stable_step.errors / max(stable_step.requests, 1))} in the same intervals"
        )
    pass_evidence = _paired_evidence(pooled_pairs, bad_ratio, good_ratio, ratio, above=False)
    met = pass_evidence >= math.log(1.0 / pass_budget)
    canary_rate = pooled.errors / max(pooled.requests, 1)
    if not met and not failure and pooled.errors == 0 and stable_pooled.errors == 0:
        # No error on either revision: nothing to compare (as below minStable); the absolute limit
        # applies. Without this a quiet service would wait for an error that never comes.
        note = "maxIncrease not applied: no errors on either revision to compare"
        return _Relative("", True, note, None, applies=False)
    decided = _paired_truncation(context, pooled, stable_pooled, good_ratio, bad_ratio)
    if not met and not failure and decided is not None:
        size, passes = decided
        met = passes
        if not passes:
            failure = (
                f"error rate ≤ +{percent(increase)} vs stable decided on the estimate after {size:,} errors "
                f"on both revisions: canary {percent(canary_rate)}, stable {percent(stable_rate)}"
            )
    if met:
        text = (
            f"error rate ≤ +{percent(increase)} vs stable met at {percent(context.confidence)} (canary "
            f"{percent(canary_rate)} of {pooled.requests:,}, stable {percent(stable_rate)} of "
            f"{stable_pooled.requests:,})"
        )
    else:
        text = (
            f"error rate ≤ +{percent(increase)} vs stable: canary {percent(canary_rate)} of "
            f"{pooled.requests:,}, stable {percent(stable_rate)}"
        )
    return _Relative(failure, met, text, allowed)


def _paired_truncation(
    context: _Context, pooled: _Counts, stable: _Counts, good: float, bad: float
) -> tuple[int, bool] | None:
    """The paired test's fixed-sample fallback: once both revisions' errors reach the size that tells
    a canary share of them at ``good`` from one at ``bad``, decided on the estimated rate ratio."""
    if pooled.requests == 0 or stable.requests == 0:
        return None
    exposure = pooled.requests / stable.requests
    share_good = exposure * good / (exposure * good + 1.0)
    share_bad = exposure * bad / (exposure * bad + 1.0)
    budget = context.budget
    alpha, beta = budget.fail_truncated(), budget.pass_truncated()
    size = truncation(share_good, share_bad, alpha, beta)
    errors = pooled.errors + stable.errors
    if errors < size:
        return None
    return errors, pooled.errors / errors <= cut(share_good, share_bad, alpha, beta)


def _paired_evidence(
    pairs: Sequence[tuple[int, int, int, int]], null: float, start: float, ratio: float, *, above: bool
) -> float:
    alternatives = []
    value = start
    for _ in range(GRID_POINTS):
        alternatives.append(value)
        value = value * ratio if above else value / ratio
    ratios = paired_log_ratios(pairs, alternatives, null)
    top = max(ratios)
    return top + math.log(sum(math.exp(r - top) for r in ratios) / len(ratios))


# -- latency quantiles --------------------------------------------------------------------------


def _judge_quantile(
    context: _Context,
    step: _Counts,
    pooled: _Counts,
    stable_step: _Counts | None,
    stable_pooled: _Counts | None,
    stable: CountSeries | None,
) -> SampledResult:
    check = context.check
    quantile = check.effective_quantile
    assert quantile is not None
    name = f"p{quantile * 100:g}"
    tolerance = check.tolerance
    ratio = 1.0 + tolerance
    budget = context.budget
    confidence = percent(context.confidence)
    histogram, pooled_histogram = step.histogram, pooled.histogram
    value = estimate_quantile(histogram, quantile)
    stable_value = estimate_quantile(stable_step.histogram if stable_step else None, quantile)
    if histogram is None or histogram.total == 0:
        return _no_requests(step, pooled)
    assert pooled_histogram is not None
    share = 1.0 - quantile
    relative = check.max_increase is not None and context.compare
    notes: list[str] = []
    fail_limits: list[tuple[float, str]] = []
    if check.max is not None:
        fail_limits.append((check.max, f"{name} ≤ {_ms(check.max)}"))
    pass_targets: list[float] = [check.max / ratio] if check.max is not None else []
    stable_applies = True
    if relative:
        assert check.max_increase is not None
        bounds = _stable_bounds(stable_pooled, quantile, budget, ratio)
        increase = check.max_increase
        if bounds is None:
            notes.append(f"vs stable: {_stable_missing(stable)}")
            pass_targets.append(-1.0)  # cannot be met before the stable revision is known
        else:
            low, high, estimate, bound_note = bounds
            if bound_note:
                notes.append(f"stable {name}: {bound_note}")
            first_edge = (
                stable_pooled.histogram.edges[0] if stable_pooled and stable_pooled.histogram else 0.0
            )
            if low is None and high is not None and high <= first_edge:
                # Stable's quantile is below the first bucket edge: no bucket can tell it from the
                # canary's, so the relative limit cannot be judged (like minStable); absolute limits apply.
                stable_applies = False
                notes.append(
                    f"maxIncrease not applied: stable {name} is below the first bucket edge {_ms(first_edge)}"
                )
            elif check.min_stable is not None and estimate is not None and estimate < check.min_stable:
                stable_applies = False
                notes.append(
                    f"maxIncrease not applied: stable {name} {_ms(estimate)} is below minStable "
                    f"{_ms(check.min_stable)}"
                )
            else:
                if high is not None:
                    fail_limits.append(
                        ((1.0 + increase) * high, f"{name} ≤ +{percent(increase)} vs stable (≤ {_ms(high)})")
                    )
                if low is not None:
                    pass_targets.append((1.0 + increase) * low / ratio)
                else:
                    pass_targets.append(-1.0)
                    notes.append(f"the stable revision's {name} is not bounded from below yet")
    edges = histogram.edges
    fail_budget = budget.fail_per_step(relative and stable_applies) / max(1, len(fail_limits))
    failures: list[str] = []
    interpolated = ""
    step_total = float(histogram.total)
    for limit, label in fail_limits:
        point = _fail_point(edges, limit, tolerance)
        slower, how = _slower(histogram, point)
        interpolated = interpolated or how
        phi = _dispersion_of([_slower_in(tally, check, point) for tally in step.intervals])
        test = _test(share, Direction.ABOVE, fail_budget, share, ratio)
        if test.rejects(slower, step_total, phi):
            failures.append(
                f"{label} broken at {confidence}: {slower:,.0f} of {_requests_text(histogram.total)} "
                f"({percent(slower / step_total)}) slower than {_ms(point)} this step, more than "
                f"{percent(share)}" + (f" ({how})" if how else "") + _phi_text(phi)
            )
    max_allowed = min(limit for limit, _ in fail_limits) if fail_limits else None
    met = False
    met_text = ""
    needed: int | None = None
    truncated: tuple[int, bool] | None = None
    valid_targets = [target for target in pass_targets if target > 0]
    if not pass_targets:  # only a relative limit, and it does not apply (minStable, below the buckets)
        met, met_text = True, "; ".join(notes)
    elif len(valid_targets) == len(pass_targets):
        target = min(valid_targets)
        point = _pass_point(pooled_histogram.edges, target, tolerance)
        slower, how = _slower(pooled_histogram, point)
        interpolated = interpolated or how
        pooled_total = float(pooled_histogram.total)
        phi = _dispersion_of([_slower_in(tally, check, point) for tally in pooled.intervals])
        test = _test(share, Direction.BELOW, budget.passing(relative and stable_applies), share, ratio)
        if check.max is not None and target == check.max / ratio:
            limit_text = _ms(check.max)
        else:  # the relative limit is the tighter: say what it is in terms of stable
            assert check.max_increase is not None
            limit_text = f"+{percent(check.max_increase)} vs stable (shown ≤ {_ms(target)})"
        if test.rejects(slower, pooled_total, phi):
            met = True
            met_text = (
                f"{name} ≤ {limit_text} met at {confidence} ({_requests_text(pooled_histogram.total)}; "
                f"slower than {_ms(point)}: {percent(slower / pooled_total)}, allowed {percent(share)})"
                + (f" ({how})" if how else "")
            )
        else:
            needed = _needed(test, slower, pooled_total, phi)
            notes.append(
                f"{name}: {percent(slower / pooled_total)} of {pooled_histogram.total:,} pooled requests "
                f"slower than {_ms(point)}, at most {percent(share)} allowed"
            )
        limits = [limit for limit, _ in fail_limits]
        if limits:
            # The fixed-sample fallback: at this many pooled requests, the share slower than the
            # tightest limit in force (absolute, or relative to stable's bound) decides.
            good, bad = share / ratio, share
            alpha_t, beta_t = budget.fail_truncated(), budget.pass_truncated()
            size = truncation(good, bad, alpha_t, beta_t, phi)
            at_limit, _ = _slower_count(pooled_histogram, min(limits))
            truncated = (size, at_limit / pooled_total <= cut(good, bad, alpha_t, beta_t))
    waiting = "not yet: " + "; ".join(notes or [f"{name} not shown within its limit yet"])
    waiting += f" — {_needed_text(needed, pooled)}"
    return _finish(
        context,
        step,
        pooled,
        failed="; ".join(failures) if failures else None,
        met=met,
        met_text=met_text,
        waiting=waiting,
        truncated=truncated,
        needed=needed,
        value=value,
        stable_value=stable_value,
        max_allowed=max_allowed,
        interpolated=interpolated,
    )


def _slower_in(tally: Tally, check: Check, point: float) -> tuple[float, float]:
    assert check.metric is not None
    histogram = tally.histograms.get(check.metric.value)
    if histogram is None or histogram.total == 0:
        return 0.0, 0.0
    slower, _ = _slower_count(histogram, point)
    return slower, float(histogram.total)


def _stable_bounds(
    stable: _Counts | None, quantile: float, budget: ErrorBudget, ratio: float
) -> tuple[float | None, float | None, float | None, str] | None:
    """(lower, upper, estimate, note) of the stable revision's quantile, from its counts.

    Upper: the lowest edge where fewer than ``1 - q`` of stable's requests are shown slower (so the
    quantile is at most that edge); lower: the highest edge where more are shown slower. Each edge's
    test gets the bound's budget divided by the number of edges (a union bound over them). Where the
    bucket around a bound is wider than one tolerance factor, an edge says too little (a p99 of
    181ms between edges at 100ms and 250ms is bounded below by 100ms), and the bound is interpolated
    inside that bucket instead — the ``note`` says so.
    """
    if stable is None or stable.histogram is None or stable.histogram.total == 0:
        return None
    histogram = stable.histogram
    share = 1.0 - quantile
    edges = histogram.edges
    total = float(histogram.total)
    upper_test = _test(share, Direction.BELOW, budget.fail_per_step(True) / max(1, len(edges)), share, ratio)
    lower_test = _test(share, Direction.ABOVE, budget.passing(True) / max(1, len(edges)), share, ratio)
    upper_index = next(
        (
            index
            for index in range(len(edges))
            if upper_test.rejects(float(histogram.slower_than(index)), total)
        ),
        None,
    )
    lower_index = next(
        (
            index
            for index in range(len(edges) - 1, -1, -1)
            if lower_test.rejects(float(histogram.slower_than(index)), total)
        ),
        None,
    )
    upper = edges[upper_index] if upper_index is not None else None
    lower = edges[lower_index] if lower_index is not None else None
    notes = []
    if upper_index is not None:
        below = edges[upper_index - 1] if upper_index > 0 else 0.0
        if below <= 0.0 or edges[upper_index] / below > ratio:
            candidate = _crossing(histogram, upper_test, below, edges[upper_index], rejecting_above=True)
            if candidate < edges[upper_index]:
                upper = candidate
                notes.append(f"upper bound interpolated inside {_ms(below)}–{_ms(edges[upper_index])}")
    if lower_index is not None and lower_index + 1 < len(edges):
        above = edges[lower_index + 1]
        if above / edges[lower_index] > ratio:
            candidate = _crossing(histogram, lower_test, edges[lower_index], above, rejecting_above=False)
            if candidate > edges[lower_index]:
                lower = candidate
                notes.append(f"lower bound interpolated inside {_ms(edges[lower_index])}–{_ms(above)}")
    return lower, upper, estimate_quantile(histogram, quantile), "; ".join(notes)


def _crossing(
    histogram: Histogram, test: MixtureTest, low: float, high: float, *, rejecting_above: bool
) -> float:
    """Where, between ``low`` and ``high``, the interpolated count slower than ``x`` starts (or stops)
    rejecting the test: bisection on the bucket's linear interpolation."""
    total = float(histogram.total)
    for _ in range(10):  # a thousandth of the bucket: far finer than the bucket tells
        middle = (low + high) / 2.0
        slower, _ = _slower_count(histogram, middle)
        if test.rejects(slower, total) == rejecting_above:
            high = middle
        else:
            low = middle
    return high if rejecting_above else low


def worst_case_requests(policy: PromotionPolicy) -> dict[str, int | None]:
    """Per counted check, the pooled requests after which it is decided on its estimate at the latest
    (``validate`` prints them); None for a relative error-rate limit, whose fallback counts errors
    (both revisions' errors reaching the paired test's size), not requests."""
    budget = ErrorBudget.of(policy)
    sizes: dict[str, int | None] = {}
    for check in _counted(policy):
        ratio = 1.0 + check.tolerance
        if check.metric is MetricKind.ERROR_RATE:
            if check.max is None or check.max <= 0 or check.max >= 1:
                sizes[check.name] = None
                continue
            good, bad = check.max / ratio, check.max
        else:  # absolute or relative: the same fixed-sample size on the share slower than the limit
            quantile = check.effective_quantile
            assert quantile is not None
            good, bad = (1 - quantile) / ratio, 1 - quantile
        sizes[check.name] = truncation(good, bad, budget.fail_truncated(), budget.pass_truncated())
    return sizes
