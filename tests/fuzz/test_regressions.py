"""The smallest inputs the fuzz properties in this directory found crashing, each a named test.

A fix that regresses fails here with the input in plain sight, whatever the fuzzers happen to draw.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from canary.evidence import ErrorClass
from canary.metrics.client import PrometheusClient, QueryFailure
from canary.metrics.plan import parse_grouped, parse_single
from canary.policy.loader import load_text
from canary.rollout.commands import apply_command
from canary.rollout.records import CommandRequest
from canary.rollout.state import Phase, RolloutState

from .test_prometheus_fuzz import FuzzedPrometheus, Response, prometheus_config

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


# -- policies ------------------------------------------------------------------------------------

NINES = "9" * 400  # more digits than a float holds: float() gives inf


def _policy(spec_line: str, check: str = "{name: p99, metric: latency, max: 800ms}") -> str:
    return (
        "apiVersion: kserve-canary.dev/v1alpha1\nkind: PromotionPolicy\n"
        "metadata: {name: fuzz, namespace: ml}\n"
        f"spec:\n  target: {{inferenceService: fuzz}}\n  {spec_line}\n  checks:\n    - {check}\n"
    )


@pytest.mark.parametrize(
    ("spec_line", "field"),
    [
        # Was accepted as an infinite window; dumping the policy then raised OverflowError.
        (f"window: {NINES}s", "spec.window"),
        # Was "cannot read this file as YAML (OverflowError)": no field, no line.
        (f"interval: {NINES}s", "spec.interval"),
        # Was accepted; the core's timedelta(seconds=1e300) overflows.
        ("window: 1.0e+300", "spec.window"),
        ("bake: 1.0e+300", "spec.bake"),
    ],
)
def test_a_duration_too_long_for_the_calendar_is_an_error_at_its_field(spec_line: str, field: str) -> None:
    result = load_text(_policy(spec_line), "ml/fuzz.yaml")
    assert not result.policies
    assert [(error.path, error.line, error.field) for error in result.errors] == [("ml/fuzz.yaml", 6, field)]
    assert "too long" in result.errors[0].message


def test_a_size_too_large_for_a_float_is_an_error_at_its_field() -> None:
    # Was accepted as an infinite gpu-memory-peak limit (which dumps as null: the round trip lost it).
    text = _policy("window: 10m", f"{{name: mem, metric: gpu-memory-peak, max: {NINES}Gi}}")
    result = load_text(text, "ml/fuzz.yaml")
    assert not result.policies
    assert [(error.line, error.field) for error in result.errors] == [(8, "spec.checks[0].max")]


_HEAD = "apiVersion: kserve-canary.dev/v1alpha1\nkind: PromotionPolicy\nmetadata: {name: a, namespace: ml}\n"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        # An empty key was reported with no field at all (the empty path).
        ("spec: {target: {inferenceService: x}}\n'': 1\n", '[""]'),
        # Was "spec.a.b", a path that is not in the file (there is no "a" under spec).
        ('spec: {target: {inferenceService: x}, "a.b": 1}\n', 'spec["a.b"]'),
    ],
)
def test_an_unknown_key_that_is_empty_or_dotted_is_named_unambiguously(spec: str, field: str) -> None:
    result = load_text(_HEAD + spec, "ml/odd.yaml")
    assert field in [error.field for error in result.errors], [str(error) for error in result.errors]


def test_a_control_character_is_an_error_with_its_line_not_an_unreadable_file() -> None:
    # test_policy_fuzz (one flipped byte: "i" -> "\x01"): was "cannot read this file as YAML
    # (ReaderError)", without a line and without saying what is wrong.
    result = load_text(_HEAD + "spec:\n  target: {inferenceService: \x01x}\n", "ml/ctl.yaml")
    assert [str(error) for error in result.errors] == [
        "ml/ctl.yaml:5: YAML does not allow the character U+0001 in a file"
    ]


def test_an_integer_too_large_for_a_float_is_an_error_at_its_field() -> None:
    # test_policy_fuzz ("huge": a limit replaced by 1,000 nines): float(int) raised OverflowError,
    # reported as "cannot read this file as YAML (OverflowError)", with no field and no line.
    result = load_text(_policy(f"window: {NINES}"), "ml/fuzz.yaml")
    assert [(error.line, error.field) for error in result.errors] == [(6, "spec.window")]
    result = load_text(
        _policy("window: 10m", f"{{name: p99, metric: latency, max: {NINES}}}"), "ml/fuzz.yaml"
    )
    assert [(error.line, error.field) for error in result.errors] == [(8, "spec.checks[0].max")]


def test_a_json_policy_with_an_escaped_character_beyond_the_bmp_loads() -> None:
    # test_policy_fuzz (a document written with json.dumps): JSON escapes U+1F680 as the surrogate pair
    # "\ud83d\ude80", which YAML decoded as two lone surrogates; pydantic refused the string ("unable to
    # parse raw data as a unicode string"), and for a key with no field at all.
    document = {
        "apiVersion": "kserve-canary.dev/v1alpha1",
        "kind": "PromotionPolicy",
        "metadata": {"name": "a", "namespace": "ml", "labels": {"team": "\U0001f680 ml"}},
        "spec": {
            "target": {"inferenceService": "a"},
            "checks": [{"name": "e", "metric": "error-rate", "max": "1%"}],
        },
    }
    text = json.dumps(document)
    assert "\\ud83d\\ude80" in text
    result = load_text(text, "ml/a.json")
    assert not result.errors
    assert result.policies[0].policy.metadata.labels == {"team": "\U0001f680 ml"}


# -- Prometheus answers (through the real client and a loopback server) ---------------------------


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[FuzzedPrometheus, PrometheusClient]]:
    server = FuzzedPrometheus()
    client = PrometheusClient(prometheus_config(server.url), sleep=lambda _seconds: None)
    yield server, client
    client.close()
    server.close()


@pytest.mark.parametrize(
    ("body", "error_class"),
    [
        # TypeError ('bool' object is not iterable) out of instant(): warnings must be a list.
        (b'{"status": "success", "warnings": true, "data": {"resultType": "vector", "result": []}}', None),
        # RecursionError out of instant(): the JSON parser gives up on deep nesting.
        (b"[" * 100_000, ErrorClass.MALFORMED_RESPONSE),
        (b'{"status": "success", "data": ' + b"[" * 100_000 + b"}", ErrorClass.MALFORMED_RESPONSE),
    ],
)
def test_an_odd_prometheus_answer_is_a_named_outcome_not_an_exception(
    served: tuple[FuzzedPrometheus, PrometheusClient], body: bytes, error_class: ErrorClass | None
) -> None:
    server, client = served
    server.response = Response(200, "application/json", body)
    outcome = client.instant("up", NOW)
    if error_class is None:
        assert outcome.answer is not None and outcome.answer.warnings == ()
    else:
        assert outcome.failure is not None and outcome.failure.error_class is error_class


@pytest.mark.parametrize(
    "series",
    [
        {"metric": [1], "value": [0, "1"]},  # AttributeError: 'list' object has no attribute 'get'
        {"metric": {"namespace": ["ml"], "revision": "r"}, "value": [0, "1"]},  # TypeError: unhashable
        {"metric": {"namespace": "ml", "revision": "r", "evidence_field": {}}, "value": [0, "1"]},
    ],
)
def test_a_grouped_answer_with_labels_that_are_not_strings_is_an_unexpected_result(
    served: tuple[FuzzedPrometheus, PrometheusClient], series: dict[str, object]
) -> None:
    # Out of parse_grouped, and so out of PrometheusEvidenceSource.collect (outside its own safety net).
    server, client = served
    body = {"status": "success", "data": {"resultType": "vector", "result": [series]}}
    server.response = Response(200, "application/json", json.dumps(body).encode())
    parsed = parse_grouped(client.instant("up", NOW))
    assert isinstance(parsed, QueryFailure) and parsed.error_class is ErrorClass.UNEXPECTED_RESULT


def test_a_duration_the_short_form_would_round_round_trips_exactly() -> None:
    # test_policy_fuzz (schema-drawn "bake: 1ms1.0s"): the policy's JSON form said "1s" for 1.001 s, so
    # a policy written back from it was another policy.
    policy = load_text(_policy("bake: 1ms1.0s"), "ml/fuzz.yaml").policies[0].policy
    dumped = policy.model_dump(mode="json", by_alias=True)
    assert dumped["spec"]["bake"] == 1.001 and dumped["spec"]["window"] == "10m"
    again = load_text(json.dumps(dumped), "ml/fuzz.json")
    assert [loaded.policy for loaded in again.policies] == [policy]


def test_a_key_that_is_not_a_string_is_named() -> None:
    # test_policy_fuzz (bytes mutated into a top-level "1: x", and "apiVersion" cut into "apiVersi~"
    # and "on:", which YAML 1.1 reads as true): pydantic's "Keys should be strings" named a field
    # "[1]" that was neither in the file nor in the schema.
    for key, read in (("1", "1"), ("on", "True")):
        result = load_text(_policy("window: 10m") + f"{key}: x\n", "ml/fuzz.yaml")
        assert [(error.field, error.message) for error in result.errors] == [
            (
                None,
                f"a key that is not a string: YAML read {read} (unquoted on/off/yes/no/true/false are "
                "booleans, digits are numbers); quote the key if it is meant as a name",
            )
        ]
    nested = load_text(_policy("window: 10m").replace("spec:\n", "spec:\n  yes: 1\n"), "ml/fuzz.yaml")
    assert [error.field for error in nested.errors] == ["spec"]


@pytest.mark.parametrize("issued", ["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59"])
def test_a_command_issued_at_a_time_with_no_utc_equivalent_is_refused_not_an_overflow(issued: str) -> None:
    # test_commands_fuzz: command.json {"command": "pause", "at": "0001-01-01T00:00:00+23:59"} raised
    # OverflowError (date value out of range) out of apply_command while saying why it was refused.
    state = RolloutState.from_json('{"schemaVersion": 1, "phase": "Progressing", "revision": "r"}')
    command = CommandRequest.from_json(json.dumps({"command": "pause", "at": issued, "revision": "r"}))
    result = apply_command(state, command, NOW)
    assert not result.accepted and result.state == state
    assert issued[:19] in result.message


def test_an_unexpected_answer_quotes_prometheus_briefly(
    served: tuple[FuzzedPrometheus, PrometheusClient],
) -> None:
    # test_prometheus_fuzz (FUZZ_SCALE=4): the detail of "5 series where one was expected" quoted three
    # label sets whole (501 characters there; a label can be any length), and details travel into
    # explain.json, logs and notifications.
    server, client = served
    labels = {"namespace": "ml", "revision": "r" * 100_000}
    body = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": labels}] * 5}}
    server.response = Response(200, "application/json", json.dumps(body).encode())
    outcome = client.instant("up", NOW)
    for parsed in (parse_single(outcome), parse_grouped(outcome)):
        assert isinstance(parsed, QueryFailure) and len(parsed.detail) <= 500, parsed
