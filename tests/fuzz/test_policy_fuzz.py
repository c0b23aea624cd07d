"""Fuzzing the policy loader: documents drawn from the JSON Schema, and hostile YAML text and bytes.

8,000 inputs per run by default, to keep the suite within 90 s on two cores shared with the rest of
``make test``; ``FUZZ_SCALE=1.25`` runs 10,000 (about 75 s for these three alone):

* 1,920 documents drawn from ``kserve-canary schema`` (every field, enum, pattern and bound of it),
  or shipped policies with subtrees redrawn from it; some then broken structurally (a field deleted,
  a value of another shape, an unknown or misspelt key);
* 2,400 YAML texts, shipped examples mutated by ``load_text``: byte flips, truncation, duplicated keys,
  deep nesting, huge scalars, anchors and aliases (billion laughs), tabs, BOMs, tags, multi-documents;
* 3,680 files read by ``load_paths`` from a namespace directory: those mutations and NUL bytes,
  non-UTF-8, UTF-16, BOMs.

What must hold for every input, accepted or not:

* loading never raises, and never reports an internal exception as unreadable YAML (only the
  parser's own ``ValueError`` for a 5,000-digit number or an impossible date is allowed there);
* every error names the file it is about, a line inside that file, and a field path that exists in
  the input (an unknown or duplicate key, a bad value) or in the schema (a missing field);
* when the YAML itself parses into mappings, every error names a field (not just "invalid");
* an accepted policy round-trips: its JSON form, written back as YAML, loads to an equal policy.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from canary.policy.loader import UNCONSTRUCTABLE, LoadResult, load_paths, load_text
from canary.policy.model import PromotionPolicy
from canary.policy.schema import policy_json_schema
from canary.policy.scope import SecretScope
from tests.policy.support import valid_policy

from .support import fuzz_settings

# Without coverage measurement (tests/conftest.py): line tracing made these three properties 108 s of
# CPU instead of 49. Every line of canary/policy they reach is reached by tests/policy as well
# (test_field_errors.py reaches the validators' branches one by one; checked with coverage).
pytestmark = pytest.mark.untraced

REPO = Path(__file__).resolve().parents[2]
SCHEMA = policy_json_schema()
EXAMPLES = sorted((REPO / "policies" / "examples").glob("*/*.yaml"))
# (namespace directory, text) of every seed the mutations start from.
SEEDS: list[tuple[str, str]] = [(path.parent.name, path.read_text()) for path in EXAMPLES] + [
    ("ml", valid_policy()),
    ("ml", valid_policy("other", "target-b")),
]

# -- the checks every load must pass ---------------------------------------------------------

_FIELD_PART = re.compile(r'\.?(?:([^.\[\]"]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\])')
# The parser's own complaint about a value it cannot construct (a 5,000-digit int, 2026-13-45).
_PARSER_VALUE_ERROR = UNCONSTRUCTABLE
# What YAML counts as a line break (an error's line may follow any of them).
_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
# Errors about the file rather than a field (each checked to be about a file that is not well-formed
# YAML of mappings only by the loader's own tests; here they are the loader's word).
_NOT_ABOUT_A_FIELD = (
    "YAML syntax error",
    "YAML error:",
    "YAML does not allow the character",
    "the file is empty",
    "expected a PromotionPolicy mapping",
    "the file is binary",
    "the file is not UTF-8",
    "nested deeper than",
    "more than 100000 YAML nodes",
    "needs more memory",
    "a key that is not a string",  # a top-level key such as `on:` (YAML 1.1: true) is no field
    _PARSER_VALUE_ERROR,
)


def _field_parts(field: str) -> list[str | int]:
    """``spec.checks[0].max`` or ``metadata.labels["a.b"]`` as its parts; the whole text must parse."""
    parts: list[str | int] = []
    position = 0
    while position < len(field):
        match = _FIELD_PART.match(field, position)
        assert match is not None and match.end() > position, f"not a field path: {field!r}"
        name, index, quoted = match.groups()
        parts.append(name if name is not None else int(index) if index is not None else json.loads(quoted))
        position = match.end()
    return parts


def _in_document(document: object, parts: list[str | int]) -> bool:
    current = document
    for part in parts:
        if isinstance(current, dict):
            keys = {_paired(str(key)): value for key, value in current.items()}
            if str(part) not in keys:
                return False
            current = keys[str(part)]
        elif isinstance(current, list) and isinstance(part, int):
            if part >= len(current):
                return False
            current = current[part]
        else:
            return False
    return True


def _paired(key: str) -> str:
    # The loader reads a JSON surrogate pair as one character; PyYAML's safe loader leaves two.
    return key.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _in_node(node: yaml.Node | None, parts: list[str | int]) -> bool:
    if not parts:
        return node is not None
    head, rest = parts[0], parts[1:]
    if isinstance(node, yaml.MappingNode):
        return any(
            _paired(str(key.value)) == str(head) and _in_node(value, rest) for key, value in node.value
        )
    if isinstance(node, yaml.SequenceNode) and isinstance(head, int):
        return head < len(node.value) and _in_node(node.value[head], rest)
    return False


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _in_schema(parts: list[str | int], node: dict[str, Any] | None = None) -> bool:
    node = _resolve(node if node is not None else SCHEMA)
    if not parts:
        return True
    head, rest = parts[0], parts[1:]
    for alternative in node.get("anyOf", []):
        if _in_schema(parts, alternative):
            return True
    if isinstance(head, int):
        return "items" in node and _in_schema(rest, node["items"])
    properties = node.get("properties", {})
    if head in properties:
        return _in_schema(rest, properties[head])
    extra = node.get("additionalProperties")
    return isinstance(extra, dict) and _in_schema(rest, extra)


def _oracle(text: str, loader: type[Any]) -> tuple[list[object], bool]:
    """The documents a YAML loader reads before it gives up, and whether it read them all."""
    documents: list[object] = []
    try:
        for document in yaml.load_all(text, Loader=loader):
            documents.append(document)
    except (yaml.YAMLError, ValueError, RecursionError, MemoryError, TypeError):
        return documents, False
    return documents, True


class _Input:
    """The input as PyYAML reads it: libyaml first (fast), the pure-Python reader when they differ."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._read: dict[type[Any], tuple[list[object], bool]] = {}

    def read(self, loader: type[Any]) -> tuple[list[object], bool]:
        if loader not in self._read:
            self._read[loader] = _oracle(self.text, loader)
        return self._read[loader]

    def has(self, parts: list[str | int]) -> bool:
        if any(_in_document(document, parts) for document in self.read(yaml.CSafeLoader)[0]):
            return True
        # Composed, not constructed: a key that a later duplicate overrides is still in the file.
        nodes: list[yaml.Node] = []
        try:
            for node in yaml.compose_all(self.text, Loader=yaml.SafeLoader):
                nodes.append(node)
        except (yaml.YAMLError, RecursionError):
            pass
        return any(_in_node(node, parts) for node in nodes)

    def structured(self) -> bool:
        """Well-formed YAML of mappings: whatever is wrong with it is wrong with a field."""
        documents, complete = self.read(yaml.SafeLoader)
        return (
            complete
            and any(isinstance(document, dict) for document in documents)
            and all(isinstance(document, dict | None) for document in documents)
        )


