"""NaN, +Inf and -Inf stored in a real Prometheus: collected as "invalid value" evidence (no crash,
no ok, no no-data), judged as an error for that check, and the reason names the check and the value."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.prometheus import PrometheusServer

from canary.evidence import REQUESTS, EvidenceStatus
from canary.metrics import PrometheusConfig, PrometheusEvidenceSource
from canary.rollout.judge import CheckVerdict, judge_evidence
from tests.integration.metrics.support import make_policy, make_request

END = int(time.time() // 15 * 15) - 60  # backfilled blocks end before Prometheus' head begins
AT = datetime.fromtimestamp(END + 0.5, UTC)
CANARY = "llama-predictor-00002"
VALUES = {"inf": "+Inf", "nan": "NaN", "neginf": "-Inf", "fine": "0.5"}


def _openmetrics() -> str:
    lines = ["# TYPE vllm:kv_cache_usage_perc gauge"]
    for namespace, value in VALUES.items():
        for moment in range(END - 300, END + 1, 15):
            pod = revision_pod_name(CANARY)
            lines.append(f'vllm:kv_cache_usage_perc{{namespace="{namespace}",pod="{pod}"}} {value} {moment}')
    lines.append("# TYPE odd_gauge gauge")
    for kind, value in VALUES.items():
        for moment in range(END - 300, END + 1, 15):
            lines.append(f'odd_gauge{{namespace="ml",kind="{kind}"}} {value} {moment}')
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    with PrometheusServer(backfill=_openmetrics()) as server:
        yield server


def _source(prometheus: PrometheusServer) -> PrometheusEvidenceSource:
    return PrometheusEvidenceSource(PrometheusConfig(url=prometheus.url), scrape_interval=15)


@pytest.mark.parametrize(("namespace", "shown"), [("inf", "+Inf"), ("nan", "NaN"), ("neginf", "-Inf")])
def test_a_builtin_check_on_a_non_finite_series_is_an_invalid_value(
    prometheus: PrometheusServer, namespace: str, shown: str
) -> None:
    policy = make_policy(
        [{"name": "kv", "metric": "kv-cache-usage", "max": "95%"}],
        namespace=namespace,
        metrics={"requests": "knative-opencensus"},
    )
    request = make_request(policy, namespace, CANARY, None, at=AT, window=300, compare_with_stable=False)
    with _source(prometheus) as source:
        evidence = source.collect(policy, request)
    kv = evidence.canary["kv"]
    assert kv.status is EvidenceStatus.INVALID_VALUE
    assert shown in kv.detail
    assert "vllm:kv_cache_usage_perc" in kv.query
    evaluation = judge_evidence(policy.spec.checks, evidence.canary, {}, compare_with_stable=False)
    (judgement,) = evaluation.judgements
    assert judgement.verdict is CheckVerdict.ERROR  # never a pass, never a fail, never no-data
    assert evaluation.has_error  # the core holds as on a query problem
    assert judgement.describe().startswith("kv: ")
    assert shown in judgement.describe()


def test_custom_checks_on_non_finite_series_are_invalid_values_and_a_finite_one_is_ok(
    prometheus: PrometheusServer,
) -> None:
    checks = [
        {"name": f"odd-{kind}", "promql": f'max(odd_gauge{{namespace="ml", kind="{kind}"}})', "max": 1}
        for kind in VALUES
    ]
    policy = make_policy(checks, namespace="ml", metrics={"requests": "knative-opencensus"})
    request = make_request(policy, "ml", CANARY, None, at=AT, window=300, compare_with_stable=False)
    with _source(prometheus) as source:
        evidence = source.collect(policy, request)
    for kind, shown in VALUES.items():
        measurement = evidence.canary[f"odd-{kind}"]
        if kind == "fine":
            assert (measurement.status, measurement.value) == (EvidenceStatus.OK, 0.5)
        else:
            assert measurement.status is EvidenceStatus.INVALID_VALUE
            assert f"Prometheus answered {shown}" in measurement.detail
    assert evidence.canary[REQUESTS].status is EvidenceStatus.NO_DATA  # no request series: no data
    evaluation = judge_evidence(policy.spec.checks, evidence.canary, {}, compare_with_stable=False)
    verdicts = {judgement.name: judgement.verdict for judgement in evaluation.judgements}
    assert verdicts == {
        "odd-inf": CheckVerdict.ERROR,
        "odd-nan": CheckVerdict.ERROR,
        "odd-neginf": CheckVerdict.ERROR,
        "odd-fine": CheckVerdict.PASS,
    }
    assert evaluation.failures == ()
