"""Loading policy files and directories, with errors as precise as a compiler's.

Every problem is a :class:`PolicyError` rendered as ``path:line: field.path: message``. Loading never
raises for bad input: a broken file is reported and the valid policies beside it still load.

Directories mounted from a ConfigMap or by git-sync contain a ``..data`` symlink and
``..<timestamp>`` directories holding the same files again; every dot-entry is skipped so nothing is
read twice.

A policy root is laid out by namespace: ``DIR/<namespace>/**/*.yaml``. The first directory under the
root *is* the policy's namespace (``metadata.namespace`` may be omitted, or must say the same), so a
team that can write only ``DIR/ml/`` governs only ``ml``. ``NamespaceSource.METADATA`` trusts
``metadata.namespace`` instead (one platform-owned repository); a file named directly (not found by
walking a root) is read that way too.

Hostile input is input like any other: a file is read only if it is a regular file (never blocking on
a FIFO or a device), at most :data:`MAX_FILE_BYTES`, nested at most :data:`MAX_DEPTH` levels, expanding
to at most 100 000 nodes; whatever still goes wrong in one file (``RecursionError``, ``MemoryError``,
a decoding error) is an error of that file, never an exception for the caller. A file with any error
is rejected whole: none of its documents load.
"""

from __future__ import annotations

import difflib
import errno
import json
import os
import re
import stat as stat_module
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, cast

import yaml
from pydantic import BaseModel, ValidationError

from canary.policy.crd import policy_document
from canary.policy.model import NotifyTarget, PromotionPolicy, SecretRef
from canary.policy.scope import NamespaceSource, ScopeError, SecretScope

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "LoadResult",
    "LoadedPolicy",
    "ObjectRef",
    "ObjectRules",
    "PolicyError",
    "load_object",
    "load_paths",
    "load_text",
]

# A policy is mounted from a ConfigMap, which holds 1 MiB at most; anything larger is a mistake.
MAX_FILE_BYTES = 1024 * 1024
# Anchors and aliases can make a small file expand exponentially ("billion laughs").
_MAX_NODES = 100_000
# A policy is a few levels deep; PyYAML composes recursively, so 6 KB of "[[[[..." would exhaust the
# interpreter's stack (RecursionError) long before any other budget is reached.
MAX_DEPTH = 64
_POLICY_SUFFIXES = (".yaml", ".yml")

_Path = tuple[str | int, ...]


@dataclass(frozen=True)
class PolicyError:
    """One problem in one file: ``line`` is 1-based, ``field`` a dotted path like ``spec.checks[0].max``."""

    path: str
    line: int | None
    field: str | None
    message: str
    # Two policies claim one InferenceService: reported on both files, but the file itself is sound
    # (the registry keeps the established claimant running).
    conflict: bool = False

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"

    @property
    def sort_key(self) -> tuple[str, int, str, str]:
        return (self.path, self.line or 0, self.field or "", self.message)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "field": self.field, "message": self.message}


@dataclass(frozen=True)
class ObjectRef:
    """The PromotionPolicy object (custom resource) a policy was read from."""

    namespace: str
    name: str
    uid: str | None = None
    generation: int | None = None

    @property
    def origin(self) -> str:
        return f"promotionpolicy/{self.namespace}/{self.name}"


@dataclass(frozen=True)
class LoadedPolicy:
    policy: PromotionPolicy
    path: str  # the file, or ``promotionpolicy/<namespace>/<name>`` for an object
    line: int  # where the document starts (0 for an object)
    document: int  # 0-based index of the YAML document in its file
    target_line: int  # where spec.target.inferenceService is written
    object: ObjectRef | None = None  # read from a PromotionPolicy object, not a file

    @property
    def origin(self) -> str:
        return self.object.origin if self.object is not None else f"{self.path}:{self.line}"


@dataclass
class LoadResult:
    policies: list[LoadedPolicy] = field(default_factory=list)
    errors: list[PolicyError] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    # InferenceServices claimed by more than one policy -> every claimant, in path order. ``policies``
    # holds the first of them (the deterministic choice); the registry may keep an established one.
    conflicts: dict[str, list[LoadedPolicy]] = field(default_factory=dict)

    @property
    def contested(self) -> set[str]:
        return set(self.conflicts)

    @property
    def ok(self) -> bool:
        return not self.errors

    def by_key(self) -> dict[str, LoadedPolicy]:
        return {loaded.policy.key: loaded for loaded in self.policies}