def check_load(result: LoadResult, path: str, text: str | None) -> str:
    """Assert the loader's contract on one result; say whether it accepted, rejected or both."""
    given = _Input(text) if text is not None else None
    line_count = len(_LINE_BREAK.findall(text)) + 1 if text is not None else None
    for error in result.errors:
        shown = str(error)
        assert error.path == path, shown
        assert shown.startswith(path), shown
        assert error.message.strip(), shown
        assert not error.message.startswith("cannot read this file as YAML (") or (
            error.message == _PARSER_VALUE_ERROR
        ), f"an internal exception reported as unreadable YAML: {shown}"
        if error.line is not None and line_count is not None:
            assert 1 <= error.line <= line_count, shown
        if error.field is not None:
            parts = _field_parts(error.field)
            exists = _in_schema(parts) or (given is not None and given.has(parts))
            assert exists, f"the field of {shown!r} is neither in the input nor in the schema"
        elif not any(reason in error.message for reason in _NOT_ABOUT_A_FIELD):
            assert given is None or not given.structured(), (
                f"a rejection of well-formed YAML names no field: {shown}"
            )
    for loaded in result.policies:
        assert loaded.path == path
        _assert_round_trip(loaded.policy, path)
    if result.policies and result.errors:
        # Only a conflict between two sound documents leaves one loaded beside an error.
        assert all(error.conflict for error in result.errors), result.errors
        return "conflict"
    return "accepted" if result.policies else "rejected"


