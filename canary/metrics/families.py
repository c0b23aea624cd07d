"""The metric families and their profiles: which series each Knative generation, DCGM style and exporter
provides, and the labels they join on (canary.metrics.catalog renders their PromQL)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from canary.evidence import REQUESTS
from canary.metrics.labels import JoinLabels
from canary.metrics.promql import regex_literal, string_literal
from canary.policy.model import GpuLabelStyle, MetricKind, RequestsProfile
from canary.policy.units import Unit


class Family(StrEnum):
    """A group of metrics that one exporter provides; profiles are chosen (or detected) per family."""

    REQUESTS = "requests"  # Knative queue-proxy: request counts and latency histograms
    KUBE_STATE = "kube-state-metrics"  # restarts, termination reasons, pod creation and readiness
    DCGM = "dcgm"  # NVIDIA dcgm-exporter: GPU framebuffer memory
    VLLM = "vllm"  # vLLM's own metrics: KV cache, time to first token, end-to-end latency


KIND_FAMILY: Mapping[str, Family] = {
    REQUESTS: Family.REQUESTS,
    MetricKind.LATENCY.value: Family.REQUESTS,
    MetricKind.ERROR_RATE.value: Family.REQUESTS,
    MetricKind.OOM_KILLS.value: Family.KUBE_STATE,
    MetricKind.RESTARTS.value: Family.KUBE_STATE,
    MetricKind.WARMUP_TIME.value: Family.KUBE_STATE,
    MetricKind.GPU_MEMORY_PEAK.value: Family.DCGM,
    MetricKind.KV_CACHE_USAGE.value: Family.VLLM,
    MetricKind.TTFT.value: Family.VLLM,
    MetricKind.E2E_LATENCY.value: Family.VLLM,
}


def measure_unit(measure: str) -> Unit:
    """The canonical unit of a builtin measure (a metric kind or ``request-count``)."""
    return Unit.COUNT if measure == REQUESTS else MetricKind(measure).unit


@dataclass(frozen=True, slots=True)
class RequestsMetrics:
    """Where one Knative generation keeps request counts and latencies."""

    profile: RequestsProfile
    knative: str  # the Knative versions that export this family (for messages and docs)
    count_metric: str  # a counter of requests, with the response code as a label
    bucket_metric: str  # the latency histogram's buckets
    histogram_count_metric: str  # the latency histogram's own count (the requests behind a quantile)
    server_error_matcher: str  # selects 5xx responses
    namespace_label: str
    revision_label: str | None  # None: the revision is known only from the pod name
    latency_divisor: float  # to seconds
    pod_label: str = "pod"  # the label naming the queue-proxy's pod (a counter reset is per pod)
    # Selects the queue-proxy's series among others of the same name (see QUEUE_PROXY_SERVER_SCOPE).
    series_matcher: str = ""
    # The family's own name, which tells the Knative generation apart (detection looks for it).
    generation_metric: str = ""
    # Where the response class comes from: a label already holding "5xx" (OpenCensus), or a status
    # code mapped to its class by the pattern ("503" -> "5xx").
    code_label: str = "http_response_status_code"
    code_pattern: str = "([1-5])[0-9][0-9]"
    code_replacement: str = "${1}xx"

    @property
    def detection_metric(self) -> str:
        return self.generation_metric or self.count_metric

    def scope_matcher(self, labels: JoinLabels) -> str:
        """Selects the queue-proxy's series (see QUEUE_PROXY_SERVER_SCOPE). Pushed over OTLP the scope
        is a label only when Prometheus promotes it (``otlp.promote_scope_metadata``): there, series
        with no scope are the queue-proxy's too."""
        if not self.series_matcher:
            return ""
        return _OUTER_SERIES_OR_UNSCOPED if labels.pushed else self.series_matcher

    @property
    def outer_selector(self) -> str | None:
        """The histogram the checks read, as a series selector, when it is not the generation's own
        (Knative >= 1.19: the otelhttp server histogram around the breaker; scraped or pushed);
        detection asks for it."""
        if self.generation_metric and self.series_matcher:
            return f"{self.count_metric}{{{_OUTER_SERIES_OR_UNSCOPED}}}"
        return None

    @property
    def scraped_labels(self) -> JoinLabels:
        """The labels of the series as a PodMonitor scrapes them (the exporter's own, OpenCensus)."""
        return JoinLabels(self.namespace_label, self.pod_label, self.revision_label)


