"""Controller runs shared by the RBAC and monitoring tests (each takes a few seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy.manifests import KUSTOMIZATIONS, kustomize
from tests.deploy.scenario import ScenarioResult, run_controller


@pytest.fixture(scope="session")
def cluster_wide_run(tmp_path_factory: pytest.TempPathFactory) -> ScenarioResult:
    """The controller with the cluster-wide overlay's arguments (every namespace)."""
    return run_controller(
        kustomize(KUSTOMIZATIONS["cluster-wide"]), Path(tmp_path_factory.mktemp("cluster-wide"))
    )


@pytest.fixture(scope="session")
def single_namespace_run(tmp_path_factory: pytest.TempPathFactory) -> ScenarioResult:
    """The controller with the single-namespace overlay's arguments (--namespace=models)."""
    return run_controller(
        kustomize(KUSTOMIZATIONS["single-namespace"]), Path(tmp_path_factory.mktemp("single-namespace"))
    )


RUN_FIXTURES = {"cluster_wide_run", "single_namespace_run"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start the controller as a process are end-to-end (``make test-fast`` skips them)."""
    for item in items:
        if RUN_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
