"""Loading policy files and directories, with errors as precise as a compiler's.

Every problem is a :class:`PolicyError` rendered as ``path:line: field.path: message``. Loading never
raises for bad input: a broken file is reported and the valid policies beside it still load.

Directories mounted from a ConfigMap or by git-sync contain a ``..data`` symlink and
``..<timestamp>`` directories holding the same files again; every dot-entry is skipped so nothing is
read twice.
"""

from __future__ import annotations

import difflib
import errno
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from canary.policy.model import PromotionPolicy

__all__ = [
    "MAX_FILE_BYTES",
    "LoadResult",
    "LoadedPolicy",
    "PolicyError",
    "load_paths",
    "load_text",
]

# A policy is mounted from a ConfigMap, which holds 1 MiB at most; anything larger is a mistake.
MAX_FILE_BYTES = 1024 * 1024
# Anchors and aliases can make a small file expand exponentially ("billion laughs").
_MAX_NODES = 100_000
_POLICY_SUFFIXES = (".yaml", ".yml")

_Path = tuple[str | int, ...]


@dataclass(frozen=True)
class PolicyError:
    """One problem in one file: ``line`` is 1-based, ``field`` a dotted path like ``spec.checks[0].max``."""

    path: str
    line: int | None
    field: str | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"

    @property
    def sort_key(self) -> tuple[str, int, str, str]:
        return (self.path, self.line or 0, self.field or "", self.message)

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "field": self.field, "message": self.message}


@dataclass(frozen=True)
class LoadedPolicy:
    policy: PromotionPolicy
    path: str
    line: int  # where the document starts
    document: int  # 0-based index of the YAML document in its file
    target_line: int  # where spec.target.inferenceService is written

    @property
    def origin(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class LoadResult:
    policies: list[LoadedPolicy] = field(default_factory=list)
    errors: list[PolicyError] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    # InferenceServices claimed by more than one policy: every claimant was refused.
    contested: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.errors

    def by_key(self) -> dict[str, LoadedPolicy]:
        return {loaded.policy.key: loaded for loaded in self.policies}


def format_loc(loc: Iterable[str | int]) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
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


def _line_for(lines: dict[_Path, int], loc: Sequence[str | int], default: int) -> int:
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
    exc: ValidationError, path: str, lines: dict[_Path, int], start_line: int
) -> list[PolicyError]:
    errors = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        if error["type"] not in {"missing", "extra_forbidden"}:
            # Normalisation can add levels the file does not have (``steps: [0]`` is validated as
            # ``{weight: 0}``): point at what the user wrote.
            while loc and loc not in lines:
                loc = loc[:-1]
        errors.append(
            PolicyError(
                path=path,
                line=_line_for(lines, loc, start_line),
                field=format_loc(loc) or None,
                message=_message(error),
            )
        )
    return errors


def _load_documents(text: str, path: str) -> tuple[list[LoadedPolicy], list[PolicyError]]:
    policies: list[LoadedPolicy] = []
    errors: list[PolicyError] = []
    loader = yaml.SafeLoader(text)
    document = -1
    try:
        while loader.check_node():
            node = loader.get_node()
            document += 1
            if node is None:
                continue
            start = node.start_mark.line + 1
            try:
                lines, duplicates = _index_lines(node)
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
            data = loader.construct_document(node)
            if data is None:
                continue
            if not isinstance(data, dict):
                kind = "a list" if isinstance(data, list) else f"a {type(data).__name__}"
                errors.append(
                    PolicyError(
                        path, start, None, f"expected a PromotionPolicy mapping at the top, got {kind}"
                    )
                )
                continue
            try:
                policy = PromotionPolicy.model_validate(data)
            except ValidationError as exc:
                errors.extend(_validation_errors(exc, path, lines, start))
                continue
            if not duplicates:
                target_line = lines.get(("spec", "target", "inferenceService"), start)
                policies.append(LoadedPolicy(policy, path, start, document, target_line))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        error_line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        errors.append(PolicyError(path, error_line, None, f"YAML syntax error: {problem}"))
    except yaml.YAMLError as exc:
        errors.append(PolicyError(path, None, None, f"YAML error: {exc}"))
    finally:
        loader.dispose()
    if not policies and not errors:
        # Only comments, "---" separators or nothing at all.
        errors.append(PolicyError(path, None, None, "the file is empty: it holds no policy document"))
    return policies, errors