# Knative >= 1.19 records its own request histogram (kn.queueproxy.app.duration, renamed
# kn.serving.invocation.duration in 1.21) *inside* the breaker: requests the breaker answers 503 when
# its queue is full, and the time admitted requests wait for a slot, never reach it. Only the
# otelhttp server histogram wrapped around the whole queue-proxy handler chain sees every request as
# the client does (knative/serving pkg/queue/sharedmain/handlers.go: requestAppMetricsHandler is
# composed inside queue.ProxyHandler, otelhttp.NewHandler outside everything). Its name is the
# generic http.server.request.duration, which a model server instrumented with OpenTelemetry in the
# same pod may export too: the instrumentation scope (Prometheus' otel_scope_name label) tells the
# queue-proxy's series apart.
QUEUE_PROXY_SERVER_SCOPE = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
OUTER_HISTOGRAM = "http_server_request_duration_seconds"
_OUTER_SERIES = f'otel_scope_name="{QUEUE_PROXY_SERVER_SCOPE}"'
_OUTER_SERIES_OR_UNSCOPED = (
    f'otel_scope_name=~"{string_literal(f"({regex_literal(QUEUE_PROXY_SERVER_SCOPE)})?")}"'
)


def _otel(profile: RequestsProfile, knative: str, generation_metric: str) -> RequestsMetrics:
    """An OpenTelemetry generation: the checks read the queue-proxy's outer otelhttp histogram (its own
    histogram, named by ``generation_metric``, only tells the generation)."""
    return RequestsMetrics(
        profile=profile,
        knative=knative,
        count_metric=f"{OUTER_HISTOGRAM}_count",
        bucket_metric=f"{OUTER_HISTOGRAM}_bucket",
        histogram_count_metric=f"{OUTER_HISTOGRAM}_count",
        server_error_matcher='http_response_status_code=~"5.."',
        namespace_label="namespace",
        revision_label=None,
        latency_divisor=1.0,
        series_matcher=_OUTER_SERIES,
        generation_metric=generation_metric,
    )


REQUESTS_PROFILES: Mapping[RequestsProfile, RequestsMetrics] = {
    RequestsProfile.KNATIVE_OPENCENSUS: RequestsMetrics(
        profile=RequestsProfile.KNATIVE_OPENCENSUS,
        knative="<= 1.18",
        count_metric="revision_request_count",
        bucket_metric="revision_request_latencies_bucket",
        histogram_count_metric="revision_request_latencies_count",
        server_error_matcher='response_code_class="5xx"',
        namespace_label="namespace_name",
        revision_label="revision_name",
        latency_divisor=1000.0,  # OpenCensus reports milliseconds
        pod_label="pod_name",  # the exporter's own label; Prometheus' `pod` depends on relabelling
        code_label="response_code_class",
        code_pattern="([1-5]xx)",
        code_replacement="$1",
    ),
    RequestsProfile.KNATIVE_OTEL_QUEUEPROXY: _otel(
        RequestsProfile.KNATIVE_OTEL_QUEUEPROXY, "1.19-1.20", "kn_queueproxy_app_duration_seconds_count"
    ),
    RequestsProfile.KNATIVE_OTEL_INVOCATION: _otel(
        RequestsProfile.KNATIVE_OTEL_INVOCATION, ">= 1.21", "kn_serving_invocation_duration_seconds_count"
    ),
}


@dataclass(frozen=True, slots=True)
class GpuLabels:
    """How dcgm-exporter series name the workload pod."""

    style: GpuLabelStyle
    namespace_label: str
    pod_label: str

    @property
    def join_labels(self) -> JoinLabels:
        return JoinLabels(self.namespace_label, self.pod_label)


DCGM_LABELS: Mapping[GpuLabelStyle, GpuLabels] = {
    # honorLabels: true (or the exporter's pod mapping scraped directly): the workload's own labels
    GpuLabelStyle.POD: GpuLabels(GpuLabelStyle.POD, "namespace", "pod"),
    # a ServiceMonitor without honorLabels: the exporter pod's labels win, the workload's get exported_*
    GpuLabelStyle.EXPORTED_POD: GpuLabels(GpuLabelStyle.EXPORTED_POD, "exported_namespace", "exported_pod"),
    # dcgm-exporter --use-old-namespace (the pre-1.13 kubelet names): pod_name/pod_namespace; a
    # ServiceMonitor's target labels (the exporter's own pod) do not clash with them
    GpuLabelStyle.POD_NAME: GpuLabels(GpuLabelStyle.POD_NAME, "pod_namespace", "pod_name"),
}
