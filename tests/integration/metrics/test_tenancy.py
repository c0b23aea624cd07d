"""One tenant's PromQL and series against a real Prometheus: custom queries read only their own
namespace (canary.metrics.tenancy), and a grouped query Prometheus refuses because of one rollout's
series holds that rollout only (canary.metrics.split)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.prometheus import PrometheusServer

from canary.evidence import REQUESTS, ErrorClass, EvidenceRequest, EvidenceStatus
from canary.metrics import PrometheusConfig, PrometheusEvidenceSource
from canary.metrics.tenancy import Tenancy
from canary.policy import PromotionPolicy

END = int(time.time() // 15 * 15) - 60  # backfilled blocks end before Prometheus' head begins
AT = datetime.fromtimestamp(END + 0.5, UTC)
WINDOW = 300
MOMENTS = range(END - 600, END + 1, 15)


def _policy(namespace: str, name: str, checks: list[dict[str, Any]], requests: str) -> PromotionPolicy:
    return PromotionPolicy.model_validate(
        {
            "apiVersion": "kserve-canary.dev/v1alpha1",
            "kind": "PromotionPolicy",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "target": {"inferenceService": name},
                "interval": "30s",
                "metrics": {"requests": requests},
                "checks": checks,
            },
        }
    )


def _request(policy: PromotionPolicy, canary: str) -> EvidenceRequest:
    return EvidenceRequest(
        namespace=policy.metadata.namespace,
        inference_service=policy.spec.target.inference_service,
        canary_revision=canary,
        stable_revision=None,
        window_start=AT - timedelta(seconds=WINDOW),
        at=AT,
        checks=tuple(policy.spec.checks),
        compare_with_stable=False,
    )


def _counter(metric: str, labels: str, per_step: int) -> list[str]:
    return [f"{metric}{{{labels}}} {per_step * index} {moment}" for index, moment in enumerate(MOMENTS)]


# -- custom PromQL reads its own namespace only ------------------------------------------------------


def _tenants() -> str:
    lines = ["# TYPE kube_secret_info gauge"]
    for namespace, secret in (("team-a", "a-db"), ("team-b", "stripe-live"), ("team-b", "stripe-test")):
        lines += [f'kube_secret_info{{namespace="{namespace}",secret="{secret}"}} 1 {m}' for m in MOMENTS]
    lines.append("# TYPE revision_request_count counter")
    for namespace, per_step in (("team-a", 10), ("team-b", 1000)):
        labels = f'namespace_name="{namespace}",revision_name="{namespace}-predictor-00002",response_code_class="2xx"'
        lines += _counter("revision_request_count", labels, per_step)
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def tenants() -> Iterator[PrometheusServer]:
    with PrometheusServer(backfill=_tenants()) as server:
        yield server


def test_team_as_custom_check_sees_only_team_as_series(tenants: PrometheusServer) -> None:
    """Today's main reads every namespace: count(kube_secret_info) was 3, and team B's counter was
    summed into team A's check."""
    checks = [
        {"name": "secrets", "promql": "count(kube_secret_info)", "max": 100},
        {"name": "served", "promql": "sum(revision_request_count)", "max": 1e9},
    ]
    policy = _policy("team-a", "fraud", checks, "knative-opencensus")
    with PrometheusEvidenceSource(PrometheusConfig(url=tenants.url), scrape_interval=15) as source:
        evidence = source.collect(policy, _request(policy, "fraud-predictor-00002"))
    secrets, served = evidence.canary["secrets"], evidence.canary["served"]
    assert (secrets.status, secrets.value) == (EvidenceStatus.OK, 1.0)  # team A's one secret
    assert 'kube_secret_info{namespace="team-a"}' in secrets.query
    # OpenCensus names the namespace namespace_name (the metric profile), so that is the label scoped.
    assert served.status is EvidenceStatus.OK
    assert served.value == 10 * (len(MOMENTS) - 1)
    assert 'namespace_name="team-a"' in served.query


def test_a_query_naming_another_namespace_is_refused_and_never_asked(tenants: PrometheusServer) -> None:
    """Today's main answered 2: team B's Stripe secrets, in team A's explain and notifications."""
    checks = [
        {
            "name": "peek",
            "promql": 'count(kube_secret_info{namespace="team-b", secret=~"stripe.*"})',
            "max": 5,
        }
    ]
    policy = _policy("team-a", "fraud", checks, "knative-opencensus")
    with PrometheusEvidenceSource(PrometheusConfig(url=tenants.url), scrape_interval=15) as source:
        evidence = source.collect(policy, _request(policy, "fraud-predictor-00002"))
        peek = evidence.canary["peek"]
        explained = evidence.canary_queries
    assert peek.status is EvidenceStatus.ERROR and peek.error_class is ErrorClass.BAD_QUERY
    assert peek.value is None
    assert 'namespace="team-b" names another namespace' in peek.detail
    assert "--custom-promql-allow-metric team-a=kube_secret_info" in peek.detail  # the fix
    assert "peek" not in explained  # explain shows no query that was not asked


def test_the_operators_allowlist_admits_a_named_cluster_wide_series(tenants: PrometheusServer) -> None:
    checks = [{"name": "secrets", "promql": "count(kube_secret_info)", "max": 100}]
    policy = _policy("team-a", "fraud", checks, "knative-opencensus")
    tenancy = Tenancy(allow={"team-a": ("kube_secret_*",)})
    config = PrometheusConfig(url=tenants.url)
    with PrometheusEvidenceSource(config, scrape_interval=15, tenancy=tenancy) as source:
        evidence = source.collect(policy, _request(policy, "fraud-predictor-00002"))
    assert evidence.canary["secrets"].value == 3.0


