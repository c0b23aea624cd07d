"""Starting a rollout (docs/design.md §2.2): new revisions, first sight, dark launches, start values.

A new revision begins a fresh rollout according to the percentage its spec came with: the first
step is accepted as it is; no percentage (``autoStart``) or the controller's own value from the
previous rollout is overwritten with the first step; 0 is a dark launch, moved to the first step once
Ready; anything else pauses. A pre-rollout gate pins the revision at 0 until it passes. On first
sight (no state) a steady InferenceService is adopted, and a percentage is not taken for a plan.
"""

from __future__ import annotations

from dataclasses import replace

from canary.policy.model import GateStage
from canary.policy.units import format_duration
from canary.rollout.artefact import describe_artefact
from canary.rollout.draft import Draft, Final, Tick, duration, weight_text
from canary.rollout.gating import gate_names, gated, gates_hold, gates_passed_headline
from canary.rollout.intent import controller_weights, found_in_spec
from canary.rollout.knative import KnativeDeadline, deadline_warning, is_progress_deadline_failure
from canary.rollout.outcomes import pause, rollback, wait, write
from canary.rollout.state import (
    MAX_ROLLED_BACK,
    PauseKind,
    Phase,
    RolledBackRevision,
    RolloutState,
    StepProgress,
    describe_time,
)
from canary.rollout.vocabulary import Action, EventReason, Severity

__all__ = [
    "end_dark_launch",
    "failed_by_knative",
    "first_deployment",
    "first_sight",
    "knative_deadline_warning",
    "new_revision",
    "not_retried",
    "rolled_back_before",
]


def first_sight(tick: Tick, draft: Draft, canary: str) -> Final:
    """No state yet: adopt a steady InferenceService, or start on a canary already under way."""
    observed = tick.observed
    if tick.ledger.has(canary):
        return not_retried(tick, draft, canary)
    if observed.latest_rolledout_revision is None:
        return first_deployment(tick, draft, canary)
    if canary == observed.latest_rolledout_revision:
        state = replace(
            draft.state,
            phase=Phase.IDLE,
            revision=canary,
            fingerprint=observed.predictor_fingerprint,
            artefact=observed.artefact,
            spec_weight=found_in_spec(observed, tick.now),
        )
        return wait(
            tick,
            draft.with_state(state),
            f"Now watching {tick.policy.key}: {canary} is the rolled-out revision; a new predictor "
            "revision will start a rollout.",
            EventReason.CANARY_IDLE,
        )
    return _start(tick, draft, canary, first_sight=True)


def new_revision(tick: Tick, draft: Draft, canary: str) -> Final:
    """A revision the state has not seen: a new rollout, unless it was rolled back before."""
    if rolled_back_before(tick, draft.state, canary):
        return not_retried(tick, draft, canary)
    if tick.observed.latest_rolledout_revision is None:
        return first_deployment(tick, draft, canary)
    return _start(tick, draft, canary)


def first_deployment(tick: Tick, draft: Draft, canary: str) -> Final:
    return wait(
        tick,
        draft,
        f"{canary} is the first deployment of {tick.policy.key}: KServe sends it 100% and there is "
        "no stable revision to compare with, so there is nothing to roll out.",
        EventReason.FIRST_DEPLOYMENT,
    )


def rolled_back_before(tick: Tick, state: RolloutState, revision: str) -> bool:
    """In the state's memory of rollbacks or in the ledger's (which survives losing the state)."""
    return state.was_rolled_back(revision) or tick.ledger.has(revision)


def not_retried(tick: Tick, draft: Draft, canary: str) -> Final:
    """A revision rolled back before: remembered as rolled back, never started again."""
    state = draft.state
    rolled_back = state.rolled_back
    recorded = tick.ledger.entry(canary)
    if recorded is not None and not state.was_rolled_back(canary):
        rolled_back = (*rolled_back, RolledBackRevision(canary, recorded.at))[-MAX_ROLLED_BACK:]
        draft = draft.noting(
            f"The rollback ledger records {canary} as rolled back at {describe_time(recorded.at)} "
            "(the rollout state did not remember it)."
        )
    state = RolloutState(
        phase=Phase.ROLLED_BACK,
        inference_service_uid=state.inference_service_uid,
        revision=canary,
        fingerprint=tick.observed.predictor_fingerprint,
        artefact=tick.observed.artefact,
        spec_weight=found_in_spec(tick.observed, tick.now),
        rolled_back=rolled_back,
        history=state.history,
    )
    return wait(
        tick,
        draft.with_state(state),
        f"{canary} was rolled back before and is never retried; push a new spec to try again.",
        EventReason.REVISION_NOT_RETRIED,
    )


