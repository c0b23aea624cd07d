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


def test_a_second_policy_for_a_governed_inference_service_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "ml" / "first.yaml").write_text(valid_policy("first", target="llama"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    (tmp_path / "ml" / "second.yaml").write_text(valid_policy("second", target="llama"))
    report = registry.reload()
    assert (report.added, report.updated, report.removed) == ([], [], [])
    assert [(c.key, c.kept.policy.metadata.name) for c in report.conflicts] == [("ml/llama", "first")]
    kept = registry.get("ml/llama")
    assert kept is not None
    assert kept.policy.metadata.name == "first"
    assert {Path(error.path).name for error in report.errors} == {"first.yaml", "second.yaml"}


def test_a_removed_policy_is_reported_removed(tmp_path: Path) -> None:
    (tmp_path / "ml" / "a.yaml").write_text(valid_policy("a"))
    (tmp_path / "ml" / "b.yaml").write_text(valid_policy("b"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    (tmp_path / "ml" / "b.yaml").unlink()
    report = registry.reload()
    assert report.removed == ["ml/b"]
    assert sorted(registry.active) == ["ml/a"]


def test_after_a_restart_two_claimants_never_leave_the_model_unguarded(tmp_path: Path) -> None:
    """No established claimant in memory: the first file in path order governs; both are told."""
    (tmp_path / "ml" / "b-second.yaml").write_text(valid_policy("second", target="llama"))
    (tmp_path / "ml" / "a-first.yaml").write_text(valid_policy("first", target="llama"))
    report = PolicyRegistry([tmp_path]).reload()
    assert report.added == ["ml/llama"]
    [conflict] = report.conflicts
    assert conflict.key == "ml/llama"
    assert conflict.kept.policy.metadata.name == "first"
    assert [refused.policy.metadata.name for refused in conflict.refused] == ["second"]
    messages = {Path(error.path).name: error.message for error in report.errors}
    assert "keeps governing" in messages["a-first.yaml"]
    assert "already governed by 'first'" in messages["b-second.yaml"]


def test_an_established_policy_keeps_its_model_against_a_newcomer_sorting_first(tmp_path: Path) -> None:
    (tmp_path / "ml" / "zz-owner.yaml").write_text(valid_policy("owner", target="llama"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    (tmp_path / "ml" / "aa-newcomer.yaml").write_text(valid_policy("newcomer", target="llama"))
    report = registry.reload()
    kept = registry.get("ml/llama")
    assert kept is not None and kept.policy.metadata.name == "owner"
    assert (report.added, report.updated, report.removed) == ([], [], [])
    [conflict] = report.conflicts
    assert [refused.policy.metadata.name for refused in conflict.refused] == ["newcomer"]
    assert {Path(error.path).name for error in report.errors} == {"zz-owner.yaml", "aa-newcomer.yaml"}
    # The owner's edits still apply while the newcomer is refused.
    (tmp_path / "ml" / "zz-owner.yaml").write_text(
        valid_policy("owner", target="llama").replace("800ms", "900ms")
    )
    os.utime(tmp_path / "ml" / "zz-owner.yaml", ns=(1, 1))
    assert registry.reload().updated == ["ml/llama"]
    edited = registry.get("ml/llama")
    assert edited is not None and edited.policy.spec.checks[0].max == 0.9


def test_a_newcomer_does_not_take_over_while_the_established_file_is_broken(tmp_path: Path) -> None:
    owner = tmp_path / "ml" / "owner.yaml"
    owner.write_text(valid_policy("owner", target="llama"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    owner.write_text(valid_policy("owner", target="llama").replace("800ms", "soon"))
    (tmp_path / "ml" / "newcomer.yaml").write_text(valid_policy("newcomer", target="llama"))
    report = registry.reload()
    kept = registry.get("ml/llama")
    assert kept is not None and kept.policy.metadata.name == "owner"
    assert report.kept_previous == ["ml/llama"]
    assert [c.refused[0].policy.metadata.name for c in report.conflicts] == ["newcomer"]


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
