"""How a decision ends: wait, write (start, advance, promote, roll back), pause — and the bake.

Each function takes the :class:`~canary.rollout.draft.Draft` so far and returns the
:class:`~canary.rollout.draft.Final` decision: the state to store (with the write-ahead intent of a
write, and a history entry for anything but a plain wait), its id, its reasons and its evaluation.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from canary.policy.units import format_duration
from canary.rollout.decision import Decision
from canary.rollout.draft import Draft, Final, Tick, duration, requests_of, shorten, weight_text
from canary.rollout.intent import record_write, reissued_action
from canary.rollout.state import (
    MAX_HISTORY,
    MAX_ROLLED_BACK,
    EvaluationRecord,
    EvaluationVerdict,
    HistoryEntry,
    Pause,
    PauseKind,
    Phase,
    RolledBackRevision,
    RolloutState,
    StepProgress,
    WeightRecord,
    describe_time,
)
from canary.rollout.vocabulary import Action, EventReason, Severity, decision_id

__all__ = [
    "after_bake_evaluation",
    "evaluation_event",
    "finish",
    "landed",
    "leave_step",
    "pause",
    "promote",
    "promoting",
    "reissue",
    "rollback",
    "wait",
    "write",
]


def finish(
    tick: Tick,
    draft: Draft,
    action: Action,
    event: EventReason,
    headline: str,
    *,
    weight: int | None = None,
    severity: Severity = Severity.INFO,
    id_time: datetime | None = None,
    decided_on: EvaluationRecord | None = None,
) -> Final:
    """The decision, with this reconcile's evaluation — or, for a write re-issued after a crash,
    the stored record of the evaluation that made it (``decided_on``)."""
    if draft.severity is Severity.WARNING:
        severity = Severity.WARNING
    state = draft.state
    step_index = state.step.index if state.step else -1
    moment = id_time or tick.now
    # Not the event: a write re-issued after a crash keeps the id of the original decision.
    identity = decision_id(
        tick.plan.key, state.revision, action, step_index, weight, repr(moment.timestamp())
    )
    if action is not Action.WAIT or state.phase is not tick.original.phase:
        draft = _in_history(tick, draft, action, event, headline, weight, identity)
        state = draft.state
    evaluation = draft.evaluation
    decision = Decision(
        action=action,
        weight=weight if action.writes else None,
        new_state=state,
        reasons=(headline, *draft.reasons),
        event_reason=event,
        severity=severity,
        id=identity,
        revision=state.revision,
        stable_revision=state.stable_revision,
        previous_weight=tick.observed.canary_traffic_percent,
        judgements=evaluation.judgements if evaluation else (),
        verdict=evaluation.verdict if evaluation else decided_on.verdict if decided_on else None,
        requests=evaluation.requests if evaluation else decided_on.requests if decided_on else None,
        evaluated_at=draft.evaluated_at or (decided_on.at if decided_on else None),
        resource_version=tick.observed.resource_version,
        gate_calls=draft.gate_calls if action is Action.WAIT else (),
    )
    return Final(decision, draft)


def _in_history(
    tick: Tick,
    draft: Draft,
    action: Action,
    event: EventReason,
    headline: str,
    weight: int | None,
    identity: str,
) -> Draft:
    """The draft with the decision in the state's history (once: a decision told again is not)."""
    history = draft.state.history
    if history and history[-1].id == identity:
        return draft
    entry = HistoryEntry(
        at=tick.now,
        action=action.value,
        weight=weight,
        phase=draft.state.phase,
        event=event.value,
        reason=shorten(headline),
        id=identity,
    )
    return draft.with_state(replace(draft.state, history=(*history, entry)[-MAX_HISTORY:]))


def wait(
    tick: Tick,
    draft: Draft,
    headline: str,
    event: EventReason,
    severity: Severity = Severity.INFO,
    *,
    awaiting: bool = False,
) -> Final:
    """Nothing to write now; ``headline`` says why (unless the draft has a lead that outranks it)."""
    if draft.resumed_by is not None and event in (EventReason.CANARY_WAITING, EventReason.CANARY_EVALUATED):
        event = EventReason.CANARY_RESUMED
    if awaiting:
        headline = f"{headline} Awaiting approval once the step passes."
    lead = draft.lead
    if lead is not None:
        draft = draft.noting_first(headline)
        headline = lead
    return finish(tick, draft, Action.WAIT, event, headline, severity=severity)


def write(
    tick: Tick,
    draft: Draft,
    action: Action,
    weight: int | None,
    headline: str,
    event: EventReason,
    *,
    phase: Phase | None = None,
) -> Final:
    """Write ``weight`` (None removes the field): the state records it as its intent first."""
    state = record_write(draft.state, weight, tick.observed, tick.now)
    state = replace(state, phase=phase or state.phase, pause=None)
    return finish(tick, draft.with_state(state), action, event, headline, weight=weight)


