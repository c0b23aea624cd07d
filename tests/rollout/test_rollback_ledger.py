"""Losing the state never undoes a rollback; a state of another InferenceService object is never used.

Issue 11, items 1 and 2: after a rollback, deleting the state ConfigMap made the controller take the
rolled-back revision (at 0, Ready) for a dark launch and write the first step again; a state read
for an InferenceService deleted and re-created under the same name drove the new object.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from canary.kserve.status_model import KServeSim
from canary.rollout import Action, PauseKind, Phase, RolloutState, decide, evidence_request
from canary.rollout.ledger import (
    MAX_LEDGER_ENTRIES,
    LedgerFormatError,
    RollbackLedger,
    ledger_after,
)
from canary.rollout.observed import ObservedInferenceService
from canary.rollout.vocabulary import EventReason

from .helpers import HEALTHY_EVIDENCE, T0, at, make_policy, progressing

UID = "0b5f3c1e-old"
NEW_UID = "7d1a9e42-new"
CANARY = "llama-predictor-00002"


def seen(sim: KServeSim, uid: str = UID) -> ObservedInferenceService:
    return replace(sim.observe(), uid=uid)


def rolled_back() -> tuple[KServeSim, RolloutState, RollbackLedger]:
    """A canary rolled back at its first step (critical OOM), the rollback patched and reconciled."""
    harness = progressing()
    observed = seen(harness.sim)
    harness.now = at(minutes=5)
    policy = harness.policy
    request = evidence_request(policy, observed, harness.state, harness.now)
    assert request is not None
    decision = decide(policy, observed, harness.state, HEALTHY_EVIDENCE.failing(oom=1)(request), harness.now)
    assert decision.action is Action.ROLLBACK
    ledger = ledger_after(decision, RollbackLedger(), observed.uid)
    assert ledger is not None
    harness.sim.set_percent(decision.weight)
    harness.sim.reconcile()
    after = seen(harness.sim)
    assert after.canary_traffic_percent == 0 and after.canary_ready
    return harness.sim, decision.new_state, ledger


def test_deleting_the_state_after_a_rollback_never_writes_the_rolled_back_revision_again() -> None:
    sim, _, ledger = rolled_back()
    assert ledger.has(CANARY) and ledger.inference_service_uid == UID
    policy = make_policy()
    state = RolloutState()  # the state ConfigMap was deleted
    for minute in range(6, 60, 3):
        now = at(minutes=minute)
        observed = seen(sim)
        request = evidence_request(policy, observed, state, now, ledger=ledger)
        decision = decide(policy, observed, state, None, now, ledger=ledger)
        assert request is None
        assert not decision.action.writes, decision.reasons
        assert decision.new_state.phase is Phase.ROLLED_BACK
        assert decision.new_state.was_rolled_back(CANARY)
        state = RolloutState.from_json(decision.new_state.to_json())
    first = decide(policy, seen(sim), RolloutState(), None, at(minutes=6), ledger=ledger)
    assert first.event_reason is EventReason.REVISION_NOT_RETRIED
    assert any("rollback ledger records" in reason for reason in first.reasons)


def test_a_resume_never_restores_traffic_to_a_rolled_back_revision_after_the_state_was_lost() -> None:
    """Found by the ledger property: state lost, someone removes the field (the rolled-back revision
    takes 100 %), the controller adopts that, someone writes 0, the controller pauses for the outside
    change, and a resume 'restores the controller's value' — which was the field's absence."""
    from canary.rollout import apply_command

    sim, _, ledger = rolled_back()
    policy = make_policy()
    sim.set_percent(None)
    sim.reconcile()
    adopted = decide(policy, seen(sim), RolloutState(), None, at(minutes=6), ledger=ledger)
    assert not adopted.action.writes
    sim.set_percent(0)
    sim.reconcile()
    state = adopted.new_state
    for minute in (7, 8):
        decision = decide(policy, seen(sim), state, None, at(minutes=minute), ledger=ledger)
        assert not decision.action.writes or decision.weight == 0, decision.reasons
        state = decision.new_state
    resumed = apply_command(state, "resume", at(minutes=9), by="alice").state
    decision = decide(policy, seen(sim), resumed, None, at(minutes=10), ledger=ledger)
    assert not decision.action.writes or (decision.action, decision.weight) == (Action.ROLLBACK, 0)
    assert decision.new_state.was_rolled_back(CANARY)


def test_a_ready_revision_at_zero_without_state_or_ledger_pauses() -> None:
    sim, _, _ = rolled_back()
    decision = decide(make_policy(), seen(sim), RolloutState(), None, at(minutes=6))
    assert decision.action is Action.PAUSE
    assert decision.new_state.pause is not None
    assert decision.new_state.pause.kind is PauseKind.UNEXPECTED_START_VALUE
    headline = decision.reasons[0]
    assert f"{CANARY} is Ready at 0 % (canaryTrafficPercent 0) and is not the rolled-out revision" in headline
    assert "llama-predictor-00001" in headline and "no rollout state or rollback ledger" in headline
    assert "`kserve-canary resume`" in headline and "`abort`" in headline
    # The pause holds: nothing is written until a person says what was meant.
    again = decide(make_policy(), seen(sim), decision.new_state, None, at(minutes=9))
    assert not again.action.writes


def test_a_ready_revision_at_zero_without_state_starts_on_resume_and_is_recorded_on_abort() -> None:
    from canary.rollout import apply_command

    sim, _, _ = rolled_back()
    policy = make_policy()
    paused = decide(policy, seen(sim), RolloutState(), None, at(minutes=6)).new_state
    resumed = apply_command(paused, "resume", at(minutes=7), by="alice").state
    started = decide(policy, seen(sim), resumed, None, at(minutes=7))
    assert (started.action, started.weight) == (Action.START, 10)
    aborted = apply_command(paused, "abort", at(minutes=7), by="alice").state
    decision = decide(policy, seen(sim), aborted, None, at(minutes=7))
    assert (decision.action, decision.weight) == (Action.ROLLBACK, 0)
    ledger = ledger_after(decision, RollbackLedger(), UID)
    assert ledger is not None and ledger.has(CANARY)


def test_a_dark_launch_first_seen_before_it_is_ready_still_starts_once_ready() -> None:
    sim = KServeSim.serving()
    policy = make_policy()
    sim.change_model("s3://m/v2", percent=0)
    sim.reconcile()
    waiting = decide(policy, seen(sim), RolloutState(), None, T0)
    assert waiting.action is Action.WAIT and waiting.new_state.phase is Phase.PENDING
    sim.make_ready()
    sim.reconcile()
    started = decide(policy, seen(sim), waiting.new_state, None, at(minutes=1))
    assert (started.action, started.weight) == (Action.START, 10)


def test_an_empty_state_with_a_percentage_pauses_with_a_true_reason() -> None:
    harness = progressing()
    harness.sim.set_percent(50)  # where the lost rollout had got to
    harness.sim.reconcile()
    empty = RolloutState()  # what an empty state.json reads as
    decision = decide(harness.policy, seen(harness.sim), empty, None, at(minutes=30))
    assert decision.action is Action.PAUSE
    headline = decision.reasons[0]
    assert "No rollout state was found for ml/llama" in headline
    assert "canaryTrafficPercent is 50 for revision llama-predictor-00002" in headline
    assert "rolled-out revision is llama-predictor-00001" in headline
    assert "came with canaryTrafficPercent" not in headline


def test_a_state_that_lost_the_rollback_rolls_back_again_from_the_ledger() -> None:
    sim, _, ledger = rolled_back()
    harness = progressing()  # the same rollout, as a restored copy of its state remembers it
    sim.set_percent(10)  # and someone put the step back
    sim.reconcile()
    decision = decide(harness.policy, seen(sim), harness.state, None, at(minutes=8), ledger=ledger)
    assert (decision.action, decision.weight) == (Action.ROLLBACK, 0)
    assert "the rollback ledger records" in decision.reasons[0]


def test_state_of_a_deleted_and_recreated_inference_service_is_never_used() -> None:
    # The old object had a rollout at 30% of its 00002; the new one (same name, new uid) has just
    # been created and Knative numbered its revisions from 00001 again.
    harness = progressing()
    old_state = replace(harness.state, inference_service_uid=UID)
    old_ledger = RollbackLedger(UID).recording(CANARY, "f", T0, UID)
    recreated = KServeSim.serving()
    recreated.change_model("s3://m/v2", percent=0)
    recreated.reconcile()
    recreated.make_ready()
    recreated.reconcile()
    observed = seen(recreated, NEW_UID)
    assert observed.latest_created_revision == CANARY
    decision = decide(harness.policy, observed, old_state, None, at(minutes=5), ledger=old_ledger)
    assert not decision.action.writes
    assert decision.new_state.inference_service_uid == NEW_UID
    assert decision.new_state.history[:-1] == ()  # nothing of the old object's record survives
    assert any("describes another InferenceService object" in reason for reason in decision.reasons)
    # The old ledger does not apply to the new object either: 00002 is not "rolled back" here.
    assert decision.event_reason is not EventReason.REVISION_NOT_RETRIED


def test_a_state_binds_to_its_object_and_an_old_one_only_through_its_owner() -> None:
    bound = RolloutState(revision="r", inference_service_uid=UID)
    assert bound.bound_to(UID, owner_uid=None) is bound
    assert bound.bound_to(NEW_UID, owner_uid=NEW_UID) is None
    assert bound.bound_to(None, owner_uid=None) is bound
    legacy = RolloutState(revision="r")
    assert legacy.bound_to(UID, owner_uid=UID) == replace(legacy, inference_service_uid=UID)
    assert legacy.bound_to(UID, owner_uid=NEW_UID) is None
    assert legacy.bound_to(UID, owner_uid=None) is None
    assert RolloutState().bound_to(UID, owner_uid=None) == RolloutState(inference_service_uid=UID)


def test_a_version_1_state_reads_without_a_uid() -> None:
    old = json.dumps({"schemaVersion": 1, "phase": "Progressing", "revision": "r-2", "fingerprint": "f"})
    state = RolloutState.from_json(old)
    assert state.inference_service_uid is None
    assert json.loads(state.to_json())["schemaVersion"] == 2


def test_the_ledger_is_bounded_round_trips_and_belongs_to_one_object() -> None:
    ledger = RollbackLedger()
    for number in range(MAX_LEDGER_ENTRIES + 5):
        ledger = ledger.recording(f"llama-predictor-{number:05d}", f"fp{number}", T0, UID)
    assert len(ledger.entries) == MAX_LEDGER_ENTRIES
    assert not ledger.has("llama-predictor-00000")
    assert ledger.recording("llama-predictor-00036", "x", T0, UID) == ledger
    assert RollbackLedger.from_json(ledger.to_json()) == ledger
    assert ledger.for_inference_service(NEW_UID) == RollbackLedger(NEW_UID)
    fresh = ledger.recording("llama-predictor-00001", "f", T0, NEW_UID)
    assert fresh.inference_service_uid == NEW_UID and len(fresh.entries) == 1
    long = json.loads(ledger.to_json())
    long["entries"] = long["entries"] * 3
    assert len(RollbackLedger.from_json(json.dumps(long)).entries) == MAX_LEDGER_ENTRIES


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[]", "not a JSON object"),
        ('{"entries": []}', "schemaVersion None"),
        ('{"schemaVersion": 2}', "schemaVersion 2"),
        ('{"schemaVersion": true}', "schemaVersion True"),
        ('{"schemaVersion": 1, "entries": [{"revision": "r"}]}', "invalid at entries"),
    ],
)
def test_an_unreadable_ledger_is_refused(text: str, message: str) -> None:
    with pytest.raises(LedgerFormatError, match=message):
        RollbackLedger.from_json(text)


def test_only_a_rollback_adds_to_the_ledger_and_only_once() -> None:
    harness = progressing()
    waited = harness.tick(30)
    assert ledger_after(waited, RollbackLedger(), UID) is None
    sim, state, ledger = rolled_back()
    policy = make_policy()
    abort = replace(state, phase=Phase.PROGRESSING)
    decision = decide(policy, seen(sim), abort, None, at(minutes=9), ledger=ledger)
    assert decision.action is Action.ROLLBACK
    assert ledger_after(decision, ledger, UID) is None
