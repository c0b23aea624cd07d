"""Hot reload of the policy directory (docs/design.md §5), on ConfigMap-style mounts."""

from __future__ import annotations

import os
from pathlib import Path

from canary.controller.policies import PolicyRegistry
from tests.policy.support import valid_policy


def swap_configmap_mount(root: Path, files: dict[str, str], generation: int) -> None:
    """Do what the kubelet does: write a new ``..<timestamp>`` dir and atomically swap ``..data``."""
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
    swap_configmap_mount(tmp_path, {"a.yaml": valid_policy("a"), "b.yaml": valid_policy("b")}, 1)
    registry = PolicyRegistry([tmp_path])
    report = registry.reload()
    assert sorted(report.added) == ["ml/a", "ml/b"]
    assert sorted(registry.active) == ["ml/a", "ml/b"]


def test_unchanged_directory_is_not_reloaded(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(valid_policy("a"))
    registry = PolicyRegistry([tmp_path])
    assert registry.reload().changed
    assert not registry.reload().changed


def test_a_broken_edit_keeps_the_previous_version_running(tmp_path: Path) -> None:
    swap_configmap_mount(tmp_path, {"a.yaml": valid_policy("a"), "b.yaml": valid_policy("b")}, 1)
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    previous = registry.get("ml/a")
    swap_configmap_mount(
        tmp_path, {"a.yaml": valid_policy("a").replace("800ms", "soon"), "b.yaml": valid_policy("b")}, 2
    )
    report = registry.reload()
    assert report.changed
    assert report.kept_previous == ["ml/a"]
    assert report.removed == []
    assert registry.get("ml/a") == previous
    assert any("spec.checks[0].max" in str(error) for error in report.errors)


def test_an_edit_applies_and_is_reported_as_updated(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
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
    (tmp_path / "first.yaml").write_text(valid_policy("first", target="llama"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    (tmp_path / "second.yaml").write_text(valid_policy("second", target="llama"))
    report = registry.reload()
    assert report.kept_previous == ["ml/llama"]
    kept = registry.get("ml/llama")
    assert kept is not None
    assert kept.policy.metadata.name == "first"
    assert {Path(error.path).name for error in report.errors} == {"first.yaml", "second.yaml"}


def test_a_removed_policy_is_reported_removed(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(valid_policy("a"))
    (tmp_path / "b.yaml").write_text(valid_policy("b"))
    registry = PolicyRegistry([tmp_path])
    registry.reload()
    (tmp_path / "b.yaml").unlink()
    report = registry.reload()
    assert report.removed == ["ml/b"]
    assert sorted(registry.active) == ["ml/a"]
