"""The policy tree's fingerprint changes whenever a reload would read something else, and only then."""

from __future__ import annotations

import os
from pathlib import Path

from canary.controller.policies import tree_fingerprint

POLICY = "apiVersion: kserve-canary.dev/v1alpha1\nkind: PromotionPolicy\n"
MOMENT = (1_764_000_000, 1_764_000_000)  # the same times for every copy: only the swap differs


def _snapshot(directory: Path, text: str = POLICY) -> Path:
    directory.mkdir(parents=True)
    (directory / "resnet.yaml").write_text(text)
    os.utime(directory / "resnet.yaml", MOMENT)
    return directory


def test_a_configmap_update_swapping_data_is_seen_even_with_equal_sizes_and_times(tmp_path: Path) -> None:
    root = tmp_path / "policies"
    _snapshot(root / "..2026_12_02_10_00_00.1")
    (root / "..data").symlink_to("..2026_12_02_10_00_00.1")
    (root / "resnet.yaml").symlink_to("..data/resnet.yaml")
    before = tree_fingerprint([root])
    assert tree_fingerprint([root]) == before  # nothing changed: nothing to reload

    _snapshot(root / "..2026_12_02_10_05_00.2")  # kubelet: a new snapshot, then ..data swapped
    (root / "..data_tmp").symlink_to("..2026_12_02_10_05_00.2")
    os.replace(root / "..data_tmp", root / "..data")
    (root / "..2026_12_02_10_00_00.1" / "resnet.yaml").unlink()
    (root / "..2026_12_02_10_00_00.1").rmdir()
    assert tree_fingerprint([root]) != before


def test_a_link_out_of_the_tree_reaching_another_file_is_seen(tmp_path: Path) -> None:
    # git-sync's shape: the policies link into a checkout that is swapped as a whole.
    outside = tmp_path / "sync"
    _snapshot(outside / "rev-a")
    _snapshot(outside / "rev-b")
    (outside / "current").symlink_to("rev-a")
    root = tmp_path / "policies"
    root.mkdir()
    (root / "resnet.yaml").symlink_to(outside / "current" / "resnet.yaml")
    before = tree_fingerprint([root])

    (outside / "next").symlink_to("rev-b")
    os.replace(outside / "next", outside / "current")
    assert tree_fingerprint([root]) != before


def test_a_root_that_is_a_link_swapped_is_seen(tmp_path: Path) -> None:
    _snapshot(tmp_path / "rev-a")
    _snapshot(tmp_path / "rev-b")
    root = tmp_path / "policies"
    root.symlink_to("rev-a")
    before = tree_fingerprint([root])
    (tmp_path / "next").symlink_to("rev-b")
    os.replace(tmp_path / "next", root)
    assert tree_fingerprint([root]) != before
