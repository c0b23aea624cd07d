"""The counter sample read by the typed decoder (counters.COUNTER_VECTOR) means what the generic
reading means: the same samples, and the same failures — their class and what they say is wrong (a
malformed series may be quoted in another rendering) — through the product's HTTP client against a
loopback server serving each generated answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canary.metrics.catalog import RevisionKey
from canary.metrics.client import PrometheusClient, PrometheusConfig, QueryFailure
from canary.metrics.counting.decode import COUNTER_VECTOR, CounterSeries, parse_counter_vector
from tests.metrics.test_prometheus_errors import Answer, FaultyPrometheus

AT = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
ASKED = [RevisionKey("ml", "resnet-predictor-00002"), RevisionKey("ml", "resnet-predictor-00001")]

_revision = st.sampled_from(["resnet-predictor-00002", "resnet-predictor-00001", "other-00001"])
_value = st.one_of(
    st.integers(0, 10**9).map(str),
    st.sampled_from(["12.5", "NaN", "+Inf", "-Inf", "1e3", "twelve", ""]),
)
_labels = st.fixed_dictionaries(
    {
        "kserve_canary_namespace": st.sampled_from(["ml", "ml", "ml", "other"]),
        "kserve_canary_revision": _revision,
        "kserve_canary_field": st.sampled_from(
            ["count", "bucket", "bucket", "bucket:ttft", "oom", "strange"]
        ),
        "kserve_canary_pod": st.sampled_from(["p0", "p1"]),
        "kserve_canary_code_class": st.sampled_from(["2xx", "5xx"]),
    },
    optional={
        "le": st.sampled_from(["100", "250", "+Inf", "0.5", "soon"]),
        "job": st.just("queue-proxy"),  # a label the counters do not read
    },
)
_series = st.fixed_dictionaries({"metric": _labels, "value": st.tuples(st.just(AT.timestamp()), _value)})
# Now and then a shape the typed decoder refuses: a number for a value, labels that are not strings.
_odd = st.sampled_from(
    [
        {
            "metric": {"kserve_canary_namespace": "ml", "kserve_canary_revision": "resnet-predictor-00002"},
            "value": [1, 5],
        },
        {
            "metric": {"kserve_canary_namespace": "ml", "kserve_canary_revision": ["resnet"]},
            "value": [1, "5"],
        },
        {"metric": "resnet", "value": [1, "5"]},
        {"metric": {"kserve_canary_namespace": "ml", "kserve_canary_revision": "resnet-predictor-00002"}},
    ]
)


@pytest.fixture(scope="module")
def server() -> Iterator[FaultyPrometheus]:
    with FaultyPrometheus(Answer(200, b"{}")) as serving:
        yield serving


def _body(series: list[object]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": series}}).encode()


def _both(server: FaultyPrometheus, body: bytes) -> tuple[object, object, object]:
    server.answer = Answer(200, body)
    client = PrometheusClient(PrometheusConfig(url=f"http://127.0.0.1:{server.port}"))
    try:
        typed = client.instant("counters", AT, typed=COUNTER_VECTOR)
        generic = client.instant("counters", AT)
    finally:
        client.close()
    result = typed.answer.result if typed.answer is not None else None
    return (
        parse_counter_vector(typed, ASKED, divisor=1000.0, metric="m"),
        parse_counter_vector(generic, ASKED, divisor=1000.0, metric="m"),
        result,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(_series, _series, _series, _odd), max_size=12))
def test_the_typed_reading_of_a_sample_means_what_the_generic_one_means(
    server: FaultyPrometheus, series: list[object]
) -> None:
    typed, generic, _ = _both(server, _body(series))
    if isinstance(generic, QueryFailure):
        assert isinstance(typed, QueryFailure)
        assert typed.error_class is generic.error_class
        assert typed.detail.split(":")[0] == generic.detail.split(":")[0]
    else:
        assert typed == generic


def test_a_well_formed_sample_is_read_typed(server: FaultyPrometheus) -> None:
    labels = {
        "kserve_canary_namespace": "ml",
        "kserve_canary_revision": ASKED[0].revision,
        "kserve_canary_pod": "p0",
        "kserve_canary_code_class": "2xx",
    }
    series = [
        {"metric": {**labels, "kserve_canary_field": "count"}, "value": [AT.timestamp(), "12"]},
        {"metric": {**labels, "kserve_canary_field": "bucket", "le": "250"}, "value": [AT.timestamp(), "10"]},
    ]
    typed, generic, result = _both(server, _body(series))
    assert isinstance(result, list) and all(isinstance(one, CounterSeries) for one in result)
    assert not isinstance(typed, QueryFailure) and typed == generic
    assert sum(len(sample.values) for sample in typed.values()) == 2


def test_both_readings_keep_one_identity_object_per_series(server: FaultyPrometheus) -> None:
    """A backfill reads a revision generically, every tick after it typed: the series identities
    both keep are the same objects (a thousand rollouts' series were held twice)."""
    labels = {
        "kserve_canary_namespace": "ml",
        "kserve_canary_revision": ASKED[1].revision,
        "kserve_canary_pod": "p-shared",
        "kserve_canary_code_class": "2xx",
    }
    series = [
        {"metric": {**labels, "kserve_canary_field": "count"}, "value": [AT.timestamp(), "12"]},
        {"metric": {**labels, "kserve_canary_field": "bucket", "le": "250"}, "value": [AT.timestamp(), "10"]},
    ]
    typed, generic, _ = _both(server, _body(series))
    assert not isinstance(typed, QueryFailure) and not isinstance(generic, QueryFailure)
    typed_ids = sorted(typed[ASKED[1]].values, key=repr)
    generic_ids = sorted(generic[ASKED[1]].values, key=repr)
    assert len(typed_ids) == 2
    assert all(one is other for one, other in zip(typed_ids, generic_ids, strict=True))