def promote(tick: Tick, draft: Draft, headline: str) -> Final:
    final = write(
        tick, draft, Action.PROMOTE, None, headline, EventReason.CANARY_PROMOTED, phase=Phase.PROMOTING
    )
    if tick.observed.canary_traffic_percent is None and promotion_recorded(tick, final.draft.state):
        # The field was already gone and KServe already routes 100% to the canary (someone
        # removed it by hand, then asked to promote): move on now, as the next tick would.
        draft, _, text = after_promotion(tick, final.draft)
        decision = replace(final.decision, new_state=draft.state, reasons=(*final.decision.reasons, text))
        return Final(decision, draft)
    return final


def rollback(tick: Tick, draft: Draft, headline: str) -> Final:
    state = draft.state
    revision = state.revision
    rolled_back = state.rolled_back
    if revision is not None and not state.was_rolled_back(revision):
        rolled_back = (*rolled_back, RolledBackRevision(revision, tick.now))[-MAX_ROLLED_BACK:]
    state = replace(state, command=None, rolled_back=rolled_back, unready_since=None)
    return write(
        tick,
        draft.with_state(state).warning(),
        Action.ROLLBACK,
        0,
        f"Rolling back {revision}: {headline}",
        EventReason.CANARY_ROLLED_BACK,
        phase=Phase.ROLLED_BACK,
    )


def pause(
    tick: Tick,
    draft: Draft,
    kind: PauseKind,
    reason: str,
    *,
    resume_phase: Phase,
    observed_weight: int | None = None,
    event: EventReason = EventReason.CANARY_PAUSED,
) -> Final:
    state = replace(
        draft.state,
        phase=Phase.PAUSED,
        pause=Pause(kind, reason, tick.now, resume_phase, observed_weight),
    )
    severity = Severity.INFO if kind is PauseKind.APPROVAL else Severity.WARNING
    return finish(tick, draft.with_state(state), Action.PAUSE, event, reason, severity=severity)


# ------------------------------------------------------------------------------------------------
# A write recorded earlier


def reissue(tick: Tick, draft: Draft) -> Final:
    """The intent recorded earlier has not reached the spec: write it again (idempotent)."""
    intent = draft.state.intent
    assert intent is not None
    ending = f"; the spec still shows {weight_text(tick.observed.canary_traffic_percent)}."
    return recorded_write(tick, draft, intent, "Writing", ending)


def landed(tick: Tick, draft: Draft) -> Decision:
    """The intent recorded earlier is in the spec: the write it describes, told again."""
    intent = draft.state.intent
    assert intent is not None
    told = recorded_write(
        tick,
        draft,
        intent,
        "Wrote",
        "; the spec shows it. Told again: the controller that wrote it may have stopped before "
        "telling it (a restart, a lost answer).",
    )
    # The value it replaced is the one known before the intent (the spec already shows the new one).
    before = draft.state.spec_weight
    return replace(told.decision, previous_weight=before.weight if before is not None else None)


def recorded_write(tick: Tick, draft: Draft, intent: WeightRecord, verb: str, ending: str) -> Final:
    """The decision that recorded ``intent``: its action, its id and — the evaluation that
    recorded the intent was stored with it (same write, same moment) — its verdict and requests,
    so a write is never told without the numbers behind it, even when the process that decided
    it died before it could log or notify."""
    state = draft.state
    action, event = reissued_action(intent, state.step)
    if intent.weight == 0 and state.phase is Phase.PENDING:
        # The 0 of a pre-rollout gate (start_pinned): a start, never a rollback (the ledger
        # would otherwise remember a revision that was never rolled back).
        action, event = Action.START, EventReason.CANARY_STARTED
    severity = Severity.WARNING if action is Action.ROLLBACK else Severity.INFO
    record = state.evaluation
    decided_on = record if record.at is not None and record.at == intent.at else None
    basis = (
        f", decided on a {decided_on.verdict} evaluation with {requests_of(decided_on.requests)}"
        if decided_on is not None and decided_on.verdict is not None
        else ""
    )
    return finish(
        tick,
        draft,
        action,
        event,
        f"{verb} canaryTrafficPercent {weight_text(intent.weight)} for {state.revision} "
        f"(intent recorded {describe_time(intent.at)}{basis}){ending}",
        weight=intent.weight,
        severity=severity,
        id_time=intent.at,
        decided_on=decided_on,
    )


# ------------------------------------------------------------------------------------------------
# Leaving a step, promoting, baking


def leave_step(tick: Tick, draft: Draft, step: StepProgress) -> Final:
    """A passed step: advance to the next one, or promote from the last."""
    assert step.started_at is not None
    assert step.passed_at is not None
    draft = draft.noting_first(_step_passed_text(tick, draft.state, step))
    if step.index + 1 < len(tick.steps):
        following = tick.steps[step.index + 1].weight
        counted = draft.state.counted_requests + (step.counted or draft.state.evaluation.requests or 0.0)
        state = replace(draft.state, step=StepProgress(step.index + 1, following), counted_requests=counted)
        draft = draft.with_state(state)
        return write(
            tick,
            draft,
            Action.ADVANCE,
            following,
            f"Advancing {draft.state.revision} from {step.weight}% to {following}%.",
            EventReason.CANARY_ADVANCED,
            phase=Phase.PROGRESSING,
        )
    return promote(
        tick,
        draft,
        f"Promoting {draft.state.revision}: its last step {step.weight}% passed; removing "
        "canaryTrafficPercent.",
    )


