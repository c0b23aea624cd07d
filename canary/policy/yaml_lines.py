"""YAML with line numbers: composing a policy file into plain values and a map from field paths to
lines, within budgets for nodes and depth, so every error can name its line.

Part of :mod:`canary.policy.loader`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast

import yaml
from pydantic import BaseModel

from canary.policy.model import PromotionPolicy

_Path = tuple[str | int, ...]
_SURROGATE = re.compile("[\ud800-\udfff]")
# Anchors and aliases can make a small file expand exponentially ("billion laughs").
_MAX_NODES = 100_000
# A policy is a few levels deep; PyYAML composes recursively, so 6 KB of "[[[[..." would exhaust the
# interpreter's stack (RecursionError) long before any other budget is reached.
MAX_DEPTH = 64


class _TooComplex(Exception):
    pass


def _index_lines(node: yaml.Node) -> tuple[dict[_Path, int], list[tuple[_Path, int, str]]]:
    """Map every field path of a composed YAML document to its 1-based line; find duplicate keys."""
    lines: dict[_Path, int] = {}
    duplicates: list[tuple[_Path, int, str]] = []
    budget = [_MAX_NODES]

    def walk(current: yaml.Node, path: _Path) -> None:
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooComplex
        lines.setdefault(path, current.start_mark.line + 1)
        if isinstance(current, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in current.value:
                key = str(key_node.value)
                if key in seen:
                    duplicates.append((path, key_node.start_mark.line + 1, key))
                seen.add(key)
                lines[(*path, key)] = key_node.start_mark.line + 1
                walk(value_node, (*path, key))
        elif isinstance(current, yaml.SequenceNode):
            for index, item in enumerate(current.value):
                walk(item, (*path, index))

    walk(node, ())
    return lines, duplicates


class _NotPlain(Exception):
    """A document :func:`_construct_plain` leaves to PyYAML's constructor (an alias, a merge key, a
    set, an omap, a collection as a key)."""


_MAP, _SEQ, _STR = "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq", "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_PLAIN_SCALARS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("null", "bool", "int", "float", "timestamp", "binary")
)


class _Lines(Mapping[_Path, int]):
    """The line of every field path of a composed document, indexed on first use: only a document
    with an error (or a duplicate key) needs them, and thousands of valid policies are parsed at
    startup."""

    def __init__(self, node: yaml.Node) -> None:
        self._node = node
        self._lines: dict[_Path, int] | None = None

    def _index(self) -> dict[_Path, int]:
        if self._lines is None:
            self._lines = _index_lines(self._node)[0]
        return self._lines

    def __getitem__(self, path: _Path) -> int:
        return self._index()[path]

    def __iter__(self) -> Iterator[_Path]:
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())


def _key_line(node: yaml.Node, path: Sequence[str], default: int) -> int:
    """The line of the key at ``path`` (mappings only), without indexing the whole document."""
    line = default
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return line
        found = next(((k, v) for k, v in node.value if str(k.value) == key), None)
        if found is None:
            return line
        line, node = found[0].start_mark.line + 1, found[1]
    return line


class _Plain(NamedTuple):
    data: Any
    duplicates: bool  # some mapping repeats a key (the last one stays, as PyYAML's)


def _construct_plain(loader: yaml.SafeLoader, root: yaml.Node, *, anchors: bool = True) -> _Plain:
    """The document as PyYAML's safe constructor would build it, for the documents policies are:
    mappings, sequences and scalars, each node once. Several times faster than the constructor's
    generic machinery (thousands of policies are parsed at startup); anything else raises
    :class:`_NotPlain` and the constructor builds it. More than :data:`_MAX_NODES` nodes raise
    :class:`_TooComplex`. ``anchors=False``: the text has no ``&``, so no node can repeat."""
    seen: set[int] = set()
    budget = [_MAX_NODES]
    duplicates = [False]
    constructors = loader.yaml_constructors

    def build(node: yaml.Node, counted: bool = True) -> Any:
        if counted:  # as _index_lines counts: every node but a mapping's keys
            budget[0] -= 1
            if budget[0] < 0:
                raise _TooComplex
        if anchors:
            if id(node) in seen:
                raise _NotPlain  # an alias: shared (or recursive) objects are the constructor's job
            seen.add(id(node))
        tag = node.tag
        if isinstance(node, yaml.ScalarNode):
            if tag == _STR:
                return _paired(node.value)
            if tag in _PLAIN_SCALARS:
                key = (tag, node.value)
                value = _SCALARS.get(key, _MISSING)
                if value is _MISSING:
                    value = constructors[tag](loader, node)
                    if len(_SCALARS) < 4096 and tag != _BINARY:
                        _SCALARS[key] = value  # ints, floats, bools, nulls, timestamps: immutable
                return value
            raise _NotPlain
        if isinstance(node, yaml.MappingNode) and tag == _MAP:
            mapping: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE:
                    raise _NotPlain
                mapping[build(key_node, False)] = build(value_node)  # a duplicate key: the last stays
            if len({str(key_node.value) for key_node, _ in node.value}) < len(node.value):
                duplicates[0] = True  # the same key text twice, as _index_lines finds them
            return mapping
        if isinstance(node, yaml.SequenceNode) and tag == _SEQ:
            return [build(item) for item in node.value]
        raise _NotPlain

    data = build(root)
    return _Plain(data, duplicates[0])


_MISSING = object()
_BINARY = "tag:yaml.org,2002:binary"
# Scalars by (tag, text) as the safe constructor builds them: policies repeat "10", "true", "30s".
_SCALARS: dict[tuple[str, str], Any] = {}


def _line_for(lines: Mapping[_Path, int], loc: Sequence[str | int], default: int) -> int:
    for end in range(len(loc), -1, -1):
        found = lines.get(tuple(loc[:end]))
        if found is not None:
            return found
    return default


def _all_aliases(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names: set[str] = set()
    for name, info in model.model_fields.items():
        names.add(info.alias or name)
        for candidate in _model_types(info.annotation):
            names |= _all_aliases(candidate, seen)
    return names


def _model_types(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in getattr(annotation, "__args__", ()) or ():
        yield from _model_types(argument)
    origin = getattr(annotation, "__origin__", None)
    if origin is not None and origin is not annotation:
        yield from _model_types(origin)


_KNOWN_FIELDS = sorted(_all_aliases(PromotionPolicy))


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        name = str(error["loc"][-1])
        close = difflib.get_close_matches(name, _KNOWN_FIELDS, n=1, cutoff=0.75)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"unknown field '{name}'{hint}: a misspelt field would silently disable what it configures"
    if kind == "missing":
        return "required field is missing"
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix) :]
    if kind in {"literal_error", "enum"}:
        message += f" (got {error.get('input')!r})"
    return message


class _TooDeep(Exception):
    def __init__(self, line: int) -> None:
        super().__init__(line)
        self.line = line


class _Loader(yaml.SafeLoader):
    """The safe loader, refusing documents nested deeper than :data:`MAX_DEPTH`."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooDeep(self.peek_event().start_mark.line + 1)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> str:
        return _paired(super().construct_scalar(node))


