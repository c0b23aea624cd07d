"""The hostile-tenant suite runs only when asked for by path (``make test-hostile``, ``pytest
tests/hostile``): ``make test`` collects ``tests/`` and leaves it out, and ``.ci/run`` runs it after
``make test`` with its own budget (3 minutes; the two runs take about 2 on the shared two-core machine).

Its one shared fixture, ``runs``, plays the same rollouts benign and with team A hostile, each with
its own controller process (tests/hostile/world.py), once for the whole module."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.hostile.world import Run

_HERE = Path(__file__).resolve().parent


def _asked_for(config: pytest.Config) -> bool:
    for argument in config.args:
        path = Path(argument.split("::", 1)[0]).resolve()
        if path == _HERE or _HERE in path.parents:
            return True
    return False


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    return None if _asked_for(config) else True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.hostile)


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """The benign run, then the hostile one (each prints its numbers)."""
    from tests.hostile.world import run

    measured = {"benign": run(hostile=False), "hostile": run(hostile=True)}
    for one in measured.values():
        print(one.summary())
    return measured
