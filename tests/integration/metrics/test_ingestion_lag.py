"""Behind an ingestion lag (issue 33, item 7): what Prometheus holds, and how far the evidence reaches.

Remote write, a Thanos sidecar's upload or Mimir's ingesters make a sample queryable some time after
it was scraped: the newest samples are simply not there yet. The sandbox reproduces that with
:class:`canary_sandbox.exporter.IngestionLag`: each scrape is answered with the exposition rendered
``lag`` seconds earlier, its samples carrying their own timestamps. Upstream behaviour this rests on
(prometheus/prometheus at 001fc1b):

* scraped samples are stored at the timestamps the exposition gives: a scrape config's
  ``honor_timestamps`` is true by default (``config/config.go``, ``DefaultScrapeConfig``);
* ``timestamp()`` of a plain vector selector answers the samples' own times — "Matrix evaluation
  always returns the evaluation time, so this function needs special handling when given a vector
  selector" (``promql/engine.go``, ``evaluator.eval``, the ``timestamp`` case calling
  ``rangeEvalTimestampFunctionOverVectorSelector``); of any other expression, the evaluation time.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
import requests
from canary_sandbox.exporter import FixtureExporter, IngestionLag
from canary_sandbox.prometheus import PrometheusServer

from canary.evidence import REQUESTS, EvidenceStatus
from canary.metrics import PrometheusConfig, PrometheusEvidenceSource
from tests.integration.metrics.support import make_policy, make_request

LAG = 4.0
RATE = 20.0  # requests a second
BORN = time.time()
REVISION = "lagged-predictor-00002"
POD = f"{REVISION}-deployment-7d9f8c6b5-x2k9p"
LABELS = (
    f'namespace_name="lag",service_name="lagged",configuration_name="lagged",revision_name="{REVISION}",'
    f'pod_name="{POD}",container_name="queue-proxy",response_code="200",response_code_class="2xx"'
)


def _served(at: float) -> int:
    return int((at - BORN) * RATE)


def _render() -> str:
    return (
        f"# TYPE revision_request_count counter\nrevision_request_count{{{LABELS}}} {_served(time.time())}\n"
    )


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    with (
        FixtureExporter(IngestionLag(_render, LAG)) as exporter,
        PrometheusServer(scrape_targets=[exporter.target], scrape_interval=1.0) as server,
    ):
        server.wait_until_scraped()
        deadline = time.monotonic() + 30
        while not _query(server, "revision_request_count") and time.monotonic() < deadline:
            time.sleep(0.5)
        yield server


def _query(server: PrometheusServer, promql: str, at: float | None = None) -> list[tuple[float, float]]:
    params = {"query": promql, "time": f"{at if at is not None else time.time():.3f}"}
    answer = requests.get(f"{server.url}/api/v1/query", params=params, timeout=10).json()
    return [(float(item["value"][0]), float(item["value"][1])) for item in answer["data"]["result"]]


def test_samples_reach_prometheus_lag_seconds_late_with_their_own_timestamps(
    prometheus: PrometheusServer,
) -> None:
    now = time.time()
    [(_, newest)] = _query(prometheus, "timestamp(revision_request_count)", now)
    # Rendered at least LAG ago, and scraped every second: the newest is LAG to LAG + 2 s old.
    assert now - LAG - 2.5 <= newest <= now - LAG, now - newest
    [(_, value)] = _query(prometheus, "revision_request_count", now)
    assert abs(value - _served(newest)) <= 1  # the value as of its own time, not as of now
    # timestamp() of anything but a plain selector is the evaluation time.
    [(_, evaluated)] = _query(prometheus, "timestamp(sum(revision_request_count))", now)
    assert evaluated == pytest.approx(now, abs=0.01)


def test_the_counts_reach_as_far_as_the_newest_sample_and_a_step_counts_its_own_traffic(
    prometheus: PrometheusServer,
) -> None:
    checks = [{"name": "errors", "metric": "error-rate", "max": "1%"}]
    policy = make_policy(checks, namespace="lag", name="lagged", metrics={"requests": "knative-opencensus"})
    with PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=1.0) as source:
        step_start = datetime.now(UTC)
        evidence = None
        # A tick a second from the step's start, until the samples reach past it (a loaded machine
        # scrapes late: at most 40 s).
        deadline = time.monotonic() + 40
        for tick in itertools.count():
            at = datetime.now(UTC)
            request = replace(make_request(policy, "lag", REVISION, None, at=at), window_start=step_start)
            evidence = source.collect(policy, request)
            newest = evidence.counts["canary"].newest
            reached = newest is not None and newest > step_start + timedelta(seconds=2)
            if (tick >= int(LAG) + 4 and reached) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    assert evidence is not None
    series = evidence.counts["canary"]
    assert series.status is EvidenceStatus.OK
    assert series.newest is not None
    behind = (evidence.request.at - series.newest).total_seconds()
    assert LAG - 0.5 <= behind <= LAG + 2.5, behind
    # The step's own evidence is what was served after it started, up to where the samples reach:
    # not what the lagging samples at the step's start still held from before it.
    own = series.since(step_start)
    assert own and own[-1].end <= evidence.request.at - timedelta(seconds=LAG - 0.5)
    covered = (series.newest - step_start).total_seconds()
    served = evidence.canary[REQUESTS].value
    assert served is not None
    assert abs(served - RATE * covered) <= 2 * RATE, (served, covered)
