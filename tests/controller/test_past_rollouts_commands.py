"""Rollouts ended through the reconciler (over HTTP against the API emulator) land in rollouts.json in
the same write as their state: an abort, and a new revision superseding a rollout under way; an
unreadable record is kept as it is even then."""

from __future__ import annotations

import pytest

from canary.kserve.store import ROLLOUTS_KEY, STATE_KEY
from canary.rollout.past import PastRolloutsFormatError, RolloutOutcome
from canary.rollout.records import CommandRequest
from canary.rollout.state import CommandKind, Phase
from tests.controller.test_command_binding import World, world  # noqa: F401 - the fixture

A, B = "llama-predictor-00002", "llama-predictor-00003"


def _abort(world: World, revision: str) -> None:  # noqa: F811
    state = world.store.load("ml", "llama").state()
    command = CommandRequest(
        CommandKind.ABORT, by="alice", at=world.clock(), revision=revision,
        step=state.step.index if state.step else None, id="a1",
    )  # fmt: skip
    world.store.request_command("ml", "llama", command, issuer="alice")


def _state_writes(world: World) -> list[tuple[bool, bool]]:  # noqa: F811
    """(changed state.json, changed rollouts.json) for every write of the state ConfigMap."""
    return [
        (entry.touched(f"data.{STATE_KEY}"), entry.touched(f"data.{ROLLOUTS_KEY}"))
        for entry in world.emulator.requests.entries(path_contains="/configmaps/kserve-canary-llama")
        if entry.method in {"PUT", "POST"} and entry.status in {200, 201}
    ]


def test_an_abort_and_a_superseded_rollout_are_recorded_with_the_decisions_that_end_them(
    world: World,  # noqa: F811
) -> None:
    world.push("s3://m/v2")
    world.rollout_of(A)
    world.push("s3://m/v3")  # B replaces A's rollout under way
    world.rollout_of(B, frozenset({Phase.PENDING, Phase.PROGRESSING}))
    _abort(world, B)
    world.reconcile()
    stored = world.store.load("ml", "llama")
    assert stored.state().phase is Phase.ROLLED_BACK
    record = stored.past_rollouts()
    assert [(entry.revision, entry.outcome) for entry in record.rollouts] == [
        (A, RolloutOutcome.SUPERSEDED),
        (B, RolloutOutcome.ABORTED),
    ]
    assert "aborted by alice" in record.rollouts[1].reason
    assert record.rollouts[1].stable_revision == "llama-predictor-00001"
    # Each entry came with a write of the state; no write changed the record alone.
    writes = _state_writes(world)
    assert [changed for changed in writes if changed[1]] == [(True, True), (True, True)], writes
    # Reconciling on adds nothing.
    for _ in range(3):
        world.reconcile()
    assert world.store.load("ml", "llama").past_rollouts() == record


def test_an_unreadable_record_is_not_overwritten_when_a_rollout_ends(world: World) -> None:  # noqa: F811
    world.push("s3://m/v2")
    world.rollout_of(A)
    stored = world.store.load("ml", "llama")
    files = {STATE_KEY: str(stored.state_json), ROLLOUTS_KEY: "not a record"}
    world.store.save_files("ml", "llama", files, resource_version=stored.resource_version, owner_uid=None)
    _abort(world, A)
    world.reconcile()
    after = world.store.load("ml", "llama")
    assert after.state().phase is Phase.ROLLED_BACK
    assert after.rollouts_json == "not a record"
    with pytest.raises(PastRolloutsFormatError, match=r"rollouts\.json"):  # what report says about it
        after.past_rollouts()
