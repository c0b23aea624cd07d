"""An overloaded canary that sheds load at the queue-proxy's breaker, on a real Prometheus (issue #33, 4).

With ``containerConcurrency`` set, a canary that cannot keep up gets requests queued in its
queue-proxy's breaker, and once the queue is full the breaker answers 503 without calling the model.
On Knative >= 1.19 the queue-proxy's own histogram (``kn_queueproxy_app_duration_seconds``,
``kn_serving_invocation_duration_seconds``) is recorded inside the breaker: those 503s and the time
queued reach only otelhttp's ``http_server_request_duration_seconds`` around it (the emulator's
expectations, with the upstream lines: tests/sandbox/test_queue_proxy_histograms.py). Read from the
inner histogram, this canary served 0 % errors at its model's speed, and was promoted.

The model server in the same pods exports its own ``http_server_request_duration_seconds`` (another
instrumentation scope): it must not be read — it sees only what the breaker admitted.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.kserve_metrics import OTEL_BUCKETS, Pod, RequestRecord, Revision, Simulation
from canary_sandbox.prometheus import PrometheusServer

from canary.evidence import CountSeries, Evidence
from canary.metrics import PrometheusConfig, PrometheusEvidenceSource
from canary.rollout.judge import CountContext, Evaluation, judge_evidence
from canary.rollout.sampled import ErrorBudget
from canary.rollout.vocabulary import CheckVerdict
from tests.integration.metrics.support import (
    AT,
    AT_SECONDS,
    END,
    STEP,
    WINDOW_START,
    counted_requests,
    make_policy,
    make_request,
    quantile_band,
)

CHECKS: list[dict[str, Any]] = [
    {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"},
    {"name": "p95", "metric": "latency", "quantile": 0.95, "max": "1s", "maxIncrease": "50%"},
]
PROFILES = {"kn119": "knative-otel-queueproxy", "kn121": "knative-otel-invocation"}
# Knative <= 1.18 records revision_request_* around the breaker already: the control.
CONTROL = {"kn118": "knative-opencensus"}
STABLE, CANARY = "llama-predictor-00001", "llama-predictor-00002"


def _revision(namespace: str, name: str, profile: str, **overload: float) -> Revision:
    created = END - 7200.0
    pods = tuple(Pod(revision_pod_name(name, index), created, created + 60.0) for index in range(2))
    return Revision(
        namespace, "llama", name, pods, requests_per_second=3.0, error_ratio=0.0, latency_median=0.12,
        latency_sigma=0.4, requests_profile=profile, model_server_otel=True, **overload,
    )  # fmt: skip


@pytest.fixture(scope="module")
def overloaded() -> Iterator[tuple[Simulation, str]]:
    revisions = []
    for namespace, profile in {**PROFILES, **CONTROL}.items():
        revisions.append(_revision(namespace, STABLE, profile))
        # 8 % answered 503 by the breaker (queue full), the rest waiting 1.5 s on average for a slot
        revisions.append(_revision(namespace, CANARY, profile, shed_ratio=0.08, queue_seconds=1.5))
    simulation = Simulation(revisions, start=END - 1200.0, end=END, step=STEP, seed=3304)
    with PrometheusServer(backfill=simulation.openmetrics()) as prometheus:
        yield simulation, prometheus.url


def _collect(url: str, namespace: str, profile: str) -> tuple[Evidence, Any]:
    policy = make_policy(CHECKS, namespace=namespace, name="llama", metrics={"requests": profile})
    request = make_request(policy, namespace, CANARY, STABLE, inference_service="llama")
    with PrometheusEvidenceSource(PrometheusConfig(url=url), scrape_interval=STEP) as source:
        return source.collect(policy, request), policy


def _judged(evidence: Evidence, policy: Any) -> Evaluation:
    """As the controller judges a step: the counted checks on the counts since the step began."""
    context = CountContext(
        step_start=WINDOW_START, budget=ErrorBudget.of(policy), confidence=policy.spec.confidence
    )
    return judge_evidence(
        policy.spec.checks, evidence.canary, evidence.stable, compare_with_stable=True,
        counts=evidence.counts, context=context,
    )  # fmt: skip


def _raw(simulation: Simulation, namespace: str) -> list[RequestRecord]:
    """The canary's requests the window counts (the truth: no PromQL)."""
    counted = counted_requests(simulation, CANARY, WINDOW_START.timestamp(), AT_SECONDS)
    return [record for record in counted if record.namespace == namespace]


