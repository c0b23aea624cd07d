"""The state ConfigMap's files as typed records: written by to_json, read by from_json, never a crash."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

import pytest

from canary.policy.units import Unit
from canary.report.rollout import judged_limits
from canary.rollout.judge import CheckVerdict, Judgement
from canary.rollout.records import (
    CommandFormatError,
    CommandOutcome,
    CommandRequest,
    ExplainDocument,
    ExplainFormatError,
)
from canary.rollout.state import CommandKind, RolloutState, StateFormatError
from canary.rollout.vocabulary import Action

from .helpers import T0, progressing

# Nested far beyond the interpreter's recursion limit: json raises RecursionError (not ValueError).
DEEP_ARRAY = "[" * 100_000 + "]" * 100_000
DEEP_OBJECT = '{"a":' * 100_000 + "1" + "}" * 100_000
HOSTILE = [DEEP_ARRAY, DEEP_OBJECT, "[1, 2]", "null", '"text"', "42", "{not json", ""]
READERS: list[tuple[str, Callable[[str], object], type[StateFormatError]]] = [
    ("state.json", RolloutState.from_json, StateFormatError),
    ("command.json", CommandRequest.from_json, CommandFormatError),
    ("explain.json", ExplainDocument.from_json, ExplainFormatError),
]


@pytest.mark.parametrize(("file", "read", "error"), READERS, ids=[r[0] for r in READERS])
@pytest.mark.parametrize(
    "text", HOSTILE, ids=["deep-array", "deep-object", "array", "null", "string", "number", "broken", "empty"]
)
def test_hostile_content_is_a_format_error_for_every_file(
    file: str, read: Callable[[str], object], error: type[StateFormatError], text: str
) -> None:
    with pytest.raises(error) as raised:
        read(text)
    message = str(raised.value)
    assert any(phrase in message for phrase in ("nested too deeply", "not a JSON object", "not valid JSON"))


def test_a_deep_document_inside_a_valid_object_is_a_format_error_too() -> None:
    nested = "[" * 100_000 + "]" * 100_000
    with pytest.raises(StateFormatError, match="nested too deeply"):
        RolloutState.from_json('{"schemaVersion": 1, "history": ' + nested + "}")
    with pytest.raises(CommandFormatError, match="nested too deeply"):
        CommandRequest.from_json('{"command": "pause", "by": ' + nested + "}")
    with pytest.raises(ExplainFormatError, match="nested too deeply"):
        ExplainDocument.from_json(
            '{"at": "2026-01-01T00:00:00Z", "decisionId": "d", "checks": ' + nested + "}"
        )


def test_a_field_of_the_wrong_kind_names_the_file_and_the_field() -> None:
    with pytest.raises(CommandFormatError, match=r"command\.json.*command"):
        CommandRequest.from_json('{"command": "explode"}')
    with pytest.raises(ExplainFormatError, match=r"explain\.json.*at"):
        ExplainDocument.from_json('{"at": "yesterday", "decisionId": "d"}')


def test_a_command_round_trips_in_the_json_the_cli_always_wrote() -> None:
    command = CommandRequest(
        CommandKind.ABORT,
        by="alice",
        at=T0,
        reason="p99 looks wrong",
        revision="m-00002",
        step=1,
        state_resource_version="41",
        id="c0ffee",
    )
    document = json.loads(command.to_json())
    assert document == {
        "command": "abort",
        "by": "alice",
        "at": T0.isoformat(),
        "reason": "p99 looks wrong",
        "revision": "m-00002",
        "step": 1,
        "stateResourceVersion": "41",
        "id": "c0ffee",
    }
    assert CommandRequest.from_json(command.to_json()) == command
    answer = CommandOutcome("abort", False, "refused: because", T0, id="c0ffee", by="alice")
    assert CommandOutcome.from_json(answer.to_json()) == answer
    with pytest.raises(CommandFormatError, match=r"command-result\.json"):
        CommandOutcome.from_json('{"command": "abort"}')
    # What older CLIs wrote (only command and by) still reads.
    assert CommandRequest.from_json('{"command": "pause", "by": "bob"}') == CommandRequest(
        CommandKind.PAUSE, "bob"
    )


def test_the_explain_record_of_a_decision_keeps_every_number_and_round_trips() -> None:
    harness = progressing()
    decision = harness.run(lambda d: d.action is Action.ADVANCE)
    record = ExplainDocument.of(decision, None, harness.now)
    assert record.decision_id == decision.id
    assert [check.name for check in record.checks] == [judgement.name for judgement in decision.judgements]
    p99 = next(check for check in record.checks if check.name == "p99")
    judged = next(judgement for judgement in decision.judgements if judgement.name == "p99")
    assert (p99.value, p99.stable, p99.limit, p99.unit) == (
        judged.value,
        judged.stable_value,
        judged.limit,
        judged.unit,
    )
    assert ExplainDocument.from_json(record.to_json()) == record
    document = json.loads(record.to_json())
    assert document["at"] == harness.now.isoformat()
    assert set(document) == {
        "at", "decisionId", "revision", "stableRevision", "action", "verdict", "requests", "reasons",
        "window", "profiles", "queries", "checks", "gates", "evidenceUntil",
    }  # fmt: skip


def test_the_explain_record_keeps_the_judged_bound_and_each_reason_once() -> None:
    # The judge failed p99 against 1.5 × the stable p99's upper bound (321 ms: 481 ms), while the
    # stable estimate is 250 ms: the record keeps the bound it used, not 1.5 × 250 ms (issue 35, item 7).
    harness = progressing()
    decision = harness.run(lambda d: d.action is Action.ADVANCE)
    broken = "p99 ≤ +50% vs stable (≤ 481ms; stable's p99 ≤ 321ms) broken"
    judged = Judgement(
        "p99", CheckVerdict.FAIL, 0.6, Unit.SECONDS, "≤ +50% vs stable", 0.25, 900.0, detail=broken,
        max_allowed=0.4815,
    )  # fmt: skip
    record = ExplainDocument.of(
        replace(decision, judgements=(judged,), reasons=(broken, broken, "rolling back", broken)),
        None,
        harness.now,
    )
    assert record.reasons == (broken, "rolling back")
    (p99,) = record.checks
    assert (p99.stable, p99.max_allowed, p99.bounds()) == (0.25, 0.4815, [("≤ 482ms", 0.4815)])
    assert judged_limits(p99) == [("judged bound ≤ 482ms", 0.4815)]
    assert ExplainDocument.from_json(record.to_json()) == record
