"""The evaluation bookkeeping of a rollout: when an evaluation is due, what it counts, when a step passes.

The rules (docs/design.md §4), each a small pure function so the tick in :mod:`canary.rollout.core`
reads as a story and the counting can be read on its own:

* **due** — every ``interval`` after the window's start, and once more when the window ends between two;
* **streak** — consecutive failed evaluations (a pass resets it; an inconclusive one leaves it);
* **conclusive** — a step's evaluation is conclusive when it fails, or passes on enough requests; an
  evaluation of absolute limits (pending, baking) when it is not inconclusive;
* **no-data clock** — ``onNoData`` counts from the latest of the step's start, the last conclusive
  evaluation and the last query error (or resume): Prometheus being down is not the canary's silence;
* **step passed** — a pass, on enough requests, after the step's window has been held.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from canary.rollout.judge import Evaluation
from canary.rollout.state import EvaluationRecord, EvaluationVerdict

__all__ = [
    "EvaluationMode",
    "is_conclusive",
    "is_due",
    "no_data_clock_from",
    "record_evaluation",
    "step_passed",
]


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
    """An evaluation is due every ``interval``, and once more when the window ends between two.

    ``last`` is the previous evaluation's time; one before ``window_start`` belongs to another window.
    """
    if at <= window_start:
        return False
    if last is None or last < window_start:
        return at - window_start >= interval
    if at <= last:
        return False
    if at - last >= interval:
        return True
    return window_end is not None and last < window_end <= at


def record_evaluation(
    previous: EvaluationRecord, evaluation: Evaluation, at: datetime, *, conclusive: bool
) -> EvaluationRecord:
    """The record after ``evaluation`` at ``at``: its verdict, the failure streak and both clocks."""
    verdict = evaluation.verdict
    streak = previous.failure_streak
    if verdict is EvaluationVerdict.FAIL:
        streak += 1
    elif verdict is EvaluationVerdict.PASS:
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


def is_conclusive(mode: EvaluationMode, verdict: EvaluationVerdict, enough_requests: bool) -> bool:
    """Whether an evaluation settles anything (else it counts towards ``onNoData``)."""
    if mode is EvaluationMode.STEP:
        return verdict is EvaluationVerdict.FAIL or (verdict is EvaluationVerdict.PASS and enough_requests)
    return verdict is not EvaluationVerdict.INCONCLUSIVE


def step_passed(
    verdict: EvaluationVerdict, enough_requests: bool, held: timedelta, window: timedelta
) -> bool:
    """A step passes on a passing evaluation of enough requests once its window has been held."""
    return verdict is EvaluationVerdict.PASS and enough_requests and held >= window


def no_data_clock_from(step_started_at: datetime, record: EvaluationRecord) -> datetime:
    """Where ``onNoData`` counts from: the latest of the step's start, the last conclusive
    evaluation and the last query error or resume."""
    return max(
        moment
        for moment in (step_started_at, record.last_conclusive_at, record.no_data_clock_from)
        if moment is not None
    )
