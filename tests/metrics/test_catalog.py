"""The catalog's PromQL: every measure on every profile, selecting exactly the revisions asked for."""

from __future__ import annotations

import itertools
import re

import pytest

from canary.evidence import REQUESTS
from canary.metrics.catalog import (
    KIND_FAMILY,
    REQUESTS_PROFILES,
    BuiltinQuery,
    Family,
    RevisionKey,
    render_builtin,
)
from canary.metrics.tick_queries import CounterQuery, render_counters
from canary.policy.model import GpuLabelStyle, MetricKind, RequestsProfile

MEASURES = [REQUESTS, *(kind.value for kind in MetricKind)]
PROFILES = [profile for profile in RequestsProfile if profile is not RequestsProfile.AUTO]
STYLES = [style for style in GpuLabelStyle if style is not GpuLabelStyle.AUTO]
ROLLOUT = [RevisionKey("ml", "llama-chat-predictor-00012"), RevisionKey("ml", "llama-chat-predictor-00011")]


def _query(
    measure: str, profile: RequestsProfile, style: GpuLabelStyle, label: str | None = None
) -> BuiltinQuery:
    family = KIND_FAMILY[measure]
    return BuiltinQuery(
        measure=measure,
        window="600s",
        quantile=0.95 if measure in {"latency", "ttft", "e2e-latency"} else None,
        requests_profile=profile if family is Family.REQUESTS else None,
        revision_label=label if family is Family.REQUESTS else None,
        gpu_labels=style if family is Family.DCGM else None,
    )


@pytest.mark.parametrize(("measure", "profile", "style"), list(itertools.product(MEASURES, PROFILES, STYLES)))
def test_every_measure_renders_short_and_grouped_by_namespace_and_revision(
    measure: str, profile: RequestsProfile, style: GpuLabelStyle
) -> None:
    promql = render_builtin(_query(measure, profile, style), ROLLOUT)
    # Short enough for a GET behind a proxy for one rollout's canary and stable revision (the routing
    # labels carry the reserved kserve_canary_ prefix; the client POSTs anything longer anyway).
    assert len(promql) < 3200, len(promql)
    assert "by (kserve_canary_namespace, kserve_canary_revision" in promql
    assert "[600s]" in promql
    assert promql.count("(") == promql.count(")")


def test_revisions_are_selected_by_label_on_opencensus_and_by_pod_name_on_otel() -> None:
    opencensus = render_builtin(
        _query("error-rate", RequestsProfile.KNATIVE_OPENCENSUS, GpuLabelStyle.POD), ROLLOUT
    )
    assert 'revision_name=~"(llama-chat-predictor-00011|llama-chat-predictor-00012)"' in opencensus
    assert 'response_code_class="5xx"' in opencensus
    otel = render_builtin(
        _query("error-rate", RequestsProfile.KNATIVE_OTEL_INVOCATION, GpuLabelStyle.POD), ROLLOUT
    )
    # The exact names Knative and the apiserver give the pods (canary.metrics.podnames).
    pods = "(?:llama-chat-predictor-00011|llama-chat-predictor-00012)-deployment-[a-z0-9]{1,10}-[a-z0-9]{5}"
    assert f'pod=~"{pods}"' in otel
    assert 'http_response_status_code=~"5.."' in otel
    relabelled = render_builtin(
        _query("latency", RequestsProfile.KNATIVE_OTEL_QUEUEPROXY, GpuLabelStyle.POD, label="rev"), ROLLOUT
    )
    assert 'rev=~"(llama-chat-predictor-00011|llama-chat-predictor-00012)"' in relabelled
    assert "deployment" not in relabelled


def test_gpu_label_style_decides_the_dcgm_labels() -> None:
    exported = render_builtin(_query("gpu-memory-peak", PROFILES[0], GpuLabelStyle.EXPORTED_POD), ROLLOUT[:1])
    assert 'exported_namespace="ml"' in exported
    assert 'exported_pod=~"(?:llama-chat-predictor-00012)-deployment-[a-z0-9]{1,10}-[a-z0-9]{5}"' in exported
    assert "* 1048576" in exported  # MiB to bytes
    plain = render_builtin(_query("gpu-memory-peak", PROFILES[0], GpuLabelStyle.POD), ROLLOUT[:1])
    assert "exported_" not in plain


def test_one_revision_uses_an_exact_match_and_names_are_escaped() -> None:
    promql = render_builtin(
        _query(REQUESTS, RequestsProfile.KNATIVE_OPENCENSUS, GpuLabelStyle.POD), [RevisionKey('n"s', "r.1")]
    )
    assert 'namespace_name="n\\"s"' in promql
    assert 'revision_name="r.1"' in promql  # an exact match needs no regex escaping
    pods = render_builtin(_query("oom-kills", PROFILES[0], GpuLabelStyle.POD), [RevisionKey("ml", "r.1")])
    assert 'pod=~"(?:r\\\\.1)-deployment-[a-z0-9]{1,10}-[a-z0-9]{5}"' in pods