def _assert_round_trip(policy: PromotionPolicy, path: str) -> None:
    dumped = policy.model_dump(mode="json", by_alias=True)
    again = load_text(json.dumps(dumped), path, namespace=policy.metadata.namespace)
    assert not again.errors, (dumped, [str(error) for error in again.errors])
    assert [loaded.policy for loaded in again.policies] == [policy], dumped


# -- documents drawn from the JSON Schema ----------------------------------------------------

_DNS = st.from_regex(r"[a-z]([a-z0-9-]{0,14}[a-z0-9])?", fullmatch=True)
_TEXT = st.text(max_size=12)
_TEMPLATES = st.sampled_from(
    [
        'sum(rate(x{namespace="{{ namespace }}", revision="{{ revision }}"}[{{ window }}]))',
        "max(up)",
        "{{ revision }} {{ nope }}",
        "{{ revision",
        "   ",
    ]
)
# Strings without a pattern in the schema: mostly plausible names, sometimes anything.
_STRING_HINTS: dict[str, st.SearchStrategy[str]] = {
    "name": st.one_of(_DNS, st.sampled_from(["p99", "errors", "gpu-memory", "Bad_Name-", "a" * 300]), _TEXT),
    "namespace": st.one_of(st.just("ml"), _DNS, _TEXT),
    "inferenceService": st.one_of(_DNS, _TEXT),
    "promql": st.one_of(_TEMPLATES, _TEXT),
    "env": st.one_of(st.sampled_from(["ML_HOOK", "OTHER", "1BAD"]), _TEXT),
    "file": st.one_of(st.sampled_from(["hook/key", "../escape", "/etc/passwd", "a/../../b"]), _TEXT),
    "channel": _TEXT,
}


_NUMBER_TEXT = st.one_of(
    st.integers(0, 10_000).map(str),
    st.tuples(st.integers(0, 999), st.integers(0, 999)).map(lambda pair: f"{pair[0]}.{pair[1]}"),
)
# The schema's two value patterns, drawn directly (from_regex is slow, and these are all there is).
_PATTERNS: dict[str, st.SearchStrategy[str]] = {
    r"^(\d+(\.\d+)?(ms|s|m|h|d))+$|^0$": st.one_of(
        st.just("0"),
        st.lists(
            st.tuples(_NUMBER_TEXT, st.sampled_from(["ms", "s", "m", "h", "d"])).map("".join),
            min_size=1,
            max_size=3,
        ).map("".join),
    ),
    r"^\d+(\.\d+)?%$": _NUMBER_TEXT.map(lambda number: number + "%"),
}
_STRATEGIES: dict[tuple[int, str | None], st.SearchStrategy[Any]] = {}


def from_schema(node: dict[str, Any], name: str | None = None) -> st.SearchStrategy[Any]:
    """A strategy for the values of one schema node (memoised: the schema is a fixed tree)."""
    key = (id(node), name)
    if key not in _STRATEGIES:
        _STRATEGIES[key] = _from_schema(node, name)
    return _STRATEGIES[key]


def _from_schema(node: dict[str, Any], name: str | None) -> st.SearchStrategy[Any]:
    node = _resolve(node)
    if "const" in node:
        return st.just(node["const"])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    if "anyOf" in node:
        return st.one_of([from_schema(alternative, name) for alternative in node["anyOf"]])
    kind = node.get("type")
    if kind == "object":
        properties = node.get("properties", {})
        required = set(node.get("required", []))
        fixed = {key: from_schema(value, key) for key, value in properties.items() if key in required}
        optional = {key: from_schema(value, key) for key, value in properties.items() if key not in required}
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and not properties:
            keys = st.one_of(st.sampled_from(["latency", "request-count", "team", "ttft"]), _TEXT)
            return st.dictionaries(keys, from_schema(extra), max_size=3)
        return st.fixed_dictionaries(fixed, optional=optional)
    if kind == "array":
        low = node.get("minItems", 0)
        return st.lists(from_schema(node["items"], name), min_size=low, max_size=low + 4)
    if kind == "string":
        if "pattern" in node:
            pattern = node["pattern"]
            return _PATTERNS[pattern] if pattern in _PATTERNS else st.from_regex(pattern, fullmatch=True)
        return _STRING_HINTS.get(name or "", _TEXT)
    if kind == "integer":
        return st.integers(node.get("minimum"), node.get("maximum"))
    if kind == "number":
        floats = st.floats(
            min_value=node.get("minimum", node.get("exclusiveMinimum")),
            max_value=node.get("maximum", node.get("exclusiveMaximum")),
            exclude_min="exclusiveMinimum" in node,
            exclude_max="exclusiveMaximum" in node,
            allow_nan=False,
        )
        return st.one_of(floats, st.integers(0, 10_000))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.nothing()


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def schema_documents(draw: st.DrawFn) -> object:
    """A document of the schema's shape; half of the time then broken in one to three places."""
    document = copy.deepcopy(draw(from_schema(SCHEMA)))
    if draw(st.booleans()):
        for _ in range(1 + draw(_below(3))):
            _break(document, draw)
    return document