def _start(tick: Tick, draft: Draft, canary: str, *, first_sight: bool = False) -> Final:
    """A new revision: a fresh rollout, begun according to the percentage the spec came with.

    On first sight (no state: never seen, or the state was lost) a percentage is not taken for
    a plan: a Ready revision at 0 may be one rolled back before the state was lost, and any
    other value may be a step of a rollout whose analysis is gone. Both pause, saying so.
    """
    first = tick.steps[0].weight
    spec_weight = tick.observed.canary_traffic_percent
    ours = controller_weights(draft.state)
    draft = _begin_rollout(tick, draft, canary)
    if tick.observed.knative_failed and not tick.observed.canary_ready:
        return failed_by_knative(tick, draft)
    if gated(tick, GateStage.PRE_ROLLOUT) and spec_weight != 0:
        leftover = spec_weight is not None and spec_weight in ours
        if spec_weight == first or leftover or (spec_weight is None and tick.spec.auto_start):
            return _start_pinned(tick, draft, canary, first, spec_weight)
    if spec_weight == first:
        return _start_at_first_step(tick, draft, canary, first, ours)
    if spec_weight == 0:
        if first_sight and tick.observed.canary_ready:
            return _pause_unexplained_zero(tick, draft, canary)
        return _start_dark_launch(tick, draft, canary, first)
    leftover = spec_weight is not None and spec_weight in ours
    if spec_weight is None or leftover:
        return _start_by_writing(tick, draft, canary, first, spec_weight, leftover=leftover)
    if first_sight:
        return _pause_on_first_sight_value(tick, draft, canary, first, spec_weight)
    return _pause_on_start_value(tick, draft, canary, first, spec_weight)


def _begin_rollout(tick: Tick, draft: Draft, canary: str) -> Draft:
    """The state of a rollout of ``canary`` at its first step, and why it begins."""
    observed = tick.observed
    previous = draft.state
    stable = observed.stable_for(canary)
    if previous.rollout_active and previous.revision is not None:
        at = weight_text(previous.spec_weight.weight) if previous.spec_weight else "an unknown weight"
        draft = draft.noting(
            f"{canary} replaces {previous.revision}, whose rollout was {previous.phase} at {at}: the "
            "analysis restarts from the first step for the new revision."
        )
    draft = draft.noting(
        f"New revision {canary} (predictor spec {observed.predictor_fingerprint}) serves "
        f"{describe_artefact(observed.artefact)}; stable revision {stable or 'unknown'} serves "
        f"{describe_artefact(previous.artefact_of(stable))}."
    )
    beyond_knative = knative_deadline_warning(tick, canary)
    if beyond_knative is not None and not observed.canary_ready:
        draft = draft.warning(beyond_knative)
    if stable is not None and rolled_back_before(tick, previous, stable):
        draft = draft.warning(
            f"KServe routes the remaining traffic to {stable}, which was rolled back earlier (KServe "
            "still tracks it as rolled out after a post-promotion rollback)."
        )
    state = RolloutState(
        phase=Phase.PROGRESSING if observed.canary_ready else Phase.PENDING,
        inference_service_uid=previous.inference_service_uid,
        revision=canary,
        fingerprint=observed.predictor_fingerprint,
        stable_revision=stable,
        # KServe keeps no spec but the newest: the stable revision's artefact is what the state
        # recorded while it was the revision under management (or the stable one before).
        artefact=observed.artefact,
        stable_artefact=previous.artefact_of(stable),
        started_at=tick.now,
        started_generation=observed.generation,
        step=StepProgress(0, tick.steps[0].weight),
        spec_weight=found_in_spec(observed, tick.now),
        rolled_back=previous.rolled_back,
        history=previous.history,
    )
    return draft.with_state(state)