OTEL_PROFILES = [RequestsProfile.KNATIVE_OTEL_QUEUEPROXY, RequestsProfile.KNATIVE_OTEL_INVOCATION]
SCOPE = 'otel_scope_name="go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"'


def _selects_outer(promql: str, suffix: str) -> bool:
    """``promql`` selects the otelhttp histogram's ``suffix`` series by the queue-proxy's scope."""
    # A selector ends at its last value's closing quote and brace (a pod pattern holds braces too).
    selectors = re.findall(rf'http_server_request_duration_seconds_{suffix}\{{(.*?")\}}', promql)
    return bool(selectors) and all(SCOPE in selector for selector in selectors)


@pytest.mark.parametrize("profile", OTEL_PROFILES)
@pytest.mark.parametrize("label", [None, "knative_revision"])
def test_otel_profiles_read_the_queue_proxys_outer_histogram_by_its_scope(
    profile: RequestsProfile, label: str | None
) -> None:
    """Knative >= 1.19 records its own histogram inside the breaker (issue #33, 4): the checks read
    otelhttp's around it, and only the queue-proxy's (a model server may export the same name)."""
    inner = REQUESTS_PROFILES[profile].detection_metric.removesuffix("_count")
    for measure in (REQUESTS, "error-rate", "latency"):
        promql = render_builtin(_query(measure, profile, GpuLabelStyle.POD, label), ROLLOUT)
        assert _selects_outer(promql, "bucket" if measure == "latency" else "count")
        assert inner not in promql
    counters = render_counters(CounterQuery(profile, label), ROLLOUT)
    assert _selects_outer(counters, "count") and _selects_outer(counters, "bucket")
    assert inner not in counters
    # detection asks for it scraped (the scope a label) or pushed over OTLP (no scope label)
    assert REQUESTS_PROFILES[profile].outer_selector == (
        'http_server_request_duration_seconds_count{otel_scope_name=~"(go\\\\.opentelemetry\\\\.io/'
        'contrib/instrumentation/net/http/otelhttp)?"}'
    )


def test_opencensus_reads_its_own_histogram_which_is_already_outside_the_breaker() -> None:
    metrics = REQUESTS_PROFILES[RequestsProfile.KNATIVE_OPENCENSUS]
    assert (metrics.count_metric, metrics.detection_metric) == ("revision_request_count",) * 2
    assert metrics.outer_selector is None
    promql = render_counters(CounterQuery(RequestsProfile.KNATIVE_OPENCENSUS), ROLLOUT)
    assert "otel_scope_name" not in promql and "http_server_request_duration" not in promql


def test_label_styles_select_by_their_own_labels() -> None:
    """OTLP with the namespace promoted: ``k8s_namespace_name`` and the pods on ``instance``;
    without promotion, a join with target_info; kube-state-metrics' exported_* read as the workload's."""
    from canary.metrics.labels import KSM_EXPORTED, JoinLabels

    profile = RequestsProfile.KNATIVE_OTEL_INVOCATION
    promoted = BuiltinQuery(
        "error-rate", "600s", requests_profile=profile, labels=JoinLabels("k8s_namespace_name", "instance")
    )
    promql = render_builtin(promoted, ROLLOUT)
    assert 'k8s_namespace_name="ml"' in promql and 'instance=~"(?:llama-chat' in promql
    assert "pod=~" not in promql
    joined = JoinLabels("k8s_namespace_name", "instance", "kn_revision_name", target_info=True, pushed=True)
    promql = render_builtin(BuiltinQuery("latency", "600s", 0.99, profile, labels=joined), ROLLOUT)
    # selected by the join; pushed over OTLP the scope is a label only when Prometheus promotes it
    scope = 'otel_scope_name=~"(go\\\\.opentelemetry\\\\.io/contrib/instrumentation/net/http/otelhttp)?"'
    assert f"http_server_request_duration_seconds_bucket{{{scope}}}[600s]" in promql
    assert (
        '* on (job, instance) group_left (k8s_namespace_name, kn_revision_name) target_info{k8s_namespace_name="ml", '
        'kn_revision_name=~"(llama-chat-predictor-00011|llama-chat-predictor-00012)"}' in promql
    )
    oom = render_builtin(BuiltinQuery("oom-kills", "600s", labels=KSM_EXPORTED), ROLLOUT)
    assert 'exported_container="kserve-container"' in oom and 'exported_namespace="ml"' in oom
    assert "label_replace(" in oom and '"pod", "$1", "exported_pod", "(.+)"' in oom


@pytest.mark.parametrize("name", ["k8s.namespace.name", 'x"}', "a b", "", "1pod"])
def test_a_label_name_that_is_not_an_identifier_never_reaches_promql(name: str) -> None:
    from canary.metrics.labels import JoinLabels

    with pytest.raises(ValueError, match="not a Prometheus label name"):
        JoinLabels(namespace=name)
