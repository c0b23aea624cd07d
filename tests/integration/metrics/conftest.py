"""The real Prometheus the evidence tests query, backfilled once per session (``support.py`` says what)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from canary_sandbox.kserve_metrics import Simulation
from canary_sandbox.prometheus import PrometheusServer

from tests.integration.metrics.support import END, START, STEP, Scenario, production_revisions


@pytest.fixture(scope="session")
def production() -> Iterator[Scenario]:
    simulation = Simulation(production_revisions(), start=START, end=END, step=STEP, seed=20261129)
    with PrometheusServer(backfill=simulation.openmetrics()) as prometheus:
        yield Scenario(simulation, prometheus)
