"""The loader's shortcuts for thousands of policies at startup give exactly what the long way gives.

* ``_construct_plain`` builds a document as PyYAML's safe constructor does, or declines;
* ``_may_be_too_deep`` (a character count) never clears a text the event walk would refuse;
* ``_CLoader.resolve`` (memoised) tags every scalar as PyYAML's resolver does.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from canary.policy import yaml_lines

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["yes", "no", "on", "0x1F", "1_000", "2026-12-01", "~", ".inf", "1e3", "012", "null"]),
)
documents = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)


def composed(text: str) -> tuple[yaml.SafeLoader, yaml.Node | None]:
    reader = yaml_lines._CLoader(text) if yaml_lines._LIBYAML else yaml_lines._Loader(text)
    return reader, reader.get_single_node()


def constructed(text: str) -> Any:
    """What PyYAML's safe constructor makes of ``text`` (a fresh loader: it caches constructed nodes)."""
    reader, node = composed(text)
    try:
        return reader.construct_document(node) if node is not None else None
    finally:
        reader.dispose()


def plain(text: str, *, anchors: bool = True) -> Any:
    return built(text, anchors=anchors)[0]


def built(text: str, *, anchors: bool = True) -> tuple[Any, bool]:
    """The document and whether a mapping repeats a key, as ``_construct_plain`` builds them."""
    reader, node = composed(text)
    try:
        if node is None:
            return None, False
        result = yaml_lines._construct_plain(reader, node, anchors=anchors)
        return result.data, result.duplicates
    finally:
        reader.dispose()


@settings(max_examples=300, deadline=None)
@given(documents, st.booleans())
def test_a_plain_document_is_built_as_pyyamls_constructor_builds_it(document: Any, flow: bool) -> None:
    text = yaml.safe_dump(document, default_flow_style=flow, allow_unicode=True)
    expected = constructed(text)
    assert plain(text) == expected
    assert type(plain(text)) is type(expected)
    # Without "&" no node can repeat: the walk that skips the alias check builds the same.
    assert "&" in text or plain(text, anchors=False) == expected
    # Built twice (the second from the scalar memo), the same values of the same types.
    again = plain(text)
    assert again == expected and repr(again) == repr(expected)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "1", "'1'", "true", "'true'", "01"]), min_size=1, max_size=5))
def test_a_repeated_key_is_noticed_as_the_line_index_notices_it(keys: list[str]) -> None:
    text = (
        "".join(f"{key}: {index}\n" for index, key in enumerate(keys))
        + "m:\n"
        + "".join(f"  {key}: x\n" for key in keys)
    )
    reader, node = composed(text)
    try:
        assert node is not None
        expected = bool(yaml_lines._index_lines(node)[1])
    finally:
        reader.dispose()
    assert built(text)[1] is expected


def test_more_nodes_than_the_budget_are_too_complex_as_the_line_index_counts_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = "a: [1, 2, 3]\nb: {c: 4, d: 5}\n"  # 1 root + 2 values + 3 items + 2 values = 8 nodes
    monkeypatch.setattr(yaml_lines, "_MAX_NODES", 8)
    assert built(text)[0] == {"a": [1, 2, 3], "b": {"c": 4, "d": 5}}
    reader, node = composed(text)
    assert node is not None
    yaml_lines._index_lines(node)  # the index agrees: 8 is within the budget
    monkeypatch.setattr(yaml_lines, "_MAX_NODES", 7)
    with pytest.raises(yaml_lines._TooComplex):
        built(text)
    with pytest.raises(yaml_lines._TooComplex):
        yaml_lines._index_lines(node)
    reader.dispose()


@pytest.mark.parametrize(
    "text",
    [
        "a: &x {b: 1}\nc: *x\n",  # an alias: shared objects
        "base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n",  # a merge key
        "!!set {a, b}\n",
        "!!omap [a: 1, b: 2]\n",
        "? [a, b]\n: c\n",  # a collection as a key
        "a: !custom 1\n",
    ],
    ids=["alias", "merge", "set", "omap", "collection-key", "unknown-tag"],
)
def test_what_is_not_plain_is_left_to_the_constructor(text: str) -> None:
    with pytest.raises(yaml_lines._NotPlain):
        plain(text)


def test_scalars_of_every_plain_tag_match_the_constructor() -> None:
    text = (
        "s: text\nn: ~\nb: true\ni: 0x1F\nf: 1.5e3\nt: 2026-12-01T10:00:00Z\nd: 2026-12-01\n"
        "bin: !!binary aGVsbG8=\nq: '123'\ndup: 1\ndup: 2\n"
    )
    built = plain(text)
    assert built == constructed(text)
    assert built["t"] == datetime.datetime(2026, 12, 1, 10, tzinfo=datetime.UTC)
    assert built["dup"] == 2  # YAML keeps the last (the loader reports the duplicate apart)
    assert built["q"] == "123"


def nested(depth: int, style: str) -> str:
    if style == "flow":
        return "[" * depth + "]" * depth + "\n"
    if style == "block-seq":
        return "".join("  " * level + "-\n" for level in range(depth - 1)) + "  " * (depth - 1) + "- x\n"
    return "".join("  " * level + f"k{level}:\n" for level in range(depth)) + "  " * depth + "v\n"


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=90),
    st.sampled_from(["flow", "block-seq", "block-map"]),
    st.text(alphabet="ab #\n", max_size=40),
)
def test_the_character_bound_never_clears_a_text_too_deep_to_compose(
    depth: int, style: str, noise: str
) -> None:
    text = nested(depth, style) + "#" + noise.replace("\n", " ") + "\n"
    if not yaml_lines._may_be_too_deep(text):
        assert not yaml_lines._too_deep(text), f"cleared a text nested {depth} deep ({style})"


def test_a_typical_policy_is_cleared_without_the_event_walk() -> None:
    # The point of the bound: small files (most policies) skip the event-by-event depth walk.
    policy = (
        "apiVersion: kserve-canary.dev/v1alpha1\nkind: PromotionPolicy\nmetadata: {name: m}\n"
        "spec:\n  target: {inferenceService: m}\n  steps: [10, 50, 100]\n  window: 10m\n"
        "  checks:\n    - {name: p99, metric: latency, quantile: 0.99, max: 2s}\n"
    )
    assert not yaml_lines._may_be_too_deep(policy)
    assert yaml_lines._may_be_too_deep("[" * 64 + "]" * 64)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=20), st.booleans(), st.booleans())
def test_the_memoised_resolver_tags_as_pyyaml_does(value: str, plain_implicit: bool, quoted: bool) -> None:
    reference = yaml.SafeLoader("")
    ours = yaml_lines._CLoader("")
    try:
        for _ in range(2):  # the second answer comes from the memo
            implicit = (plain_implicit, quoted)
            assert ours.resolve(yaml.ScalarNode, value, implicit) == reference.resolve(
                yaml.ScalarNode, value, implicit
            )
    finally:
        ours.dispose()
        reference.dispose()
