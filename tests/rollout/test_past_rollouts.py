"""The record of past rollouts (canary.rollout.past): what ends a rollout, what is kept, the bounds,
identity after a crash, and reading garbage."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest

from canary.rollout import Action, Phase
from canary.rollout.commands import apply_command
from canary.rollout.decision import Decision
from canary.rollout.past import (
    MAX_RECORD_BYTES,
    MAX_ROLLOUT_BYTES,
    MAX_ROLLOUTS,
    PastRollout,
    PastRollouts,
    PastRolloutsFormatError,
    RolloutOutcome,
    ends_rollout,
    record_after,
    rollout_id,
)
from canary.rollout.records import ExplainDocument
from canary.rollout.state import HistoryEntry

from .helpers import HEALTHY_EVIDENCE, T0, Harness, make_policy, progressing
from .test_records import HOSTILE

OLD, NEW = "llama-predictor-00001", "llama-predictor-00002"


class Recording:
    """A harness whose every tick also goes through record_after, with the record stored as JSON
    (as the shell stores it, beside the state), and the latest evaluation kept as explain.json is."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.text: str | None = None
        self.ends: list[Decision] = []
        self.explain: ExplainDocument | None = None

    @property
    def record(self) -> PastRollouts:
        return PastRollouts.from_json(self.text) if self.text else PastRollouts()

    def tick(self, after: float = 60.0, **kwargs: object) -> Decision:
        before = self.harness.state
        decision = self.harness.tick(after, **kwargs)  # type: ignore[arg-type]
        recorded = record_after(
            before, decision, self.record, self.harness.now, latest_evaluation=self.explain
        )
        assert ends_rollout(before, decision) == (recorded is not None)
        if recorded is not None:
            self.text = recorded.to_json()
            self.ends.append(decision)
        if decision.judgements:
            self.explain = ExplainDocument.of(decision, None, self.harness.now)
        return decision

    def run(self, until: object, *, evidence: object = HEALTHY_EVIDENCE, limit: int = 200) -> Decision:
        for _ in range(limit):
            decision = self.tick(60, evidence=evidence)
            if until(decision):  # type: ignore[operator]
                return decision
        raise AssertionError(self.harness.timeline.render())


def promoted_once() -> Recording:
    recording = Recording(progressing())
    recording.run(lambda d: d.new_state.phase is Phase.SUCCEEDED)
    return recording


def test_a_promoted_rollout_is_recorded_with_its_revisions_steps_and_decisions() -> None:
    recording = promoted_once()
    (entry,) = recording.record.rollouts
    state = recording.harness.state
    assert entry.outcome is RolloutOutcome.PROMOTED
    assert (entry.revision, entry.stable_revision) == (NEW, OLD)
    assert entry.id == rollout_id(NEW, state.started_at)
    assert entry.started_at == state.started_at
    assert entry.ended_at == recording.harness.now
    assert [step.weight for step in entry.steps] == [10, 30, 50]
    # Each step ends where the next was written; the last where the promotion was.
    for current, following in zip(entry.steps, entry.steps[1:], strict=False):
        assert current.until == following.at
    promote = next(d for d in entry.decisions if d.action == "promote")
    assert entry.steps[-1].until == promote.at
    assert [d.action for d in entry.decisions if d.action != "wait"] == [
        "start",
        "advance",
        "advance",
        "promote",
    ]
    assert all(entry.started_at <= d.at <= entry.ended_at for d in entry.decisions)  # type: ignore[operator]
    # The promotion's evaluation (explain.json when Succeeded ends the rollout): its checks, with values,
    # without PromQL.
    promoted = next(d for d in recording.harness.decisions if d.action is Action.PROMOTE)
    assert {c.name for c in entry.checks} == {j.name for j in promoted.judgements}
    assert all(c.query == "" for c in entry.checks)
    p99 = next(c for c in entry.checks if c.name == "p99")
    assert p99.value == pytest.approx(0.40) and p99.stable == pytest.approx(0.38)


