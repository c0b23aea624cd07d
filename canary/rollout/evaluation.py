"""Evaluations: where a tick judges evidence, what it asks for, and what a judged evaluation records.

A phase that judges evidence (a held step, a canary not Ready yet, a bake) stops at its
:class:`EvaluationPoint` and hands the rest of its rule on (:class:`Judging`): the tick is the same
up to there whether evidence was collected or not, so :func:`canary.rollout.core.evidence_request`
reads the request off the point (:func:`request_at`) and :func:`canary.rollout.core.decide` judges
the evidence there (:func:`judged`) and goes on with the rest of the rule.

:func:`record_evaluation` is the one place where judged evidence becomes the rollout's record: the
verdict, the failure streak and clocks (:mod:`canary.rollout.bookkeeping`), whether the step passed,
and what follows from it (a rollback, a failure that leads the wait, ``onNoData``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import NamedTuple

from canary.evidence import Evidence, EvidenceRequest
from canary.policy.model import Check, HorizonAction, NoDataAction
from canary.policy.units import format_duration
from canary.rollout import bookkeeping
from canary.rollout.bookkeeping import EvaluationMode, is_conclusive, is_due, no_data_clock_from, step_passed
from canary.rollout.draft import Draft, Final, Outcome, Tick, duration, seconds
from canary.rollout.horizon import Horizon, HorizonOutcome, evidence_time, evidence_until
from canary.rollout.judge import CheckVerdict, CountContext, Evaluation, judge_evidence
from canary.rollout.outcomes import pause, rollback
from canary.rollout.state import PauseKind, Phase, RolloutState, StepProgress, describe_time
from canary.rollout.vocabulary import EventReason

__all__ = [
    "EvaluationPoint",
    "Judging",
    "evaluating",
    "judged",
    "record_evaluation",
    "request_at",
]


class EvaluationPoint(NamedTuple):
    """What a phase judges now: which checks, over which window, against which stable revision."""

    mode: EvaluationMode
    checks: tuple[Check, ...]  # all of the policy's for a step; those with absolute limits otherwise
    window_start: datetime
    window_end: datetime | None  # the step's or the bake's; None while pending
    stable: str | None  # compared with (a step only)

    @property
    def compare(self) -> bool:
        return self.mode is EvaluationMode.STEP


# The rest of a phase's rule once the evidence is judged (or none was due or supplied).
Continuation = Callable[[Tick, Draft], Final]


class Judging(NamedTuple):
    """A tick stopped where its evidence is judged: the draft up to there, and the rest of the rule."""

    draft: Draft
    point: EvaluationPoint
    then: Continuation


def evaluating(
    tick: Tick,
    draft: Draft,
    mode: EvaluationMode,
    window_start: datetime,
    stable: str | None,
    then: Continuation,
) -> Final | Judging:
    """Stop at the evaluation of ``mode`` over the window from ``window_start`` — or, when there is
    nothing to judge in this mode (no checks, or none with an absolute limit), go on at once."""
    compare = mode is EvaluationMode.STEP
    checks = tick.plan.checks if compare else tick.plan.absolute_checks
    if not checks:
        return then(tick, draft)
    point = EvaluationPoint(mode, checks, window_start, _window_end(tick, draft, mode, window_start), stable)
    return Judging(draft, point, then)


def _window_end(tick: Tick, draft: Draft, mode: EvaluationMode, window_start: datetime) -> datetime | None:
    if mode is EvaluationMode.STEP:
        step = draft.state.step
        assert step is not None
        return window_start + tick.plan.windows[step.index]
    if mode is EvaluationMode.BAKE:
        return window_start + tick.plan.bake
    return None


def request_at(tick: Tick, judging: Judging) -> EvidenceRequest | None:
    """The evidence to collect for the evaluation at ``judging``: None unless one is due now."""
    draft, point = judging.draft, judging.point
    if not _due(tick, draft, point, tick.now):
        return None
    state = draft.state
    assert state.revision is not None
    since = state.evidence_since if point.compare else None
    return EvidenceRequest(
        namespace=tick.policy.metadata.namespace,
        inference_service=tick.spec.target.inference_service,
        canary_revision=state.revision,
        stable_revision=point.stable if point.compare else None,
        window_start=point.window_start,
        at=tick.now,
        checks=point.checks,
        compare_with_stable=point.compare,
        history_start=since if since is not None and since < point.window_start else None,
        # Pending and the first step: the canary's warm-up is its own evidence (never while baking).
        canary_born=state.started_at if state.warm_up_counted else None,
    )


def judged(tick: Tick, judging: Judging, evidence: Evidence | None) -> Final:
    """The rest of the tick after judging ``evidence`` at ``judging``'s point. Evidence that does not
    answer the evaluation due there (another revision, window or comparison, a time after ``now``,
    or an evaluation that is not due) is ignored, never judged."""
    draft, point = judging.draft, judging.point
    outcome: Outcome = draft
    if evidence is None:
        if _due(tick, draft, point, tick.now):
            outcome = draft.noting("An evaluation is due but no evidence was supplied.")
    elif _answers(tick, draft, point, evidence.request):
        outcome = record_evaluation(tick, draft, point, evidence)
    if isinstance(outcome, Final):
        return outcome
    return judging.then(tick, outcome)


def _answers(tick: Tick, draft: Draft, point: EvaluationPoint, asked: EvidenceRequest) -> bool:
    return not (
        asked.canary_revision != draft.state.revision
        or asked.window_start != point.window_start
        or asked.compare_with_stable != point.compare
        or (point.compare and asked.stable_revision != point.stable)
        or asked.at > tick.now
        or not _due(tick, draft, point, asked.at)
    )


def _due(tick: Tick, draft: Draft, point: EvaluationPoint, at: datetime) -> bool:
    last = draft.state.evaluation.at
    if tick.alarm and at > point.window_start and (last is None or at > last):
        return True  # an extra look, now: a critical signal moved (see decide)
    return is_due(at, point.window_start, point.window_end, last, tick.plan.interval)


def record_evaluation(tick: Tick, draft: Draft, point: EvaluationPoint, evidence: Evidence) -> Outcome:
    """Judge ``evidence`` (the answer to the evaluation due at ``point``) and record it in the state:
    the evaluation's record (verdict, streak, clocks), and for a step whether it passed. Then what
    follows from the verdict: a rollback, a pause, or a draft to go on with."""
    at = evidence.request.at
    compare = point.mode is EvaluationMode.STEP
    state = draft.state
    step = state.step
    final = compare and step is not None and step.index == len(tick.steps) - 1
    # A step's window is time covered by evidence: up to the canary's newest sample, not the clock.
    until = evidence_until((evidence.counts or {}).get("canary"), at)
    context = CountContext(
        step_start=point.window_start,
        budget=tick.plan.budget,
        confidence=tick.spec.confidence,
        final_step=final,
        horizon=_horizon(tick, step, evidence, until) if compare else None,
    )
    evaluation = judge_evidence(
        point.checks,
        evidence.canary,
        evidence.stable,
        compare_with_stable=compare,
        counts=evidence.counts,
        context=context,
    )
    min_requests = tick.plan.min_requests[step.index] if compare and step else 0
    enough_requests = evaluation.requests is not None and evaluation.requests >= min_requests
    previous = state.evaluation
    # Requests arrived since the previous evaluation of this window: "not yet" with data flowing
    # is not silence (onNoData counts only time without new requests or without series).
    earlier = previous.requests if previous.at is not None and previous.at > point.window_start else 0.0
    flowing = evaluation.requests is not None and evaluation.requests > (earlier or 0.0)
    conclusive = is_conclusive(point.mode, evaluation, flowing)
    record = bookkeeping.record_evaluation(previous, evaluation, at, conclusive=conclusive)
    if compare:
        assert step is not None
        assert step.started_at is not None
        passed = step_passed(
            evaluation,
            enough_requests,
            until - step.started_at,
            tick.plan.windows[step.index],
            final_step=final,
        )
        share = _carries_share(tick, state, evaluation, step.index) if final and passed else (True, "")
        passed = passed and share[0]
        counted = (step.counted if step.passed_at is not None else None) or evaluation.requests
        step = replace(step, passed_at=at if passed else None, counted=counted if passed else None)
    draft = draft.evaluated(evaluation, at, replace(state, evaluation=record, step=step))
    draft = draft.noting(*_evaluation_reasons(point, step, evaluation, at))
    if compare and share[1]:
        draft = draft.noting(share[1])
    return _verdict_consequences(tick, draft, point, evaluation, record.failure_streak, conclusive)


def _horizon(tick: Tick, step: StepProgress | None, evidence: Evidence, until: datetime) -> Horizon | None:
    """Where the step stands against its horizon: the evidence time its canary tallies cover, and
    whether the evidence (up to ``until``) covers its window."""
    if step is None or step.started_at is None:
        return None
    covered = evidence_time((evidence.counts or {}).get("canary"), step.started_at)
    ended = until - step.started_at >= tick.plan.windows[step.index]
    at = evidence.request.at
    return Horizon(tick.plan.horizons[step.index], covered, at, tick.spec.at_horizon, ended, until)


def _carries_share(tick: Tick, state: RolloutState, evaluation: Evaluation, index: int) -> tuple[bool, str]:
    """The highest step carries its fair share of the requests the steps counted (each counted when
    it passed), unless a check was decided on this step's own estimate. Only counted checks pool the
    steps' evidence: without them there is no share to carry."""
    judgements = evaluation.judgements
    if not any(j.counted for j in judgements) or any(
        j.horizon is HorizonOutcome.ESTIMATE for j in judgements
    ):
        return True, ""
    share = tick.plan.fair_shares[index]
    earlier = state.counted_requests
    needed = math.ceil(share / (1.0 - share) * earlier) if share < 1.0 else 0
    requests = evaluation.requests or 0.0
    if requests >= needed:
        return True, ""
    return False, (
        f"This step has {requests:,.0f} canary requests; as the highest step it must carry at least "
        f"{share:.0%} of the requests the steps counted ({earlier:,.0f} before it): {needed:,} "
        f"(about {needed - requests:,.0f} more)."
    )