_PLAIN_KEY = re.compile(r"^[^.\[\]\"\s\x00-\x1f]+$")


def format_loc(loc: Iterable[str | int]) -> str:
    """``spec.checks[0].max``; a key that is empty or holds ``.``, ``[``, ``]``, ``"`` or a space is quoted
    (``metadata.labels["a.b"]``, ``[""]``) so the path stays unambiguous and never empty."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif not _PLAIN_KEY.fullmatch(str(part)):
            text += f"[{json.dumps(str(part), ensure_ascii=False)}]"
        else:
            text += f".{part}" if text else str(part)
    return text


# ---------------------------------------------------------------------------------------------
# YAML with line numbers


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


def _validation_errors(
    exc: ValidationError, path: str, lines: Mapping[_Path, int], start_line: int
) -> list[PolicyError]:
    errors = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        if error["type"] not in {"missing", "extra_forbidden"}:
            # Normalisation can add levels the file does not have (``steps: [0]`` is validated as
            # ``{weight: 0}``): point at what the user wrote.
            # A path not in the file at all (a key that is not a string: ``1: x``) is kept as it is.
            written = loc
            while written and written not in lines:
                written = written[:-1]
            loc = written or loc
        errors.append(
            PolicyError(
                path=path,
                line=_line_for(lines, loc, start_line),
                field=format_loc(loc) or None,
                message=_message(error),
            )
        )
    return errors


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


_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class _Origin:
    """Where a file was found: its namespace directory (None: take ``metadata.namespace``)."""

    namespace: str | None = None
    root: str | None = None  # the policy root it was found under, for messages


def _secret_refs(policy: PromotionPolicy) -> Iterator[tuple[tuple[str | int, ...], SecretRef]]:
    targets: list[NotifyTarget] = list(policy.spec.notify)
    for index, target in enumerate(targets):
        base: tuple[str | int, ...] = ("spec", "notify", index)
        if target.slack is not None:
            yield (*base, "slack", "webhookUrlFrom"), target.slack.webhook_url_from
        if target.teams is not None:
            yield (*base, "teams", "webhookUrlFrom"), target.teams.webhook_url_from
        if target.discord is not None:
            yield (*base, "discord", "webhookUrlFrom"), target.discord.webhook_url_from
        if target.webhook is not None:
            yield (*base, "webhook", "urlFrom"), target.webhook.url_from
            if target.webhook.secret_from is not None:
                yield (*base, "webhook", "secretFrom"), target.webhook.secret_from
    for index, gate in enumerate(policy.spec.gates):
        where: tuple[str | int, ...] = ("spec", "gates", index, "webhook")
        yield (*where, "urlFrom"), gate.webhook.url_from
        if gate.webhook.secret_from is not None:
            yield (*where, "secretFrom"), gate.webhook.secret_from


def _scope_errors(
    policy: PromotionPolicy, scope: SecretScope, path: str, lines: Mapping[_Path, int], start: int
) -> list[PolicyError]:
    errors = []
    for loc, ref in _secret_refs(policy):
        try:
            scope.check(ref, policy.metadata.namespace)
        except ScopeError as error:
            kind = "env" if ref.env is not None else "file"
            where = (*loc, kind)
            errors.append(PolicyError(path, _line_for(lines, where, start), format_loc(where), str(error)))
    return errors


def _bind_namespace(
    data: dict[Any, Any], origin: _Origin, path: str, lines: Mapping[_Path, int], start: int
) -> PolicyError | None:
    """Fill in ``metadata.namespace`` from the directory, or refuse a different one."""
    if origin.namespace is None:
        return None
    metadata = data.get("metadata")
    if not isinstance(metadata, dict):
        return None  # validation reports it
    written = metadata.get("namespace")
    if written is None:
        data["metadata"] = {**metadata, "namespace": origin.namespace}
        return None
    if written != origin.namespace:
        return PolicyError(
            path,
            _line_for(lines, ("metadata", "namespace"), start),
            "metadata.namespace",
            f"is {written!r} but the file lives in {os.path.join(origin.root or '', origin.namespace)}/: "
            f"a policy governs only the namespace of its directory (omit metadata.namespace, or move "
            f"the file to the {written} directory)",
        )
    return None


def _load_documents(
    text: str, path: str, origin: _Origin | None = None, scope: SecretScope | None = None
) -> tuple[list[LoadedPolicy], list[PolicyError]]:
    """Every policy in ``text``, or none: a file with any error is rejected whole."""
    origin = origin or _Origin()
    try:
        policies, errors = _read_documents(text, path, origin, scope)
    except _TooDeep as exc:
        return [], [PolicyError(path, exc.line, None, f"YAML nested deeper than {MAX_DEPTH} levels")]
    except RecursionError:
        return [], [PolicyError(path, None, None, f"YAML nested deeper than {MAX_DEPTH} levels")]
    except MemoryError:
        return [], [PolicyError(path, None, None, "the document needs more memory than a policy can")]
    except yaml.reader.ReaderError as exc:
        # The reader checks the whole text before any document: a control character (U+0001, U+007F).
        line = text[: exc.position].count("\n") + 1 if isinstance(exc.position, int) else None
        shown = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        return [], [PolicyError(path, line, None, f"YAML does not allow the character {shown} in a file")]
    except Exception as exc:
        # ValueError for a 5000-digit integer, and whatever else a parser can raise on hostile bytes.
        return [], [PolicyError(path, None, None, f"cannot read this file as YAML ({type(exc).__name__})")]
    if errors:
        return [], errors
    return policies, errors


def _read_documents(
    text: str, path: str, origin: _Origin, scope: SecretScope | None
) -> tuple[list[LoadedPolicy], list[PolicyError]]:
    """libyaml for what it reads without complaint (the wheels ship it); anything it refuses or
    cannot read safely, PyYAML's own parser reads, so every YAML error is reported as before (libyaml
    words them differently, and refuses JSON's surrogate-pair escapes that PyYAML decodes)."""
    if _LIBYAML:
        try:
            return _parse_documents(text, path, origin, scope, fast=True)
        except Exception:  # noqa: S110 - whatever libyaml raises, PyYAML's parser reports below
            pass
    return _parse_documents(text, path, origin, scope, fast=False)


