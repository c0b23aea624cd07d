"""Fixtures of the policy tests (helpers live in ``tests.policy.support``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.policy.support import valid_policy


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """A directory that already holds one valid policy, so every test also proves it still loads."""
    directory = tmp_path / "policies"
    directory.mkdir()
    (directory / "good.yaml").write_text(valid_policy())
    return directory
