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

import errno
import json
import os
import re
import stat as stat_module
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from canary.policy.crd import policy_document
from canary.policy.model import NotifyTarget, PromotionPolicy, SecretRef
from canary.policy.scope import NamespaceSource, ScopeError, SecretScope
from canary.policy.yaml_lines import (
    _LIBYAML,
    _MAX_NODES,
    MAX_DEPTH,
    _construct_plain,
    _index_lines,
    _key_line,
    _line_for,
    _Lines,
    _loader,
    _message,
    _NotForLibyaml,
    _NotPlain,
    _TooComplex,
    _TooDeep,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "LoadResult",
    "LoadedPolicy",
    "ObjectRef",
    "PolicyCheck",
    "PolicyError",
    "load_paths",
    "load_text",
    "secret_refs",
]

# A policy is mounted from a ConfigMap, which holds 1 MiB at most; anything larger is a mistake.
MAX_FILE_BYTES = 1024 * 1024
_POLICY_SUFFIXES = (".yaml", ".yml")

_Path = tuple[str | int, ...]
# Where (a field path) and why each custom query of a policy cannot run in its namespace: the
# metrics layer's PromQL scoping (canary.metrics.tenancy.Tenancy.refusals), given by the caller.
PolicyCheck = Callable[[PromotionPolicy], Sequence[tuple[_Path, str]]]


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


def _validation_errors(
    exc: ValidationError, path: str, lines: Mapping[_Path, int], start_line: int
) -> list[PolicyError]:
    errors = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        if error["type"] == "invalid_key":
            # A key YAML read as a boolean or a number (``on:``, ``yes:``, ``1:``) names no field: the
            # error is about the mapping that holds it.
            key = error.get("input")
            errors.append(
                PolicyError(
                    path=path,
                    line=_line_for(lines, loc[:-1], start_line),
                    field=format_loc(loc[:-1]) or None,
                    message=f"a key that is not a string: YAML read {key!r} (unquoted on/off/yes/no/true/"
                    "false are booleans, digits are numbers); quote the key if it is meant as a name",
                )
            )
            continue
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


@dataclass(frozen=True)
class _Origin:
    """Where a file was found: its namespace directory (None: take ``metadata.namespace``)."""

    namespace: str | None = None
    root: str | None = None  # the policy root it was found under, for messages


def secret_refs(policy: PromotionPolicy) -> Iterator[tuple[tuple[str | int, ...], SecretRef]]:
    """Every secret reference of ``policy``, with where it is written (``("spec", "notify", 0, ...)``)."""
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
    for loc, ref in secret_refs(policy):
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
    text: str,
    path: str,
    origin: _Origin | None = None,
    scope: SecretScope | None = None,
    promql: PolicyCheck | None = None,
) -> tuple[list[LoadedPolicy], list[PolicyError]]:
    """Every policy in ``text``, or none: a file with any error is rejected whole."""
    origin = origin or _Origin()
    try:
        policies, errors = _read_documents(text, path, origin, scope, promql)
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
        if _raised_by_yaml(exc):  # a 5000-digit integer, `!!timestamp 2026-13-45a` (PyYAML's AttributeError)
            return [], [PolicyError(path, None, None, UNCONSTRUCTABLE)]
        return [], [PolicyError(path, None, None, f"cannot read this file as YAML ({type(exc).__name__})")]
    if errors:
        return [], errors
    return policies, errors


UNCONSTRUCTABLE = (
    "cannot read this file as YAML: a value cannot be constructed (a number too large, or an explicit "
    "tag such as !!timestamp on text that is not one)"
)


def _raised_by_yaml(exc: Exception) -> bool:
    """Whether PyYAML's own code raised ``exc`` while constructing a value (not a bug of ours)."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and f"{os.sep}yaml{os.sep}" in frame.tb_frame.f_code.co_filename


def _read_documents(
    text: str, path: str, origin: _Origin, scope: SecretScope | None, promql: PolicyCheck | None
) -> tuple[list[LoadedPolicy], list[PolicyError]]:
    """libyaml for what it reads without complaint (the wheels ship it); anything it refuses or
    cannot read safely, PyYAML's own parser reads, so every YAML error is reported as before (libyaml
    words them differently, and refuses JSON's surrogate-pair escapes that PyYAML decodes)."""
    if _LIBYAML:
        try:
            return _parse_documents(text, path, origin, scope, promql, fast=True)
        except Exception:  # noqa: S110 - whatever libyaml raises, PyYAML's parser reports below
            pass
    return _parse_documents(text, path, origin, scope, promql, fast=False)


