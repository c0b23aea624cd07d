"""Honest values and honest "no data", against the real Prometheus: the rules the peers got wrong."""

from __future__ import annotations

from datetime import timedelta

import pytest

from canary.evidence import REQUESTS, ErrorClass, EvidenceStatus
from tests.integration.metrics.support import (
    AT,
    AT_SECONDS,
    ODD_DECOY,
    ODD_NAMESPACE,
    ODD_REVISION,
    WINDOW,
    Scenario,
    make_policy,
    make_request,
    revision_of,
    visible_requests,
)

HEALTH_CHECKS = [
    {"name": "errors", "metric": "error-rate", "max": "1%"},
    {"name": "oom", "metric": "oom-kills", "max": 0},
    {"name": "p99", "metric": "latency", "max": "2s"},
]


def custom(promql: str, unit: str = "none") -> list[dict[str, object]]:
    return [{"name": "custom", "promql": promql, "unit": unit, "max": 1}]


def test_healthy_canary_without_5xx_or_oom_series_reads_zero_not_no_data(production: Scenario) -> None:
    # bert's new revision has no pods OOMKilled and resnet's canary has no 5xx series at all.
    policy = make_policy(
        HEALTH_CHECKS, namespace="kn121", name="resnet", metrics={"requests": "knative-otel-invocation"}
    )
    with production.source() as source:
        evidence = source.collect(policy, make_request(policy, "kn121", "resnet-predictor-00008", None))
        bert = source.collect(
            make_policy([{"name": "oom", "metric": "oom-kills", "max": 0}], namespace="kn119", name="bert"),
            make_request(policy, "kn119", "bert-predictor-00005", None),
        )
    assert not any(
        r.status.startswith("5")
        for r in production.simulation.requests
        if r.revision.startswith("resnet-predictor-00008")
    )
    errors = evidence.canary["errors"]
    assert (errors.status, errors.value) == (EvidenceStatus.OK, 0.0)
    assert errors.samples == pytest.approx(
        len(visible_requests(production.simulation, "resnet-predictor-00008")), rel=0.03
    )
    oom = bert.canary["oom"]
    assert (oom.status, oom.value, oom.samples) == (EvidenceStatus.OK, 0.0, 2.0)


def test_canary_with_pods_but_zero_requests_is_no_data(production: Scenario) -> None:
    policy = make_policy(
        HEALTH_CHECKS, namespace="idle", name="quiet", metrics={"requests": "knative-opencensus"}
    )
    with production.source() as source:
        evidence = source.collect(policy, make_request(policy, "idle", "quiet-predictor-00002", None))
    # the request series exist (the pod serves) but never grow: 0 requests, and 0/0 is not a rate
    assert (evidence.canary[REQUESTS].status, evidence.canary[REQUESTS].value) == (EvidenceStatus.OK, 0.0)
    for check in ("errors", "p99"):
        assert evidence.canary[check].status is EvidenceStatus.NO_DATA, evidence.canary[check]
        assert "no requests" in evidence.canary[check].detail
    # pods are there, so OOM kills are an honest zero
    assert evidence.canary["oom"].value == 0.0


def test_canary_without_any_request_series_is_no_data(production: Scenario) -> None:
    policy = make_policy(
        HEALTH_CHECKS, namespace="idle", name="dark", metrics={"requests": "knative-opencensus"}
    )
    with production.source() as source:
        evidence = source.collect(policy, make_request(policy, "idle", "dark-predictor-00002", None))
    for key in (REQUESTS, "errors", "p99"):
        assert evidence.canary[key].status is EvidenceStatus.NO_DATA
        assert "dark-predictor-00002" in evidence.canary[key].detail


def test_revision_without_pods_is_no_data_for_oom_kills(production: Scenario) -> None:
    policy = make_policy([{"name": "oom", "metric": "oom-kills", "max": 0}])
    with production.source() as source:
        evidence = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00099", None))
    assert evidence.canary["oom"].status is EvidenceStatus.NO_DATA
    assert "no pods" in evidence.canary["oom"].detail


