"""Hot reload of the policy directory (docs/design.md §5), on ConfigMap-style mounts.

The policy root is ``tmp_path``; its ``ml`` directory (one ConfigMap per namespace) holds the files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from canary.controller.policies import PolicyRegistry
from tests.policy.support import valid_policy


@pytest.fixture(autouse=True)
def namespace_directory(tmp_path: Path) -> Path:
    directory = tmp_path / "ml"
    directory.mkdir()
    return directory


def swap_configmap_mount(root: Path, files: dict[str, str], generation: int) -> None:
    """Do what the kubelet does: write a new ``..<timestamp>`` dir and atomically swap ``..data``."""
    root.mkdir(exist_ok=True)
    data = root / f"..2026_11_29_12_00_0{generation}.000"
    data.mkdir()
    for name, text in files.items():
        (data / name).write_text(text)
    tmp = root / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, root / "..data")
    for name in files:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


def test_first_load_adds_every_valid_policy(tmp_path: Path) -> None:
    swap_configmap_mount(tmp_path / "ml", {"a.yaml": valid_policy("a"), "b.yaml": valid_policy("b")}, 1)
    registry = PolicyRegistry([tmp_path])
    report = registry.reload()
    assert sorted(report.added) == ["ml/a", "ml/b"]
    assert sorted(registry.active) == ["ml/a", "ml/b"]


def test_unchanged_directory_is_not_reloaded(tmp_path: Path) -> None:
    (tmp_path / "ml" / "a.yaml").write_text(valid_policy("a"))
    registry = PolicyRegistry([tmp_path])
    assert registry.reload().changed
    assert not registry.reload().changed


def test_a_broken_edit_keeps_the_previous_version_running(tmp_path: Path) -> None:
    swap_configmap_mount(tmp_path / "ml", {"a.yaml": valid_policy("a"), "b.yaml": valid_policy("b")}, 1)
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    previous = registry.get("ml/a")
    swap_configmap_mount(
        tmp_path / "ml",
        {"a.yaml": valid_policy("a").replace("800ms", "soon"), "b.yaml": valid_policy("b")},
        2,
    )
    report = registry.reload()
    assert report.changed
    assert report.kept_previous == ["ml/a"]
    assert report.removed == []
    assert registry.get("ml/a") == previous
    assert any("spec.checks[0].max" in str(error) for error in report.errors)


def test_an_edit_applies_and_is_reported_as_updated(tmp_path: Path) -> None:
    path = tmp_path / "ml" / "a.yaml"
    path.write_text(valid_policy("a"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    path.write_text(valid_policy("a").replace("800ms", "900ms"))
    os.utime(path, ns=(1, 1))  # make sure the fingerprint sees it even within one mtime tick
    report = registry.reload()
    assert report.updated == ["ml/a"]
    found = registry.get("ml/a")
    assert found is not None
    assert found.policy.spec.checks[0].max == 0.9


def test_a_second_policy_for_a_governed_inference_service_holds_it(tmp_path: Path) -> None:
    """Neither governs: the rollout is held (not removed, so not paused); both files are told."""
    (tmp_path / "ml" / "first.yaml").write_text(valid_policy("first", target="llama"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    (tmp_path / "ml" / "second.yaml").write_text(valid_policy("second", target="llama"))
    report = registry.reload()
    assert (report.added, report.updated, report.removed, report.held) == ([], [], [], ["ml/llama"])
    [conflict] = report.conflicts
    assert conflict.key == "ml/llama"
    assert sorted(c.policy.metadata.name for c in conflict.claimants) == ["first", "second"]
    assert registry.get("ml/llama") is None
    assert sorted(registry.held) == ["ml/llama"]
    assert {Path(error.path).name for error in report.errors} == {"first.yaml", "second.yaml"}
    assert all("neither governs it" in error.message for error in report.errors)


def test_a_removed_policy_is_reported_removed(tmp_path: Path) -> None:
    (tmp_path / "ml" / "a.yaml").write_text(valid_policy("a"))
    (tmp_path / "ml" / "b.yaml").write_text(valid_policy("b"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    (tmp_path / "ml" / "b.yaml").unlink()
    report = registry.reload()
    assert report.removed == ["ml/b"]
    assert sorted(registry.active) == ["ml/a"]


def test_after_a_restart_two_claimants_hold_the_model_too(tmp_path: Path) -> None:
    """Which claimant came first is never remembered: after a restart the answer is the same."""
    (tmp_path / "ml" / "b-second.yaml").write_text(valid_policy("second", target="llama"))
    (tmp_path / "ml" / "a-first.yaml").write_text(valid_policy("first", target="llama"))
    report = PolicyRegistry([tmp_path]).reload()
    assert (report.added, report.held) == ([], ["ml/llama"])
    [conflict] = report.conflicts
    assert [c.policy.metadata.name for c in conflict.claimants] == ["first", "second"]
    messages = {Path(error.path).name: error.message for error in report.errors}
    assert "'second'" in messages["a-first.yaml"] and "'first'" in messages["b-second.yaml"]


def test_removing_one_claimant_hands_the_model_to_the_other_without_a_pause(tmp_path: Path) -> None:
    (tmp_path / "ml" / "zz-owner.yaml").write_text(valid_policy("owner", target="llama"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    (tmp_path / "ml" / "aa-newcomer.yaml").write_text(valid_policy("newcomer", target="llama"))
    assert registry.reload().held == ["ml/llama"]
    (tmp_path / "ml" / "zz-owner.yaml").unlink()
    report = registry.reload()
    assert (report.added, report.removed, report.conflicts) == (["ml/llama"], [], [])
    survivor = registry.get("ml/llama")
    assert survivor is not None and survivor.policy.metadata.name == "newcomer"


def test_removing_every_claimant_of_a_held_model_removes_it(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / "ml" / f"{name}.yaml").write_text(valid_policy(name, target="llama"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    for name in ("a", "b"):
        (tmp_path / "ml" / f"{name}.yaml").unlink()
    report = registry.reload()
    assert report.removed == ["ml/llama"]
    assert report.removed_policies["ml/llama"].spec.target.inference_service == "llama"


def test_a_broken_established_file_still_claims_its_model_against_a_newcomer(tmp_path: Path) -> None:
    owner = tmp_path / "ml" / "owner.yaml"
    owner.write_text(valid_policy("owner", target="llama"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    owner.write_text(valid_policy("owner", target="llama").replace("800ms", "soon"))
    (tmp_path / "ml" / "newcomer.yaml").write_text(valid_policy("newcomer", target="llama"))
    report = registry.reload()
    assert registry.get("ml/llama") is None
    assert report.kept_previous == ["ml/llama"]
    [conflict] = report.conflicts
    assert sorted(c.policy.metadata.name for c in conflict.claimants) == ["newcomer", "owner"]
    assert report.removed == []


def test_policies_of_other_namespaces_are_refused_and_do_not_displace_their_owner(tmp_path: Path) -> None:
    """Team ml writes a policy claiming team-b's model: refused; team-b's own policy governs."""
    (tmp_path / "team-b").mkdir()
    (tmp_path / "team-b" / "own.yaml").write_text(
        valid_policy("own", target="scorer").replace("namespace: ml", "")
    )
    (tmp_path / "ml" / "evil.yaml").write_text(
        valid_policy("evil", target="scorer").replace("namespace: ml", "namespace: team-b")
    )
    registry = PolicyRegistry([tmp_path])
    report = registry.reload()
    assert sorted(registry.active) == ["team-b/scorer"]
    owner = registry.get("team-b/scorer")
    assert owner is not None and owner.policy.metadata.name == "own"
    assert [(Path(e.path).name, e.field) for e in report.errors] == [("evil.yaml", "metadata.namespace")]