def _step_passed_text(tick: Tick, state: RolloutState, step: StepProgress) -> str:
    assert step.started_at is not None
    assert step.passed_at is not None
    requests = state.evaluation.requests
    final = step.index + 1 >= len(tick.steps)
    shown = (
        f"latest evaluation passed at {describe_time(step.passed_at)}"
        if final or state.evaluation.verdict is EvaluationVerdict.PASS
        else f"nothing failed or lacked data at {describe_time(step.passed_at)} (checks not decided yet "
        "are judged again at the next step, on its own evidence, and pooled for the promotion)"
    )
    return (
        f"Step {step.weight}% passed: held {duration(step.passed_at - step.started_at)} (window "
        f"{tick.plan.window_texts[step.index]}), {(requests or 0):.0f} canary requests "
        f"(minRequests {tick.plan.min_requests[step.index]}), {shown}."
    )


def promoting(tick: Tick, draft: Draft) -> Final:
    """Waiting for KServe to record the promotion; then bake, or done."""
    observed = tick.observed
    revision = draft.state.revision
    if not promotion_recorded(tick, draft.state):
        return wait(
            tick,
            draft,
            f"Waiting for KServe to record the promotion of {revision} (latestRolledoutRevision is "
            f"{observed.latest_rolledout_revision or 'unset'}, {revision} receives "
            f"{observed.weight_of(revision)}%).",
            EventReason.CANARY_WAITING,
        )
    draft, event, text = after_promotion(tick, draft)
    return wait(tick, draft, text, event)


def promotion_recorded(tick: Tick, state: RolloutState) -> bool:
    """KServe routes 100% to the canary and records it as the rolled-out revision."""
    observed = tick.observed
    revision = state.revision
    return (
        observed.latest_rolledout_revision == revision
        and observed.weight_of(revision) == 100
        and observed.canary_traffic_percent is None
    )


def after_promotion(tick: Tick, draft: Draft) -> tuple[Draft, EventReason, str]:
    """Move on from a recorded promotion: bake, or done."""
    revision = draft.state.revision
    if tick.spec.bake > 0:
        draft = draft.with_state(replace(draft.state, phase=Phase.BAKING, bake_started_at=tick.now))
        return (
            draft,
            EventReason.CANARY_BAKING,
            (
                f"KServe recorded the promotion of {revision}; baking for {format_duration(tick.spec.bake)}: "
                "absolute limits are still watched and a failure rolls back (to a cold previous revision)."
            ),
        )
    draft = draft.with_state(replace(draft.state, phase=Phase.SUCCEEDED))
    return (
        draft,
        EventReason.CANARY_SUCCEEDED,
        (f"Rollout of {revision} succeeded: KServe records it as the rolled-out revision at 100%."),
    )


def after_bake_evaluation(tick: Tick, draft: Draft) -> Final:
    """Baking, once this tick's evidence (if any) is judged: done when the bake is over without a
    failure (judged after its end, when there are absolute limits to watch)."""
    state = draft.state
    bake_start = state.bake_started_at
    assert bake_start is not None
    bake_end = bake_start + tick.plan.bake
    last = state.evaluation
    if not tick.plan.absolute_checks:
        # Only relative limits, and the stable revision gets no traffic any more: nothing to watch.
        finished = tick.now >= bake_end
    else:
        finished = (
            last.at is not None
            and last.at >= bake_end
            and last.verdict is not EvaluationVerdict.FAIL
            and not last.query_error
        )
    if finished:
        return wait(
            tick,
            draft.with_state(replace(state, phase=Phase.SUCCEEDED)),
            f"Rollout of {state.revision} succeeded: the {format_duration(tick.spec.bake)} bake is over "
            "without a failure.",
            EventReason.CANARY_SUCCEEDED,
        )
    return wait(
        tick,
        draft,
        f"Baking {state.revision}: {duration(tick.now - bake_start)} of {format_duration(tick.spec.bake)}.",
        evaluation_event(draft, default=EventReason.CANARY_BAKING),
    )


def evaluation_event(draft: Draft, default: EventReason = EventReason.CANARY_WAITING) -> EventReason:
    """What a wait after this tick's evaluation (if any) tells."""
    evaluation = draft.evaluation
    if evaluation is None:
        return default
    if evaluation.verdict is EvaluationVerdict.FAIL:
        return EventReason.CANARY_CHECK_FAILED
    if evaluation.has_error:
        return EventReason.PROMETHEUS_UNAVAILABLE
    if evaluation.verdict is EvaluationVerdict.INCONCLUSIVE:
        return EventReason.CANARY_INCONCLUSIVE
    return EventReason.CANARY_EVALUATED