def _parse_documents(
    text: str,
    path: str,
    origin: _Origin,
    scope: SecretScope | None,
    promql: PolicyCheck | None = None,
    *,
    fast: bool,
) -> tuple[list[LoadedPolicy], list[PolicyError]]:
    parsed = _ParsedFile(text, path, origin, scope, promql)
    document = -1
    loader: yaml.SafeLoader | None = None
    try:
        loader = _loader(text, fast)
        while loader.check_node():
            node = loader.get_node()
            document += 1
            if node is not None:
                parsed.add_document(loader, node, document)
    except yaml.reader.ReaderError:
        raise  # the whole text is unreadable: _load_documents says which character, on which line
    except yaml.MarkedYAMLError as exc:
        if fast:
            raise _NotForLibyaml from exc
        mark = exc.problem_mark or exc.context_mark
        error_line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        parsed.errors.append(PolicyError(path, error_line, None, f"YAML syntax error: {problem}"))
    except yaml.YAMLError as exc:
        if fast:
            raise _NotForLibyaml from exc
        parsed.errors.append(PolicyError(path, None, None, f"YAML error: {exc}"))
    finally:
        if loader is not None:
            loader.dispose()
    if not parsed.policies and not parsed.errors:
        # Only comments, "---" separators or nothing at all.
        parsed.errors.append(PolicyError(path, None, None, "the file is empty: it holds no policy document"))
    return parsed.policies, parsed.errors


@dataclass
class _ParsedFile:
    """The documents of one file as they are parsed: where the file is from, the policies and the
    problems found so far."""

    text: str
    path: str
    origin: _Origin
    scope: SecretScope | None
    promql: PolicyCheck | None = None
    policies: list[LoadedPolicy] = field(default_factory=list)
    errors: list[PolicyError] = field(default_factory=list)

    def add_document(self, loader: yaml.SafeLoader, node: yaml.Node, document: int) -> None:
        """Document number ``document`` (0-based) of the file: its policy, or its problems."""
        path, start = self.path, node.start_mark.line + 1
        try:
            data, lines, duplicates = _construct(loader, node, anchors="&" in self.text)
        except _TooComplex:
            self.errors.append(
                PolicyError(path, start, None, f"document expands to more than {_MAX_NODES} YAML nodes")
            )
            return
        for parent, line, key in duplicates:
            self.errors.append(
                PolicyError(path, line, format_loc((*parent, key)), "duplicate key: YAML keeps only the last")
            )
        if data is None:
            return
        if not isinstance(data, dict):
            kind = "a list" if isinstance(data, list) else f"a {type(data).__name__}"
            self.errors.append(
                PolicyError(
                    path,
                    start,
                    None,
                    f"expected a PromotionPolicy mapping at the top, got {kind} "
                    f"(document {document + 1} of the file; a file with any invalid document is "
                    "rejected whole)",
                )
            )
            return
        policy = self._validated(data, lines, start)
        if policy is not None and not duplicates:
            target_line = _key_line(node, ("spec", "target", "inferenceService"), start)
            self.policies.append(LoadedPolicy(policy, path, start, document, target_line))

    def _validated(
        self, data: dict[Any, Any], lines: Mapping[_Path, int], start: int
    ) -> PromotionPolicy | None:
        """The policy ``data`` holds, bound to its namespace and its secrets in scope; None when it
        is not (its problems are added)."""
        # A manifest fetched from the API server (kubectl get -o yaml) validates as the object it
        # is: its status and server-set metadata are not the author's and are set aside.
        data = policy_document(data)
        mismatch = _bind_namespace(data, self.origin, self.path, lines, start)
        if mismatch is not None:
            self.errors.append(mismatch)
            return None
        try:
            policy = PromotionPolicy.model_validate(data)
        except ValidationError as exc:
            self.errors.extend(_validation_errors(exc, self.path, lines, start))
            return None
        if self.scope is not None:
            refused = _scope_errors(policy, self.scope, self.path, lines, start)
            if refused:
                self.errors.extend(refused)
                return None
        if self.promql is not None:
            unscoped = [
                PolicyError(self.path, _line_for(lines, loc, start), format_loc(loc), message)
                for loc, message in self.promql(policy)
            ]
            if unscoped:
                self.errors.extend(unscoped)
                return None
        return policy


def _construct(
    loader: yaml.SafeLoader, node: yaml.Node, *, anchors: bool
) -> tuple[Any, Mapping[_Path, int], list[tuple[_Path, int, str]]]:
    """The document's data, the line of each of its field paths and its duplicate keys; raises
    :class:`_TooComplex` for a document that expands to too many nodes."""
    lines: Mapping[_Path, int] = _Lines(node)
    duplicates: list[tuple[_Path, int, str]] = []
    try:
        plain = _construct_plain(loader, node, anchors=anchors)
        data = plain.data
        if plain.duplicates:
            lines, duplicates = _index_lines(node)
    except _NotPlain:
        # PyYAML's constructor expands aliases: count the nodes it would build first.
        lines, duplicates = _index_lines(node)
        data = loader.construct_document(node)
    return data, lines, duplicates


def load_text(
    text: str,
    path: str = "<string>",
    *,
    namespace: str | None = None,
    secrets: SecretScope | None = None,
    promql: PolicyCheck | None = None,
) -> LoadResult:
    """Load the policies in one YAML text (several documents allowed).

    ``namespace``: the namespace directory the text lives in (None: ``metadata.namespace`` decides);
    ``secrets``: check secret references against these rules (None: not checked); ``promql``: where
    and why each custom query cannot run in the policy's namespace (None: not checked).
    """
    policies, errors = _load_documents(text, path, _Origin(namespace), secrets, promql)
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
    promql: PolicyCheck | None = None,
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
            policies, errors = _load_documents(text, path_shown, origin, secrets, promql)
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
