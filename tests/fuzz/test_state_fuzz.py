"""Fuzzing what the state ConfigMap holds: ``state.json``, ``command.json`` and ``explain.json``.

Anyone who may edit the ConfigMap can put anything there. Documents of the right shape are drawn,
then broken (a field deleted or given another shape, an unknown field) and written out, then the
text or bytes are broken too (truncation, byte flips, deep nesting, huge and non-finite numbers,
BOMs, UTF-16, non-UTF-8, every kind of ``schemaVersion``).

What must hold for every input: reading raises the record's own format error (a
:class:`StateFormatError`) and nothing else — no ``KeyError``, ``TypeError``, ``RecursionError`` —
or it returns a record whose JSON reads back to an equal record with the same JSON (a fixed point),
and a state's growing lists stay within their bounds.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canary.rollout.records import CommandFormatError, CommandRequest, ExplainDocument, ExplainFormatError
from canary.rollout.state import (
    MAX_HISTORY,
    MAX_ROLLED_BACK,
    CommandKind,
    EvaluationVerdict,
    PauseKind,
    Phase,
    RolloutState,
    StateFormatError,
)

from .support import fuzz_settings

# Without coverage measurement (tests/conftest.py): every line and branch they reach is reached by
# the unit tests as well (checked with coverage against the rest of the suite but e2e and faults),
# and line tracing made them twice as slow.
pytestmark = pytest.mark.untraced

_ZONES = [
    UTC,
    timezone(timedelta(hours=5, minutes=30)),
    timezone(-timedelta(hours=8)),
    timezone(timedelta(0)),
]


def _mostly(valid: st.SearchStrategy[Any], odd: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Nine times in ten a valid value: a document has a dozen fields, and some should parse."""
    return st.integers(0, 9).flatmap(lambda n: odd if n == 0 else valid)


TIMES = _mostly(
    st.datetimes(datetime(1970, 1, 2), datetime(2200, 1, 1), timezones=st.sampled_from(_ZONES)).map(
        datetime.isoformat
    ),
    st.one_of(
        st.sampled_from(
            [
                "2026-12-01T12:00:00Z",
                "2026-12-01T12:00:00",
                "0001-01-01T00:00:00+23:59",
                "9999-12-31T23:59:59-23:59",
            ]
        ),
        st.integers(-(2**40), 2**40),
        st.floats(allow_nan=True, allow_infinity=True),
    ),
)
NAMES = _mostly(st.sampled_from(["llama-00001", "llama-00002"]), st.one_of(st.just(""), st.text(max_size=20)))
MAYBE_NAMES = st.one_of(st.none(), NAMES)
WEIGHTS = _mostly(
    st.integers(0, 100), st.one_of(st.integers(-5, 105), st.sampled_from([10**30, True, 1.5, "50"]))
)
NUMBERS = st.one_of(st.integers(), st.floats(), st.none())


def _obj(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            key: value if isinstance(value, st.SearchStrategy) else st.just(value)
            for key, value in required.items()
        },
        optional={key: value for key, value in optional.items()},
    )


def _long_lists(items: st.SearchStrategy[Any], longest: int) -> st.SearchStrategy[list[Any]]:
    """A few drawn items, or up to ``longest`` copies of a few (past the bounds, cheaply)."""
    few = st.lists(items, max_size=3)
    return st.one_of(
        few, st.builds(lambda drawn, times: (drawn * times)[:longest], few, st.integers(0, longest))
    )


