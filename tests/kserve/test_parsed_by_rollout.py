"""The parsed state and explain records: one per rollout, its current text's (canary.kserve.store)."""

from __future__ import annotations

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