def _parse_documents(
    text: str, path: str, origin: _Origin, scope: SecretScope | None, *, fast: bool
) -> tuple[list[LoadedPolicy], list[PolicyError]]:
    policies: list[LoadedPolicy] = []
    errors: list[PolicyError] = []
    document = -1
    loader: yaml.SafeLoader | None = None
    try:
        loader = _loader(text, fast)
        while loader.check_node():
            node = loader.get_node()
            document += 1
            if node is None:
                continue
            start = node.start_mark.line + 1
            lines: Mapping[_Path, int] = _Lines(node)
            duplicates: list[tuple[_Path, int, str]] = []
            try:
                try:
                    plain = _construct_plain(loader, node, anchors="&" in text)
                    data = plain.data
                    if plain.duplicates:
                        lines, duplicates = _index_lines(node)
                except _NotPlain:
                    # PyYAML's constructor expands aliases: count the nodes it would build first.
                    lines, duplicates = _index_lines(node)
                    data = loader.construct_document(node)
            except _TooComplex:
                errors.append(
                    PolicyError(path, start, None, f"document expands to more than {_MAX_NODES} YAML nodes")
                )
                continue
            for parent, line, key in duplicates:
                errors.append(
                    PolicyError(
                        path, line, format_loc((*parent, key)), "duplicate key: YAML keeps only the last"
                    )
                )
            if data is None:
                continue
            if not isinstance(data, dict):
                kind = "a list" if isinstance(data, list) else f"a {type(data).__name__}"
                errors.append(
                    PolicyError(
                        path,
                        start,
                        None,
                        f"expected a PromotionPolicy mapping at the top, got {kind} "
                        f"(document {document + 1} of the file; a file with any invalid document is "
                        "rejected whole)",
                    )
                )
                continue
            # A manifest fetched from the API server (kubectl get -o yaml) validates as the object it
            # is: its status and server-set metadata are not the author's and are set aside.
            data = policy_document(data)
            mismatch = _bind_namespace(data, origin, path, lines, start)
            if mismatch is not None:
                errors.append(mismatch)
                continue
            try:
                policy = PromotionPolicy.model_validate(data)
            except ValidationError as exc:
                errors.extend(_validation_errors(exc, path, lines, start))
                continue
            if scope is not None:
                refused = _scope_errors(policy, scope, path, lines, start)
                if refused:
                    errors.extend(refused)
                    continue
            if not duplicates:
                target_line = _key_line(node, ("spec", "target", "inferenceService"), start)
                policies.append(LoadedPolicy(policy, path, start, document, target_line))
    except yaml.reader.ReaderError:
        raise  # the whole text is unreadable: _load_documents says which character, on which line
    except yaml.MarkedYAMLError as exc:
        if fast:
            raise _NotForLibyaml from exc
        mark = exc.problem_mark or exc.context_mark
        error_line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        errors.append(PolicyError(path, error_line, None, f"YAML syntax error: {problem}"))
    except yaml.YAMLError as exc:
        if fast:
            raise _NotForLibyaml from exc
        errors.append(PolicyError(path, None, None, f"YAML error: {exc}"))
    finally:
        if loader is not None:
            loader.dispose()
    if not policies and not errors:
        # Only comments, "---" separators or nothing at all.
        errors.append(PolicyError(path, None, None, "the file is empty: it holds no policy document"))
    return policies, errors


