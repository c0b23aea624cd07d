"""NaN, +Inf and -Inf from Prometheus are their own evidence status, "invalid value": never ok (so
never a pass or a fail), never no-data (so never counted towards onNoData) — and never a crash."""

from __future__ import annotations

import math
from typing import Any

import pytest

from canary.evidence import REQUESTS, EvidenceStatus, Measurement
from canary.metrics.client import QueryAnswer, QueryOutcome
from canary.metrics.plan import Need, QueryGrouping, Side, measurement_for, parse_grouped, plan_rollout
from tests.metrics.test_plan import ALL_BUILTINS, RESOLVED, policy, request

CANARY = {"namespace": "ml", "revision": "llama-predictor-00002"}


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
        series.append({"metric": {**CANARY, "evidence_field": "samples"}, "value": [1, samples]})
    outcome = _outcome(series)
    return measurement_for(_need(key, check), outcome, parse_grouped(outcome), min_requests=20)


ERRORS = ALL_BUILTINS[2]  # error-rate, max 1%
KV = ALL_BUILTINS[6]  # kv-cache-usage, max 95%


@pytest.mark.parametrize(
    ("key", "check", "value", "samples", "shown"),
    [
        pytest.param("errors", ERRORS, "0.001", "+Inf", "+Inf", id="samples-plus-inf"),  # OverflowError today
        pytest.param("errors", ERRORS, "+Inf", "500", "+Inf", id="rate-plus-inf"),
        pytest.param("errors", ERRORS, "NaN", "500", "NaN", id="rate-nan-with-requests"),
        pytest.param("errors", ERRORS, "-Inf", "500", "-Inf", id="rate-minus-inf"),
        pytest.param("kv", KV, "NaN", None, "NaN", id="gauge-nan"),
        pytest.param("kv", KV, "+Inf", None, "+Inf", id="gauge-plus-inf"),
        pytest.param(REQUESTS, ERRORS, "+Inf", None, "+Inf", id="request-count-plus-inf"),
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
    # 0 errors / 0 requests is NaN: nothing was measured, which is no-data (as before), not invalid.
    measurement = _measure("errors", ERRORS, "NaN", "0")
    assert measurement.status is EvidenceStatus.NO_DATA
    assert measurement.detail == "no requests in the window; a value needs at least 20"


def test_finite_values_are_still_ok() -> None:
    measurement = _measure("errors", ERRORS, "0.004", "500")
    assert (measurement.status, measurement.value, measurement.samples) == (EvidenceStatus.OK, 0.004, 500)
    assert math.isfinite(measurement.value or math.nan)


def test_an_invalid_request_count_says_so() -> None:
    measurement = _measure(REQUESTS, ERRORS, "+Inf", None)
    assert measurement.detail == "Prometheus answered +Inf for the request count"
