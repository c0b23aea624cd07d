"""The rollout state's JSON form: versioned, readable by newer controllers, bounded in size."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from canary.kserve.status_model import KServeSim
from canary.rollout.state import (
    MAX_HISTORY,
    MAX_ROLLED_BACK,
    SCHEMA_VERSION,
    CommandKind,
    EvaluationRecord,
    EvaluationVerdict,
    HistoryEntry,
    Pause,
    PauseKind,
    PendingCommand,
    Phase,
    RolledBackRevision,
    RolloutState,
    StateFormatError,
    StepProgress,
    UnsupportedStateVersion,
    WeightRecord,
    describe_time,
)

from .helpers import T0, Harness, make_policy

LONG_NAME = "m" * 40 + "-predictor-00042"  # Kubernetes names reach 63 characters


def busy_state() -> RolloutState:
    """A state with every field set, as it looks in the middle of a rollout."""
    return RolloutState(
        phase=Phase.PAUSED,
        revision=LONG_NAME,
        fingerprint="sha256:" + "a" * 32,
        stable_revision="llama-predictor-00001",
        started_at=T0,
        step=StepProgress(1, 30, T0 + timedelta(minutes=3), None),
        evaluation=EvaluationRecord(
            at=T0 + timedelta(minutes=5),
            verdict=EvaluationVerdict.FAIL,
            requests=1234.0,
            failed_checks=("p99",),
            failure_streak=1,
            query_error=False,
            last_conclusive_at=T0 + timedelta(minutes=5),
            no_data_clock_from=None,
        ),
        unready_since=T0,
        spec_change_seen_at=None,
        bake_started_at=None,
        pause=Pause(PauseKind.EXTERNAL_CHANGE, "changed by someone else", T0, Phase.PROGRESSING, 40),
        command=PendingCommand(CommandKind.RESUME, T0, "alice"),
        intent=WeightRecord(30, LONG_NAME, T0),
        spec_weight=WeightRecord(None, LONG_NAME, T0, by_controller=False),
        unguarded=True,
        approvals=(30,),
        rolled_back=(RolledBackRevision("llama-predictor-00003", T0),),
        history=(HistoryEntry(T0, "advance", 30, Phase.PROGRESSING, "CanaryAdvanced", "Advancing.", "abc"),),
    )


def test_state_round_trips_through_json_with_a_schema_version() -> None:
    state = busy_state()
    text = state.to_json()
    document = json.loads(text)
    assert next(iter(document)) == "schemaVersion"
    assert document["schemaVersion"] == SCHEMA_VERSION
    assert document["step"]["startedAt"].endswith("Z")  # camelCase keys, UTC timestamps
    assert document["spec" + "Weight"]["weight"] is None  # the field being absent is explicit
    assert RolloutState.from_json(text) == state
    assert RolloutState.from_json(text.encode()) == state


def test_initial_state_round_trips() -> None:
    assert RolloutState.from_json(RolloutState().to_json()) == RolloutState()


def test_newer_controller_reads_a_minimal_older_state_with_defaults() -> None:
    # The smallest document a version-1 writer could have produced: every later field defaults.
    old = json.dumps({"schemaVersion": 1, "phase": "Progressing", "revision": "r-2", "fingerprint": "f"})
    state = RolloutState.from_json(old)
    assert state.phase is Phase.PROGRESSING
    assert state.revision == "r-2"
    assert state.evaluation == EvaluationRecord()
    assert state.history == ()


def test_fields_unknown_to_this_version_are_ignored() -> None:
    document = json.loads(busy_state().to_json())
    document["someFieldAddedLater"] = {"x": 1}
    assert RolloutState.from_json(json.dumps(document)) == busy_state()


def test_a_future_schema_version_is_refused_clearly() -> None:
    document = json.loads(busy_state().to_json())
    document["schemaVersion"] = SCHEMA_VERSION + 1
    with pytest.raises(
        UnsupportedStateVersion, match=rf"newer kserve-canary \(schemaVersion {SCHEMA_VERSION + 1}\)"
    ) as raised:
        RolloutState.from_json(json.dumps(document))
    assert raised.value.version == SCHEMA_VERSION + 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"phase": "Idle"}', "no valid schemaVersion"),
        ('{"schemaVersion": true}', "no valid schemaVersion"),
        ('{"schemaVersion": 0}', "no valid schemaVersion"),
        ('{"schemaVersion": 1, "phase": "Exploding"}', "invalid at phase"),
        ('{"schemaVersion": 1, "startedAt": "2026-03-01T12:00:00"}', "invalid at startedAt"),
    ],
)
def test_malformed_states_are_refused_with_the_location(text: str, message: str) -> None:
    with pytest.raises(StateFormatError, match=message):
        RolloutState.from_json(text)


def test_history_and_rolled_back_revisions_are_bounded_when_read() -> None:
    entries = tuple(
        HistoryEntry(T0 + timedelta(seconds=i), "wait", None, Phase.IDLE, "CanaryIdle", f"entry {i}", str(i))
        for i in range(MAX_HISTORY + 30)
    )
    revisions = tuple(RolledBackRevision(f"r-{i}", T0) for i in range(MAX_ROLLED_BACK + 5))
    state = RolloutState.from_json(replace(RolloutState(), history=entries, rolled_back=revisions).to_json())
    assert len(state.history) == MAX_HISTORY
    assert state.history[-1].reason == f"entry {MAX_HISTORY + 29}"  # the newest are kept
    assert len(state.rolled_back) == MAX_ROLLED_BACK
    assert state.rolled_back[-1].revision == f"r-{MAX_ROLLED_BACK + 4}"


def test_serialised_state_stays_under_64_kib_with_long_histories() -> None:
    long_reason = "x" * 400
    harness = Harness(make_policy(), KServeSim.serving())
    harness.tick()
    # Hundreds of rollouts and rollbacks with long names and reasons.
    state = harness.state
    for index in range(3 * MAX_HISTORY):
        entry = HistoryEntry(
            T0, "rollback", 0, Phase.ROLLED_BACK, "CanaryRolledBack", long_reason[:200], "i" * 20
        )
        state = replace(
            state,
            history=(*state.history, entry)[-MAX_HISTORY:],
            rolled_back=(*state.rolled_back, RolledBackRevision(f"{LONG_NAME}{index}", T0))[
                -MAX_ROLLED_BACK:
            ],
        )
    state = replace(
        state, pause=busy_state().pause, step=busy_state().step, evaluation=busy_state().evaluation
    )
    assert len(state.to_json().encode()) < 64 * 1024


def test_decision_history_in_a_real_rollout_stays_bounded() -> None:
    harness = Harness(make_policy(), KServeSim.serving())
    harness.tick()
    for version in range(2, 60):  # many rollouts, each starting and rolled back
        harness.sim.change_model(f"s3://m/v{version}")
        harness.sim.reconcile()
        harness.tick(1)
        harness.state = replace(harness.state, command=PendingCommand(CommandKind.ABORT, harness.now))
        harness.tick(1)
    assert len(harness.state.history) == MAX_HISTORY
    assert len(harness.state.rolled_back) == MAX_ROLLED_BACK


def test_describe_time_is_utc_whole_seconds() -> None:
    assert describe_time(T0 + timedelta(microseconds=5)) == "2026-03-01T12:00:00Z"
    assert describe_time(None) == "never"