def test_counter_reset_inside_the_window_is_counted_across(production: Scenario) -> None:
    # stable llama pod 2 and canary pod 1 had their queue-proxy restarted inside the window.
    restarted = [
        pod.name
        for name in ("llama-predictor-00001", "llama-predictor-00002")
        for pod in revision_of(production.simulation, name).pods
        if any(
            r.container == "queue-proxy" and AT_SECONDS - WINDOW < r.at <= AT_SECONDS for r in pod.restarts
        )
    ]
    assert len(restarted) == 2
    checks = [{"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"}]
    policy = make_policy(checks, metrics={"requests": "knative-opencensus"})
    with production.source() as source:
        evidence = source.collect(
            policy, make_request(policy, "kn118", "llama-predictor-00002", "llama-predictor-00001")
        )
        # the same window evaluated on one restarted pod alone, by a custom query: the reset is absorbed
        pod_policy = make_policy(
            custom(
                f'sum(increase(revision_request_count{{pod="{restarted[1]}"}}[{{{{ window }}}}]))', "count"
            )
        )
        pod_evidence = source.collect(
            pod_policy, make_request(pod_policy, "kn118", "llama-predictor-00002", None)
        )
    for revision, measurements in (
        ("llama-predictor-00002", evidence.canary),
        ("llama-predictor-00001", evidence.stable),
    ):
        raw = visible_requests(production.simulation, revision)
        assert measurements[REQUESTS].value == pytest.approx(len(raw), rel=0.03)
        errors = sum(1 for r in raw if r.status.startswith("5"))
        assert measurements["errors"].value == pytest.approx(errors / len(raw), abs=0.003)
    per_pod = [
        r for r in visible_requests(production.simulation, "llama-predictor-00002") if r.pod == restarted[1]
    ]
    assert pod_evidence.canary["custom"].value == pytest.approx(len(per_pod), rel=0.03)
    # had the reset been read as a drop, the increase would have lost everything before it
    assert len(per_pod) > 2 * sum(1 for r in per_pod if r.tick > AT_SECONDS - 200)


def test_explicit_evaluation_time_sees_the_past(production: Scenario) -> None:
    # at T - 320 s the canary's OOM kill (T - 300 s) had not happened yet
    policy = make_policy([{"name": "oom", "metric": "oom-kills", "max": 0}])
    earlier = AT - timedelta(seconds=320)
    with production.source() as source:
        before = source.collect(
            policy, make_request(policy, "kn118", "llama-predictor-00002", None, at=earlier, window=300)
        )
        after = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
    assert (before.canary["oom"].value, after.canary["oom"].value) == (0.0, 1.0)
    assert (
        f"{earlier.timestamp():.3f}" not in before.canary["oom"].query
    )  # time travels as time=, not in PromQL


@pytest.mark.parametrize(
    ("promql", "status", "value"),
    [
        # NaN and ±Inf are invalid values: held like a query problem, never judged, never no-data
        ("vector(0) / 0", EvidenceStatus.INVALID_VALUE, None),
        ("0 / 0", EvidenceStatus.INVALID_VALUE, None),  # a NaN scalar
        ("vector(1) / 0", EvidenceStatus.INVALID_VALUE, None),
        ("vector(-1) / 0", EvidenceStatus.INVALID_VALUE, None),
        (
            'sum(kube_pod_created{namespace="{{ namespace }}", pod="nope"})',
            EvidenceStatus.NO_DATA,
            None,
        ),  # empty
        ("scalar(vector(0.25))", EvidenceStatus.OK, 0.25),
    ],
)
def test_special_values(
    production: Scenario, promql: str, status: EvidenceStatus, value: float | None
) -> None:
    policy = make_policy(custom(promql))
    with production.source() as source:
        measurement = source.collect(
            policy, make_request(policy, "kn118", "llama-predictor-00002", None)
        ).canary["custom"]
    assert measurement.status is status
    assert measurement.value == value
    assert measurement.error_class is None
    if status is not EvidenceStatus.OK:
        assert measurement.detail