def _evaluation_reasons(
    point: EvaluationPoint, step: StepProgress | None, evaluation: Evaluation, at: datetime
) -> list[str]:
    if point.mode is EvaluationMode.STEP:
        what = f"step {step.weight}%" if step else "step"
    elif point.mode is EvaluationMode.PENDING:
        what = "while not Ready, absolute limits"
    else:
        what = "bake, absolute limits"
    behind = evaluation.horizon.behind if evaluation.horizon is not None else ""
    reasons = [
        f"Evaluation at {describe_time(at)} over {duration(at - point.window_start)} ({what}"
        f"{'; ' + behind if behind else ''}): {evaluation.summary()}."
    ]
    # A counted check's statement says what was shown, met or not; a measured check's value is
    # news only when it is not a pass.
    reasons.extend(
        judgement.describe()
        for judgement in evaluation.judgements
        if judgement.counted or judgement.verdict is not CheckVerdict.PASS
    )
    return reasons


def _verdict_consequences(
    tick: Tick, draft: Draft, point: EvaluationPoint, evaluation: Evaluation, streak: int, conclusive: bool
) -> Outcome:
    """A critical failure or ``failureLimit`` failures in a row roll back; a failure below the limit
    leads the wait; query errors hold; a step's inconclusive evaluation runs the ``onNoData`` clock."""
    critical = evaluation.critical_failures
    if not any(judgement.horizon is HorizonOutcome.NONE for judgement in critical):
        paused = _pause_at_horizon(tick, draft, evaluation)
        if paused is not None:
            return paused
    if critical:
        counted = all(judgement.counted and not judgement.critical for judgement in critical)
        return rollback(
            tick,
            draft,
            ("Limit broken: " if counted else "Critical check failed: ")
            + "; ".join(f"{j.name}: {j.detail}" for j in critical)
            + ".",
        )
    failed = evaluation.measured_failures
    if failed:
        failures = "; ".join(f"{j.name}: {j.detail}" for j in failed)
        limit = tick.spec.failure_limit
        if streak >= limit:
            return rollback(
                tick, draft, f"{streak} consecutive failed evaluations (failureLimit {limit}): {failures}."
            )
        draft = draft.leading(f"Evaluation failed ({streak} of failureLimit {limit} in a row): {failures}.")
    if evaluation.has_error:
        draft = draft.warning(
            "Prometheus queries failed: the rollout holds and retries; query errors never count as "
            "failures and never trigger onNoData."
        )
    if point.mode is not EvaluationMode.STEP or conclusive or evaluation.has_error:
        return draft
    return _no_data(tick, draft)


