"""NaN, +Inf and -Inf from Prometheus are their own evidence status, "invalid value": never ok (so
never a pass or a fail), never no-data (so never counted towards onNoData) — and never a crash."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from canary.evidence import REQUESTS, EvidenceStatus, Measurement
from canary.metrics.catalog import RevisionKey
from canary.metrics.client import QueryAnswer, QueryFailure, QueryOutcome
from canary.metrics.counting.book import CounterBook
from canary.metrics.counting.counts import count_measurement
from canary.metrics.counting.decode import parse_counter_vector
from canary.metrics.plan import Need, QueryGrouping, Side, measurement_for, parse_grouped, plan_rollout
from canary.policy.units import Unit
from tests.metrics.test_plan import ALL_BUILTINS, RESOLVED, policy, request

CANARY = {"kserve_canary_namespace": "ml", "kserve_canary_revision": "llama-predictor-00002"}
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _outcome(series: list[dict[str, Any]]) -> QueryOutcome:
    return QueryOutcome("the-query", QueryAnswer("vector", series), None, 1, 0.01)


def _need(key: str, check: dict[str, Any]) -> Need:
    the_policy = policy([check])
    needs = plan_rollout(
        0, the_policy, request(the_policy), RESOLVED, min_window=10, grouping=QueryGrouping.PER_TICK
    )
    return next(n for n in needs if n.key == key and n.side is Side.CANARY)


def _measure(key: str, check: dict[str, Any], value: str, samples: str | None) -> Measurement:
    series = [{"metric": CANARY, "value": [1, value]}]
    if samples is not None:
        series.append({"metric": {**CANARY, "kserve_canary_field": "samples"}, "value": [1, samples]})
    outcome = _outcome(series)
    return measurement_for(_need(key, check), outcome, parse_grouped(outcome), min_requests=20)


TTFT = ALL_BUILTINS[8]  # ttft p95, max 2 s: a grouped request-based query (error-rate is counted)
KV = ALL_BUILTINS[6]  # kv-cache-usage, max 95%


@pytest.mark.parametrize(
    ("key", "check", "value", "samples", "shown"),
    [
        pytest.param("ttft", TTFT, "0.001", "+Inf", "+Inf", id="samples-plus-inf"),  # OverflowError once
        pytest.param("ttft", TTFT, "+Inf", "500", "+Inf", id="value-plus-inf"),
        pytest.param("ttft", TTFT, "NaN", "500", "NaN", id="value-nan-with-requests"),
        pytest.param("ttft", TTFT, "-Inf", "500", "-Inf", id="value-minus-inf"),
        pytest.param("kv", KV, "NaN", None, "NaN", id="gauge-nan"),
        pytest.param("kv", KV, "+Inf", None, "+Inf", id="gauge-plus-inf"),
    ],
)
def test_non_finite_values_are_invalid_values_naming_the_value(
    key: str, check: dict[str, Any], value: str, samples: str | None, shown: str
) -> None:
    measurement = _measure(key, check, value, samples)
    assert measurement.status is EvidenceStatus.INVALID_VALUE
    assert measurement.value is None
    assert measurement.error_class is None
    assert shown in measurement.detail
    assert measurement.query == "the-query"


def test_nan_from_no_requests_stays_no_data() -> None:
    # A quantile of 0 requests is NaN: nothing was measured, which is no-data (as before), not invalid.
    measurement = _measure("ttft", TTFT, "NaN", "0")
    assert measurement.status is EvidenceStatus.NO_DATA
    assert measurement.detail == "no requests in the window; a value needs at least 20"


def test_finite_values_are_still_ok() -> None:
    measurement = _measure("ttft", TTFT, "0.004", "500")
    assert (measurement.status, measurement.value, measurement.samples) == (EvidenceStatus.OK, 0.004, 500)
    assert math.isfinite(measurement.value or math.nan)


@pytest.mark.parametrize("value", ["+Inf", "NaN", "-Inf"])
def test_an_invalid_request_counter_makes_every_counted_measure_invalid(value: str) -> None:
    revision = RevisionKey(CANARY["kserve_canary_namespace"], CANARY["kserve_canary_revision"])
    labels = {
        **CANARY,
        "kserve_canary_pod": "p0",
        "kserve_canary_code_class": "2xx",
        "kserve_canary_field": "count",
    }
    book = CounterBook(tolerance=timedelta(seconds=2.5))
    for seconds, text in ((0, "10"), (5, value)):
        outcome = _outcome([{"metric": labels, "value": [seconds, text]}])
        parsed = parse_counter_vector(outcome, [revision], metric="revision_request_count")
        assert not isinstance(parsed, QueryFailure)
        book.record(revision, T0 + timedelta(seconds=seconds), parsed[revision])
    counts = book.tally(revision, T0, T0 + timedelta(seconds=5))
    for measure in (REQUESTS, "error-rate", "latency"):
        measurement = count_measurement(measure, Unit.NONE, revision, 0.99, counts, min_requests=1)
        assert measurement.status is EvidenceStatus.INVALID_VALUE
        assert measurement.detail == (
            f"Prometheus answered {value} for a request counter series of revision_request_count"
        )
    assert book.count_series(revision, T0, T0 + timedelta(seconds=5)).status is EvidenceStatus.INVALID_VALUE