@pytest.mark.parametrize(
    ("promql", "error_class", "detail"),
    [
        (
            'sum(rate(kube_pod_created{namespace="{{ namespace }}"}[5m]',
            ErrorClass.BAD_QUERY,
            # Parsed before it is scoped to its namespace (canary.metrics.tenancy): never sent.
            "refused, not asked: the query does not parse as PromQL (unclosed left parenthesis)",
        ),
        ('label_replace(vector(1), "bad-label", "x", "", "")', ErrorClass.EXECUTION, "HTTP 422 execution"),
        ('kube_pod_created{namespace="{{ namespace }}"}', ErrorClass.UNEXPECTED_RESULT, "series where one"),
        ('kube_pod_created{namespace="{{ namespace }}"}[5m]', ErrorClass.UNEXPECTED_RESULT, "got a matrix"),
        ('"a string"', ErrorClass.UNEXPECTED_RESULT, "got a string"),
    ],
)
def test_query_errors_stay_errors(
    production: Scenario, promql: str, error_class: ErrorClass, detail: str
) -> None:
    policy = make_policy(custom(promql))
    with production.source() as source:
        measurement = source.collect(
            policy, make_request(policy, "kn118", "llama-predictor-00002", None)
        ).canary["custom"]
    assert measurement.status is EvidenceStatus.ERROR
    assert measurement.error_class is error_class
    assert detail in measurement.detail
    assert measurement.value is None
    assert measurement.query.startswith(promql.split("{", maxsplit=1)[0])


def test_a_failing_override_does_not_spoil_the_other_checks(production: Scenario) -> None:
    policy = make_policy(
        [
            {"name": "oom", "metric": "oom-kills", "max": 0},
            {"name": "errors", "metric": "error-rate", "max": "1%"},
        ],
        metrics={"requests": "knative-opencensus", "queries": {"error-rate": "sum(rate(x[{{ window }}]"}},
    )
    with production.source() as source:
        evidence = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
    assert evidence.canary["errors"].error_class is ErrorClass.BAD_QUERY
    assert evidence.canary["oom"].value == 1.0


def test_regex_metacharacters_in_names_match_only_that_revision(production: Scenario) -> None:
    policy = make_policy(
        [{"name": "warmup", "metric": "warmup-time", "max": "3m"}],
        metrics={"requests": "knative-otel-invocation"},
    )
    with production.source() as source:
        evidence = source.collect(
            policy, make_request(policy, ODD_NAMESPACE, ODD_REVISION, None, inference_service="odd")
        )
    requests = evidence.canary[REQUESTS]
    own = len(visible_requests(production.simulation, ODD_REVISION))
    decoy = len(visible_requests(production.simulation, ODD_DECOY))
    assert decoy > 2 * own  # so counting the decoy too could not pass unnoticed
    assert requests.value == pytest.approx(own, rel=0.05)
    assert evidence.canary["warmup"].status is EvidenceStatus.OK
    assert evidence.canary["warmup"].samples == 1.0  # the decoy's pod is not counted


def test_values_cannot_inject_promql(production: Scenario) -> None:
    hostile = 'kn118"} or vector(42) or up{x="'
    policy = make_policy(
        [
            {"name": "oom", "metric": "oom-kills", "max": 0},
            *custom('sum(kube_pod_created{namespace="{{ namespace }}"})'),
        ],
        metrics={"requests": "knative-opencensus"},
    )
    with production.source() as source:
        evidence = source.collect(
            policy, make_request(policy, hostile, 'x"} or vector(7) #', 'y\\"} or vector(9)')
        )
    for key in (REQUESTS, "oom", "custom"):
        measurement = evidence.canary[key]
        assert measurement.status is EvidenceStatus.NO_DATA, measurement  # the literal names match nothing
    assert evidence.stable[REQUESTS].status is EvidenceStatus.NO_DATA
