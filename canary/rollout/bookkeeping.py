"""The evaluation bookkeeping of a rollout: when an evaluation is due, what it counts, when a step passes.

The rules (docs/design.md §4), each a small pure function so the tick in :mod:`canary.rollout.core`
reads as a story and the counting can be read on its own:

* **due** — every ``interval`` after the window's start, and once more when the window ends between two;
* **streak** — consecutive evaluations in which a *measured* check failed (counted checks fail at
  once, their sequential test already holds its error budget); an evaluation without such a failure
  resets it, unless a query failed (an outage is no evidence either way);
* **conclusive** — a step's evaluation is conclusive when it fails, or when requests arrived since the
  previous one and no check lacks data ("not yet" with data flowing is not silence); an evaluation
  of absolute limits (pending, baking) when no check lacks data;
* **no-data clock** — ``onNoData`` counts from the latest of the step's start, the last conclusive
  evaluation and the last query error (or resume): Prometheus being down is not the canary's silence;
* **step passed** — after the step's window, on enough requests: below the highest step when nothing
  failed or lacks data (counted checks may still be "not yet": advance on exposure); at the highest
  step when every check is met (promote on evidence).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from canary.rollout.judge import Evaluation
from canary.rollout.state import EvaluationRecord, EvaluationVerdict
from canary.rollout.vocabulary import CheckVerdict

__all__ = [
    "TIMER_SLACK",
    "EvaluationMode",
    "is_conclusive",
    "is_due",
    "no_data_clock_from",
    "record_evaluation",
    "step_passed",
]


# An evaluation whose interval ends within this of the tick is due in that tick. A timer fires a
# few milliseconds late, by a different amount each time: without the slack, the tick an interval
# after an evaluation comes just before the interval ends as often as not, and the evaluation slips
# a whole tick (at 1,000 rollouts, a 30 s interval averaged 37 s). The shell schedules with it too.
TIMER_SLACK = timedelta(seconds=1)


class EvaluationMode(StrEnum):
    """What an evaluation is for: holding a step (all checks, relative to stable) or watching a
    canary that is not serving a step (pending, baking: absolute limits only)."""

    STEP = "step"
    PENDING = "pending"
    BAKE = "bake"


def is_due(
    at: datetime,
    window_start: datetime,
    window_end: datetime | None,
    last: datetime | None,
    interval: timedelta,
) -> bool:
    """An evaluation is due every ``interval`` (:data:`TIMER_SLACK` early at most), and once more
    when the window ends between two.

    ``last`` is the previous evaluation's time; one before ``window_start`` belongs to another window.
    """
    if at <= window_start:
        return False
    if last is None or last < window_start:
        return at - window_start >= interval - TIMER_SLACK
    if at <= last:
        return False
    if at - last >= interval - TIMER_SLACK:
        return True
    return window_end is not None and last < window_end <= at


def record_evaluation(
    previous: EvaluationRecord, evaluation: Evaluation, at: datetime, *, conclusive: bool
) -> EvaluationRecord:
    """The record after ``evaluation`` at ``at``: its verdict, the failure streak and both clocks."""
    verdict = evaluation.verdict
    streak = previous.failure_streak
    if evaluation.measured_failures:
        streak += 1
    elif not evaluation.has_error:
        streak = 0
    return EvaluationRecord(
        at=at,
        verdict=verdict,
        requests=evaluation.requests,
        failed_checks=tuple(judgement.name for judgement in evaluation.failures),
        failure_streak=streak,
        query_error=evaluation.has_error,
        last_conclusive_at=at if conclusive else previous.last_conclusive_at,
        no_data_clock_from=at if evaluation.has_error else previous.no_data_clock_from,
    )


def is_conclusive(mode: EvaluationMode, evaluation: Evaluation, flowing: bool) -> bool:
    """Whether an evaluation is evidence at all (else its time counts towards ``onNoData``)."""
    if evaluation.verdict is EvaluationVerdict.FAIL:
        return True
    lacking = any(judgement.verdict is CheckVerdict.NO_DATA for judgement in evaluation.judgements)
    if lacking or evaluation.has_error:
        return False
    if mode is EvaluationMode.STEP:
        return flowing
    return True


def step_passed(
    evaluation: Evaluation, enough_requests: bool, held: timedelta, window: timedelta, *, final_step: bool
) -> bool:
    """Below the highest step: held, enough requests, nothing failed or lacking (advance on exposure).
    The highest step: the same, and every check met on the pooled evidence (promote on evidence)."""
    if not enough_requests or held < window:
        return False
    if final_step:
        return evaluation.verdict is EvaluationVerdict.PASS
    return evaluation.advance_ok


def no_data_clock_from(step_started_at: datetime, record: EvaluationRecord) -> datetime:
    """Where ``onNoData`` counts from: the latest of the step's start, the last conclusive
    evaluation and the last query error or resume."""
    return max(
        moment
        for moment in (step_started_at, record.last_conclusive_at, record.no_data_clock_from)
        if moment is not None
    )