@functools.cache
def _below(count: int) -> st.SearchStrategy[int]:
    return st.integers(0, count - 1)


def _pick(draw: st.DrawFn, items: list[Any]) -> Any:
    """One of ``items``; strategies are made once per length (making one per draw is slow)."""
    return items[draw(_below(len(items)))]


_SEED_DOCUMENTS = [document for _, text in SEEDS for document in yaml.safe_load_all(text)]


@st.composite
def seeded_documents(draw: st.DrawFn) -> object:
    """A shipped policy with one to four of its subtrees redrawn from the schema (mostly valid ones)."""
    document = copy.deepcopy(_pick(draw, _SEED_DOCUMENTS))
    for _ in range(draw(_below(5))):
        document = _redraw(document, SCHEMA, None, draw)
    if draw(_below(4)) == 0:
        _break(document, draw)
    return document


def _container(node: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node)
    for alternative in node.get("anyOf", []):
        alternative = _resolve(alternative)
        if alternative.get("type") in {"object", "array"}:
            return alternative
    return node


def _redraw(value: object, node: dict[str, Any], name: str | None, draw: st.DrawFn) -> object:
    """``value`` with one subtree (or itself) replaced by a value drawn from its schema ``node``."""
    shape = _container(node)
    properties = shape.get("properties")
    if properties and isinstance(value, dict) and draw(_below(5)) > 0:
        key = _pick(draw, sorted(properties))
        value[key] = (
            _redraw(value[key], properties[key], key, draw)
            if key in value
            else draw(from_schema(properties[key], key))
        )
        return value
    if "items" in shape and isinstance(value, list) and value and draw(_below(5)) > 0:
        index = draw(_below(len(value)))
        value[index] = _redraw(value[index], shape["items"], name, draw)
        return value
    return draw(from_schema(node, name))


def _break(document: object, draw: st.DrawFn) -> None:
    # Walk down a random path, then delete, replace or add something there.
    current = document
    for _ in range(draw(_below(6))):
        children = list(current.values()) if isinstance(current, dict) else current
        containers = (
            [child for child in children if isinstance(child, dict | list)]
            if isinstance(current, dict | list)
            else []
        )
        if not containers:
            break
        current = _pick(draw, containers)
    if isinstance(current, dict):
        action = _pick(draw, ["delete", "replace", "unknown", "typo"])
        keys = sorted(current, key=str)
        if action == "delete" and keys:
            del current[_pick(draw, keys)]
        elif action == "replace" and keys:
            current[_pick(draw, keys)] = draw(_JSON_VALUES)
        elif action == "typo" and keys:
            key = _pick(draw, keys)
            current[str(key)[:-1] + "x"] = current.pop(key)
        else:
            current[draw(_TEXT)] = draw(_JSON_VALUES)
    elif isinstance(current, list):
        if current and draw(st.booleans()):
            current[draw(_below(len(current)))] = draw(_JSON_VALUES)
        else:
            current.append(draw(_JSON_VALUES))


def _as_text(document: object, style: str) -> str:
    if style == "json":
        return json.dumps(document)
    return yaml.dump(document, Dumper=yaml.CSafeDumper, sort_keys=style == "sorted", allow_unicode=True)


@pytest.fixture  # per test (a directory, made in a moment): the module's tests run on several workers
def scope(tmp_path_factory: pytest.TempPathFactory) -> SecretScope:
    root = tmp_path_factory.mktemp("secrets")
    (root / "ml" / "hook").mkdir(parents=True)
    return SecretScope(file_root=root, env_allow={"ml": ("ML_*",)})


