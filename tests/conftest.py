"""Suites are marked by the directory they live in, so ``make test-fast`` skips every slow one.

- ``tests/integration/`` — against a real Prometheus server (Debian's package): ``integration``;
- ``tests/e2e/`` — the controller as a separate process, the emulator and Prometheus: ``e2e``;
- ``tests/faults/`` — the same stack with faults injected (Prometheus, the API, the receiver, kills): ``faults``;
- ``tests/fuzz/`` — thousands of generated policies, states, commands and Prometheus answers: ``fuzz``;
- ``tests/deploy/`` marks its controller-process tests ``e2e`` itself (its conftest knows which).

Everything else mirrors a package (``tests/policy`` for ``canary.policy``, ``tests/sandbox`` for
``canary_sandbox``, ...) and runs in seconds.

The slowest modules are collected first (``SLOWEST_FIRST``): ``make test`` hands whole modules to its
workers in collection order (``--dist loadscope --no-loadscope-reorder``), so the long ones start at
once and the short ones fill the gaps at the end, instead of a minute-long module starting last.
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
_MARK_BY_DIRECTORY = {
    "integration": pytest.mark.integration,
    "e2e": pytest.mark.e2e,
    "faults": pytest.mark.faults,
    "fuzz": pytest.mark.fuzz,
}


# Modules by their time under ``make test`` (coverage, three workers on two cores), slowest first; every
# other module takes well under 15 s and keeps its place after these. Only the order of whole modules
# changes: a module's own tests keep theirs. A stale entry costs some wall time, never a result.
SLOWEST_FIRST = (
    "tests/integration/metrics/test_counters.py",
    "tests/controller/test_startup.py",
    "tests/e2e/test_resilience.py",
    "tests/fuzz/test_policy_fuzz.py",
    "tests/faults/test_process_faults.py",
    "tests/faults/test_state_faults.py",
    "tests/deploy/test_rbac.py",
    "tests/e2e/test_rollouts.py",
    "tests/faults/test_prometheus_faults.py",
    "tests/controller/test_promotionpolicy_crs.py",
    "tests/e2e/test_scale.py",
    "tests/cli/test_status.py",
    "tests/e2e/test_state_loss.py",
    "tests/faults/test_api_faults.py",
    "tests/e2e/test_shards.py",
    "tests/faults/test_notification_faults.py",
    "tests/e2e/test_rollout_report.py",
    "tests/fuzz/test_judge_error_rates.py",
    "tests/e2e/test_gates.py",
    "tests/e2e/test_demo.py",
    "tests/deploy/test_admission_policies.py",
    "tests/cli/test_commands.py",
    "tests/backtest/test_backtest.py",
    "tests/deploy/test_helm.py",
    "tests/rollout/test_sequential_judge.py",
    "tests/e2e/test_gitops_flow.py",
    "tests/dashboard/test_api.py",
    "tests/e2e/test_notification_delivery.py",
    "tests/deploy/test_manifests.py",
    "tests/integration/metrics/test_semantics.py",
    "tests/cli/test_failures.py",
    "tests/cli/test_explain.py",
    "tests/integration/metrics/test_explain_queries.py",
    "tests/deploy/test_crd_manifests.py",
    "tests/deploy/test_least_privilege.py",
    "tests/deploy/test_dockerfile.py",
    "tests/cli/test_report.py",
)
_RANK = {module: rank for rank, module in enumerate(SLOWEST_FIRST)}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: modules not listed keep their collection order, after the listed ones.
    items[:] = sorted(items, key=lambda item: _RANK.get(item.nodeid.split("::", 1)[0], len(_RANK)))
    for item in items:
        try:
            top = item.path.resolve().relative_to(_TESTS).parts[0]
        except ValueError:
            continue
        mark = _MARK_BY_DIRECTORY.get(top)
        if mark is not None:
            item.add_marker(mark)
