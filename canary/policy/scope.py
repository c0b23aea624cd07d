"""What a policy may reach: its namespace, and the secrets the operator opened to that namespace.

A policy file belongs to the namespace of the directory it lives in (``DIR/<namespace>/**/*.yaml``,
see :class:`NamespaceSource`), and its secret references are scoped to that namespace
(:class:`SecretScope`):

* ``file: relative/path`` resolves inside ``<secret file root>/<namespace>/``; absolute paths, ``..``
  and symlinks that leave that directory are refused, and without a root every ``file:`` is refused;
* ``env: NAME`` is allowed only when ``NAME`` matches a glob the operator allowed for the namespace
  (``--secret-env-allow ml=ML_*``); by default no variable is allowed.

The same checks run when the policy is loaded (an error naming the file and field) and again when the
secret is read (a rotated mount or a swapped symlink is checked afresh).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path, PurePosixPath

from canary.policy.model import SecretRef

__all__ = [
    "MAX_SECRET_FILE_BYTES",
    "NamespaceSource",
    "ScopeError",
    "SecretScope",
    "option_items",
    "parse_env_allow",
]

# A Secret holds 1 MiB at most, but a URL or an HMAC key is a few hundred bytes: a bigger file is not
# a secret meant for us (``/dev/zero``, a log file) and is refused before it fills the memory.
MAX_SECRET_FILE_BYTES = 64 * 1024

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class NamespaceSource(StrEnum):
    """Where a policy's namespace comes from."""

    # DIR/<namespace>/**/*.yaml: the directory decides; metadata.namespace may be omitted or must match.
    DIRECTORY = "directory"
    # metadata.namespace decides, wherever the file is: for one platform-owned repository only.
    METADATA = "metadata"


class ScopeError(ValueError):
    """A secret reference outside what the policy's namespace may reach. Names the reference only."""


def option_items(values: Iterable[str]) -> Iterator[str]:
    """The items of a repeatable option, each value also comma-separated: stripped, empty ones left out."""
    for value in values:
        for raw in value.split(","):
            if item := raw.strip():
                yield item


def parse_env_allow(values: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``["ml=ML_*", "web=WEB_HOOK,WEB_KEY"]`` (also comma-separated in one value) -> namespace -> globs."""
    allowed: dict[str, list[str]] = {}
    for item in option_items(values):
        namespace, separator, pattern = item.partition("=")
        namespace, pattern = namespace.strip(), pattern.strip()
        if not separator or not _NAMESPACE.match(namespace) or not pattern:
            raise ValueError(f"expected NAMESPACE=GLOB (e.g. ml=ML_*), got {item!r}")
        allowed.setdefault(namespace, []).append(pattern)
    return {namespace: tuple(patterns) for namespace, patterns in allowed.items()}


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class SecretScope:
    """The operator's rules for secret references. The default allows nothing."""

    file_root: Path | None = None
    env_allow: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def check(self, ref: SecretRef, namespace: str) -> None:
        """Raise :class:`ScopeError` if a policy of ``namespace`` may not use ``ref``."""
        if ref.env is not None:
            self.check_env(ref.env, namespace)
        else:
            assert ref.file is not None
            self.file_path(ref.file, namespace)

    def check_env(self, name: str, namespace: str) -> None:
        patterns = self.env_allow.get(namespace, ())
        if not any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            allowed = ", ".join(patterns) if patterns else "none"
            raise ScopeError(
                f"environment variable {name} is not allowed for namespace {namespace} "
                f"(allowed: {allowed}; the operator opens variables with --secret-env-allow "
                f"{namespace}=GLOB)"
            )

    def namespace_root(self, namespace: str) -> Path:
        if self.file_root is None:
            raise ScopeError("file references are disabled: the controller runs without --secret-file-root")
        return self.file_root / namespace

    def file_path(self, relative: str, namespace: str) -> Path:
        """The file ``relative`` names for ``namespace``, resolved; raise if it leaves ``DIR/<namespace>``.

        A file that does not exist (yet) is accepted here: reading it reports that at send time.
        """
        root = self.namespace_root(namespace)
        pure = PurePosixPath(relative)
        if pure.is_absolute() or relative.startswith("~"):
            raise ScopeError(
                f"file {relative} is absolute: name a path relative to the namespace's secret "
                f"directory (<secret file root>/{namespace}/)"
            )
        if ".." in pure.parts or not pure.parts or "\0" in relative:
            raise ScopeError(f"file {relative} must stay inside <secret file root>/{namespace}/ ('..')")
        candidate = root / relative
        resolved_root = os.path.realpath(root)
        resolved = os.path.realpath(candidate)
        if not _within(resolved, resolved_root):
            raise ScopeError(f"file {relative} leaves <secret file root>/{namespace}/ through a symlink")
        return Path(resolved)
