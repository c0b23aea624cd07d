"""The phases that hold a canary and judge it: Pending, Progressing (and its un-Ready hold), Baking.

Each returns the decision, or stops where its evidence is judged
(:class:`~canary.rollout.evaluation.Judging`) with the rest of its rule as the continuation: for a
step, whether it passed and what follows (gates, approval, advance or promote); while pending, the
progress deadline; while baking, the end of the bake (:func:`canary.rollout.outcomes.after_bake_evaluation`).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from canary.policy.model import GateStage
from canary.policy.units import format_duration
from canary.rollout.bookkeeping import EvaluationMode
from canary.rollout.draft import Draft, Final, Tick, duration, step_at_or_below
from canary.rollout.evaluation import Judging, evaluating
from canary.rollout.gating import gated, gates_hold, gates_passed_headline
from canary.rollout.judge import CheckVerdict
from canary.rollout.outcomes import after_bake_evaluation, evaluation_event, leave_step, pause, rollback, wait
from canary.rollout.starting import end_dark_launch, failed_by_knative, knative_deadline_warning
from canary.rollout.state import PauseKind, Phase, StepProgress, describe_time
from canary.rollout.vocabulary import EventReason, Severity

__all__ = ["baking", "pending", "progressing"]


def pending(tick: Tick, draft: Draft) -> Final | Judging:
    """Waiting for the canary to become Ready (absolute limits are watched meanwhile)."""
    checked = _check_policy_step(tick, draft)
    if isinstance(checked, Final):
        return checked
    draft = checked
    state = draft.state
    assert state.started_at is not None
    assert state.step is not None
    if not tick.observed.canary_ready:
        if tick.observed.knative_failed:
            return failed_by_knative(tick, draft)
        return evaluating(tick, draft, EvaluationMode.PENDING, state.started_at, None, _pending_evaluated)
    draft = draft.noting(
        f"{state.revision} became Ready {duration(tick.now - state.started_at)} after its rollout started."
    )
    if state.spec_weight is None or state.spec_weight.weight != 0:
        return progressing(
            tick, draft.with_state(replace(state, phase=Phase.PROGRESSING)), awaiting_approval=False
        )
    # A dark launch (or a pre-rollout gate's 0): the first step, once the gates passed.
    weight = state.step.weight
    held = gates_hold(tick, draft, frozenset({GateStage.PRE_ROLLOUT}), None)
    if isinstance(held, Final):
        return held
    if gated(tick, GateStage.PRE_ROLLOUT):
        return end_dark_launch(tick, held, weight, gates_passed_headline(tick, state.revision, weight))
    return end_dark_launch(
        tick,
        held,
        weight,
        f"Dark-launched revision {state.revision} is Ready: moving it to the first step {weight}%.",
    )


def _pending_evaluated(tick: Tick, draft: Draft) -> Final:
    """Not Ready yet, the evidence judged: roll back past the progress deadline, else wait."""
    state = draft.state
    assert state.started_at is not None
    observed = tick.observed
    waited = tick.now - state.started_at
    failure = f" Knative reports: {observed.revision_failure}" if observed.revision_failure else ""
    deadline = tick.spec.progress_deadline
    beyond_knative = knative_deadline_warning(tick, state.revision or "the canary")
    if beyond_knative is not None:
        draft = draft.noting(beyond_knative)
    if waited >= tick.plan.progress_deadline:
        return rollback(
            tick,
            draft,
            f"{state.revision} did not become Ready within progressDeadline {format_duration(deadline)} "
            f"(rollout started {describe_time(state.started_at)}).{failure}",
        )
    return wait(
        tick,
        draft,
        f"Waiting for {state.revision} to become Ready: {duration(waited)} of progressDeadline "
        f"{format_duration(deadline)}.{failure}",
        EventReason.CANARY_PENDING,
        Severity.WARNING if observed.revision_failure else Severity.INFO,
    )


def progressing(tick: Tick, draft: Draft, *, awaiting_approval: bool) -> Final | Judging:
    """Holding a step: its clock starts when status shows it; its evidence is judged every interval."""
    checked = _check_policy_step(tick, draft)
    if isinstance(checked, Final):
        return checked
    draft = checked
    observed = tick.observed
    if not observed.canary_ready:
        return _hold_unready(tick, draft)
    state = draft.state
    revision = state.revision
    if state.unready_since is not None:
        draft = draft.noting(
            f"{revision} is Ready again (it was not since {describe_time(state.unready_since)})."
        )
        draft = draft.with_state(state := replace(state, unready_since=None))
    stable = observed.stable_for(revision) if revision is not None else None
    if stable is not None and stable != state.stable_revision:
        draft = draft.noting(
            f"KServe routes the rest of the traffic to {stable} (was {state.stable_revision})."
        )
        draft = draft.with_state(state := replace(state, stable_revision=stable))
    step = state.step
    assert step is not None
    if step.started_at is None:
        return _start_step_clock(tick, draft, awaiting_approval=awaiting_approval)
    then = _step_evaluated_awaiting_approval if awaiting_approval else _step_evaluated
    return evaluating(tick, draft, EvaluationMode.STEP, step.started_at, state.stable_revision, then)


def _start_step_clock(tick: Tick, draft: Draft, *, awaiting_approval: bool) -> Final:
    """A step's clock starts when status traffic shows its weight."""
    state = draft.state
    step = state.step
    assert step is not None
    revision = state.revision
    shown = tick.observed.weight_of(revision)
    if shown != step.weight:
        return wait(
            tick,
            draft,
            f"Waiting for status traffic to show {step.weight}% for {revision} (it shows "
            f"{shown}%); the step's clock starts then.",
            EventReason.CANARY_WAITING,
        )
    # Nothing can be due at the very moment the step starts: its window is empty.
    state = replace(
        state, step=replace(step, started_at=tick.now), evidence_since=state.evidence_since or tick.now
    )
    window = tick.plan.window_texts[step.index]
    return wait(
        tick,
        draft.with_state(state),
        f"Step {step.index + 1} of {len(tick.steps)} ({step.weight}%) of {revision} started: status "
        f"traffic shows it at {describe_time(tick.now)}; holding it for {window}.",
        EventReason.CANARY_WAITING,
        awaiting=awaiting_approval,
    )