def test_documents_drawn_from_the_schema(scope: SecretScope) -> None:
    outcomes: Counter[str] = Counter()

    @fuzz_settings(1920)
    @given(
        document=st.one_of(schema_documents(), seeded_documents()),
        style=st.sampled_from(["json", "sorted", "written"]),
        namespace=st.sampled_from([None, "ml"]),
        secrets=st.booleans(),
    )
    def run(document: object, style: str, namespace: str | None, secrets: bool) -> None:
        text = _as_text(document, style)
        result = load_text(text, "ml/drawn.yaml", namespace=namespace, secrets=scope if secrets else None)
        outcomes[check_load(result, "ml/drawn.yaml", text)] += 1

    run()
    # The generator reaches both sides of the loader: the round trip is really exercised.
    assert outcomes["accepted"] >= 10 and outcomes["rejected"] >= 10, outcomes


# -- hostile YAML text ---------------------------------------------------------------------------

_SCALAR = re.compile(r"(?<=: )[^\s{}\[\],#&*!|>'\"][^\n{}\[\],#]*")
_KEY_LINE = re.compile(r"^\s*-?\s*[A-Za-z][A-Za-z0-9]*:.*$", re.MULTILINE)


def _laughs(levels: int) -> str:
    """A billion laughs of ``4 ** levels`` nodes, its levels as top-level keys of the document."""
    return "l0: &l0 [lol]\n" + "".join(
        f"l{n}: &l{n} [*l{n - 1}, *l{n - 1}, *l{n - 1}, *l{n - 1}]\n" for n in range(1, levels + 1)
    )


_SNIPPETS = [
    "\t",
    "\ufeff",
    "\x00",
    "\x85",
    "\u2028",
    "---\n",
    "...\n",
    "%YAML 1.1\n---\n",
    "%TAG ! tag:evil,2000:\n",
    "!!python/object/apply:os.system ['true']",
    "!!binary 'not base64'",
    "!!timestamp 2026-13-45",
    "!!set {a, b}",
    "!!omap [a: 1]",
    "!custom x",
    "*undefined",
    "&anchor",
    "<<: *anchor",
    "<<: [{}, x]",
    "? [a, b]\n: c\n",
    "? {a: 1}\n: c\n",
    "1: 2\n",
    "~: null\n",
    "'\n",
    '"\\uD800"',
    '"\\x00"',
    "{",
    "]",
    "- ",
    "|\n",
    ">-\n  folded\n",
    "0x" + "f" * 5000,
    "1" * 6000,
    "1." + "0" * 400 + "e+999",
    "-.inf",
    ".nan",
    "2026-02-30",
    "é" * 1000,
]


