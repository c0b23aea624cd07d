"""The running set of policies, and how it follows edits of the policy directory.

Rules (docs/design.md §5):

* a file that breaks is reported and the previous valid version of each policy it held keeps running;
* a second policy for an InferenceService already governed is rejected; the first keeps running —
  also while the first one's file is broken. Both files are told (``ReloadReport.conflicts`` and an
  error on each). After a restart no claimant is established: the first in path order (file path, then
  document) governs, so an InferenceService is never left without its policy;
* an edited policy applies from the next evaluation;
* a removed policy is *removed* — the controller then pauses its rollout (never rolls it back).

Directories mounted from a ConfigMap or by git-sync change by swapping a ``..data`` symlink, so
changes are detected from a fingerprint of the whole tree (every file's resolved path, size and
mtime), never by watching single files.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from canary.policy import LoadedPolicy, PolicyError, load_paths
from canary.policy.loader import conflict_errors
from canary.policy.scope import NamespaceSource, SecretScope

__all__ = ["Conflict", "PolicyRegistry", "ReloadReport", "tree_fingerprint"]


def tree_fingerprint(paths: Sequence[str | os.PathLike[str]]) -> str:
    """A cheap digest of everything a load would read (dot-entries included: ``..data`` swaps)."""
    digest = hashlib.sha256()
    for given in paths:
        root = Path(given)
        for directory, dirs, files in os.walk(root, followlinks=False):
            dirs.sort()
            for name in sorted(files + dirs):
                entry = os.path.join(directory, name)
                try:
                    resolved = os.path.realpath(entry)
                    stat = os.stat(entry)
                    digest.update(f"{entry}\0{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
                except OSError:
                    digest.update(f"{entry}\0missing\n".encode())
        if root.is_file():
            stat = root.stat()
            digest.update(f"{root}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Conflict:
    """Several policies claim one InferenceService: ``kept`` governs it, ``refused`` do not."""

    key: str
    kept: LoadedPolicy
    refused: tuple[LoadedPolicy, ...]

    def __str__(self) -> str:
        refused = ", ".join(f"'{r.policy.metadata.name}' ({r.origin})" for r in self.refused)
        return (
            f"InferenceService {self.key} is claimed by several policies: '{self.kept.policy.metadata.name}' "
            f"({self.kept.origin}) keeps governing it; refused: {refused}"
        )


@dataclass
class ReloadReport:
    changed: bool
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept_previous: list[str] = field(default_factory=list)  # broken edit: the old version still runs
    errors: list[PolicyError] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)


class PolicyRegistry:
    """Policies by ``namespace/inferenceService``. Not thread-safe: the controller reloads from one thread."""

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        namespaces: NamespaceSource = NamespaceSource.DIRECTORY,
        secrets: SecretScope | None = None,
    ):
        self._paths = list(paths)
        self._namespaces = namespaces
        self._secrets = secrets
        self._fingerprint: str | None = None
        self._active: dict[str, LoadedPolicy] = {}
        self.errors: list[PolicyError] = []
        self.conflicts: list[Conflict] = []

    @property
    def active(self) -> dict[str, LoadedPolicy]:
        return dict(self._active)

    def get(self, key: str) -> LoadedPolicy | None:
        return self._active.get(key)

    def reload(self, *, force: bool = False) -> ReloadReport:
        fingerprint = tree_fingerprint(self._paths)
        if not force and fingerprint == self._fingerprint:
            return ReloadReport(changed=False, errors=list(self.errors), conflicts=list(self.conflicts))
        self._fingerprint = fingerprint
        result = load_paths(self._paths, namespaces=self._namespaces, secrets=self._secrets)
        errors = [error for error in result.errors if not error.conflict]
        broken_files = {error.path for error in errors}

        loaded = result.by_key()
        conflicts: list[Conflict] = []
        for key in list(loaded):
            group = result.conflicts.get(key, [loaded[key]])
            previous = self._active.get(key)
            kept = self._established(key, group)
            if kept is None and previous is not None and previous.path in broken_files:
                # The established policy's file is broken for now: a newcomer does not take over.
                del loaded[key]
                conflicts.append(Conflict(key, previous, tuple(group)))
                errors.extend(conflict_errors(key, previous, [previous, *group]))
                continue
            if len(group) > 1:
                kept = kept or group[0]
                loaded[key] = kept
                conflicts.append(Conflict(key, kept, tuple(c for c in group if c is not kept)))
                errors.extend(conflict_errors(key, kept, group))

        report = ReloadReport(changed=True, errors=errors, conflicts=conflicts)
        self.errors = errors
        self.conflicts = conflicts
        next_active: dict[str, LoadedPolicy] = {}
        for key, current in loaded.items():
            previous = self._active.get(key)
            if previous is None:
                report.added.append(key)
            elif previous.policy != current.policy or previous.path != current.path:
                report.updated.append(key)
            next_active[key] = current
        for key, previous in self._active.items():
            if key in next_active:
                continue
            if previous.path in broken_files:
                # A broken edit: the version already running stays.
                next_active[key] = previous
                report.kept_previous.append(key)
            else:
                report.removed.append(key)
        self._active = next_active
        return report

    def _established(self, key: str, group: Sequence[LoadedPolicy]) -> LoadedPolicy | None:
        """The claimant that already governs ``key`` (same file, same policy name), if any."""
        previous = self._active.get(key)
        if previous is None:
            return None
        for claimant in group:
            if (
                claimant.path == previous.path
                and claimant.policy.metadata.name == previous.policy.metadata.name
            ):
                return claimant
        return None
