"""explain's canary-only PromQL (canary.metrics.explain_queries) on a real Prometheus: each query the
evidence source hands to explain parses, answers one series, and that series is the canary's value
as the raw simulated events give it — exactly where nothing is extrapolated, within the documented
tolerance where ``increase()`` extrapolates; hostile names cannot leave their selectors."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import requests
from canary_sandbox.kserve_metrics import E2E_BUCKETS, TTFT_BUCKETS

from canary.evidence import CanaryQuery, Evidence, EvidenceStatus
from canary.metrics.explain_queries import EXTRAPOLATED_NOTE, QUANTILE_NOTE, canary_queries
from tests.integration.metrics.support import (
    AT,
    AT_SECONDS,
    ODD_DECOY,
    ODD_NAMESPACE,
    ODD_REVISION,
    WINDOW,
    Scenario,
    counted_requests,
    latency_bounds_seconds,
    make_policy,
    make_request,
    quantile_band,
    revision_of,
)

MIB = 1048576
# increase() extrapolates each series to the window's edges (by up to half a scrape interval on each
# side, 5 s of 600 s here), numerator and denominator alike: a ratio moves by a small fraction of itself.
ERROR_RATE_TOLERANCE = 0.05  # relative


def instant(scenario: Scenario, promql: str) -> list[dict[str, Any]]:
    """Prometheus' answer to ``promql`` at the evaluation time: the series (it must parse)."""
    answer = requests.get(
        f"{scenario.url}/api/v1/query", params={"query": promql, "time": str(AT_SECONDS)}, timeout=10
    )
    assert answer.status_code == 200, (answer.status_code, answer.text, promql)
    body = answer.json()
    assert body["status"] == "success" and body["data"]["resultType"] == "vector", body
    series: list[dict[str, Any]] = body["data"]["result"]
    return series


def value_of(scenario: Scenario, query: CanaryQuery) -> float:
    series = instant(scenario, query.promql)
    assert len(series) == 1, (query.promql, series)  # one series: the canary's, nothing else
    return float(series[0]["value"][1])


def collect(scenario: Scenario, checks: list[dict[str, Any]], namespace: str, name: str, canary: str,
            stable: str | None, **policy: Any) -> Evidence:  # fmt: skip
    built = make_policy(checks, namespace=namespace, name=name, **policy)
    with scenario.source() as source:
        return source.collect(built, make_request(built, namespace, canary, stable, inference_service=name))


PROFILES = [
    ("kn118", "llama", "llama-predictor-00002", "llama-predictor-00001", "knative-opencensus"),
    ("kn119", "bert", "bert-predictor-00005", "bert-predictor-00004", "knative-otel-queueproxy"),
    ("kn121", "resnet", "resnet-predictor-00008", "resnet-predictor-00007", "knative-otel-invocation"),
]


