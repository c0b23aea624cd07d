"""What the counted checks share: their counts, the error budget and the verdict's assembly.

The two kinds of counted checks live in :mod:`canary.rollout.quantiles` and
:mod:`canary.rollout.rates`; :mod:`canary.rollout.sampled` is their entry point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from canary.evidence import CountSeries, EvidenceStatus, Histogram, Tally, tallies_since
from canary.policy.model import Check, HorizonAction, MetricKind, PromotionPolicy
from canary.rollout.horizon import Horizon, HorizonOutcome
from canary.rollout.sequential import GRID_POINTS, MixtureTest
from canary.rollout.state import describe_time
from canary.rollout.vocabulary import CheckVerdict

__all__ = [
    "SAMPLED_METRICS",
    "Context",
    "Counts",
    "ErrorBudget",
    "Outcome",
    "SampledResult",
    "Sides",
    "Terminal",
    "Totals",
    "counts_of",
    "finish",
    "is_sampled",
]

SAMPLED_METRICS = frozenset(
    {MetricKind.ERROR_RATE, MetricKind.LATENCY, MetricKind.TTFT, MetricKind.E2E_LATENCY}
)


def is_sampled(check: Check) -> bool:
    """Whether the check is estimated from a sample of requests (and so judged on counts)."""
    return check.metric in SAMPLED_METRICS


def counted_checks(policy: PromotionPolicy) -> list[Check]:
    overrides = policy.spec.metrics.queries
    return [
        check
        for check in policy.spec.checks
        if is_sampled(check) and check.metric is not None and check.metric.value not in overrides
    ]


@dataclass(frozen=True, slots=True)
class ErrorBudget:
    """One rollout's error budget for the sequential tests, split.

    ``alpha`` (a good canary rolled back by a test) is split evenly across the counted checks, then
    evenly across the steps (each step's fail test is a fresh one on its own counts); ``beta`` (a bad
    canary promoted by a test) is not split across checks — a canary that breaks one limit is promoted
    only if *that* check's pass test errs. A relative latency limit gives half of its shares to the
    bound on the stable revision's quantile. Horizon decisions are outside this budget: each states
    its own error.
    """

    alpha: float
    beta: float
    checks: int
    steps: int

    @classmethod
    def of(cls, policy: PromotionPolicy) -> ErrorBudget:
        risk = 1.0 - policy.spec.confidence
        return cls(risk, risk, max(1, len(counted_checks(policy))), max(1, len(policy.spec.canary_steps)))

    @property
    def per_check(self) -> float:
        return self.alpha / self.checks

    def fail_per_step(self, relative_quantile: bool = False) -> float:
        share = self.per_check / self.steps
        return share / 2.0 if relative_quantile else share

    def passing(self, relative_quantile: bool = False) -> float:
        return self.beta / 2.0 if relative_quantile else self.beta


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
    horizon: HorizonOutcome = HorizonOutcome.NONE


# ---------------------------------------------------------------------------------------------
# Counts


@dataclass(frozen=True, slots=True)
class Counts:
    requests: int
    errors: int
    histogram: Histogram | None
    intervals: tuple[Tally, ...]


class Totals:
    """What the checks of one evaluation share: the totals already added up, by (series identity,
    start), and each series' tallies, built once (a counter book's series builds them when read)."""

    __slots__ = ("tallies", "totals")

    def __init__(self) -> None:
        self.totals: dict[tuple[int, datetime | None], Tally | None] = {}
        self.tallies: dict[int, tuple[Tally, ...]] = {}


def counts_of(series: CountSeries, start: datetime | None, memo: Totals | None, measure: str) -> Counts:
    memo = memo if memo is not None else Totals()
    every = memo.tallies.get(id(series))
    if every is None:
        every = memo.tallies[id(series)] = tuple(series.tallies)
    key = (id(series), start)
    if key not in memo.totals:
        memo.totals[key] = series.total_since(start)
    total = memo.totals[key]
    tallies = every if start is None else tallies_since(every, start)
    if total is None:
        return Counts(0, 0, None, ())
    histogram = total.histograms.get(measure)
    requests = total.requests if measure == MetricKind.LATENCY.value or histogram is None else histogram.total
    return Counts(requests, total.errors, histogram, tallies)


@dataclass(frozen=True, slots=True)
class Context:
    """What judging one counted check needs besides its counts."""

    check: Check
    budget: ErrorBudget
    final_step: bool
    compare: bool
    confidence: float
    horizon: Horizon | None


@dataclass(frozen=True, slots=True)
class Sides:
    """The canary's and the stable revision's counts, over the step and pooled over the rollout."""

    step: Counts
    pooled: Counts
    stable_step: Counts | None
    stable_pooled: Counts | None
    stable: CountSeries | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a check's tests found, before the verdict is assembled (:func:`finish`)."""

    failed: str | None = None
    met: bool = False
    met_text: str = ""
    waiting: str = ""
    needed: int | None = None
    value: float | None = None
    stable_value: float | None = None
    max_allowed: float | None = None
    terminal: Terminal | None = None


@dataclass(frozen=True, slots=True)
class Terminal:
    """A check read at its horizon: PASS or FAIL on the estimate, NOT_YET while the estimate needs
    more requests (or cannot be judged: ``outcome`` says which)."""

    verdict: CheckVerdict
    statement: str  # PASS/FAIL: what the estimate shows, without the verdict's words
    outcome: HorizonOutcome = HorizonOutcome.ESTIMATE
    chance: float = 0.5  # that the estimate is on the wrong side of the limit


