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

The workers know the fixtures, the scheduler in the main process only the test ids: each worker writes
every test's unit to a file (``_UNITS_FILE``; they collect the same tests, so the same content) before
it reports its collection, and the scheduler reads it when it hands out the first tests. (pytest-xdist's own ``xdist_group`` marks would do the same, but xdist 3.8 sets
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
    "integration": (pytest.mark.integration,),
    "e2e": (pytest.mark.e2e, pytest.mark.untraced),
    "faults": (pytest.mark.faults, pytest.mark.untraced),
    "fuzz": (pytest.mark.fuzz,),
}
# Set by the main process before its workers start (they inherit it): where they write the units.
_UNITS_FILE = "KSERVE_CANARY_TEST_UNITS"
_units_key = pytest.StashKey[str]()

# Seconds of each long unit, measured directory by directory under coverage on the shared two-core
# machine (only their order matters): a module kept whole is one unit (keyed by its path), any other
# test is a unit of its own (keyed by its node id, parameters left out: each parameter is a unit of
# that time). Every unit not listed takes a
# few seconds at most and counts as 0: those keep their collection order, after the listed ones. A
# stale entry costs some wall time, never a result.
EXPECTED_SECONDS: dict[str, float] = {
    # waiting on real time: stacks, controller processes, rollouts
    "tests/faults/test_process_faults.py": 160,
    "tests/e2e/test_rollout_report.py": 145,
    "tests/e2e/test_rollouts.py": 120,
    "tests/e2e/test_evidence_lag.py": 140,
    "tests/faults/test_prometheus_faults.py": 115,
    "tests/faults/test_state_faults.py": 100,
    "tests/e2e/test_state_loss.py": 95,
    "tests/faults/test_notification_faults.py": 90,
    "tests/faults/test_api_faults.py": 85,
    "tests/e2e/test_demo.py": 80,
    "tests/e2e/test_scale.py": 80,
    "tests/e2e/test_resilience.py::test_killed_controllers_resume_the_same_step_and_exactly_one_replica_acts": 65,
    "tests/e2e/test_shards.py": 60,
    "tests/e2e/test_notification_delivery.py::test_a_takeover_replica_delivers_the_previous_leaders_queue": 55,
    "tests/e2e/test_resilience.py::test_prometheus_down_mid_rollout_holds_and_resumes_when_it_returns": 52,
    "tests/e2e/test_gitops_flow.py::test_a_policy_beside_its_model_in_git_runs_the_rollout_and_kubectl_wait_returns_on_this_promotion": 50,
    "tests/e2e/test_gates.py": 45,
    "tests/e2e/test_otel_overload.py": 40,
    "tests/e2e/test_resilience.py::test_sigterm_stops_cleanly_and_releases_the_lease_for_the_standby": 35,
    "tests/e2e/test_notification_delivery.py::test_the_outbox_survives_a_controller_restart": 33,
    "tests/e2e/test_resilience.py::test_dry_run_decides_and_logs_but_writes_nothing": 16,
    # on the CPU
    "tests/fuzz/test_policy_fuzz.py::test_documents_drawn_from_the_schema": 95,
    "tests/fuzz/test_policy_fuzz.py::test_mutated_yaml_text": 105,
    "tests/fuzz/test_policy_fuzz.py::test_mutated_policy_files": 40,
    "tests/deploy/test_rbac.py": 45,
    "tests/backtest/test_backtest.py": 40,
    "tests/integration/metrics/test_counters.py": 25,
    "tests/fuzz/test_state_fuzz.py::test_state_documents": 16,
    "tests/fuzz/test_judge_error_rates.py::test_a_good_canary_at_the_tolerance_edge_is_failed_within_the_budget": 15,
    "tests/fuzz/test_judge_error_rates.py::test_a_bad_canary_at_the_limit_is_met_within_the_budget": 10,
    "tests/fuzz/test_commands_fuzz.py::test_command_sequences_on_stored_states": 10,
    "tests/controller/test_promotionpolicy_crs.py::test_a_valid_object_governs_and_its_status_is_written_only_when_it_changes": 10,
    "tests/controller/test_persistence.py::test_a_restart_from_the_stored_state_reaches_the_same_decisions": 9,
}


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
        for mark in _MARK_BY_DIRECTORY.get(top, ()):
            item.add_marker(mark)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """A test marked ``untraced`` runs its setup, call and teardown with this process's coverage
    measurement paused (when coverage runs at all); the processes it starts are measured as ever.

    Line tracing slows every Python call in the process, measured or not (the sandbox's and the
    libraries' as much as the product's), two to four times. Paused for the Monte-Carlo simulations
    of the judge, whose lines the unit tests cover, and for the end-to-end and fault suites, whose
    product code runs in the controller processes (traced there); their own process runs the sandbox
    (which imports nothing of the product) and the test's assertions."""
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