def knative_deadline_warning(tick: Tick, revision: str) -> str | None:
    """When the policy's progressDeadline outlasts the one Knative applies to ``revision``."""
    knative = tick.observed.knative_deadline or KnativeDeadline.default(
        "config-deployment not read (a revision annotation would say otherwise)"
    )
    return deadline_warning(revision, tick.plan.progress_deadline.total_seconds(), knative)


def failed_by_knative(tick: Tick, draft: Draft) -> Final:
    """Knative failed the canary before it was Ready: it never retries it, so neither does waiting."""
    state = draft.state
    assert state.started_at is not None
    message = tick.observed.revision_failure or ""
    headline = (
        f"Knative failed {state.revision} before it became Ready (RevisionFailed: {message}), "
        f"{duration(tick.now - state.started_at)} after its rollout started; rolled back at once rather "
        f"than at progressDeadline {format_duration(tick.spec.progress_deadline)}."
    )
    if is_progress_deadline_failure(message):
        knative = tick.observed.knative_deadline
        applied = f", {knative.text}" if knative is not None else ""
        headline += (
            f" It missed Knative's progress deadline{applied}: for a model that loads longer, annotate "
            "the InferenceService serving.knative.dev/progress-deadline."
        )
    return rollback(tick, draft, headline)


def _start_at_first_step(tick: Tick, draft: Draft, canary: str, first: int, ours: set[int | None]) -> Final:
    """The spec already has the first step: nothing to write."""
    ready = tick.observed.canary_ready
    origin = "left from the previous rollout" if first in ours else "set with the spec"
    draft = draft.noting(f"canaryTrafficPercent is already the first step {first}% ({origin}).")
    if ready and tick.observed.weight_of(canary) == first:
        # Its clock starts now, as it would on the next tick: decide() is idempotent.
        state = draft.state
        draft = draft.with_state(
            replace(
                state,
                step=StepProgress(0, first, started_at=tick.now),
                evidence_since=state.evidence_since or tick.now,
            )
        )
    return wait(
        tick,
        draft,
        f"Rollout of {canary} started at the first step {first}% ({origin}); "
        + ("evaluating once status traffic shows it." if ready else "waiting for it to become Ready."),
        EventReason.CANARY_STARTED,
    )


def _start_pinned(tick: Tick, draft: Draft, canary: str, first: int, spec_weight: int | None) -> Final:
    """A pre-rollout gate: 0 is written at once (KServe would send a revision without a
    percentage everything once Ready), the first step only after the gate passed."""
    names = ", ".join(gate_names(tick, GateStage.PRE_ROLLOUT))
    draft = draft.with_state(replace(draft.state, phase=Phase.PENDING))
    exposed = tick.observed.weight_of(canary)
    if tick.observed.canary_ready and exposed > 0:
        draft = draft.warning(
            f"{canary} was already Ready with {exposed}% before the controller acted; 0% pins all "
            f"traffic back to {draft.state.stable_revision or 'the previous revision'}."
        )
    had = "the spec had no canaryTrafficPercent" if spec_weight is None else f"the spec had {spec_weight}%"
    return write(
        tick,
        draft,
        Action.START,
        0,
        f"Starting the rollout of {canary}: writing 0% ({had}) so that it gets no traffic before its "
        f"pre-rollout gate {names} passes; the first step {first}% follows.",
        EventReason.CANARY_STARTED,
        phase=Phase.PENDING,
    )


def _start_dark_launch(tick: Tick, draft: Draft, canary: str, first: int) -> Final:
    """``canaryTrafficPercent: 0``: the first step once the canary is Ready."""
    if tick.observed.canary_ready and gated(tick, GateStage.PRE_ROLLOUT):
        draft = draft.with_state(replace(draft.state, phase=Phase.PENDING))
        held = gates_hold(tick, draft, frozenset({GateStage.PRE_ROLLOUT}), None)
        if isinstance(held, Final):
            return held
        return end_dark_launch(tick, held, first, gates_passed_headline(tick, canary, first))
    if tick.observed.canary_ready:
        return end_dark_launch(
            tick,
            draft,
            first,
            f"Dark-launched revision {canary} is Ready: starting its rollout at the first step {first}%.",
        )
    return wait(
        tick,
        draft,
        f"Rollout of {canary} started as a dark launch (canaryTrafficPercent 0): it moves to the "
        f"first step {first}% once Ready.",
        EventReason.CANARY_STARTED,
    )