def no_requests(pooled: Counts) -> SampledResult:
    return SampledResult(
        CheckVerdict.NO_DATA, None, None, 0, pooled.requests, "no canary requests in this step yet"
    )


def stable_missing(stable: CountSeries | None) -> str:
    if stable is None:
        return "no counts for the stable revision"
    if stable.status is EvidenceStatus.ERROR:
        return f"counts for the stable revision failed: {stable.detail or stable.error_class}"
    if stable.status is EvidenceStatus.INVALID_VALUE:
        return f"invalid value for the stable revision: {stable.detail or 'not a number'}"
    return f"no data for the stable revision: {stable.detail or 'no series'}"


def requests_text(requests: float) -> str:
    return f"{requests:,.0f} request" + ("" if round(requests) == 1 else "s")


# ---------------------------------------------------------------------------------------------
# The verdict


def finish(context: Context, sides: Sides, outcome: Outcome) -> SampledResult:
    """The verdict from the tests' outcomes: a failure, a pass, the horizon's estimate, or not yet."""
    step, pooled = sides.step, sides.pooled

    def result(verdict: CheckVerdict, statement: str, **extra: object) -> SampledResult:
        return SampledResult(
            verdict, outcome.value, outcome.stable_value, step.requests, pooled.requests, statement,
            outcome.max_allowed, **extra,  # type: ignore[arg-type]
        )  # fmt: skip

    if outcome.failed is not None:
        return result(CheckVerdict.FAIL, outcome.failed)
    if outcome.met:
        return result(CheckVerdict.PASS, outcome.met_text)
    decided = _on_estimate(context, outcome.terminal)
    if decided is not None:
        verdict, statement, horizon = decided
        if verdict is CheckVerdict.PASS and not context.final_step:
            # Below the highest step a pass on the estimate adds nothing: it advances on exposure.
            return result(CheckVerdict.NOT_YET, statement, needed=outcome.needed)
        return result(verdict, statement, horizon=horizon)
    waiting = outcome.waiting + f" — {needed_text(outcome.needed, pooled)}"
    if context.horizon is not None:
        waiting += "; " + horizon_text(context.horizon)
    return result(CheckVerdict.NOT_YET, waiting, needed=outcome.needed)


def _on_estimate(
    context: Context, terminal: Terminal | None
) -> tuple[CheckVerdict, str, HorizonOutcome] | None:
    """The estimate's verdict: at the horizon whatever its chance, after the window once resolved."""
    horizon = context.horizon
    if horizon is None or terminal is None:
        return None
    if terminal.verdict not in (CheckVerdict.PASS, CheckVerdict.FAIL):
        return (terminal.verdict, terminal.statement, terminal.outcome) if horizon.reached else None
    words = "broken" if terminal.verdict is CheckVerdict.FAIL else "met"
    if horizon.reached:
        return (
            terminal.verdict,
            f"{words} at the horizon on the estimate: {terminal.statement}",
            terminal.outcome,
        )
    resolved = terminal.chance <= 1.0 - context.confidence
    if horizon.window_ended and resolved and horizon.action is HorizonAction.DECIDE:
        where = f"{words} on the estimate, resolved at {context.confidence:.0%} after the window"
        return terminal.verdict, f"{where}: {terminal.statement}", terminal.outcome
    return None


def horizon_text(horizon: Horizon) -> str:
    covered = minutes_text(horizon.covered.total_seconds())
    length = minutes_text(horizon.length.total_seconds())
    return (
        f"decided on the estimate by {describe_time(horizon.by)} at the latest (the step's horizon: "
        f"{length} of evidence, {covered} so far)"
    )


def too_few_for_estimate(step: Counts, needed: int, phi: float, side: str = "") -> Terminal:
    """At the horizon, the step's estimate does not rest on enough requests yet."""
    if side:
        return Terminal(
            CheckVerdict.NOT_YET,
            f"at the horizon: the estimate needs {needed:,} requests of {side}, which has fewer",
            HorizonOutcome.NONE,
        )
    more = max(1, needed - step.requests)
    seconds = _elapsed(step.intervals)
    rate = step.requests / seconds if seconds > 0 else 0.0
    eta = f", ~{minutes_text(more / rate)} at this rate" if rate > 0 else ""
    bursty = f" (bursty: × {phi:.1f})" if phi > 1.0 else ""
    return Terminal(
        CheckVerdict.NOT_YET,
        f"at the horizon: the estimate needs {needed:,} requests this step{bursty}; "
        f"{step.requests:,} so far, {more:,} more{eta}",
        HorizonOutcome.NONE,
    )


def needed_text(needed: int | None, pooled: Counts) -> str:
    if needed is None:
        return "the tests may not decide (the estimate is close to the limit)"
    seconds = _elapsed(pooled.intervals)
    rate = pooled.requests / seconds if seconds > 0 else 0.0
    eta = f" (~{minutes_text(needed / rate)} at this rate)" if rate > 0 else ""
    return f"about {needed:,} more needed{eta}"


def _elapsed(intervals: Sequence[Tally]) -> float:
    if not intervals:
        return 0.0
    return (intervals[-1].end - intervals[0].start).total_seconds()


def minutes_text(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))}s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"


def needed(test: MixtureTest, events: float, trials: float, phi: float) -> int | None:
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


def phi_text(phi: float) -> str:
    return f"; bursty: each request counted as 1/{phi:.1f}" if phi > 1.0 else ""


@lru_cache(maxsize=4096)
def test_of(boundary: float, direction: str, budget: float, start: float, ratio: float) -> MixtureTest:
    return MixtureTest(boundary, direction, budget, start, ratio)
