"""The parsed state and explain records: one per rollout, its current text's (canary.kserve.store)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from canary.kserve.store import StoredState, _ParsedByRollout


class Counting:
    def __init__(self) -> None:
        self.parsed: list[str] = []

    def __call__(self, text: str) -> str:
        if text == "broken":
            raise ValueError("cannot read")
        self.parsed.append(text)
        return text.upper()


def test_a_text_is_parsed_once_while_it_is_the_rollouts_current_one() -> None:
    parse = Counting()
    cache = _ParsedByRollout(parse)
    assert cache.get("ml/resnet", "v1") == cache.get("ml/resnet", "v1") == "V1"
    assert parse.parsed == ["v1"]
    assert cache.get("ml/bert", "v1") == "V1"  # another rollout's text of the same content
    assert parse.parsed == ["v1", "v1"]


def test_a_superseded_text_is_not_kept() -> None:
    parse = Counting()
    cache = _ParsedByRollout(parse)
    cache.get("ml/resnet", "v1")
    cache.get("ml/resnet", "v2")  # written: v1's record is dropped, not kept beside it
    cache.get("ml/resnet", "v1")
    assert parse.parsed == ["v1", "v2", "v1"]


def test_beyond_its_size_the_least_recently_read_rollout_is_dropped() -> None:
    parse = Counting()
    cache = _ParsedByRollout(parse, size=2)
    cache.get("a", "1")
    cache.get("b", "2")
    cache.get("a", "1")  # a is read again: b is now the least recent
    cache.get("c", "3")
    cache.get("a", "1")
    cache.get("b", "2")
    assert parse.parsed == ["1", "2", "3", "2"]


def test_a_text_that_cannot_be_read_raises_every_time() -> None:
    cache = _ParsedByRollout(Counting())
    for _ in range(2):
        with pytest.raises(ValueError, match="cannot read"):
            cache.get("ml/resnet", "broken")


def test_the_stored_state_reads_through_it() -> None:
    stored = StoredState("ml", "resnet", '{"schemaVersion": 2, "phase": "Idle"}', "1")
    assert stored.state() is stored.state()


def test_the_controller_keeps_a_reading_of_the_latest_evaluation_without_its_promql() -> None:
    from canary.rollout.records import ExplainCheck, ExplainDocument

    query = "sum by (namespace, revision, pod, code_class) (revision_request_count)" * 20
    document = ExplainDocument(
        at=datetime(2026, 12, 1, tzinfo=UTC),
        decision_id="d-1",
        revision="resnet-predictor-00002",
        action="wait",
        verdict="inconclusive",
        reasons=("Holding resnet-predictor-00002 at 10%",),
        checks=(
            ExplainCheck(
                name="p99",
                verdict="not-yet",
                value=0.2,
                limit="≤ 2.00s",
                detail="not yet",
                query=query,
                canary_query="histogram_quantile(0.99, ...)",
                canary_query_note="interpolates",
            ),
        ),
    )
    stored = StoredState("ml", "resnet-reading", None, "1", explain_json=document.to_json())
    reading = stored.explain_reading()
    assert reading is not None and reading is stored.explain_reading()  # parsed once, kept
    check = reading.checks[0]
    assert (check.name, check.verdict, check.value, check.limit, check.detail) == (
        "p99",
        "not-yet",
        0.2,
        "≤ 2.00s",
        "not yet",
    )
    assert (check.query, check.canary_query, check.canary_query_note) == ("", None, "")
    assert (reading.revision, reading.action, reading.reasons) == (
        document.revision,
        document.action,
        document.reasons,
    )
    assert len(reading.to_json()) < len(query)
    # Written back, the evaluation is read whole, and not kept.
    whole = stored.explain_uncached()
    assert whole == document and whole is not stored.explain_uncached()


def test_an_equal_text_read_again_is_not_parsed_and_the_older_copy_is_let_go() -> None:
    import gc
    import weakref

    class Text(str):  # a str that can be weakly referenced: is the older copy still held?
        pass

    calls: list[None] = []

    def parse(text: str) -> str:
        calls.append(None)  # counts without holding the text
        return text.upper()

    cache = _ParsedByRollout(parse)
    first = Text("v1")
    gone = weakref.ref(first)
    assert cache.get("ml/resnet", first) == "V1"
    del first
    again = Text("v1")  # the watch re-listed: an equal text, another object
    assert cache.get("ml/resnet", again) == "V1"
    gc.collect()
    assert len(calls) == 1 and gone() is None