@pytest.mark.parametrize(("namespace", "name", "canary", "stable", "profile"), PROFILES)
def test_request_queries_answer_the_canarys_error_rate_and_latency(
    production: Scenario, namespace: str, name: str, canary: str, stable: str, profile: str
) -> None:
    checks: list[dict[str, Any]] = [
        {"name": "p50", "metric": "latency", "quantile": 0.5, "maxIncrease": "20%"},
        {"name": "p99", "metric": "latency", "max": "2s"},
        {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"},
    ]
    evidence = collect(production, checks, namespace, name, canary, stable, metrics={"requests": profile})
    queries = evidence.canary_queries
    assert set(queries) == {"p50", "p99", "errors"}
    raw = counted_requests(production.simulation, canary, AT_SECONDS - WINDOW, AT_SECONDS)
    assert len(raw) > 500
    for query in queries.values():
        assert "[10m]" in query.promql, query.promql  # the evaluated window, as a range
        assert stable not in query.promql
        # short enough to read and paste (on >= 1.19 each selector carries the queue-proxy's scope)
        assert len(query.promql) < 560, query.promql

    truth = sum(1 for record in raw if record.status.startswith("5")) / len(raw)
    shown = value_of(production, queries["errors"])
    assert shown == pytest.approx(truth, rel=ERROR_RATE_TOLERANCE, abs=1e-12), (truth, shown)
    assert queries["errors"].note == EXTRAPOLATED_NOTE
    if canary == "llama-predictor-00002":
        assert shown == 0.0  # no 5xx series at all: 0 %, not "no answer"

    bounds = latency_bounds_seconds(profile)
    latencies = [record.latency for record in raw]
    for check, quantile in (("p50", 0.5), ("p99", 0.99)):
        low, high = quantile_band(latencies, quantile, bounds)
        shown = value_of(production, queries[check])
        assert low <= shown <= high, (check, shown, (low, high))  # seconds, whatever the exporter's unit
        assert queries[check].note == QUANTILE_NOTE
        judged = evidence.canary[check].value
        assert judged is not None and low <= judged <= high


def test_kube_state_gpu_and_vllm_queries_answer_the_judged_values(production: Scenario) -> None:
    checks: list[dict[str, Any]] = [
        {"name": "oom", "metric": "oom-kills", "max": 0, "critical": True},
        {"name": "restarts", "metric": "restarts", "max": 0},
        {"name": "warmup", "metric": "warmup-time", "max": "3m"},
        {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9},
        {"name": "kv", "metric": "kv-cache-usage", "max": "95%"},
        {"name": "ttft-p95", "metric": "ttft", "quantile": 0.95, "max": "2s"},
        {"name": "e2e-p99", "metric": "e2e-latency", "max": "60s"},
    ]
    canary = "llama-predictor-00002"
    evidence = collect(production, checks, "kn118", "llama", canary, "llama-predictor-00001",
                       metrics={"gpuLabels": "pod"})  # fmt: skip
    queries = evidence.canary_queries
    assert set(queries) == {check["name"] for check in checks}
    shown = {name: value_of(production, query) for name, query in queries.items()}

    revision = revision_of(production.simulation, canary)
    restarts = [r for pod in revision.pods for r in pod.restarts if AT_SECONDS - WINDOW < r.at <= AT_SECONDS]
    assert shown["restarts"] == len(restarts) == 2
    assert shown["oom"] == sum(1 for r in restarts if r.reason == "OOMKilled") == 1
    assert shown["warmup"] == max(pod.ready - pod.created for pod in revision.pods if pod.ready)
    gpu_mib = [
        used
        for (owner, _pod, _gpu), samples in production.simulation.gpu_samples.items()
        if owner == canary
        for moment, used, _free, _reserved in samples
        if AT_SECONDS - WINDOW <= moment <= AT_SECONDS
    ]
    assert shown["gpu"] == max(gpu_mib) * MIB  # bytes, the spike included
    kv = [
        level
        for (owner, _pod), samples in production.simulation.kv_samples.items()
        if owner == canary
        for moment, level in samples
        if AT_SECONDS - WINDOW <= moment <= AT_SECONDS
    ]
    assert shown["kv"] == pytest.approx(max(kv), rel=1e-12)
    # Nothing extrapolated: the judged value itself.
    for name in ("oom", "restarts", "warmup", "gpu", "kv"):
        assert shown[name] == pytest.approx(evidence.canary[name].value, rel=1e-12), name
        assert "[10m]" in queries[name].promql

    first = production.simulation.first_tick_at_or_after(AT_SECONDS - WINDOW)
    firsts: dict[str, float] = {}
    for record in production.simulation.requests:
        if record.revision == canary:
            firsts[record.pod] = min(firsts.get(record.pod, math.inf), record.tick)
    raw = [r for r in production.simulation.requests
           if r.revision == canary and max(first, firsts[r.pod]) < r.tick <= AT_SECONDS]  # fmt: skip
    low, high = quantile_band([r.ttft for r in raw], 0.95, TTFT_BUCKETS)
    assert low <= shown["ttft-p95"] <= high
    low, high = quantile_band([r.e2e for r in raw], 0.99, E2E_BUCKETS)
    assert low <= shown["e2e-p99"] <= high


def test_a_storage_initializer_oom_and_pods_born_in_the_window(production: Scenario) -> None:
    checks: list[dict[str, Any]] = [
        {"name": "oom", "metric": "oom-kills", "max": 0},
        {"name": "restarts", "metric": "restarts", "max": 0},
        {"name": "warmup", "metric": "warmup-time", "max": "3m"},
    ]
    canary = "resnet-predictor-00008"
    evidence = collect(production, checks, "kn121", "resnet", canary, "resnet-predictor-00007")
    shown = {name: value_of(production, query) for name, query in evidence.canary_queries.items()}
    revision = revision_of(production.simulation, canary)
    assert shown == {
        "oom": 1.0,  # the storage-initializer, counted from zero: the pod was born in the window
        "restarts": 1.0,
        "warmup": max(pod.ready - pod.created for pod in revision.pods if pod.ready),
    }
    assert all(evidence.canary[name].value == value for name, value in shown.items())


def test_a_warm_up_oom_counted_in_the_first_step_is_what_its_query_shows(production: Scenario) -> None:
    """The first step began after resnet's canary was OOM-killed while loading (AT-380): the judged
    count and the query explain shows both cover the canary's life from the rollout's start, and
    both leave the kill out of a later step's window."""
    checks: list[dict[str, Any]] = [
        {"name": "oom", "metric": "oom-kills", "max": 0},
        {"name": "restarts", "metric": "restarts", "max": 0},
    ]
    built = make_policy(checks, namespace="kn121", name="resnet")
    plain = make_request(built, "kn121", "resnet-predictor-00008", "resnet-predictor-00007", window=300.0,
                         inference_service="resnet")  # fmt: skip
    for born, expected in ((AT - timedelta(seconds=390), 1.0), (None, 0.0)):
        with production.source() as source:
            evidence = source.collect(built, replace(plain, canary_born=born))
        shown = {name: value_of(production, query) for name, query in evidence.canary_queries.items()}
        assert shown == {"oom": expected, "restarts": expected}, born
        assert all(evidence.canary[name].value == value for name, value in shown.items())


def test_custom_promql_and_overrides_are_the_controllers_canary_query(production: Scenario) -> None:
    checks: list[dict[str, Any]] = [
        {
            "name": "served",
            "promql": 'sum(increase(kn_serving_invocation_duration_seconds_count{namespace="{{ namespace }}",'
            ' pod=~"{{ revision }}-deployment-.*"}[{{ window }}]))',
            "max": 1e9,
        },
        {"name": "p90", "metric": "latency", "quantile": 0.9, "max": "5s"},
    ]
    override = (
        "histogram_quantile(0.9, sum by (le) (rate(kn_serving_invocation_duration_seconds_bucket"
        '{namespace="{{ namespace }}", pod=~"{{ revision }}-deployment-.*"}[{{ window }}])))'
    )
    canary = "resnet-predictor-00008"
    evidence = collect(production, checks, "kn121", "resnet", canary, "resnet-predictor-00007",
                       metrics={"queries": {"latency": override}})  # fmt: skip
    for name in ("served", "p90"):
        query = evidence.canary_queries[name]
        measured = evidence.canary[name]
        assert measured.status is EvidenceStatus.OK
        # The very text the controller asked Prometheus for the canary, and so its very answer.
        assert query.promql == measured.query
        assert f'pod=~"{canary}-deployment-.*"' in query.promql
        assert value_of(production, query) == measured.value
        assert query.note == ""


def test_regex_metacharacters_in_a_name_match_only_that_name(production: Scenario) -> None:
    """``odd"rev.x+(y)`` used as a regex would also match the decoy ``odd"revZxxxy`` (3x the traffic)."""
    checks = [{"name": "errors", "metric": "error-rate", "max": "1%"}]
    evidence = collect(production, checks, ODD_NAMESPACE, "odd", ODD_REVISION, None,
                       metrics={"requests": "knative-otel-invocation"})  # fmt: skip
    query = evidence.canary_queries["errors"]
    denominator = query.promql.rsplit(" / ", 1)[1]  # the canary's requests in the window
    requests_seen = value_of(production, CanaryQuery(denominator))
    own = len(counted_requests(production.simulation, ODD_REVISION, AT_SECONDS - WINDOW, AT_SECONDS))
    decoy = len(counted_requests(production.simulation, ODD_DECOY, AT_SECONDS - WINDOW, AT_SECONDS))
    assert decoy > 2 * own
    assert requests_seen == pytest.approx(own, rel=ERROR_RATE_TOLERANCE)


HOSTILE = [
    'x"} or vector(42) or up{job="',  # leaves a double-quoted string if not escaped
    'x\\"} or vector(42) #',  # a backslash before the quote
    "x\n} or vector(42)",  # a newline
    ".*",  # a regex matching every pod
    "x'`$1\\d",
    "x\\",  # a trailing backslash would escape the closing quote
]


@pytest.mark.parametrize("namespace", ["kn118", None])
@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_names_cannot_leave_their_selectors(
    production: Scenario, hostile: str, namespace: str | None
) -> None:
    """Every kind of query, for a revision with such a name (in a namespace full of series, and in a
    namespace with a hostile name too): each parses and answers nothing (no such series), where a
    name that broke out would answer 42 or select the namespace's other pods."""
    checks: list[dict[str, Any]] = [
        {"name": "p99", "metric": "latency", "max": "2s"},
        {"name": "errors", "metric": "error-rate", "max": "1%"},
        {"name": "oom", "metric": "oom-kills", "max": 0},
        {"name": "restarts", "metric": "restarts", "max": 0},
        {"name": "warmup", "metric": "warmup-time", "max": "3m"},
        {"name": "gpu", "metric": "gpu-memory-peak", "max": "80Gi"},
        {"name": "kv", "metric": "kv-cache-usage", "max": "95%"},
        {"name": "ttft", "metric": "ttft", "max": "2s"},
        {"name": "e2e", "metric": "e2e-latency", "max": "60s"},
        {"name": "custom", "promql": 'sum(up{namespace="{{ namespace }}", pod="{{ revision }}"})', "max": 1},
    ]
    for profile in ("knative-opencensus", "knative-otel-invocation"):
        policy = make_policy(checks, metrics={"requests": profile, "gpuLabels": "exported_pod"})
        request = make_request(policy, namespace or hostile, hostile, None)
        queries = canary_queries(
            policy, request, {"requests": profile, "gpuLabels": "exported_pod"}, min_window=10.0
        )
        assert set(queries) == {check["name"] for check in checks}
        for name, query in queries.items():
            assert instant(production, query.promql) == [], (name, query.promql)
