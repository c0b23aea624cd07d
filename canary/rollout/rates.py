"""Error rates judged on counts.

An absolute limit ``L`` is a binomial share test: fail on the step's errors when they show the rate
above ``L / (1 + t)``, met on the pooled errors when they show it below ``L``.

A relative limit (``maxIncrease``) is two-sample. Per block of intervals, given the errors both
revisions had in it, the canary's share of them is binomial with ``π = n_c ρ / (n_c ρ + n_s)`` in the
rate ratio ``ρ`` (:func:`canary.rollout.sequential.paired_log_ratios`): the tests are on
``ρ ≥ 1 + maxIncrease`` (bad) against ``ρ ≤ (1 + maxIncrease) / (1 + t)`` (good), so what both
revisions share in an interval — a burst, a quiet night — cancels.

At the horizon the step's rate is judged against ``L``, and against ``(1 + maxIncrease)`` times the
stable revision's rate over the same step (:mod:`canary.rollout.horizon`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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
from canary.rollout.horizon import HorizonOutcome, chance_text, requests_needed, share_variance, wrong_side
from canary.rollout.limits import percent
from canary.rollout.sequential import GRID_POINTS, Direction, dispersion, paired_log_ratios
from canary.rollout.vocabulary import CheckVerdict

__all__ = ["judge_rate"]


@dataclass(frozen=True, slots=True)
class _Part:
    """One limit's findings: a failure, met or not, its texts, and its horizon reading."""

    failure: str = ""
    met: bool = False
    text: str = ""
    needed: int | None = None
    allowed: float | None = None
    applies: bool = True
    terminal: Terminal | None = None


def judge_rate(context: Context, sides: Sides) -> SampledResult:
    check, step, pooled = context.check, sides.step, sides.pooled
    if step.requests == 0:
        return no_requests(pooled)
    parts: list[_Part] = []
    if check.max is not None:
        parts.append(_absolute(context, step, pooled, check.max))
    if check.max_increase is not None and context.compare:
        parts.append(_relative(context, sides))
    applying = [part for part in parts if part.applies]
    failures = [part.failure for part in applying if part.failure]
    allowed = [part.allowed for part in applying if part.allowed is not None]
    more = [part.needed for part in applying if not part.met and part.needed is not None]
    stable_step = sides.stable_step
    return finish(
        context,
        sides,
        Outcome(
            failed="; ".join(failures) if failures else None,
            met=all(part.met for part in applying),
            met_text="; ".join(part.text for part in parts if part.met or not part.applies),
            waiting="not yet: " + "; ".join(part.text for part in applying if not part.met),
            needed=max(more) if more else None,
            value=step.errors / step.requests,
            stable_value=stable_step.errors / stable_step.requests
            if stable_step and stable_step.requests
            else None,
            max_allowed=min(allowed) if allowed else None,
            terminal=_combined([part.terminal for part in applying if not part.met]),
        ),
    )


def _combined(terminals: Sequence[Terminal | None]) -> Terminal | None:
    """Every limit's horizon reading together: any failure fails, any wait waits, else met."""
    known = [terminal for terminal in terminals if terminal is not None]
    if not known or len(known) < len(terminals):
        return None
    for verdict in (CheckVerdict.FAIL, CheckVerdict.NOT_YET):
        chosen = [terminal for terminal in known if terminal.verdict is verdict]
        if chosen:
            return Terminal(verdict, "; ".join(t.statement for t in chosen), chosen[0].outcome)
    return Terminal(CheckVerdict.PASS, "; ".join(t.statement for t in known), known[0].outcome)


def _absolute(context: Context, step: Counts, pooled: Counts, limit: float) -> _Part:
    if limit <= 0.0:  # max 0: any error breaks it; none among the pooled requests meets it
        failure = f"{step.errors:,} errors in {requests_text(step.requests)}; max 0" if step.errors else ""
        return _Part(failure, True, f"no errors in {requests_text(pooled.requests)}", allowed=limit)
    if limit >= 1.0:
        return _Part("", True, f"error rate ≤ {percent(limit)}: any rate meets it", allowed=limit)
    ratio = 1.0 + context.check.tolerance
    good, bad = limit / ratio, limit
    budget, confidence = context.budget, percent(context.confidence)
    step_phi = _dispersion(step)
    pooled_phi = _dispersion(pooled)
    failure = ""
    if test_of(good, Direction.ABOVE, budget.fail_per_step(), bad, ratio).rejects(
        step.errors, step.requests, step_phi
    ):
        failure = (
            f"error rate ≤ {percent(limit)} broken at {confidence}: {step.errors:,} errors in "
            f"{requests_text(step.requests)} ({percent(step.errors / step.requests)}) this step"
            + phi_text(step_phi)
        )
    pass_test = test_of(bad, Direction.BELOW, budget.passing(), good, ratio)
    rate = pooled.errors / max(pooled.requests, 1)
    if pass_test.rejects(pooled.errors, pooled.requests, pooled_phi):
        text = (
            f"error rate ≤ {percent(limit)} met at {confidence} ({requests_text(pooled.requests)}; "
            f"{pooled.errors:,} errors, {percent(rate)})"
        )
        return _Part(failure, True, text, allowed=limit)
    return _Part(
        failure,
        False,
        f"error rate ≤ {percent(limit)}: {pooled.errors:,} errors in {pooled.requests:,}",
        needed(pass_test, pooled.errors, pooled.requests, pooled_phi),
        limit,
        terminal=_terminal(context, step, limit, percent(limit), step_phi),
    )


