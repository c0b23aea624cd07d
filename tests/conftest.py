"""Suites are marked by the directory they live in, so ``make test-fast`` skips every slow one.

- ``tests/integration/`` — against a real Prometheus server (Debian's package): ``integration``;
- ``tests/e2e/`` — the controller as a separate process, the emulator and Prometheus: ``e2e``;
- ``tests/faults/`` — the same stack with faults injected (Prometheus, the API, the receiver, kills): ``faults``;
- ``tests/fuzz/`` — thousands of generated policies, states, commands and Prometheus answers: ``fuzz``;
- ``tests/deploy/`` marks its controller-process tests ``e2e`` itself (its conftest knows which).

Everything else mirrors a package (``tests/policy`` for ``canary.policy``, ``tests/sandbox`` for
``canary_sandbox``, ...) and runs in seconds.

How ``make test`` shares the tests among its workers (``-n N --dist loadscope``, refined here):

- a test that uses a fixture of ours wider than a function (a module's stack, a session's Prometheus)
  goes with the rest of its module, as plain ``loadscope`` sends it: the fixture starts once and the
  module's tests run in their order on one worker;
- every other test is a unit of its own, so the independent tests of one long module (each starting
  its own stack or process, or fuzzing for a minute) run side by side on several workers;
- the units are handed out longest first (``EXPECTED_SECONDS``), the short ones fill the gaps at the
  end. Only the order of units changes: a module kept whole keeps its order.

The workers know the fixtures, the scheduler in the main process only the test ids: the first worker
to collect writes each test's unit to a file (``_UNITS_FILE``) that the scheduler reads when it hands
out the first tests. (pytest-xdist's own ``xdist_group`` marks would do the same, but xdist 3.8 sets
them through a node attribute pytest 9.2 no longer reads.) Without the file the scheduler is plain
``loadscope``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

_TESTS = Path(__file__).resolve().parent
_MARK_BY_DIRECTORY = {
    "integration": pytest.mark.integration,
    "e2e": pytest.mark.e2e,
    "faults": pytest.mark.faults,
    "fuzz": pytest.mark.fuzz,
}
# Set by the main process before its workers start (they inherit it): where they write the units.
_UNITS_FILE = "KSERVE_CANARY_TEST_UNITS"
_units_key = pytest.StashKey[str]()

# Seconds of each long unit under ``make test`` (coverage on, PYTEST_WORKERS workers on two cores): a
# module kept whole is one unit (keyed by its path), any other test is a unit of its own (keyed by its
# node id, parameters left out: each parameter is a unit of that time). Every unit not listed takes a
# few seconds at most and counts as 0: those keep their collection order, after the listed ones. A
# stale entry costs some wall time, never a result.
EXPECTED_SECONDS: dict[str, float] = {}


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _shares_a_wider_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture of this tree (not a plugin's) scoped wider than a function."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return True  # not a plain test function: keep it with its module
    return any(
        definition.baseid and definition.scope != "function"
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


def _units(items: list[pytest.Item]) -> dict[str, str]:
    """Each test's unit: its module's path when the module is kept whole, else its own node id."""
    whole = {_module_of(item) for item in items if _shares_a_wider_fixture(item)}
    return {item.nodeid: _module_of(item) if _module_of(item) in whole else item.nodeid for item in items}


def _seconds(nodeid: str, unit: str) -> float:
    if unit != nodeid:
        return EXPECTED_SECONDS.get(unit, 0.0)
    return EXPECTED_SECONDS.get(nodeid, EXPECTED_SECONDS.get(nodeid.split("[", 1)[0], 0.0))


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and _UNITS_FILE not in os.environ:
        handle, path = tempfile.mkstemp(prefix="kserve-canary-test-units-", suffix=".json")
        os.close(handle)
        os.environ[_UNITS_FILE] = path
        config.stash[_units_key] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_units_key, None)
    if path is not None:
        Path(path).unlink(missing_ok=True)
        os.environ.pop(_UNITS_FILE, None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    units = _units(items)
    seconds = {nodeid: _seconds(nodeid, unit) for nodeid, unit in units.items()}
    # A stable sort: units of equal time (every unlisted one) keep their collection order, and a
    # module kept whole stays in one piece in its order (all its tests have its unit's time).
    items[:] = sorted(items, key=lambda item: -seconds[item.nodeid])
    if hasattr(config, "workerinput") and os.environ.get(_UNITS_FILE):
        target = Path(os.environ[_UNITS_FILE])
        partial = target.with_name(f"{target.name}.{config.workerinput['workerid']}")
        partial.write_text(json.dumps(units), encoding="utf-8")
        partial.replace(target)  # every worker collects the same tests: the same content
    for item in items:
        try:
            top = item.path.resolve().relative_to(_TESTS).parts[0]
        except ValueError:
            continue
        mark = _MARK_BY_DIRECTORY.get(top)
        if mark is not None:
            item.add_marker(mark)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    """A test marked ``untraced`` runs with coverage measurement paused (when coverage runs at all).

    For Monte-Carlo simulations of the judge: their assertions are about error rates over thousands
    of simulated rollouts, the lines they run are covered by the unit tests as well, and line tracing
    made them four times as slow."""
    current = None
    if item.get_closest_marker("untraced") is not None:
        try:
            import coverage
        except ImportError:  # pragma: no cover - coverage is a dev dependency
            coverage = None
        current = coverage.Coverage.current() if coverage is not None else None
    if current is None:
        return (yield)
    current.stop()
    try:
        return (yield)
    finally:
        current.start()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """``loadscope`` whose scopes are the units the workers wrote (module scope without them)."""

        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:
                try:
                    self.units = json.loads(Path(os.environ.get(_UNITS_FILE, "")).read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    self.units = {}
            found = self.units.get(nodeid) if self.units else None
            return found if isinstance(found, str) else super()._split_scope(nodeid)

    return UnitScheduling(config, log)
