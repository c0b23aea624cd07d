"""Fuzzing operator commands: any sequence of commands, by anyone, at any time, on any stored state.

States are what ``state.json`` can hold (drawn documents read by :meth:`RolloutState.from_json`, so
also the inconsistent ones someone may write: Paused without a pause, a step without a start), the
commands are the five kinds and names that are none of them.

What must hold after every command: an unknown name raises ``ValueError`` (documented) and nothing
else ever raises; a refused command leaves the state exactly as it was; an accepted one records
itself as the newest history entry, at the time it was given, within :data:`MAX_HISTORY`; a
pending abort refuses everything after it; the resulting state is stored and read back unchanged.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canary.rollout.commands import apply_command
from canary.rollout.records import CommandFormatError, CommandRequest
from canary.rollout.state import MAX_HISTORY, CommandKind, RolloutState, StateFormatError

from .support import fuzz_settings
from .test_state_fuzz import STATES

# Without coverage measurement (tests/conftest.py): every line and branch they reach is reached by
# the unit tests as well (checked with coverage against the rest of the suite but e2e and faults),
# and line tracing made them twice as slow.
pytestmark = pytest.mark.untraced

_KINDS = [kind.value for kind in CommandKind]
COMMANDS = st.lists(
    st.tuples(
        st.one_of(st.sampled_from(_KINDS), st.sampled_from(["PAUSE", "", "stop", " abort"])),
        st.one_of(st.none(), st.sampled_from(["alice", ""]), st.text(max_size=30)),
        st.integers(-(10**6), 10**8),  # seconds after the state's clock
    ),
    min_size=1,
    max_size=6,
)
_AT = "2026-12-01T11:00:00+00:00"
# Two times in three a state in the middle of a rollout (the only states most commands apply to).
ROLLOUTS = st.fixed_dictionaries(
    {
        "schemaVersion": st.just(1),
        "phase": st.sampled_from(["Pending", "Progressing", "Promoting", "Baking", "Paused"]),
        "revision": st.just("llama-00002"),
        "startedAt": st.just(_AT),
    },
    optional={
        "step": st.builds(
            lambda weight: {"index": 0, "weight": weight, "startedAt": _AT}, st.sampled_from([10, 50])
        ),
        "pause": st.builds(
            lambda kind, phase: {"kind": kind, "reason": "r", "since": _AT, "resumePhase": phase},
            st.sampled_from(["manual", "approval", "external-change", "no-data"]),
            st.sampled_from(["Pending", "Progressing", "Baking"]),
        ),
        "approvals": st.lists(st.sampled_from([10, 50]), max_size=2),
        "command": st.builds(lambda kind: {"kind": kind, "at": _AT}, st.sampled_from(_KINDS)),
    },
)
# And one time in four a rollout paused for an operator (a manual pause, a step awaiting approval): the
# states resume and approve apply to, which the draws above reach too rarely to count on.
PAUSED = st.fixed_dictionaries(
    {
        "schemaVersion": st.just(1),
        "phase": st.just("Paused"),
        "revision": st.just("llama-00002"),
        "startedAt": st.just(_AT),
        "step": st.builds(
            lambda weight: {"index": 0, "weight": weight, "startedAt": _AT}, st.sampled_from([10, 50])
        ),
        "pause": st.builds(
            lambda kind, phase: {"kind": kind, "reason": "r", "since": _AT, "resumePhase": phase},
            st.sampled_from(["manual", "approval"]),
            st.sampled_from(["Progressing", "Baking"]),
        ),
    }
)
STORED = st.integers(0, 3).flatmap(
    lambda n: (
        STATES
        if n == 0
        else st.builds(lambda base, rollout: {**base, **rollout}, STATES, PAUSED if n == 3 else ROLLOUTS)
    )
)
ZONES = st.sampled_from([UTC, timezone(timedelta(hours=14)), timezone(-timedelta(hours=12))])
BASE = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_command_sequences_on_stored_states() -> None:
    outcomes: Counter[str] = Counter()

    @fuzz_settings(500)
    @given(document=STORED, commands=COMMANDS, zone=ZONES)
    def run(document: dict[str, object], commands: list[tuple[str, str | None, int]], zone: timezone) -> None:
        try:
            state = RolloutState.from_json(json.dumps(document))
        except StateFormatError:
            outcomes["unreadable state"] += 1
            return
        for name, by, offset in commands:
            now = (BASE + timedelta(seconds=offset)).astimezone(zone)
            if name not in _KINDS:
                with pytest.raises(ValueError, match="is not a valid CommandKind"):
                    apply_command(state, name, now, by=by)
                outcomes["unknown"] += 1
                continue
            abort_pending = state.command is not None and state.command.kind is CommandKind.ABORT
            result = apply_command(state, name, now, by=by)
            assert isinstance(result.message, str) and result.message
            if not result.accepted:
                assert result.state is state or result.state == state
                outcomes["refused"] += 1
            else:
                assert not abort_pending, "a command was accepted over a pending abort"
                entry = result.state.history[-1]
                assert entry.action == f"command:{name}" and entry.at == now
                assert len(result.state.history) <= MAX_HISTORY
                assert len(result.state.history) == min(len(state.history) + 1, MAX_HISTORY)
                outcomes[f"accepted {name}"] += 1
            state = RolloutState.from_json(result.state.to_json())
            assert state == result.state

    run()
    # Every kind of command is accepted somewhere and refused somewhere: both paths are exercised.
    assert all(outcomes[f"accepted {kind}"] >= 1 for kind in _KINDS), outcomes
    assert outcomes["refused"] >= 50 and outcomes["unknown"] >= 10, outcomes


# -- commands as the CLI writes them (command.json), bound to a revision, a step and a time -----------

_OFFSETS = st.one_of(st.integers(-3000, 0), st.integers(-7200, 600), st.integers(-(10**9), 10**9))
RECORDS = st.fixed_dictionaries(
    {
        "command": st.sampled_from(_KINDS),
        "revision": st.sampled_from(["llama-00002", "llama-00002", "llama-00001", None, ""]),
        "step": st.sampled_from([0, 0, None, 1, -1]),
    },
    optional={
        "by": st.one_of(st.none(), st.text(max_size=12)),
        "reason": st.one_of(st.none(), st.text(max_size=12)),
        "id": st.one_of(st.none(), st.text(max_size=8)),
        "stateResourceVersion": st.one_of(st.none(), st.just("42")),
    },
)
EXTREME_TIMES = st.sampled_from(
    ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59", "2026-12-01T12:00:00"]
)


def test_command_records_on_stored_states() -> None:
    outcomes: Counter[str] = Counter()

    @fuzz_settings(500)
    @given(
        document=STORED,
        record=RECORDS,
        offset=_OFFSETS,
        extreme=st.one_of(st.none(), EXTREME_TIMES),
        zone=ZONES,
        bound=st.booleans(),
    )
    def run(
        document: dict[str, object],
        record: dict[str, object],
        offset: int,
        extreme: str | None,
        zone: timezone,
        bound: bool,
    ) -> None:
        try:
            state = RolloutState.from_json(json.dumps(document))
        except StateFormatError:
            outcomes["unreadable state"] += 1
            return
        if bound:
            # Half the records are written as the CLI writes them for this very state (its revision,
            # its step, within the hour), so the accepting path is fuzzed as much as the refusals.
            step = state.step.index if state.step is not None else None
            record = {**record, "revision": state.revision, "step": step}
            offset, extreme = -abs(offset) % 3600, None
        issued = extreme if extreme is not None else (BASE + timedelta(seconds=offset)).isoformat()
        try:
            command = CommandRequest.from_json(json.dumps({**record, "at": issued}))
        except CommandFormatError:
            outcomes["unreadable command"] += 1
            return
        now = BASE.astimezone(zone)
        result = apply_command(state, command, now)
        assert isinstance(result.message, str) and result.message
        if not result.accepted:
            assert result.state is state or result.state == state
            outcomes["refused"] += 1
            return
        # Accepted only when bound: its revision, its step, issued within the hour before now.
        assert command.revision == state.revision and command.at is not None
        assert command.step == (state.step.index if state.step is not None else None)
        assert timedelta(0) <= now - command.at <= timedelta(hours=1) or command.at > now
        assert result.state.history[-1].action == f"command:{command.command.value}"
        assert RolloutState.from_json(result.state.to_json()) == result.state
        outcomes["accepted"] += 1

    run()
    # Both paths exercised (the count of accepted records depends on the drawn states: a handful).
    assert outcomes["accepted"] >= 3 and outcomes["refused"] >= 10, outcomes