def _terminal(
    context: Context,
    step: Counts,
    allowed: float,
    allowed_text: str,
    phi: float,
    allowed_variance: float = 0.0,
) -> Terminal | None:
    """The step's rate against ``allowed`` (with that limit's own variance, for a relative one), once
    the step's window has passed (None before: nothing to read yet)."""
    horizon = context.horizon
    if horizon is None or not (horizon.reached or horizon.window_ended):
        return None
    enough = requests_needed(allowed, context.confidence, phi)
    if step.requests < enough:
        return too_few_for_estimate(step, enough, phi)
    rate = step.errors / step.requests
    chance = wrong_side(rate, allowed, share_variance(rate, step.requests, phi) + allowed_variance)
    return Terminal(
        CheckVerdict.FAIL if rate > allowed else CheckVerdict.PASS,
        f"error rate {percent(rate)} ({step.errors:,} of {requests_text(step.requests)} this step) against "
        f"{allowed_text}; the chance that the estimate is on the wrong side of the limit: "
        f"{chance_text(chance)}",
        chance=chance,
    )


def _dispersion(counts: Counts) -> float:
    return dispersion([(tally.errors, tally.requests) for tally in counts.intervals])


# Consecutive intervals paired into one block: the conditioning on each block's errors still cancels
# what both revisions share at that resolution (a minute at 15 s scrapes), at a quarter of the cost.
_PAIR_BLOCK = 4


def _pairs(canary: Counts, stable: Counts) -> list[tuple[int, int, int, int]]:
    by_window = {(tally.start, tally.end): tally for tally in stable.intervals}
    pairs: list[tuple[int, int, int, int]] = []
    block = [0, 0, 0, 0]
    filled = 0
    for tally in canary.intervals:
        other = by_window.get((tally.start, tally.end))
        if other is None:
            continue
        block = [
            block[0] + tally.errors,
            block[1] + tally.requests,
            block[2] + other.errors,
            block[3] + other.requests,
        ]
        filled += 1
        if filled == _PAIR_BLOCK:
            pairs.append((block[0], block[1], block[2], block[3]))
            block, filled = [0, 0, 0, 0], 0
    if filled:
        pairs.append((block[0], block[1], block[2], block[3]))
    return pairs


def _relative(context: Context, sides: Sides) -> _Part:
    check = context.check
    assert check.max_increase is not None
    pooled = sides.pooled
    stable_step, stable_pooled = sides.stable_step, sides.stable_pooled
    if stable_step is None or stable_pooled is None or stable_pooled.requests == 0:
        missing = f"vs stable: {stable_missing(sides.stable)}"
        return _Part(
            "", False, missing, terminal=Terminal(CheckVerdict.NOT_YET, missing, HorizonOutcome.UNJUDGEABLE)
        )
    increase = check.max_increase
    stable_rate = stable_pooled.errors / stable_pooled.requests
    if check.min_stable is not None and stable_rate < check.min_stable:
        floor = percent(check.min_stable)
        note = f"maxIncrease not applied: stable {percent(stable_rate)} is below minStable {floor}"
        return _Part("", True, note, applies=False)
    if pooled.errors == 0 and stable_pooled.errors == 0:
        # Nothing to compare (as below minStable): the absolute limit applies. Without this a quiet
        # service would wait for an error that never comes.
        return _Part(
            "", True, "maxIncrease not applied: no errors on either revision to compare", applies=False
        )
    return _paired(context, sides, stable_step, stable_pooled, increase)


def _paired(
    context: Context, sides: Sides, stable_step: Counts, stable_pooled: Counts, increase: float
) -> _Part:
    ratio = 1.0 + context.check.tolerance
    bad, good = 1.0 + increase, (1.0 + increase) / ratio
    step, pooled = sides.step, sides.pooled
    failure = ""
    fail_evidence = _paired_evidence(_pairs(step, stable_step), good, bad, ratio, above=True)
    if fail_evidence >= math.log(1.0 / context.budget.fail_per_step()):
        failure = (
            f"error rate ≤ +{percent(increase)} vs stable broken at {percent(context.confidence)}: canary "
            f"{percent(step.errors / max(step.requests, 1))} ({step.errors:,} of {step.requests:,}) against "
            f"stable {percent(stable_step.errors / max(stable_step.requests, 1))} in the same intervals"
        )
    pass_evidence = _paired_evidence(_pairs(pooled, stable_pooled), bad, good, ratio, above=False)
    met = pass_evidence >= math.log(1.0 / context.budget.passing())
    canary_rate = pooled.errors / max(pooled.requests, 1)
    stable_rate = stable_pooled.errors / stable_pooled.requests
    head = f"error rate ≤ +{percent(increase)} vs stable"
    numbers = f"canary {percent(canary_rate)} of {pooled.requests:,}, stable {percent(stable_rate)}"
    if met:
        text = f"{head} met at {percent(context.confidence)} ({numbers} of {stable_pooled.requests:,})"
        return _Part(failure, True, text, allowed=stable_rate * bad)
    # On the estimate: the stable revision's rate pooled over the rollout, with its own variance.
    allowed = bad * stable_rate
    allowed_text = f"{percent(allowed)} (+{percent(increase)} of stable's {percent(stable_rate)})"
    variance = bad * bad * share_variance(stable_rate, stable_pooled.requests, _dispersion(stable_pooled))
    terminal = (
        _terminal(context, step, allowed, allowed_text, _dispersion(step), variance)
        if allowed > 0
        else Terminal(
            CheckVerdict.NOT_YET,
            f"{head} cannot be judged at the horizon: the stable revision had no errors (a minStable floor "
            "makes the absolute limit decide then)",
            HorizonOutcome.UNJUDGEABLE,
        )
    )
    return _Part(failure, False, f"{head}: {numbers}", allowed=stable_rate * bad, terminal=terminal)


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