WEIGHT_RECORD = _obj(
    {"weight": st.one_of(st.none(), WEIGHTS), "at": TIMES},
    {"revision": MAYBE_NAMES, "byController": st.booleans()},
)
PHASES = _mostly(st.sampled_from([phase.value for phase in Phase]), st.text(max_size=8))
STATE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "phase": PHASES,
    "inferenceServiceUid": MAYBE_NAMES,
    "revision": MAYBE_NAMES,
    "fingerprint": MAYBE_NAMES,
    "stableRevision": MAYBE_NAMES,
    "startedAt": st.one_of(st.none(), TIMES),
    "step": st.one_of(
        st.none(),
        _obj({"index": st.integers(-1, 10), "weight": WEIGHTS}, {"startedAt": TIMES, "passedAt": TIMES}),
    ),
    "evaluation": _obj(
        {},
        {
            "at": TIMES,
            "verdict": st.sampled_from([verdict.value for verdict in EvaluationVerdict] + ["maybe", None]),
            "requests": NUMBERS,
            "failedChecks": st.lists(NAMES, max_size=3),
            "failureStreak": st.integers(-3, 2**70),
            "queryError": st.booleans(),
            "lastConclusiveAt": TIMES,
            "noDataClockFrom": TIMES,
        },
    ),
    "unreadySince": TIMES,
    "specChangeSeenAt": TIMES,
    "bakeStartedAt": TIMES,
    "pause": st.one_of(
        st.none(),
        _obj(
            {
                "kind": st.sampled_from([kind.value for kind in PauseKind] + ["nap"]),
                "reason": st.text(max_size=30),
                "since": TIMES,
                "resumePhase": PHASES,
            },
            {"observedWeight": st.one_of(st.none(), WEIGHTS)},
        ),
    ),
    "command": st.one_of(
        st.none(),
        _obj(
            {"kind": st.sampled_from([kind.value for kind in CommandKind] + ["reboot"]), "at": TIMES},
            {"by": MAYBE_NAMES},
        ),
    ),
    "intent": st.one_of(st.none(), WEIGHT_RECORD),
    "specWeight": st.one_of(st.none(), WEIGHT_RECORD),
    "unguarded": st.booleans(),
    "approvals": st.lists(WEIGHTS, max_size=4),
    "rolledBack": _long_lists(_obj({"revision": NAMES, "at": TIMES}, {}), MAX_ROLLED_BACK + 8),
    "history": _long_lists(
        _obj(
            {
                "at": TIMES,
                "action": st.sampled_from(["set-weight", "hold", "command:pause"]),
                "weight": st.one_of(st.none(), WEIGHTS),
                "phase": PHASES,
                "event": st.just("CanaryProgressing"),
                "reason": st.text(max_size=20),
                "id": st.text(max_size=12),
            },
            {},
        ),
        MAX_HISTORY + 10,
    ),
}
VERSIONS = _mostly(
    st.sampled_from([1, 2]),
    st.one_of(st.integers(-2, 5), st.sampled_from([1.0, "1", True, None, 10**30, [1]])),
)
STATES = st.builds(
    lambda version, body, drop: {"schemaVersion": version, **body} if not drop else body,
    VERSIONS,
    st.fixed_dictionaries({}, optional=STATE_FIELDS),
    st.integers(0, 9).map(lambda n: n == 0),
)

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=5,
)


def _break(document: dict[str, Any], draw: st.DrawFn) -> None:
    """Delete, replace or add one thing somewhere in ``document``."""
    current: Any = document
    for _ in range(draw(st.integers(0, 3))):
        children = list(current.values()) if isinstance(current, dict) else current
        containers = [child for child in children if isinstance(child, dict | list) and child]
        if not containers:
            break
        current = draw(st.sampled_from(containers))
    if isinstance(current, dict) and current and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(current)))
        if draw(st.booleans()):
            del current[key]
        else:
            current[key] = draw(_JSON)
    elif isinstance(current, dict):
        current[draw(st.text(max_size=6))] = draw(_JSON)
    elif isinstance(current, list) and current:
        current[draw(st.integers(0, len(current) - 1))] = draw(_JSON)


_TEXT_BREAKS = [
    "none",
    "truncate",
    "flip",
    "nest",
    "huge",
    "nan",
    "bom",
    "utf16",
    "latin1",
    "garbage",
    "duplicate",
]


