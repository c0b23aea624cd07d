"""Commands bound to what they mean (issue 17, item 4): an operator command names the revision and
the step it was issued for and when; a command meant for another rollout, or one the rollout has
moved past, or an old one, is refused with its reason — never carried out on something else."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from canary.rollout import Action, CommandKind, Phase, RolloutState, apply_command
from canary.rollout.commands import binding_refusal
from canary.rollout.records import COMMAND_TTL, CommandRequest

from .helpers import T0, progressing

OLD = "llama-predictor-00002"
NEW = "llama-predictor-00003"


def issued(state: RolloutState, kind: CommandKind, **fields: object) -> CommandRequest:
    """What the CLI writes for ``state``: its revision and step, now."""
    step = state.step.index if state.step is not None else None
    return replace(
        CommandRequest(kind, by="alice", at=T0, revision=state.revision, step=step, id="c1"),
        **fields,  # type: ignore[arg-type]
    )


def test_a_promote_issued_for_one_revision_is_refused_for_another() -> None:
    harness = progressing()
    assert harness.state.revision == OLD
    promote = issued(harness.state, CommandKind.PROMOTE, at=harness.now)
    # Before the controller reads it, a new spec starts the rollout of the next revision.
    harness.sim.change_model("s3://m/v3")
    harness.sim.reconcile()
    harness.tick(1)
    assert harness.state.revision == NEW
    result = apply_command(harness.state, promote, harness.now)
    assert not result.accepted
    assert result.message == f"promote was issued for {OLD}, the rollout is now of {NEW}: refused"
    assert result.state == harness.state, "a refusal changes nothing"
    harness.state = result.state
    assert all(harness.tick(60).action is not Action.PROMOTE for _ in range(2)), "no analysis skipped"
    # The same command for the rollout in progress is carried out.
    meant = issued(harness.state, CommandKind.PROMOTE, at=harness.now)
    harness.sim.make_ready()
    harness.sim.reconcile()
    accepted = apply_command(harness.state, meant, harness.now)
    assert accepted.accepted, accepted.message
    assert "by alice" in accepted.state.history[-1].reason


def test_a_stale_command_is_refused_with_its_reason() -> None:
    harness = progressing()
    state = harness.state
    assert state.step is not None
    # Issued while the rollout was at the step before (the rollout has moved since).
    moved = issued(state, CommandKind.APPROVE, step=state.step.index - 1 if state.step.index else None)
    refused = apply_command(state, moved, T0)
    assert not refused.accepted
    assert refused.message.startswith(
        f"approve was issued at no step of {OLD}, the rollout has moved to step 1"
    )
    assert refused.message.endswith("since: stale, refused")
    ahead = issued(state, CommandKind.PAUSE, step=state.step.index + 1)
    assert "issued at step 2" in binding_refusal(state, ahead, T0)  # type: ignore[operator]
    # Expired: older than COMMAND_TTL when the controller reads it, whatever it says.
    old = issued(state, CommandKind.PAUSE, at=T0 - COMMAND_TTL - timedelta(seconds=1))
    expired = apply_command(state, old, T0)
    assert not expired.accepted
    assert "more than 1 h before the controller read it: expired, refused" in expired.message
    assert apply_command(state, issued(state, CommandKind.PAUSE, at=T0 - COMMAND_TTL), T0).accepted
    # Forged into the future to outlive the bound, or no time at all; no revision named.
    future = apply_command(state, issued(state, CommandKind.PAUSE, at=T0 + timedelta(hours=2)), T0)
    assert "in the future" in future.message
    assert not future.accepted
    assert (
        "carries no issue time" in apply_command(state, issued(state, CommandKind.PAUSE, at=None), T0).message
    )
    unnamed = apply_command(state, issued(state, CommandKind.ABORT, revision=None), T0)
    assert (unnamed.accepted, unnamed.message) == (False, "abort names no revision it is meant for: refused")
    nothing = apply_command(RolloutState(), issued(state, CommandKind.PAUSE), T0)
    assert nothing.message == f"pause was issued for {OLD}, no rollout is known now: refused"


def test_a_bound_command_still_meets_the_phase_rules_and_names_its_issuer() -> None:
    harness = progressing()
    paused = apply_command(harness.state, issued(harness.state, CommandKind.PAUSE), T0)
    assert paused.accepted
    assert paused.state.phase is Phase.PAUSED
    assert "(by alice)" in paused.state.history[-1].reason
    again = apply_command(paused.state, issued(paused.state, CommandKind.PAUSE), T0, by="bob")
    assert (again.accepted, again.message.split(":")[0]) == (False, "already paused")
    resumed = apply_command(paused.state, issued(paused.state, CommandKind.RESUME), T0, by="bob")
    assert resumed.accepted
    assert "(by bob)" in resumed.state.history[-1].reason, "the controller's issuer wins over 'by'"
