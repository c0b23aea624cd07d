"""The sandbox's ingestion lag (canary_sandbox.exporter.IngestionLag), on a clock of its own.

What Prometheus then does with the timestamps is checked against a real Prometheus in
tests/integration/metrics/test_ingestion_lag.py.
"""

from __future__ import annotations

import pytest
from canary_sandbox.exporter import IngestionLag


def test_each_scrape_gets_the_exposition_rendered_lag_seconds_ago_with_its_own_time() -> None:
    now = [1000.0]
    rendered = iter(range(100))
    lagged = IngestionLag(
        lambda: f'# TYPE x counter\nx{{a="1"}} {next(rendered)}\n\n', 3.0, clock=lambda: now[0]
    )
    served = []
    for _ in range(6):
        served.append(lagged())
        now[0] += 1.0
    assert served[:3] == ["", "", ""]  # nothing is there before the lag has passed
    assert served[3] == '# TYPE x counter\nx{a="1"} 0 1000000\n\n'  # rendered at 1000 s, stamped so
    assert served[5] == '# TYPE x counter\nx{a="1"} 2 1002000\n\n'


def test_a_negative_lag_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        IngestionLag(str, -1.0)