def test_a_rollback_on_a_failing_check_is_recorded_with_the_numbers_that_failed() -> None:
    recording = Recording(progressing())
    failing = HEALTHY_EVIDENCE.failing(p99=1.2)
    recording.run(lambda d: d.action is Action.ROLLBACK, evidence=failing)
    (entry,) = recording.record.rollouts
    assert entry.outcome is RolloutOutcome.ROLLED_BACK
    assert entry.reason.startswith(f"Rolling back {NEW}")
    assert "p99: 1.20s is above max 800ms" in entry.reason, entry.reason
    p99 = next(c for c in entry.checks if c.name == "p99")
    assert (p99.verdict, p99.value) == ("fail", pytest.approx(1.2))
    assert [step.weight for step in entry.steps] == [10]


def test_an_abort_is_recorded_as_aborted() -> None:
    recording = Recording(progressing())
    harness = recording.harness
    harness.state = apply_command(harness.state, "abort", harness.now, by="frank").state
    recording.tick(5)
    (entry,) = recording.record.rollouts
    assert entry.outcome is RolloutOutcome.ABORTED
    assert "aborted by frank" in entry.reason
    assert any(d.action == "command:abort" for d in entry.decisions)


def test_a_newer_revision_supersedes_the_rollout_under_way_and_starts_its_own() -> None:
    recording = Recording(progressing())
    harness = recording.harness
    recording.run(lambda d: d.action is Action.ADVANCE)
    harness.sim.change_model("s3://m/v3")
    harness.sim.reconcile()
    started = recording.tick(5)
    assert started.revision == "llama-predictor-00003"
    (entry,) = recording.record.rollouts
    assert entry.outcome is RolloutOutcome.SUPERSEDED
    assert entry.revision == NEW
    assert "llama-predictor-00003 replaced" in entry.reason
    # The new rollout's start belongs to the new rollout, not to the superseded one.
    assert [d.action for d in entry.decisions if d.action != "wait"] == ["start", "advance"]
    assert [step.weight for step in entry.steps] == [10, 30]
    assert entry.steps[-1].until == harness.now


def test_two_consecutive_rollouts_leave_two_entries_latest_last() -> None:
    recording = promoted_once()
    harness = recording.harness
    harness.sim.change_model("s3://m/v3")
    harness.sim.reconcile()
    recording.tick(1)
    harness.sim.make_ready()
    harness.sim.reconcile()
    recording.run(lambda d: d.action is Action.ROLLBACK, evidence=HEALTHY_EVIDENCE.failing(errors=0.2))
    record = recording.record
    assert [(e.revision, e.outcome) for e in record.rollouts] == [
        (NEW, RolloutOutcome.PROMOTED),
        ("llama-predictor-00003", RolloutOutcome.ROLLED_BACK),
    ]
    assert record.rollouts[1].stable_revision == NEW
    assert record.select("1") == record.rollouts[1]
    assert record.select("2") == record.rollouts[0]
    assert record.select(NEW) == record.rollouts[0]
    assert record.select(record.rollouts[1].id) == record.rollouts[1]
    assert record.select("3") is None and record.select("llama-predictor-00009") is None
    # Nothing else ends a rollout: later ticks add nothing.
    for _ in range(5):
        recording.tick(60)
    assert len(recording.record.rollouts) == 2


def test_the_ending_decision_replayed_after_a_crash_records_the_rollout_once() -> None:
    recording = Recording(progressing())
    recording.run(lambda d: d.action is Action.ROLLBACK, evidence=HEALTHY_EVIDENCE.failing(p99=1.2))
    rollback = recording.ends[-1]
    first = recording.record
    # The same decision decided again on the same state (its write was lost, or it is replayed):
    before = replace(rollback.new_state, phase=Phase.PROGRESSING)
    again = record_after(before, rollback, first, recording.harness.now + timedelta(seconds=3))
    assert again is not None
    assert len(again.rollouts) == 1
    assert again.rollouts[0].id == first.rollouts[0].id
    # And the state as stored after the decision ends nothing: a restart reads it and adds nothing.
    restarted = record_after(rollback.new_state, rollback, first, recording.harness.now)
    assert restarted is None


def test_the_record_round_trips_and_says_its_schema_version() -> None:
    record = promoted_once().record
    document = json.loads(record.to_json())
    assert document["schemaVersion"] == 1
    (entry,) = document["rollouts"]
    assert {
        "id",
        "revision",
        "stableRevision",
        "startedAt",
        "endedAt",
        "outcome",
        "steps",
        "decisions",
    } <= set(entry)
    assert entry["outcome"] == "promoted"
    assert PastRollouts.from_json(record.to_json()) == record


