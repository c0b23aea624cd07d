"""One real Prometheus for the backtest tests, on TSDB blocks promtool built from generated history."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from canary_sandbox.history import combined_openmetrics
from canary_sandbox.prometheus import PrometheusServer

from tests.backtest.support import HISTORIES


@pytest.fixture(scope="session")
def prometheus() -> Iterator[PrometheusServer]:
    with PrometheusServer(backfill=combined_openmetrics(HISTORIES)) as server:
        yield server