def _pause_at_horizon(tick: Tick, draft: Draft, evaluation: Evaluation) -> Final | None:
    """``atHorizon: pause`` with a check decided on its estimate, or, at the highest step, a check
    the estimate cannot judge: a person decides, with the numbers."""
    step = draft.state.step
    final = step is not None and step.index == len(tick.steps) - 1
    decided = [j for j in evaluation.judgements if j.horizon is HorizonOutcome.ESTIMATE]
    stuck = [j for j in evaluation.judgements if j.horizon is HorizonOutcome.UNJUDGEABLE] if final else []
    if not stuck and not (decided and tick.spec.at_horizon is HorizonAction.PAUSE):
        return None
    named = "; ".join(f"{j.name}: {j.detail}" for j in stuck or decided)
    return pause(
        tick,
        draft,
        PauseKind.HORIZON,
        f"At the step's horizon: {named}. Paused for a person: `kserve-canary promote`, `abort`, or "
        "`resume` (another horizon on fresh evidence).",
        resume_phase=Phase.PROGRESSING,
        event=EventReason.CANARY_INCONCLUSIVE,
    )


def _no_data(tick: Tick, draft: Draft) -> Outcome:
    """``onNoData``: counted from the last conclusive evaluation, the step's start, or the last
    query error or resume, whichever is latest."""
    step = draft.state.step
    at = draft.evaluated_at
    assert step is not None
    assert step.started_at is not None
    assert at is not None
    clock_from = no_data_clock_from(step.started_at, draft.state.evaluation)
    # Silence as far as the evidence reaches: an ingestion lag is not the canary's silence.
    horizon = draft.evaluation.horizon if draft.evaluation is not None else None
    age = horizon.evidence_age if horizon is not None else timedelta(0)
    silent = max(at - clock_from - age, timedelta(0))
    after = tick.spec.on_no_data.after
    action = tick.spec.on_no_data.action
    if age >= seconds(after):
        # Evidence that stopped arriving is Prometheus' outage, not the canary's silence: say so, hold.
        draft = draft.warning(
            f"The canary's newest sample in Prometheus is {duration(age)} old: its ingestion (remote "
            "write, Thanos, Mimir) may be stalled. The step holds until the evidence covers its window."
        )
    if silent < seconds(after):
        return draft.noting(
            f"No conclusive evidence for {duration(silent)}; onNoData ({action}) applies after "
            f"{format_duration(after)}."
        )
    text = (
        f"No conclusive evidence for {step.weight}% of {draft.state.revision} for {duration(silent)} "
        f"(since {describe_time(clock_from)}; onNoData.after {format_duration(after)})"
    )
    if action is NoDataAction.ROLLBACK:
        return rollback(tick, draft, f"{text}: onNoData rolls back.")
    if action is NoDataAction.PAUSE:
        return pause(
            tick,
            draft,
            PauseKind.NO_DATA,
            f"{text}: paused until `kserve-canary resume`.",
            resume_phase=Phase.PROGRESSING,
            event=EventReason.CANARY_INCONCLUSIVE,
        )
    return draft.leading(f"{text}: holding the step and evaluating again (onNoData: hold).")