def _paired(value: str) -> str:
    # JSON (a policy may be JSON) writes a character past U+FFFF as a surrogate pair ("\ud83d\ude80"),
    # which YAML decodes as two lone surrogates that no string field accepts: pair them again.
    if not value.isascii() and _SURROGATE.search(value):
        value = value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    return value


_COLLECTION_START = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_COLLECTION_END = (yaml.MappingEndEvent, yaml.SequenceEndEvent)
_NODE_EVENTS = (yaml.ScalarEvent, yaml.AliasEvent, *_COLLECTION_START)
_LIBYAML: bool = bool(yaml.__with_libyaml__)


class _NotForLibyaml(Exception):
    """libyaml refused the text or cannot compose it safely: PyYAML's parser reads it instead."""


if _LIBYAML:
    from yaml._yaml import CParser  # type: ignore[import-not-found,unused-ignore]

    class _CLoader(yaml.CSafeLoader):  # type: ignore[misc,unused-ignore]
        """libyaml's parser and composer (about 4x faster than PyYAML's, which matters for
        thousands of policies), the same safe constructor. Its composer recurses in C, so a text
        is first checked for depth on libyaml's event stream (:func:`_too_deep`), which is flat."""

        def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> str:
            return _paired(super().construct_scalar(node))

        def resolve(self, kind: type[yaml.Node], value: Any, implicit: tuple[bool, bool]) -> str:
            # A plain scalar's tag depends on its text alone (the safe loader has no path
            # resolvers); policies repeat the same keys and values thousands of times.
            if kind is not yaml.ScalarNode or not isinstance(value, str) or len(value) > 64:
                return cast(str, super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call]
            key = (value, implicit)
            tag = _RESOLVED.get(key)
            if tag is None:
                tag = cast(str, super().resolve(kind, value, implicit))  # type: ignore[no-untyped-call]
                if len(_RESOLVED) < 65_536:
                    _RESOLVED[key] = tag
            return tag

    _RESOLVED: dict[tuple[str, tuple[bool, bool]], str] = {}

    def _too_deep(text: str) -> bool:
        """Whether a node is nested deeper than :data:`MAX_DEPTH` (counted as :class:`_Loader`
        counts: every node one level below its collection)."""
        parser = CParser(text)
        depth = 0
        try:
            while parser.check_event():
                event = parser.get_event()
                if isinstance(event, _NODE_EVENTS) and depth + 1 > MAX_DEPTH:
                    return True
                if isinstance(event, _COLLECTION_START):
                    depth += 1
                elif isinstance(event, _COLLECTION_END):
                    depth -= 1
        finally:
            parser.dispose()
        return False


def _may_be_too_deep(text: str) -> bool:
    """False when ``text`` cannot hold a node under :data:`MAX_DEPTH` collections, without parsing.

    Every collection starts at an indicator character of its own: ``[`` or ``{`` (flow), ``-``
    (a block sequence's first entry), ``:`` or ``?`` (a mapping's first key). Fewer of them than
    ``MAX_DEPTH`` in the whole text (counting those in scalars and comments too) is a bound on the
    nesting: most policy files pass here, and only larger ones are walked event by event."""
    indicators = sum(text.count(char) for char in "[{-:?")
    return indicators >= MAX_DEPTH


def _loader(text: str, fast: bool) -> yaml.SafeLoader:
    if fast:
        if _may_be_too_deep(text) and _too_deep(text):
            raise _NotForLibyaml
        return cast(yaml.SafeLoader, _CLoader(text))
    return _Loader(text)