# -- a refused grouped query holds only the rollout whose series it refused ------------------------

# Knative >= 1.19: the queue-proxy's otelhttp server histogram (canary.metrics.catalog, outer).
OTEL_COUNT = "http_server_request_duration_seconds_count"
SCOPE = 'otel_scope_name="go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"'
# (namespace, InferenceService): team-a's "greedy" exports a counter per request path, far more
# series than Prometheus' --query.max-samples lets one query load; the others export one each.
ROLLOUTS = (("team-a", "fraud"), ("team-a", "greedy"), ("team-b", "search"))
GREEDY_SERIES = 400
MAX_SAMPLES = 300


def _fleet(rollouts: tuple[tuple[str, str], ...] = ROLLOUTS) -> str:
    lines = [f"# TYPE {OTEL_COUNT} counter"]
    for namespace, name in rollouts:
        pod = revision_pod_name(f"{name}-predictor-00002")
        paths = GREEDY_SERIES if name == "greedy" else 1
        for path in range(paths):
            labels = (
                f'{SCOPE},namespace="{namespace}",pod="{pod}",http_response_status_code="200",path="/{path}"'
            )
            lines += _counter(OTEL_COUNT, labels, 5)
        if name == "search":
            # The same counter exported a second time with a `revision` label of its own: the grouped
            # query once wrote `revision` over it and Prometheus refused the whole query (HTTP 422,
            # "vector cannot contain metrics with the same labelset").
            labels = f'{SCOPE},namespace="{namespace}",pod="{pod}",http_response_status_code="200",path="/0",revision="v2"'
            lines += _counter(OTEL_COUNT, labels, 5)
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def fleet() -> Iterator[PrometheusServer]:
    with PrometheusServer(backfill=_fleet(), extra_args=(f"--query.max-samples={MAX_SAMPLES}",)) as server:
        yield server


@pytest.fixture(scope="module")
def collision() -> Iterator[PrometheusServer]:
    with PrometheusServer(backfill=_fleet(ROLLOUTS[::2])) as server:  # fraud and search, no limit
        yield server


def _collect_fleet(fleet: PrometheusServer, names: tuple[tuple[str, str], ...] = ROLLOUTS) -> dict[str, Any]:
    rollouts = []
    for namespace, name in names:
        policy = _policy(
            namespace,
            name,
            [{"name": "errors", "metric": "error-rate", "max": "5%"}],
            "knative-otel-invocation",
        )
        rollouts.append((policy, _request(policy, f"{name}-predictor-00002")))
    config = PrometheusConfig(url=fleet.url)
    with PrometheusEvidenceSource(config, scrape_interval=15, min_window=WINDOW) as source:
        first = source.collect_many(rollouts)
        # The next tick: the greedy rollout is asked apart at once (no failed grouped query first).
        later = [(policy, _request(policy, request.canary_revision)) for policy, request in rollouts]
        later = [(policy, _shifted(request, 15)) for policy, request in later]
        second = source.collect_many(later)
    return {name: (one, two) for (_, name), one, two in zip(names, first, second, strict=True)}


def _shifted(request: EvidenceRequest, seconds: float) -> EvidenceRequest:
    moved = timedelta(seconds=seconds)
    return EvidenceRequest(
        namespace=request.namespace,
        inference_service=request.inference_service,
        canary_revision=request.canary_revision,
        stable_revision=None,
        window_start=request.window_start + moved,
        at=request.at + moved,
        checks=request.checks,
        compare_with_stable=False,
    )


def test_a_grouped_query_refused_for_one_rollouts_series_holds_only_that_rollout(
    fleet: PrometheusServer,
) -> None:
    """Today's main asks one counter sample for all three rollouts; Prometheus refuses it (too many
    samples, and the duplicated counter) and every rollout is held."""
    evidence = _collect_fleet(fleet)
    for tick in (0, 1):
        for healthy in ("fraud", "search"):
            requests = evidence[healthy][tick].canary[REQUESTS]
            assert requests.status is EvidenceStatus.OK, (healthy, tick, requests.detail)
            assert evidence[healthy][tick].canary["errors"].status is EvidenceStatus.OK
        held = evidence["greedy"][tick].canary[REQUESTS]
        assert held.status is EvidenceStatus.ERROR and held.error_class is ErrorClass.EXECUTION
        assert "too many samples" in held.detail
        assert "only this rollout is held" in held.detail  # said in its status and explain
    # A workload's own `revision` label is neither overwritten nor refused: both series are counted.
    assert evidence["search"][0].canary[REQUESTS].value == 2 * 5 * (WINDOW // 15)


def test_a_workload_exporting_a_revision_label_of_its_own_blinds_nobody(collision: PrometheusServer) -> None:
    """Today's main relabels into `revision`: search's second counter, which carries its own
    `revision` label, then has the labelset of its first, Prometheus refuses the grouped sample
    (HTTP 422, "vector cannot contain metrics with the same labelset") and fraud is held too."""
    evidence = _collect_fleet(collision, ROLLOUTS[::2])
    for name in ("fraud", "search"):
        requests = evidence[name][0].canary[REQUESTS]
        assert requests.status is EvidenceStatus.OK, (name, requests.detail)
    assert evidence["fraud"][0].canary[REQUESTS].value == 5 * (WINDOW // 15)
    # Both of search's series are its own: counted, neither misattributed nor refused.
    assert evidence["search"][0].canary[REQUESTS].value == 2 * 5 * (WINDOW // 15)
