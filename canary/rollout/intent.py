"""The write-ahead intent protocol: who wrote ``canaryTrafficPercent`` (docs/design.md §2.4).

Before the shell patches the percentage it stores the state with an *intent* (the value about to be
written). The next decision compares the spec with it:

* the spec shows the intent — our write landed (perhaps just before a crash): it becomes the known
  value (``spec_weight``) and the intent is cleared;
* the spec shows the known value — nothing happened, or the write has not landed: the intent is
  written again, with the id of the original decision;
* the spec shows anything else — somebody else changed it: the rollout pauses.

Values found in the spec rather than written by the controller are recorded with
``by_controller=False``, so a leftover of our own earlier rollout is told apart from a value someone
set with the spec.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from canary.rollout.observed import ObservedInferenceService
from canary.rollout.state import RolloutState, StepProgress, WeightRecord
from canary.rollout.vocabulary import Action, EventReason

__all__ = [
    "controller_weights",
    "found_in_spec",
    "heading_for",
    "reconcile_spec_weight",
    "record_write",
    "reissued_action",
]


def found_in_spec(observed: ObservedInferenceService, now: datetime) -> WeightRecord:
    """The percentage in the spec, adopted as known (not written by the controller)."""
    return WeightRecord(
        observed.canary_traffic_percent, observed.latest_created_revision, now, by_controller=False
    )


def controller_weights(state: RolloutState) -> set[int | None]:
    """The values the controller itself wrote or meant to write (known value and intent)."""
    return {record.weight for record in (state.spec_weight, state.intent) if record and record.by_controller}


def reconcile_spec_weight(
    state: RolloutState, observed: ObservedInferenceService, now: datetime
) -> RolloutState | None:
    """``state`` with the spec's percentage accounted for, or None when somebody else changed it."""
    observed_weight = observed.canary_traffic_percent
    if state.intent is not None and observed_weight == state.intent.weight:
        # Our write landed (perhaps before a crash): it is now the known value.
        return replace(state, spec_weight=state.intent, intent=None)
    if state.spec_weight is None:
        return replace(state, spec_weight=found_in_spec(observed, now))
    if observed_weight == state.spec_weight.weight:
        return state
    return None


def heading_for(
    state: RolloutState, weight: int | None, observed: ObservedInferenceService, now: datetime
) -> RolloutState:
    """``state`` heading for ``weight`` (its step's clock restarts): an intent unless the spec has it."""
    step: StepProgress | None = state.step
    if step is not None:
        step = replace(step, started_at=None, passed_at=None)
    if weight == observed.canary_traffic_percent:
        return replace(state, step=step, intent=None)
    return replace(state, step=step, intent=WeightRecord(weight, state.revision, now))


def record_write(
    state: RolloutState, weight: int | None, observed: ObservedInferenceService, now: datetime
) -> RolloutState:
    """``state`` about to write ``weight``: the intent, stored before the patch."""
    observed_weight = observed.canary_traffic_percent
    if state.spec_weight is None or state.spec_weight.weight != observed_weight:
        # The value being overwritten becomes the known one: our own earlier write that has
        # landed, or (for abort/promote commands, which override anything) whatever is there.
        landed = state.intent is not None and state.intent.weight == observed_weight
        state = replace(state, spec_weight=state.intent if landed else found_in_spec(observed, now))
    record = WeightRecord(weight, state.revision, now)
    if weight == observed_weight:
        # Already in the spec (a rollback of a dark launch): nothing to confirm later. The
        # decision still writes it, a harmless no-op patch, so the shell acts uniformly.
        return replace(state, spec_weight=record, intent=None)
    return replace(state, intent=record)


def reissued_action(intent: WeightRecord, step: StepProgress | None) -> tuple[Action, EventReason]:
    """What re-writing a recorded intent is: the action (and reason) of the decision that recorded it."""
    if intent.weight is None:
        return Action.PROMOTE, EventReason.CANARY_PROMOTED
    if intent.weight == 0:
        return Action.ROLLBACK, EventReason.CANARY_ROLLED_BACK
    if step is not None and step.index == 0:
        return Action.START, EventReason.CANARY_STARTED
    return Action.ADVANCE, EventReason.CANARY_ADVANCED