def _step_evaluated(tick: Tick, draft: Draft) -> Final:
    return _after_step_evaluation(tick, draft, awaiting_approval=False)


def _step_evaluated_awaiting_approval(tick: Tick, draft: Draft) -> Final:
    return _after_step_evaluation(tick, draft, awaiting_approval=True)


def _after_step_evaluation(tick: Tick, draft: Draft, *, awaiting_approval: bool) -> Final:
    """A held step, its evidence judged: hold it, or — passed — its gates, its approval, and on."""
    step = draft.state.step
    assert step is not None
    if step.passed_at is None:
        return wait(
            tick,
            draft,
            _step_progress_text(tick, draft, step),
            evaluation_event(draft),
            awaiting=awaiting_approval,
        )
    final = step.index + 1 >= len(tick.steps)
    stages = {GateStage.STEP, GateStage.PRE_PROMOTION} if final else {GateStage.STEP}
    held = gates_hold(tick, draft, frozenset(stages), step.weight)
    if isinstance(held, Final):
        return held
    draft = held
    if tick.steps[step.index].approval == "manual" and step.weight not in draft.state.approvals:
        text = (
            f"Step {step.weight}% of {draft.state.revision} passed and needs approval before the rollout "
            f"leaves it: `kserve-canary approve {tick.policy.key}`. Evaluations continue meanwhile; a "
            "failure still rolls back."
        )
        if awaiting_approval:
            return wait(tick, draft, text, EventReason.CANARY_AWAITING_APPROVAL)
        return pause(
            tick,
            draft,
            PauseKind.APPROVAL,
            text,
            resume_phase=Phase.PROGRESSING,
            event=EventReason.CANARY_AWAITING_APPROVAL,
        )
    return leave_step(tick, draft, step)