def load_text(text: str, path: str = "<string>") -> LoadResult:
    """Load the policies in one YAML text (several documents allowed)."""
    policies, errors = _load_documents(text, path)
    result = LoadResult(policies=policies, errors=errors, files=[path])
    _reject_duplicate_targets(result)
    return result


# ---------------------------------------------------------------------------------------------
# Files and directories


def _read_policy_file(path: Path, shown: str) -> tuple[str | None, PolicyError | None]:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
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
    if len(raw) > MAX_FILE_BYTES:
        return None, PolicyError(
            shown,
            None,
            None,
            f"the file is larger than {MAX_FILE_BYTES // 1024} KiB, the most a ConfigMap holds",
        )
    if b"\x00" in raw:
        return None, PolicyError(shown, None, None, "the file is binary (it contains NUL bytes), not YAML")
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        return None, PolicyError(shown, line, None, "the file is not UTF-8 text")


def _walk(
    directory: Path, shown: str, visited: set[tuple[int, int]]
) -> Iterator[tuple[Path, str, PolicyError | None]]:
    """Yield policy files under ``directory`` in a stable order, skipping dot-entries."""
    try:
        stat = directory.stat()
    except OSError as exc:
        reason = "symlink loop" if exc.errno == errno.ELOOP else (exc.strerror or str(exc))
        yield directory, shown, PolicyError(shown, None, None, f"cannot read the directory: {reason}")
        return
    identity = (stat.st_dev, stat.st_ino)
    if identity in visited:
        yield (
            directory,
            shown,
            PolicyError(
                shown, None, None, "symlink loop: this directory was already read through another path"
            ),
        )
        return
    visited = visited | {identity}
    try:
        entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError as exc:
        yield (
            directory,
            shown,
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
            yield from _walk(child, child_shown, visited)
        elif entry.name.endswith(_POLICY_SUFFIXES):
            yield child, child_shown, None
        elif entry.is_symlink() and not os.path.exists(entry.path):
            # A broken link that is not a .yaml file is not ours to read; a loop is worth a word.
            try:
                os.stat(entry.path)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    yield child, child_shown, PolicyError(child_shown, None, None, "symlink loop")


def load_paths(paths: Sequence[str | os.PathLike[str]]) -> LoadResult:
    """Load every policy in the given files and directory trees."""
    result = LoadResult()
    for given in paths:
        root = Path(given)
        shown = os.fspath(given)
        if root.is_dir():
            candidates: Iterable[tuple[Path, str, PolicyError | None]] = _walk(root, shown, set())
        elif root.exists() or root.is_symlink():
            candidates = [(root, shown, None)]
        else:
            result.errors.append(PolicyError(shown, None, None, "no such file or directory"))
            continue
        for path, path_shown, problem in candidates:
            if problem is not None:
                result.errors.append(problem)
                continue
            result.files.append(path_shown)
            text, read_error = _read_policy_file(path, path_shown)
            if read_error is not None:
                result.errors.append(read_error)
                continue
            assert text is not None
            policies, errors = _load_documents(text, path_shown)
            result.policies.extend(policies)
            result.errors.extend(errors)
    _reject_duplicate_targets(result)
    return result


def _reject_duplicate_targets(result: LoadResult) -> None:
    """Two policies for one InferenceService: an error against each, and neither is loaded."""
    by_key: dict[str, list[LoadedPolicy]] = defaultdict(list)
    for loaded in result.policies:
        by_key[loaded.policy.key].append(loaded)
    for key, group in by_key.items():
        if len(group) < 2:
            continue
        result.contested.add(key)
        for loaded in group:
            others = ", ".join(f"'{o.policy.metadata.name}' ({o.origin})" for o in group if o is not loaded)
            result.errors.append(
                PolicyError(
                    loaded.path,
                    loaded.target_line,
                    "spec.target.inferenceService",
                    f"InferenceService {key} is also governed by {others}: one policy per InferenceService",
                )
            )
        result.policies = [loaded for loaded in result.policies if loaded.policy.key != key]