def _mutate(text: str, kind: str, where: int, amount: int, seeds: list[str]) -> str:
    position = where % (len(text) + 1)
    if kind == "flip" and text:
        index = where % len(text)
        return text[:index] + chr((ord(text[index]) ^ (1 << (amount % 8))) or 1) + text[index + 1 :]
    if kind == "truncate":
        return text[:position]
    if kind == "snippet":
        return text[:position] + _SNIPPETS[amount % len(_SNIPPETS)] + text[position:]
    if kind == "duplicate":
        lines = _KEY_LINE.findall(text)
        if lines:
            line = lines[amount % len(lines)]
            return text.replace(line, f"{line}\n{line}", 1)
        return text
    if kind == "nest":
        # Mostly just past the loader's cap; now and then as deep as costs the most (~0.5 s a file).
        depth = 30 + (amount % 2000 if amount % 16 == 0 else amount % 100)
        value = "[" * depth + "]" * depth if amount % 2 else "{a: " * depth + "x" + "}" * depth
        return text.replace("spec:\n", f"spec:\n  nested: {value}\n", 1) if amount % 3 else value
    if kind == "block-nest":
        depth = 30 + amount % 200
        return "".join(" " * i + "a:\n" for i in range(depth)) + " " * depth + "x\n"
    if kind == "huge":
        matches = list(_SCALAR.finditer(text))
        if matches:
            match = matches[amount % len(matches)]
            huge = ("9" * (300 + amount % 6000)) if amount % 2 else ("x" * (1000 + amount % 8_000))
            return text[: match.start()] + huge + text[match.end() :]
        return text
    if kind == "laughs":
        # Up to 4**7 nodes fit the loader's budget of 100,000 (twice: the keys and the alias); more do not.
        levels = 9 if amount % 16 == 0 else 3 + amount % 6
        return _laughs(levels) + text.replace("spec:\n", f"spec:\n  laughs: *l{levels}\n", 1)
    if kind == "alias":
        return text.replace("metadata:", "metadata: &meta", 1).replace("spec:\n", "spec:\n  copy: *meta\n", 1)
    if kind == "tabs":
        return re.sub(
            r"^( +)", lambda m: "\t" * (len(m.group(1)) // 2), text, count=1 + amount % 5, flags=re.M
        )
    if kind == "bom":
        return "\ufeff" + text
    if kind == "multi":
        other = seeds[amount % len(seeds)]
        return text + ("\n---\n" if amount % 2 else "---\n") + (other if amount % 3 else "just a scalar\n")
    if kind == "crlf":
        return text.replace("\n", "\r\n" if amount % 2 else "\r")
    if kind == "indent":
        lines = text.split("\n")
        index = amount % len(lines)
        lines[index] = " " * (1 + where % 7) + lines[index]
        return "\n".join(lines)
    return text


_TEXT_MUTATIONS = [
    "flip", "truncate", "snippet", "duplicate", "nest", "block-nest", "huge", "laughs", "alias", "tabs",
    "bom", "multi", "crlf", "indent",
]  # fmt: skip
_MUTATIONS = st.lists(
    st.tuples(st.sampled_from(_TEXT_MUTATIONS), st.integers(0, 2**20), st.integers(0, 2**20)),
    min_size=1,
    max_size=4,
)


@fuzz_settings(2400)
@given(seed=st.sampled_from(SEEDS), mutations=_MUTATIONS, directory=st.booleans())
def test_mutated_yaml_text(
    seed: tuple[str, str], mutations: list[tuple[str, int, int]], directory: bool
) -> None:
    namespace, text = seed
    texts = [other for _, other in SEEDS]
    for kind, where, amount in mutations:
        text = _mutate(text, kind, where, amount, texts)
    path = f"{namespace}/mutated.yaml"
    result = load_text(text, path, namespace=namespace if directory else None)
    check_load(result, path, text)


# -- hostile bytes, read from a namespace directory -------------------------------------------

_BYTE_SNIPPETS = [
    b"\x00",
    b"\xff",
    b"\xfe\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xef\xbb\xbf",
    b"\x80\x80",
]


def _mutate_bytes(raw: bytes, kind: str, where: int, amount: int) -> bytes:
    position = where % (len(raw) + 1)
    if kind == "flip" and raw:
        index = where % len(raw)
        return raw[:index] + bytes([raw[index] ^ (1 << (amount % 8))]) + raw[index + 1 :]
    if kind == "insert":
        return raw[:position] + _BYTE_SNIPPETS[amount % len(_BYTE_SNIPPETS)] + raw[position:]
    if kind == "truncate":
        return raw[:position]
    if kind == "utf16":
        return raw.decode("utf-8", "replace").encode("utf-16" if amount % 2 else "utf-16-le")
    if kind == "latin1":
        return raw.decode("utf-8", "replace").replace("a", "é").encode("latin-1", "replace")
    if kind == "bom":
        return b"\xef\xbb\xbf" + raw
    return raw


_BYTE_MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "insert", "truncate", "utf16", "latin1", "bom", "text"]),
        st.integers(0, 2**20),
        st.integers(0, 2**20),
    ),
    min_size=1,
    max_size=4,
)


def test_mutated_policy_files(tmp_path: Path, scope: SecretScope) -> None:
    root = tmp_path / "policies"
    texts = [text for _, text in SEEDS]

    @fuzz_settings(3680)
    @given(seed=st.sampled_from(SEEDS), mutations=_BYTE_MUTATIONS)
    def run(seed: tuple[str, str], mutations: list[tuple[str, int, int]]) -> None:
        namespace, text = seed
        raw = text.encode()
        for kind, where, amount in mutations:
            if kind == "text":
                raw = _mutate(
                    raw.decode("utf-8", "replace"), _TEXT_MUTATIONS[amount % 14], where, amount, texts
                ).encode("utf-8", "surrogatepass")
            else:
                raw = _mutate_bytes(raw, kind, where, amount)
        directory = root / namespace
        directory.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*/*.yaml"):
            stale.unlink()
        file = directory / "policy.yaml"
        file.write_bytes(raw)
        result = load_paths([root], secrets=scope)
        try:
            decoded: str | None = raw.decode("utf-8")
        except UnicodeDecodeError:
            decoded = None
        check_load(result, str(file), decoded if decoded is not None and "\x00" not in decoded else None)
        if b"\x00" in raw or decoded is None:
            assert not result.policies and len(result.errors) == 1, result.errors

    run()
