"""The running set of policies, and how it follows edits of the policy directory.

Rules (docs/design.md §5):

* a file that breaks is reported and the previous valid version of each policy it held keeps running;
* a second policy for an InferenceService already governed is rejected; the first keeps running;
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

__all__ = ["PolicyRegistry", "ReloadReport", "tree_fingerprint"]


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


@dataclass
class ReloadReport:
    changed: bool
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    kept_previous: list[str] = field(default_factory=list)  # broken edit: the old version still runs
    errors: list[PolicyError] = field(default_factory=list)


class PolicyRegistry:
    """Policies by ``namespace/inferenceService``. Not thread-safe: the controller reloads from one thread."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]]):
        self._paths = list(paths)
        self._fingerprint: str | None = None
        self._active: dict[str, LoadedPolicy] = {}
        self.errors: list[PolicyError] = []

    @property
    def active(self) -> dict[str, LoadedPolicy]:
        return dict(self._active)

    def get(self, key: str) -> LoadedPolicy | None:
        return self._active.get(key)

    def reload(self, *, force: bool = False) -> ReloadReport:
        fingerprint = tree_fingerprint(self._paths)
        if not force and fingerprint == self._fingerprint:
            return ReloadReport(changed=False, errors=list(self.errors))
        self._fingerprint = fingerprint
        result = load_paths(self._paths)
        report = ReloadReport(changed=True, errors=result.errors)
        self.errors = result.errors

        broken_files = {error.path for error in result.errors}
        loaded = result.by_key()
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
            if previous.path in broken_files or key in result.contested:
                # A broken edit, or a second claimant: the version already running stays.
                next_active[key] = previous
                report.kept_previous.append(key)
            else:
                report.removed.append(key)
        self._active = next_active
        return report