def _entry(number: int, decisions: int = 0, reason_chars: int = 190) -> PastRollout:
    start = T0 + timedelta(hours=number)
    return PastRollout(
        id=rollout_id(f"m-predictor-{number:05d}", start),
        revision=f"m-predictor-{number:05d}",
        outcome=RolloutOutcome.PROMOTED,
        started_at=start,
        ended_at=start + timedelta(minutes=40),
        decisions=tuple(
            HistoryEntry(
                at=start + timedelta(seconds=index),
                action="advance" if index % 20 == 0 else "wait",
                weight=10 if index % 20 == 0 else None,
                phase=Phase.PROGRESSING,
                event="CanaryEvaluated",
                reason="x" * reason_chars,
                id=f"{number}-{index}",
            )
            for index in range(decisions)
        ),
    )


def test_at_most_ten_rollouts_are_kept_oldest_dropped_first() -> None:
    record = PastRollouts()
    for number in range(1, 14):
        record = record.with_rollout(_entry(number))
    assert len(record.rollouts) == MAX_ROLLOUTS == 10
    assert record.rollouts[0].revision == "m-predictor-00004"
    assert record.rollouts[-1].revision == "m-predictor-00013"


def test_big_rollouts_stay_within_the_byte_bounds() -> None:
    record = PastRollouts()
    for number in range(1, 12):
        record = record.with_rollout(_entry(number, decisions=400))
    size = len(record.to_json().encode())
    assert size <= MAX_RECORD_BYTES
    for entry in record.rollouts:
        assert len(entry.to_json().encode()) <= MAX_ROLLOUT_BYTES
        assert entry.decisions_dropped > 0
        # The decisions that wrote a weight are kept over the waits.
        assert sum(1 for d in entry.decisions if d.action == "advance") == 20
    assert record.rollouts[-1].revision == "m-predictor-00011"
    assert len(record.rollouts) < MAX_ROLLOUTS  # bytes, not the count, bounded this record


def test_adding_a_recorded_id_again_replaces_it_in_place() -> None:
    record = PastRollouts().with_rollout(_entry(1)).with_rollout(_entry(2))
    changed = replace(_entry(1), outcome=RolloutOutcome.ROLLED_BACK)
    again = record.with_rollout(changed)
    assert [(e.revision, e.outcome) for e in again.rollouts] == [
        ("m-predictor-00001", RolloutOutcome.ROLLED_BACK),
        ("m-predictor-00002", RolloutOutcome.PROMOTED),
    ]


@pytest.mark.parametrize(
    "text", HOSTILE, ids=["deep-array", "deep-object", "array", "null", "string", "number", "broken", "empty"]
)
def test_hostile_content_is_a_format_error_naming_the_file(text: str) -> None:
    with pytest.raises(PastRolloutsFormatError, match=r"rollouts\.json"):
        PastRollouts.from_json(text)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{}", "no valid schemaVersion"),
        ('{"schemaVersion": 2, "rollouts": []}', "newer kserve-canary"),
        ('{"schemaVersion": 1, "rollouts": {}}', "invalid at rollouts"),
        ('{"schemaVersion": 1, "rollouts": [{"id": "a", "revision": "r"}]}', "invalid at rollouts.0"),
        (
            '{"schemaVersion": 1, "rollouts": [{"id": "a", "revision": "r", "outcome": "exploded",'
            ' "endedAt": "2026-01-01T00:00:00Z"}]}',
            "invalid at rollouts.0.outcome",
        ),
        ('{"schemaVersion": 1, "rollouts": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ],
)
def test_a_wrong_record_says_where_and_why(text: str, match: str) -> None:
    with pytest.raises(PastRolloutsFormatError, match=match):
        PastRollouts.from_json(text)


def test_a_record_from_a_newer_controller_keeps_its_known_fields() -> None:
    record = PastRollouts().with_rollout(_entry(1))
    document = json.loads(record.to_json())
    document["rollouts"][0]["somethingNew"] = {"a": 1}
    document["alsoNew"] = True
    assert PastRollouts.from_json(json.dumps(document)) == record


def test_nothing_is_recorded_while_no_rollout_ends() -> None:
    recording = Recording(Harness(make_policy(), progressing().sim))
    for _ in range(3):
        recording.tick(60)
    assert recording.text is None