def _step_progress_text(tick: Tick, draft: Draft, step: StepProgress) -> str:
    assert step.started_at is not None
    held = tick.now - step.started_at
    record = draft.state.evaluation
    current = record.at is not None and record.at >= step.started_at
    requests = f"{record.requests:.0f}" if current and record.requests is not None else "?"
    verdict = record.verdict if current and record.verdict else "none yet"
    waiting = ""
    evaluation = draft.evaluation
    if evaluation is not None and step.index + 1 == len(tick.steps):
        undecided = [j.name for j in evaluation.judgements if j.verdict is CheckVerdict.NOT_YET]
        if undecided:
            waiting = (
                f" Before the promotion every limit must be shown met on the evidence pooled over the "
                f"steps; not yet: {', '.join(undecided)}."
            )
    horizon = evaluation.horizon if evaluation is not None else None
    held_text = f"held {duration(held)} of {tick.plan.window_texts[step.index]}"
    if horizon is not None and horizon.behind and horizon.evidence_until is not None:
        covered = max(horizon.evidence_until - step.started_at, timedelta(0))
        held_text += f", evidence covering {duration(covered)} of it ({horizon.behind})"
    if horizon is not None and not horizon.reached:
        waiting += (
            f" Decided by {describe_time(horizon.by)} at the latest (the step's horizon: "
            f"{duration(horizon.length)} of evidence, {duration(horizon.covered)} so far)."
        )
    return (
        f"Holding {draft.state.revision} at {step.weight}% (step {step.index + 1} of "
        f"{len(tick.steps)}): {held_text}, "
        f"{requests} of {tick.plan.min_requests[step.index]} canary requests, latest evaluation "
        f"{verdict}.{waiting}"
    )


def _hold_unready(tick: Tick, draft: Draft) -> Final | Judging:
    """A canary that turned un-Ready mid-rollout holds its step; the progress deadline applies.
    Its evidence is still judged: the restarts or OOM kills that made it un-Ready are evidence."""
    state = draft.state
    state = replace(state, unready_since=state.unready_since or tick.now)
    draft = draft.with_state(state)
    step = state.step
    assert step is not None
    if step.started_at is None:
        return _unready_hold(tick, draft)
    return evaluating(
        tick, draft, EvaluationMode.STEP, step.started_at, state.stable_revision, _unready_evaluated
    )


def _unready_evaluated(tick: Tick, draft: Draft) -> Final:
    """A step never passes while its canary is un-Ready."""
    state = draft.state
    if state.step is not None and state.step.passed_at is not None:
        draft = draft.with_state(replace(state, step=replace(state.step, passed_at=None)))
    return _unready_hold(tick, draft)


def _unready_hold(tick: Tick, draft: Draft) -> Final:
    state = draft.state
    since = state.unready_since
    step = state.step
    assert since is not None
    assert step is not None
    failure = f" Knative reports: {tick.observed.revision_failure}" if tick.observed.revision_failure else ""
    unready_for = tick.now - since
    deadline = tick.spec.progress_deadline
    if unready_for >= tick.plan.progress_deadline:
        return rollback(
            tick,
            draft,
            f"{state.revision} has not been Ready for {duration(unready_for)} "
            f"(since {describe_time(since)}), beyond progressDeadline {format_duration(deadline)}."
            f"{failure}",
        )
    return wait(
        tick,
        draft,
        f"{state.revision} is not Ready (since {describe_time(since)}): holding step {step.weight}%; "
        f"rollback after progressDeadline {format_duration(deadline)}.{failure}",
        EventReason.CANARY_WAITING,
        Severity.WARNING,
    )


def baking(tick: Tick, draft: Draft) -> Final | Judging:
    """Promoted and recorded: absolute limits are watched for ``bake``; a failure rolls back."""
    bake_start = draft.state.bake_started_at
    assert bake_start is not None
    return evaluating(tick, draft, EvaluationMode.BAKE, bake_start, None, after_bake_evaluation)


def _check_policy_step(tick: Tick, draft: Draft) -> Draft | Final:
    """The policy may have been edited: find the current weight among its steps, or pause."""
    state = draft.state
    step = state.step
    assert step is not None
    steps = tick.steps
    if step.index < len(steps) and steps[step.index].weight == step.weight:
        return draft
    for index, candidate in enumerate(steps):
        if candidate.weight == step.weight:
            draft = draft.with_state(replace(state, step=replace(step, index=index)))
            return draft.noting(
                f"The policy was edited: {step.weight}% is now step {index + 1} of {len(steps)}."
            )
    weights = ", ".join(f"{candidate.weight}%" for candidate in steps)
    return pause(
        tick,
        draft,
        PauseKind.POLICY_CHANGED,
        f"The policy was edited: the current weight {step.weight}% is no longer one of its steps "
        f"({weights}). Paused; `kserve-canary resume` continues from "
        f"{steps[step_at_or_below(steps, step.weight)].weight}%.",
        resume_phase=state.phase if state.phase is not Phase.PAUSED else Phase.PROGRESSING,
    )
