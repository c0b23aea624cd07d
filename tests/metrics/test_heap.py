"""The cyclic collector waits while a counter sample is parsed and recorded (canary.metrics.heap).

The large-answer test goes through the product's HTTP client against a loopback server serving one
real-sized answer; it watches the collector with ``gc.callbacks``.
"""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from canary.metrics.catalog import FIELD_LABEL, RevisionKey
from canary.metrics.client import PrometheusClient, PrometheusConfig
from canary.metrics.counting.counts import CountsPipeline
from canary.metrics.heap import collector_paused
from canary.metrics.tick_queries import COUNTER_FIELD, RESTARTS_COUNTER
from tests.metrics.test_prometheus_errors import Answer, FaultyPrometheus

AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
REVISION = RevisionKey("serving", "resnet-predictor-00002")
SERIES = 30_000  # a few thousand are enough to set off young collections at the default thresholds


@pytest.fixture
def collector_enabled() -> Iterator[None]:
    """The collector enabled for the test, and as it was before it afterwards (a test disables it)."""
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_the_collector_is_enabled_again_when_the_last_caller_leaves(collector_enabled: None) -> None:
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with collector_paused():
            entered.set()
            leave.wait(10)

    thread = threading.Thread(target=other)
    with collector_paused():
        assert not gc.isenabled()
        thread.start()
        assert entered.wait(10)
        with collector_paused():  # nested in the same thread
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert not gc.isenabled(), "the other thread is still parsing"
    leave.set()
    thread.join(10)
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled(collector_enabled: None) -> None:
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def _restart_answer(series: int) -> bytes:
    result = [
        {
            "metric": {
                FIELD_LABEL: COUNTER_FIELD,
                "kserve_canary_namespace": REVISION.namespace,
                "kserve_canary_revision": REVISION.revision,
                "kserve_canary_pod": f"resnet-predictor-00002-deployment-{index // 4:06d}",
                "kserve_canary_code_class": f"container-{index % 4}",
            },
            "value": [AT.timestamp(), str(index % 3)],
        }
        for index in range(series)
    ]
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()


def test_a_large_sample_is_parsed_and_recorded_without_a_collection(collector_enabled: None) -> None:
    collections: list[int] = []

    def observe(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    with FaultyPrometheus(Answer(200, _restart_answer(SERIES))) as server:
        client = PrometheusClient(PrometheusConfig(url=f"http://127.0.0.1:{server.port}"))
        pipeline = CountsPipeline(
            client.instant, client.range_query, scrape_interval=2.0, sample_budget=10_000, idle=900.0
        )
        pipeline.watch(REVISION, "serving/resnet", AT - timedelta(minutes=1), AT)
        gc.collect()
        gc.callbacks.append(observe)
        try:
            pipeline.sample_restarts(AT)
        finally:
            gc.callbacks.remove(observe)
        client.close()
    (snapshot,) = pipeline.book(RESTARTS_COUNTER).snapshots(REVISION)
    assert snapshot.series == SERIES  # the whole answer was parsed and recorded
    # Without the pause: hundreds of young collections and full ones among them. With it: at most the
    # young collection the first allocation after the pause sets off (what survived it is young).
    assert collections in ([], [0]), f"collections ran while the sample was parsed: {collections}"