@pytest.mark.parametrize(("namespace", "profile"), sorted({**PROFILES, **CONTROL}.items()))
def test_a_canary_shedding_503s_at_the_breaker_fails_the_error_rate_check(
    overloaded: tuple[Simulation, str], namespace: str, profile: str
) -> None:
    simulation, url = overloaded
    evidence, policy = _collect(url, namespace, profile)
    raw = _raw(simulation, namespace)
    shed = sum(1 for record in raw if record.shed)
    assert shed > 100 and all(record.status == "503" for record in raw if record.shed)
    assert not any(record.status == "503" for record in raw if not record.shed)  # the model is fine

    errors = evidence.canary["errors"]
    assert (errors.value, errors.samples) == (shed / len(raw), len(raw))
    assert evidence.stable["errors"].value == 0.0
    evaluation = _judged(evidence, policy)
    verdicts = {judgement.name: judgement.verdict for judgement in evaluation.judgements}
    assert verdicts["errors"] is CheckVerdict.FAIL, evaluation


@pytest.mark.parametrize(("namespace", "profile"), sorted(PROFILES.items()))
def test_the_canarys_latency_includes_the_time_queued_at_the_breaker(
    overloaded: tuple[Simulation, str], namespace: str, profile: str
) -> None:
    simulation, url = overloaded
    evidence, policy = _collect(url, namespace, profile)
    raw = _raw(simulation, namespace)
    p95 = evidence.canary["p95"].value
    assert p95 is not None
    low, high = quantile_band([record.latency for record in raw], 0.95, OTEL_BUCKETS)
    assert low <= p95 <= high
    # What the model alone took (the queue-proxy's own histogram) is far below: not what was read.
    _, app_high = quantile_band([r.app_latency for r in raw if not r.shed], 0.95, OTEL_BUCKETS)
    assert app_high < low
    evaluation = _judged(evidence, policy)
    verdicts = {judgement.name: judgement.verdict for judgement in evaluation.judgements}
    assert verdicts["p95"] is CheckVerdict.FAIL, evaluation


def test_the_explained_query_reads_the_queue_proxys_outer_histogram_only(
    overloaded: tuple[Simulation, str],
) -> None:
    _, url = overloaded
    evidence, _ = _collect(url, "kn121", "knative-otel-invocation")
    for measurement in (evidence.canary["errors"], evidence.canary["p95"]):
        assert "http_server_request_duration_seconds" in measurement.query
        assert 'otel_scope_name="go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"' in (
            measurement.query
        )
    # The counts reach as far as the newest sample Prometheus holds (within a scrape of the tick).
    end = evidence.counts["canary"].tallies[-1].end
    assert AT - timedelta(seconds=STEP) <= end <= AT, end


@pytest.mark.parametrize(("namespace", "profile"), sorted(PROFILES.items()))
def test_the_model_servers_own_histogram_in_the_same_pod_is_not_read(
    overloaded: tuple[Simulation, str], namespace: str, profile: str
) -> None:
    """Same name, same pods: only the queue-proxy's scope is counted (every request the clients sent,
    the breaker's 503s included), never the model server's (what the breaker let through)."""
    simulation, url = overloaded
    evidence, _ = _collect(url, namespace, profile)
    raw = _raw(simulation, namespace)
    assert evidence.canary["request-count"].value == len(raw)
    total = CountSeries.total(evidence.counts["canary"].tallies)
    assert total is not None
    assert (total.requests, total.errors) == (len(raw), sum(1 for record in raw if record.shed))
