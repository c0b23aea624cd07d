"""The catalog's PromQL: every measure on every profile, selecting exactly the revisions asked for."""

from __future__ import annotations

import itertools

import pytest

from canary.evidence import REQUESTS
from canary.metrics.catalog import KIND_FAMILY, BuiltinQuery, Family, RevisionKey, render_builtin
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
