"""The smallest inputs the fuzz properties in this directory found crashing, each a named test.

A fix that regresses fails here with the input in plain sight, whatever the fuzzers happen to draw.
"""

from __future__ import annotations

from datetime import UTC, datetime

from canary.rollout.commands import apply_command
from canary.rollout.state import Phase, RolloutState

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_pause_of_a_stored_paused_state_without_its_pause_is_refused_not_an_assertion() -> None:
    # test_commands_fuzz: state.json {"schemaVersion": 1, "phase": "Paused"} and `pause` raised
    # AssertionError out of apply_command (and so out of the reconciler).
    state = RolloutState.from_json('{"schemaVersion": 1, "phase": "Paused"}')
    assert state.phase is Phase.PAUSED and state.pause is None
    result = apply_command(state, "pause", NOW, by="alice")
    assert not result.accepted
    assert result.state == state
    assert result.message == "already paused"
