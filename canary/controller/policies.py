"""The running set of policies: the policy files and the PromotionPolicy objects, merged.

Rules (docs/design.md §5):

* a file that breaks is reported and the previous valid version of each policy it held keeps running
  (an object that breaks: the previous valid generation, see :mod:`canary.controller.crsource`);
* two policies for one InferenceService, from files, objects or both, are a conflict: **neither**
  governs it, each is told (``ReloadReport.conflicts`` and an error on each), and its rollout is
  *held* — not reconciled, not paused, not rolled back. Removing all but one hands the rollout to the
  one left, which continues it from the state ConfigMap without a pause. The same holds after a
  restart: which claimant was first is never remembered, so the answer never depends on history;
* an edited policy applies from the next evaluation;
* a removed policy (no claimant left) is *removed* — the controller then pauses its rollout (never
  rolls it back).

Directories mounted from a ConfigMap or by git-sync change by swapping a ``..data`` symlink, so
changes are detected from a fingerprint of the whole tree (every file's resolved path, size and
mtime), never by watching single files.
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from canary.policy import LoadedPolicy, PolicyError, PromotionPolicy, load_paths
from canary.policy.loader import PolicyCheck, conflict_errors
from canary.policy.scope import NamespaceSource, SecretScope

__all__ = ["Conflict", "PolicyRegistry", "ReloadReport", "tree_fingerprint"]


def tree_fingerprint(paths: Sequence[str | os.PathLike[str]]) -> str:
    """A cheap digest of everything a load would read (dot-entries included: ``..data`` swaps).

    Per entry: where a symbolic link points (a ConfigMap update swaps ``..data``; the links through
    it stay) and the inode, size and modification time of what it reaches. A link is read where it is, not
    resolved: every link in the tree is an entry of its own, and resolving each path again (a system
    call per component) was most of a reload of a thousand policies, every few seconds."""
    digest = hashlib.sha256()
    for given in paths:
        root = Path(given)
        digest.update(f"{root}\0{os.path.realpath(root)}\n".encode())
        for directory, dirs, files in os.walk(root, followlinks=False):
            dirs.sort()
            for name in sorted(files + dirs):
                entry = os.path.join(directory, name)
                try:
                    target = os.readlink(entry) if os.path.islink(entry) else ""
                    stat = os.stat(entry)
                    # The inode too: a link outside the tree may now reach another file of the same size
                    # and time (a synced snapshot), which resolving it used to catch.
                    reached = f"{stat.st_dev}:{stat.st_ino}\0{stat.st_size}\0{stat.st_mtime_ns}"
                    digest.update(f"{entry}\0{target}\0{reached}\n".encode())
                except OSError:
                    digest.update(f"{entry}\0missing\n".encode())
        if root.is_file():
            stat = root.stat()
            digest.update(f"{root}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@dataclass(frozen=True)
class Conflict:
    """Several policies claim one InferenceService: none of them governs it (its rollout is held)."""

    key: str
    claimants: tuple[LoadedPolicy, ...]

    def __str__(self) -> str:
        names = ", ".join(f"'{c.policy.metadata.name}' ({c.origin})" for c in self.claimants)
        return (
            f"InferenceService {self.key} is claimed by several policies: {names}; neither governs it "
            "and its rollout is held until all but one are removed"
        )


@dataclass
class ReloadReport:
    changed: bool
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    # No policy claims it any more (``removed_policies``: the last one that did): its rollout pauses.
    removed: list[str] = field(default_factory=list)
    removed_policies: dict[str, PromotionPolicy] = field(default_factory=dict)
    held: list[str] = field(default_factory=list)  # newly contested: nobody governs, nothing is paused
    kept_previous: list[str] = field(default_factory=list)  # broken edit: the old version still runs
    errors: list[PolicyError] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)


class PolicyRegistry:
    """Policies by ``namespace/inferenceService``, from files and PromotionPolicy objects.

    Not thread-safe for writers: the controller reloads from one thread; readers (``get``) see one
    dict or the next, never a half-built one.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        namespaces: NamespaceSource = NamespaceSource.DIRECTORY,
        secrets: SecretScope | None = None,
        files: bool = True,
        promql: PolicyCheck | None = None,
    ):
        self._paths = list(paths)
        self._namespaces = namespaces
        self._secrets = secrets
        self._promql = promql
        self._files = files
        self._fingerprint: str | None = None
        self._file_claims: list[LoadedPolicy] = []
        self._file_errors: list[PolicyError] = []
        self._objects: list[LoadedPolicy] = []
        self._object_errors: list[PolicyError] = []
        self._objects_version = 0
        self._seen_objects_version = -1
        self._active: dict[str, LoadedPolicy] = {}
        self._held: dict[str, Conflict] = {}
        self.errors: list[PolicyError] = []
        self.conflicts: list[Conflict] = []

    @property
    def active(self) -> dict[str, LoadedPolicy]:
        return dict(self._active)

    @property
    def held(self) -> dict[str, Conflict]:
        return dict(self._held)

    def get(self, key: str) -> LoadedPolicy | None:
        return self._active.get(key)

    def set_objects(self, policies: Sequence[LoadedPolicy], errors: Sequence[PolicyError] = ()) -> None:
        """The PromotionPolicy objects as they are now (valid ones, and what the others got wrong);
        the next :meth:`reload` merges them with the files."""
        if list(policies) == self._objects and list(errors) == self._object_errors:
            return
        self._objects = list(policies)
        self._object_errors = list(errors)
        self._objects_version += 1

    def reload(self, *, force: bool = False) -> ReloadReport:
        files_changed, kept_previous = self._reload_files(force)
        if not files_changed and not force and self._objects_version == self._seen_objects_version:
            return ReloadReport(changed=False, errors=list(self.errors), conflicts=list(self.conflicts))
        self._seen_objects_version = self._objects_version

        by_key: dict[str, list[LoadedPolicy]] = defaultdict(list)
        for claimant in [*self._file_claims, *self._objects]:
            by_key[claimant.policy.key].append(claimant)
        errors = [*self._file_errors, *self._object_errors]
        active: dict[str, LoadedPolicy] = {}
        held: dict[str, Conflict] = {}
        for key, group in by_key.items():
            if len(group) == 1:
                active[key] = group[0]
                continue
            # Any mix of sources: neither governs. Choosing one would let the order of files (or of
            # creation) decide which team's policy drives a model; holding lets nobody act until a
            # person removes the extra one, and the rollout's state waits for whoever remains.
            group.sort(key=lambda claimant: claimant.origin)
            held[key] = Conflict(key, tuple(group))
            errors.extend(conflict_errors(key, group))

        report = ReloadReport(
            changed=True, errors=errors, conflicts=list(held.values()), kept_previous=kept_previous
        )
        for key, current in active.items():
            previous = self._active.get(key)
            if previous is None:
                report.added.append(key)
            elif previous.policy != current.policy or previous.origin != current.origin:
                report.updated.append(key)
        report.held = [key for key in held if key not in self._held]
        before: dict[str, PromotionPolicy] = {
            **{key: conflict.claimants[0].policy for key, conflict in self._held.items()},
            **{key: loaded.policy for key, loaded in self._active.items()},
        }
        for key, policy in before.items():
            if key not in active and key not in held:
                report.removed.append(key)
                report.removed_policies[key] = policy
        self._active = active
        self._held = held
        self.errors = errors
        self.conflicts = list(held.values())
        return report

    def _reload_files(self, force: bool) -> tuple[bool, list[str]]:
        """Read the policy files again if anything in the tree changed: (changed, kept_previous)."""
        if not self._files:
            return False, []
        fingerprint = tree_fingerprint(self._paths)
        if not force and fingerprint == self._fingerprint:
            return False, []
        self._fingerprint = fingerprint
        result = load_paths(
            self._paths, namespaces=self._namespaces, secrets=self._secrets, promql=self._promql
        )
        # Conflicts are decided over every source at once (reload), not per file set.
        errors = [error for error in result.errors if not error.conflict]
        broken_files = {error.path for error in errors}
        claims = [*result.policies, *(c for group in result.conflicts.values() for c in group)]
        present = {(claimant.path, claimant.policy.metadata.name) for claimant in claims}
        kept_previous = []
        for previous in self._file_claims:
            if (
                previous.path in broken_files
                and (previous.path, previous.policy.metadata.name) not in present
            ):
                # A broken edit: the version already running keeps claiming its model.
                claims.append(previous)
                kept_previous.append(previous.policy.key)
        self._file_claims = claims
        self._file_errors = errors
        return True, kept_previous
