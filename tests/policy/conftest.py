"""Fixtures of the policy tests (helpers live in ``tests.policy.support``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.policy.support import valid_policy


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """The ``ml`` namespace directory of a policy root (``policy_dir.parent``), already holding one valid
    policy, so every test also proves it still loads."""
    directory = tmp_path / "policies" / "ml"
    directory.mkdir(parents=True)
    (directory / "good.yaml").write_text(valid_policy())
    return directory