def load_text(
    text: str,
    path: str = "<string>",
    *,
    namespace: str | None = None,
    secrets: SecretScope | None = None,
) -> LoadResult:
    """Load the policies in one YAML text (several documents allowed).

    ``namespace``: the namespace directory the text lives in (None: ``metadata.namespace`` decides);
    ``secrets``: check secret references against these rules (None: not checked).
    """
    policies, errors = _load_documents(text, path, _Origin(namespace), secrets)
    result = LoadResult(policies=policies, errors=errors, files=[path])
    _resolve_conflicts(result)
    return result


# ---------------------------------------------------------------------------------------------
# Files and directories


def _read_policy_file(path: Path, shown: str) -> tuple[str | None, PolicyError | None]:
    """The text of a regular file of at most :data:`MAX_FILE_BYTES`; never blocks (FIFOs, devices)."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting forever.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except PermissionError:
        return None, PolicyError(shown, None, None, "cannot read the file: permission denied")
    except FileNotFoundError:
        return None, PolicyError(
            shown, None, None, "cannot read the file: it does not exist (a dangling symlink?)"
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, PolicyError(shown, None, None, "cannot read the file: symlink loop")
        return None, PolicyError(shown, None, None, f"cannot read the file: {exc.strerror or exc}")
    try:
        info = os.fstat(descriptor)
        if not stat_module.S_ISREG(info.st_mode):
            return None, PolicyError(
                shown, None, None, "not a regular file (a FIFO, socket or device): policies are files"
            )
        if info.st_size > MAX_FILE_BYTES:
            return None, _too_large(shown)
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(descriptor, MAX_FILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        raw = b"".join(chunks)
    except OSError as exc:
        return None, PolicyError(shown, None, None, f"cannot read the file: {exc.strerror or exc}")
    finally:
        os.close(descriptor)
    if len(raw) > MAX_FILE_BYTES:
        return None, _too_large(shown)
    if b"\x00" in raw:
        return None, PolicyError(shown, None, None, "the file is binary (it contains NUL bytes), not YAML")
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return None, PolicyError(shown, line, None, "the file is not UTF-8 text")


def _too_large(shown: str) -> PolicyError:
    return PolicyError(
        shown, None, None, f"the file is larger than {MAX_FILE_BYTES // 1024} KiB, the most a ConfigMap holds"
    )


def _walk(
    directory: Path, shown: str, visited: set[tuple[int, int]], depth: int = 0
) -> Iterator[tuple[Path, str, tuple[str, ...], PolicyError | None]]:
    """Yield policy files under ``directory`` in a stable order, skipping dot-entries.

    Each file comes with the directory names between ``directory`` and it.
    """
    try:
        stat = directory.stat()
    except OSError as exc:
        reason = "symlink loop" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        yield directory, shown, (), PolicyError(shown, None, None, f"cannot read the directory: {reason}")
        return
    identity = (stat.st_dev, stat.st_ino)
    if identity in visited:
        yield (
            directory,
            shown,
            (),
            PolicyError(
                shown, None, None, "symlink loop: this directory was already read through another path"
            ),
        )
        return
    if depth > MAX_DEPTH:
        yield directory, shown, (), PolicyError(shown, None, None, "directories nested too deep")
        return
    visited = visited | {identity}
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError as exc:
        yield (
            directory,
            shown,
            (),
            PolicyError(shown, None, None, f"cannot read the directory: {exc.strerror or exc}"),
        )
        return
    for entry in entries:
        if entry.name.startswith("."):
            continue
        child = Path(entry.path)
        child_shown = os.path.join(shown, entry.name)
        try:
            is_dir = entry.is_dir(follow_symlinks=True)
        except OSError:
            is_dir = False
        if is_dir:
            for found, found_shown, parts, problem in _walk(child, child_shown, visited, depth + 1):
                yield found, found_shown, (entry.name, *parts), problem
        elif entry.name.endswith(_POLICY_SUFFIXES):
            yield child, child_shown, (), None
        elif entry.is_symlink() and not os.path.exists(entry.path):
            # A broken link that is not a .yaml file is not ours to read; a loop is worth a word.
            try:
                os.stat(entry.path)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    yield child, child_shown, (), PolicyError(child_shown, None, None, "symlink loop")


def _origin(
    parts: tuple[str, ...], root_shown: str, path_shown: str, namespaces: NamespaceSource
) -> tuple[_Origin | None, PolicyError | None]:
    if namespaces is NamespaceSource.METADATA:
        return _Origin(), None
    if not parts:
        name = os.path.basename(path_shown)
        return None, PolicyError(
            path_shown,
            None,
            None,
            f"a policy file lives in its namespace's directory: move it to "
            f"{os.path.join(root_shown, '<namespace>', name)} (the directory decides the namespace a "
            "policy may govern; give the policy root, the parent of the namespace directories; "
            "--policy-namespaces metadata trusts metadata.namespace instead)",
        )
    namespace = parts[0]
    if len(namespace) > 63 or not _NAMESPACE_DIR.match(namespace):
        return None, PolicyError(
            path_shown,
            None,
            None,
            f"directory {os.path.join(root_shown, namespace)}/ is not a namespace name (a DNS-1123 "
            "label): the first directory under the policy root is the namespace of the policies in it",
        )
    return _Origin(namespace, root_shown), None


def _realpath(directory: str, resolved: dict[str, str]) -> str:
    """``os.path.realpath`` of a directory, once per :func:`load_paths` call (``resolved``): a
    directory swapped for a symlink between two loads, as git-sync does, is resolved afresh."""
    found = resolved.get(directory)
    if found is None:
        found = resolved[directory] = os.path.realpath(directory)
    return found


def _escapes(path: Path, directory: Path, shown: str, resolved: dict[str, str]) -> PolicyError | None:
    """A symlink out of the file's namespace directory (or the root): not read.

    A team committing ``x.yaml -> /var/run/secrets/...`` to a synced repository would otherwise have
    the controller parse a file it may read, and quote parts of it in errors.
    """
    inside = _realpath(os.fspath(directory), resolved)
    if path.is_symlink():
        target = os.path.realpath(path)
    else:
        # Not a link itself: it resolves where its directory does (one realpath per directory,
        # not one per file: 10,000 policies in a directory would otherwise resolve it 20,000 times).
        target = os.path.join(_realpath(os.fspath(path.parent), resolved), path.name)
    if target == inside or target.startswith(inside.rstrip(os.sep) + os.sep):
        return None
    return PolicyError(
        shown, None, None, f"a symlink leading out of {directory}: policy files are read only inside it"
    )


def load_paths(
    paths: Sequence[str | os.PathLike[str]],
    *,
    namespaces: NamespaceSource = NamespaceSource.DIRECTORY,
    secrets: SecretScope | None = None,
) -> LoadResult:
    """Load every policy in the given files and directory trees.

    A directory is a policy root (``DIR/<namespace>/**/*.yaml`` unless ``namespaces`` is METADATA); a
    file named directly takes its namespace from ``metadata.namespace``. ``secrets``: check secret
    references against these rules (None: not checked).
    """
    result = LoadResult()
    resolved: dict[str, str] = {}  # directory -> its realpath, for this call
    for given in paths:
        root = Path(given)
        shown = os.fspath(given)
        candidates: Iterable[tuple[Path, str, tuple[str, ...], PolicyError | None]]
        directory = root.is_dir()
        if directory:
            candidates = _walk(root, shown, set())
        elif root.exists() or root.is_symlink():
            candidates = [(root, shown, (), None)]
        else:
            result.errors.append(PolicyError(shown, None, None, "no such file or directory"))
            continue
        for path, path_shown, parts, problem in candidates:
            if problem is not None:
                result.errors.append(problem)
                continue
            result.files.append(path_shown)
            origin: _Origin | None = _Origin()
            if directory:
                origin, misplaced = _origin(parts, shown, path_shown, namespaces)
                if misplaced is None:
                    misplaced = _escapes(path, root / parts[0] if parts else root, path_shown, resolved)
                if misplaced is not None:
                    result.errors.append(misplaced)
                    continue
            text, read_error = _read_policy_file(path, path_shown)
            if read_error is not None:
                result.errors.append(read_error)
                continue
            assert text is not None
            policies, errors = _load_documents(text, path_shown, origin, secrets)
            result.policies.extend(policies)
            result.errors.extend(errors)
    _resolve_conflicts(result)
    return result


_NAMESPACE_DIR = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _resolve_conflicts(result: LoadResult) -> None:
    """Two policies for one InferenceService: neither governs it (docs/design.md §5).

    Every claimant is told (an error on each, ``conflict=True``) and none stays in ``policies``;
    ``conflicts`` keeps them all, so the controller can hold the rollout until one is removed.
    """
    by_key: dict[str, list[LoadedPolicy]] = defaultdict(list)
    for loaded in result.policies:
        by_key[loaded.policy.key].append(loaded)
    for key, group in by_key.items():
        if len(group) < 2:
            continue
        group.sort(key=lambda loaded: (loaded.path, loaded.document))
        result.conflicts[key] = group
        result.policies = [p for p in result.policies if p.policy.key != key]
        result.errors.extend(conflict_errors(key, group))


def conflict_errors(key: str, group: Sequence[LoadedPolicy]) -> list[PolicyError]:
    """The errors telling each claimant of ``key`` that it does not govern it while the others exist."""
    errors = []
    for loaded in group:
        others = ", ".join(f"'{o.policy.metadata.name}' ({o.origin})" for o in group if o is not loaded)
        message = (
            f"InferenceService {key} is also claimed by {others}: neither governs it, and its rollout is "
            "held (not paused, not rolled back) until all but one are removed (one policy per "
            "InferenceService)"
        )
        errors.append(
            PolicyError(
                loaded.path,
                None if loaded.object is not None else loaded.target_line,
                "spec.target.inferenceService",
                message,
                conflict=True,
            )
        )
    return errors


# ---------------------------------------------------------------------------------------------
# PromotionPolicy objects (custom resources)

# What the API server adds to every object's metadata: not the author's, never validated. A
# PromotionPolicy's own metadata is name, namespace, labels and annotations (as in a file).
_AUTHORED_METADATA = ("name", "namespace", "labels", "annotations")


@dataclass(frozen=True)
class ObjectRules:
    """What a PromotionPolicy object may ask for (docs/design.md §5, "Tenancy").

    An object is written by whoever may create it in its namespace — a model team — so it reaches
    only what that namespace may: secret references name keys of one Secret in its own namespace
    (``secret_name``, read through the API), never the controller's environment or files; custom
    PromQL (``checks[].promql``, ``metrics.queries``) runs with the controller's Prometheus
    credentials and is refused unless the platform allows it.
    """

    allow_custom_promql: bool = False
    secret_name: str = "kserve-canary-notifications"  # noqa: S105 - a Secret's name, not a secret


_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")


def _object_errors(policy: PromotionPolicy, rules: ObjectRules, path: str) -> list[PolicyError]:
    errors = []
    for loc, ref in _secret_refs(policy):
        if ref.file is not None:
            errors.append(
                PolicyError(
                    path,
                    None,
                    format_loc((*loc, "file")),
                    "a PromotionPolicy object cannot name a file; name a key of the Secret "
                    f"{rules.secret_name} in namespace {policy.metadata.namespace} with "
                    "{env: KEY} instead",
                )
            )
        elif ref.env is not None and not _SECRET_KEY.match(ref.env):
            errors.append(
                PolicyError(
                    path,
                    None,
                    format_loc((*loc, "env")),
                    f"{ref.env!r} is not a Secret key ([-._a-zA-Z0-9]+)",
                )
            )
    if not rules.allow_custom_promql:
        refusal = (
            "is refused in a PromotionPolicy object: custom PromQL runs with the controller's "
            "Prometheus credentials, so the platform must allow it (--allow-custom-promql-from-crds); "
            "use a builtin metric, or a policy file"
        )
        for index, check in enumerate(policy.spec.checks):
            if check.promql is not None:
                errors.append(
                    PolicyError(path, None, format_loc(("spec", "checks", index, "promql")), refusal)
                )
        for name in sorted(policy.spec.metrics.queries):
            errors.append(PolicyError(path, None, format_loc(("spec", "metrics", "queries", name)), refusal))
    return errors


def load_object(
    obj: Any, *, rules: ObjectRules | None = None
) -> tuple[LoadedPolicy | None, list[PolicyError]]:
    """A PromotionPolicy object as the API serves it: the policy, or the errors ``validate`` prints.

    Errors are ``promotionpolicy/<namespace>/<name>: field.path: message`` (no line: the object has
    none). The object's namespace is the policy's namespace; ``spec.target.namespace``, if given,
    must say the same. Unknown fields are errors, as in a file (the CRD keeps them so that they are
    reported). Never raises for bad input.
    """
    rules = rules or ObjectRules()
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        return None, [PolicyError("promotionpolicy/?", None, "metadata", "required field is missing")]
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    generation = meta.get("generation")
    ref = ObjectRef(
        namespace,
        name,
        uid=str(meta["uid"]) if meta.get("uid") else None,
        generation=generation if isinstance(generation, int) and not isinstance(generation, bool) else None,
    )
    path = ref.origin
    try:
        return _load_object(obj, meta, ref, rules, path)
    except RecursionError:
        return None, [PolicyError(path, None, None, "the object is nested too deeply to be read")]
    except Exception as exc:  # whatever a hostile object can make pydantic raise is this object's error
        return None, [PolicyError(path, None, None, f"cannot read this object ({type(exc).__name__})")]


def _load_object(
    obj: dict[str, Any], meta: dict[str, Any], ref: ObjectRef, rules: ObjectRules, path: str
) -> tuple[LoadedPolicy | None, list[PolicyError]]:
    data: dict[str, Any] = {key: value for key, value in obj.items() if key not in {"metadata", "status"}}
    data["metadata"] = {key: meta[key] for key in _AUTHORED_METADATA if key in meta}
    errors: list[PolicyError] = []
    spec = data.get("spec")
    target = spec.get("target") if isinstance(spec, dict) else None
    if isinstance(spec, dict) and isinstance(target, dict) and "namespace" in target:
        written = target.get("namespace")
        if written != ref.namespace:
            errors.append(
                PolicyError(
                    path,
                    None,
                    "spec.target.namespace",
                    f"is {written!r} but the PromotionPolicy lives in namespace {ref.namespace!r}: a "
                    "policy governs only InferenceServices of its own namespace (omit it, or create "
                    f"the object in {written})",
                )
            )
        # The same namespace, said twice: accepted (the model has no such field).
        data["spec"] = {**spec, "target": {k: v for k, v in target.items() if k != "namespace"}}
    try:
        policy = PromotionPolicy.model_validate(data)
    except ValidationError as exc:
        errors.extend(_validation_errors(exc, path, {}, 0))
        return None, [_without_line(error) for error in errors]
    if errors:
        return None, errors
    refused = _object_errors(policy, rules, path)
    if refused:
        return None, refused
    return LoadedPolicy(policy, path, 0, 0, 0, object=ref), []


def _without_line(error: PolicyError) -> PolicyError:
    """An object's error has no line."""
    return PolicyError(error.path, None, error.field, error.message, error.conflict)