@st.composite
def documents(draw: st.DrawFn, shapes: st.SearchStrategy[dict[str, Any]]) -> bytes | str:
    """A document drawn from ``shapes``, broken in a few places, written out and maybe broken again."""
    document = copy.deepcopy(draw(shapes))  # never mutate what a strategy may hand out again
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        _break(document, draw)
    text = json.dumps(document, allow_nan=True)
    kind = draw(st.sampled_from(["none"] * len(_TEXT_BREAKS) + _TEXT_BREAKS))
    where = draw(st.integers(0, max(len(text) - 1, 0)))
    if kind == "truncate":
        text = text[:where]
    elif kind == "flip" and text:
        text = text[:where] + chr(ord(text[where]) ^ (1 << draw(st.integers(0, 7)))) + text[where + 1 :]
    elif kind == "nest":
        depth = draw(st.sampled_from([50, 999, 5_000, 100_000]))
        text = text[:where] + "[" * depth + "]" * depth + text[where:] if draw(st.booleans()) else "[" * depth
    elif kind == "huge":
        huge = draw(
            st.sampled_from(
                ["1e999", "-1e999", "9" * 5000, "9" * 300, "1" + "0" * 400 + ".5", "0." + "0" * 400 + "1"]
            )
        )
        text = (
            text.replace(": 0", ": " + huge, 1).replace(": 1", ": " + huge, 1)
            if draw(st.booleans())
            else huge
        )
    elif kind == "nan":
        text = text.replace(": 0", ": NaN", 1).replace(": 1", ": Infinity", 1)
    elif kind == "bom":
        return b"\xef\xbb\xbf" + text.encode() if draw(st.booleans()) else "\ufeff" + text
    elif kind == "utf16":
        return text.encode(draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32"])))
    elif kind == "latin1":
        return (
            text.encode("utf-8", "surrogatepass")[:where]
            + b"\xff\xfe\x80"
            + text.encode("utf-8", "surrogatepass")[where:]
        )
    elif kind == "garbage":
        text = draw(
            st.sampled_from(["", "null", "[]", "1", '"x"', "{", "}", "{}", "true", "NaN", "-Infinity"])
        )
    elif kind == "duplicate":
        text = text.replace("{", '{"phase": "Paused", ', 1)
    return text


def _assert_fixed_point(record: Any, reader: Any) -> None:
    written = record.to_json()
    again = reader(written)
    assert again == record, (record, again)
    assert again.to_json() == written


def _read_all(
    strategy: st.SearchStrategy[bytes | str], examples: int, read: Any, error: type[Exception]
) -> Counter[str]:
    """Run the property over ``examples`` inputs; count how many were read and how many refused."""
    outcomes: Counter[str] = Counter()

    @fuzz_settings(examples)
    @given(raw=strategy)
    def run(raw: bytes | str) -> None:
        try:
            record = read(raw)
        except error:
            outcomes["refused"] += 1
            return
        outcomes["read"] += 1
        _assert_fixed_point(record, read)
        if isinstance(record, RolloutState):
            assert len(record.history) <= MAX_HISTORY and len(record.rolled_back) <= MAX_ROLLED_BACK

    run()
    # Both sides are reached: the round trip is exercised, and so is every kind of refusal.
    assert outcomes["read"] >= 10 and outcomes["refused"] >= 10, outcomes
    return outcomes


def test_state_documents() -> None:
    _read_all(documents(STATES), 400, RolloutState.from_json, StateFormatError)


COMMANDS = st.fixed_dictionaries(
    {},
    optional={
        "command": st.one_of(st.sampled_from([kind.value for kind in CommandKind]), st.text(max_size=8)),
        "by": MAYBE_NAMES,
        "at": TIMES,
        "reason": st.one_of(st.none(), st.text(max_size=40)),
        "revision": MAYBE_NAMES,
        "step": st.one_of(st.none(), st.integers(-1, 10), _JSON),
        "id": MAYBE_NAMES,
        "stateResourceVersion": MAYBE_NAMES,
    },
)


def test_command_documents() -> None:
    _read_all(documents(COMMANDS), 300, CommandRequest.from_json, CommandFormatError)


CHECKS = _obj(
    {"name": NAMES, "verdict": st.sampled_from(["pass", "fail", "no-data"])},
    {
        "value": NUMBERS,
        "unit": st.sampled_from(["seconds", "ratio", "bytes", "MiB", "count", "none", "furlongs"]),
        "limit": st.text(max_size=10),
        "stable": NUMBERS,
        "samples": NUMBERS,
        "critical": st.booleans(),
        "detail": st.text(max_size=10),
        "query": st.text(max_size=10),
    },
)
EXPLAINS = _obj(
    {"at": TIMES, "decisionId": st.text(max_size=10)},
    {
        "revision": MAYBE_NAMES,
        "stableRevision": MAYBE_NAMES,
        "action": st.text(max_size=10),
        "verdict": st.one_of(st.none(), st.text(max_size=6)),
        "requests": NUMBERS,
        "reasons": st.lists(st.text(max_size=10), max_size=3),
        "window": st.one_of(st.none(), _obj({"start": TIMES, "end": TIMES}, {})),
        "profiles": st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=2),
        "queries": st.one_of(st.integers(-1, 10**6), st.just(10**40)),
        "checks": st.lists(CHECKS, max_size=4),
    },
)


def test_explain_documents() -> None:
    _read_all(documents(EXPLAINS), 300, ExplainDocument.from_json, ExplainFormatError)