def end_dark_launch(tick: Tick, draft: Draft, first: int, headline: str) -> Final:
    """A dark-launched canary (``canaryTrafficPercent: 0``) is Ready: write the first step."""
    return write(
        tick, draft, Action.START, first, headline, EventReason.CANARY_STARTED, phase=Phase.PROGRESSING
    )


def _start_by_writing(
    tick: Tick, draft: Draft, canary: str, first: int, spec_weight: int | None, *, leftover: bool
) -> Final:
    """No percentage (autoStart), or our own from the previous rollout: write the first step."""
    observed = tick.observed
    ready = observed.canary_ready
    if spec_weight is None and not tick.spec.auto_start:
        state = replace(draft.state, phase=Phase.IDLE, step=None, stable_revision=None, started_at=None)
        return wait(
            tick,
            draft.with_state(state),
            f"New revision {canary} has no canaryTrafficPercent and autoStart is off: KServe sends "
            "it 100% once Ready, unguarded. Put the first step in the spec, or enable autoStart.",
            EventReason.UNGUARDED_ROLLOUT,
            Severity.WARNING,
        )
    exposed = observed.weight_of(canary)
    event = EventReason.CANARY_STARTED
    if ready and (spec_weight is None or exposed > first):
        event = EventReason.UNGUARDED_ROLLOUT
        draft = draft.with_state(replace(draft.state, unguarded=True))
        draft = draft.warning(
            f"Unguarded rollout: {canary} was already Ready with "
            f"{weight_text(spec_weight) if spec_weight is not None else '100% (no field)'} before "
            f"the controller acted (status shows {exposed}%); the first step pins {100 - first}% "
            f"back to {draft.state.stable_revision or 'the previous revision'} while its pods are still "
            "there."
        )
    elif leftover:
        draft = draft.noting(
            f"canaryTrafficPercent {spec_weight} is the controller's own value from the previous "
            "rollout, not a value set with the spec."
        )
    return write(
        tick,
        draft,
        Action.START,
        first,
        f"Starting the rollout of {canary}: writing the first step {first}%"
        + ("." if ready else " before it becomes Ready."),
        event,
    )


def _pause_on_start_value(tick: Tick, draft: Draft, canary: str, first: int, spec_weight: int) -> Final:
    """A percentage that is neither the first step nor 0: a person must say what was meant."""
    reason = (
        f"New revision {canary} came with canaryTrafficPercent {spec_weight}, which is neither the "
        f"policy's first step ({first}) nor 0 (dark launch). Paused without writing: set it to {first} "
        f"or remove it in Git, or `kserve-canary resume` to start from {first}%."
    )
    return pause(tick, draft, PauseKind.UNEXPECTED_START_VALUE, reason, resume_phase=draft.state.phase)


def _pause_unexplained_zero(tick: Tick, draft: Draft, canary: str) -> Final:
    """No state, no ledger entry, and a Ready revision at 0 that KServe has not rolled out."""
    rolled_out = tick.observed.latest_rolledout_revision
    reason = (
        f"{canary} is Ready at 0 % (canaryTrafficPercent 0) and is not the rolled-out revision "
        f"({rolled_out}); no rollout state or rollback ledger was found that says why (a rollback "
        f"whose state was lost, or a dark launch): paused without writing. Run `kserve-canary "
        f"resume` to start its rollout at {tick.steps[0].weight}% or `abort` to keep it at 0 %."
    )
    return pause(tick, draft, PauseKind.UNEXPECTED_START_VALUE, reason, resume_phase=draft.state.phase)


def _pause_on_first_sight_value(tick: Tick, draft: Draft, canary: str, first: int, spec_weight: int) -> Final:
    """No state, and a percentage the spec was not given by this policy's first step."""
    rolled_out = tick.observed.latest_rolledout_revision
    reason = (
        f"No rollout state was found for {tick.policy.key}, and canaryTrafficPercent is "
        f"{spec_weight} for revision {canary} (the rolled-out revision is {rolled_out}): a rollout "
        f"whose state was lost, or a value set by hand. Paused without writing: `kserve-canary "
        f"resume` starts its rollout from the first step {first}%, `abort` rolls it back."
    )
    return pause(tick, draft, PauseKind.UNEXPECTED_START_VALUE, reason, resume_phase=draft.state.phase)
