"""Production-like metrics of KServe revisions, generated from raw events, for a real Prometheus.

A :class:`Simulation` plays pods of revisions over time — requests with latencies and status codes,
container restarts and OOM kills, GPU memory, vLLM KV cache — and keeps the **raw events** so a test
can compute the truth independently (exact quantiles from the individual latencies, error ratios
from the individual requests) and compare it with what PromQL says. It renders the series as the
real exporters do:

* Knative queue-proxy, one family per generation: OpenCensus ``revision_request_count`` /
  ``revision_request_latencies`` (milliseconds, Knative's bucket layout, ``namespace_name``,
  ``revision_name``, ``response_code_class``), recorded around the breaker; on OpenTelemetry (>= 1.19)
  *two* histograms, as the queue-proxy's handler chain records them: its own
  ``kn_queueproxy_app_duration_seconds`` (1.19-1.20) or ``kn_serving_invocation_duration_seconds``
  (>= 1.21), recorded *inside* the breaker (scope ``knative.dev/serving/pkg/queue``), and otelhttp's
  ``http_server_request_duration_seconds`` around everything (scope
  ``go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp``); both with
  ``http_response_status_code`` and no revision label. A revision whose breaker sheds load
  (``shed_ratio``: 503s when its queue is full) or queues requests (``queue_seconds``) shows both only
  in the outer histogram. Counters reset when the queue-proxy container restarts; a 5xx series
  appears only with the first 5xx, as the exporters do.
  The OpenTelemetry families are scraped by a PodMonitor (``request_labels="scraped"``: ``namespace``,
  ``pod``, and the scope as ``otel_scope_name``) or pushed over OTLP to Prometheus' OTLP receiver, as
  its translator stores them (:func:`otlp_labels`): ``job`` and ``instance`` from the queue-proxy's
  ``service.name`` and ``service.instance.id``, the other resource attributes on ``target_info``
  only, and ``k8s_namespace_name`` on every series too when ``promote_resource_attributes`` names
  ``k8s.namespace.name`` (``request_labels="otlp"``); no scope label (Prometheus promotes it only
  with ``otlp.promote_scope_metadata``).
* optionally (``model_server_otel``) the model server's own OpenTelemetry
  ``http_server_request_duration_seconds`` in the same pod (another scope, another container): the
  requests that reached it, as it timed them.
* kube-state-metrics: ``kube_pod_created``, ``kube_pod_status_ready_time`` (only while Ready),
  restart counters of containers and of the ``storage-initializer`` init container, and the
  ``*_last_terminated_reason`` gauges (only the last reason, as kube-state-metrics does); scraped
  with honorLabels, or without (``ksm_labels="exported_pod"``: a ServiceMonitor's target labels
  ``namespace``, ``pod``, ``container`` win and the workload's become ``exported_*``).
* dcgm-exporter: ``DCGM_FI_DEV_FB_USED`` / ``FREE`` / ``RESERVED`` in MiB, one series per GPU, with the
  workload under ``pod``/``namespace`` or, behind a ServiceMonitor without honorLabels,
  ``exported_pod``/``exported_namespace`` (then ``pod`` is the exporter's own pod), or with
  ``--use-old-namespace`` under ``pod_name``/``pod_namespace``.
* vLLM: ``vllm:kv_cache_usage_perc`` (or the old ``vllm:gpu_cache_usage_perc``), and the
  ``vllm:time_to_first_token_seconds`` / ``vllm:e2e_request_latency_seconds`` histograms.

:meth:`Simulation.openmetrics` gives timestamped OpenMetrics text for
``PrometheusServer(backfill=...)``. Everything is deterministic for a given seed.
"""

from __future__ import annotations

import bisect
import math
import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from canary_sandbox.k8s_names import MAX_GENERATED_NAME_LENGTH, deployment_name

__all__ = [
    "BREAKER_REJECT_SECONDS",
    "E2E_BUCKETS",
    "MODEL_SERVER_SCOPE",
    "OPENCENSUS_BUCKETS_MS",
    "OTELHTTP_SCOPE",
    "OTEL_BUCKETS",
    "OUTER_HISTOGRAM",
    "QUEUE_PROXY_SCOPE",
    "TTFT_BUCKETS",
    "Pod",
    "RequestRecord",
    "Restart",
    "Revision",
    "Simulation",
    "bucket_bounds",
    "empirical_quantile",
    "inner_histogram",
    "otel_request_labels",
    "otlp_labels",
    "otlp_resource",
]

# Knative's OpenCensus latency distribution (milliseconds).
OPENCENSUS_BUCKETS_MS = (
    5.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 150.0, 200.0, 250.0, 300.0, 350.0, 400.0, 450.0, 500.0,
    600.0, 700.0, 800.0, 900.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0, 50000.0, 100000.0,
)  # fmt: skip
# Knative's OpenTelemetry duration buckets (seconds): 5 ms .. 10 s.
OTEL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

GPU_TOTAL_MIB = 81559.0  # an H100 80GB HBM3 as DCGM reports it
GPU_RESERVED_MIB = 573.0

OK_CODE = "200"
ERROR_CODE = "503"

# Knative >= 1.19's queue-proxy: its own histogram's instrumentation scope (pkg/queue/request_metric.go,
# scopeName), and otelhttp's, whose server histogram wraps the whole handler chain (the OTel
# Prometheus exporter writes the scope as otel_scope_name on every series).
QUEUE_PROXY_SCOPE = "knative.dev/serving/pkg/queue"
OTELHTTP_SCOPE = "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
OUTER_HISTOGRAM = "http_server_request_duration_seconds"
MODEL_SERVER_SCOPE = "opentelemetry.instrumentation.fastapi"  # a Python model server's, for contrast
BREAKER_REJECT_SECONDS = 0.0004  # ErrRequestQueueFull is returned at once, without waiting


def inner_histogram(profile: str) -> str:
    """The queue-proxy's own request histogram on an OpenTelemetry profile (inside the breaker)."""
    if profile == "knative-otel-queueproxy":
        return "kn_queueproxy_app_duration_seconds"
    return "kn_serving_invocation_duration_seconds"


def otel_request_labels(scope: str, status: str) -> dict[str, str]:
    """The attributes each OpenTelemetry request histogram records, with its scope label."""
    if scope == QUEUE_PROXY_SCOPE:  # semconv.HTTPResponseStatusCode only
        return {"http_response_status_code": status, "otel_scope_name": scope}
    labels = {
        "http_request_method": "POST",
        "url_scheme": "http",
        "network_protocol_name": "http",
        "network_protocol_version": "1.1",
        "http_response_status_code": status,
        "otel_scope_name": scope,
    }
    if scope == OTELHTTP_SCOPE:
        labels["otel_scope_version"] = "0.63.0"
    return labels


@dataclass(frozen=True, slots=True)
class Restart:
    """A container (or the storage-initializer init container) terminated at ``at`` and restarted."""

    at: float
    container: str  # "kserve-container", "queue-proxy" or "storage-initializer"
    reason: str  # "OOMKilled", "Error", ...

    @property
    def init(self) -> bool:
        return self.container == "storage-initializer"


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    created: float
    ready: float | None  # when it became Ready; None: never
    deleted: float | None = None
    gpus: int = 0
    restarts: tuple[Restart, ...] = ()

    @property
    def uid(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{self.name}"))

    def alive(self, t: float) -> bool:
        return self.created <= t and (self.deleted is None or t < self.deleted)

    def serving(self, t: float) -> bool:
        return self.alive(t) and self.ready is not None and t >= self.ready


@dataclass(frozen=True, slots=True)
class Revision:
    """A revision and how its pods behave. Pod names must be names the cluster could give the
    revision's pods: the ``generateName`` of its Deployment's ReplicaSet, cut to 58 characters
    (:mod:`canary_sandbox.k8s_names`; :func:`~canary_sandbox.k8s_names.revision_pod_name` makes one)."""

    namespace: str
    inference_service: str
    name: str
    pods: tuple[Pod, ...]
    requests_per_second: float = 2.0  # per serving pod
    error_ratio: float = 0.0  # probability that a request gets a 5xx
    latency_median: float = 0.08  # seconds
    latency_sigma: float = 0.6  # of the log-normal
    requests_profile: str | None = "knative-opencensus"  # or knative-otel-queueproxy / -invocation
    # Overload with containerConcurrency set: the share of requests the queue-proxy's breaker answers
    # 503 at once (its queue is full), and the mean time an admitted request waits for a slot.
    shed_ratio: float = 0.0
    queue_seconds: float = 0.0
    model_server_otel: bool = False  # the model server exports its own http_server_request_duration
    revision_label: str | None = None  # OTel profiles: a PodMonitor relabelling that adds the revision
    # OTel profiles: "scraped" (a PodMonitor), or pushed over OTLP: "otlp" (k8s.namespace.name promoted),
    # "otlp-target-info" (no resource attribute promoted: namespace and revision only on target_info)
    request_labels: str = "scraped"
    ksm_labels: str = (
        "pod"  # or "exported_pod": kube-state-metrics behind a ServiceMonitor without honorLabels
    )
    gpu_labels: str = "pod"  # or "exported_pod", or "pod_name" (dcgm-exporter --use-old-namespace)
    gpu_used_mib: float = 40000.0  # plateau of framebuffer use per GPU
    gpu_spike_mib: float = 0.0  # added once, on the first pod's GPU 0, mid-way
    vllm: bool = False
    vllm_old_names: bool = False  # vllm:gpu_cache_usage_perc instead of vllm:kv_cache_usage_perc
    kv_cache_level: float = 0.4

    def __post_init__(self) -> None:
        prefix = (deployment_name(self.name) + "-")[:MAX_GENERATED_NAME_LENGTH]
        for pod in self.pods:
            if not pod.name.startswith(prefix) or len(pod.name) > MAX_GENERATED_NAME_LENGTH + 5:
                raise ValueError(f"pod {pod.name!r} is not a name of {self.name}'s pods ({prefix}...)")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    revision: str
    namespace: str
    pod: str
    tick: float  # the scrape at which the request is first counted
    latency: float  # seconds, as the client sees it: the time queued at the breaker included
    status: str
    ttft: float = 0.0
    e2e: float = 0.0
    queued: float = 0.0  # seconds it waited for a slot in the queue-proxy's breaker
    shed: bool = False  # answered 503 by the breaker (queue full): it never reached the model

    @property
    def app_latency(self) -> float:
        """The time inside the breaker, as the queue-proxy's own histogram records it."""
        return self.latency - self.queued


def bucket_bounds(value: float, bounds: tuple[float, ...]) -> tuple[float, float]:
    """The (lower, upper] bucket of ``value`` among histogram ``bounds`` (upper may be +Inf)."""
    index = bisect.bisect_left(bounds, value)
    lower = bounds[index - 1] if index > 0 else 0.0
    upper = bounds[index] if index < len(bounds) else math.inf
    return lower, upper


def empirical_quantile(values: list[float], quantile: float) -> float:
    """The smallest value with at least ``quantile`` of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, math.ceil(quantile * len(ordered)))
    return ordered[rank - 1]


@dataclass(slots=True)
class _Tally:
    """One histogram's cumulative state per status code, as an exporter keeps it since its start."""

    counts: dict[str, int] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)
    buckets: dict[str, list[int]] = field(default_factory=dict)

    def open(self, status: str, width: int) -> None:
        """The series of ``status`` exists from now on, even before its first observation."""
        self.counts.setdefault(status, 0)
        self.sums.setdefault(status, 0.0)
        self.buckets.setdefault(status, [0] * width)

    def observe(self, status: str, value: float, bounds: tuple[float, ...]) -> None:
        self.open(status, len(bounds))
        self.counts[status] += 1
        self.sums[status] += value
        per_bucket = self.buckets[status]
        for index, bound in enumerate(bounds):
            if value <= bound:
                per_bucket[index] += 1


@dataclass(slots=True)
class _Series:
    name: str
    labels: dict[str, str]
    samples: list[tuple[float, float]] = field(default_factory=list)


class Simulation:
    """Plays ``revisions`` from ``start`` to ``end`` with a sample every ``step`` seconds."""

    def __init__(
        self, revisions: list[Revision], *, start: float, end: float, step: float = 5.0, seed: int = 7
    ) -> None:
        if step <= 0 or end <= start:
            raise ValueError("need start < end and a positive step")
        self.revisions = revisions
        self.step = step
        count = int((end - start) // step) + 1
        self.ticks = [start + index * step for index in range(count)]
        self.requests: list[RequestRecord] = []
        self.gpu_samples: dict[tuple[str, str, int], list[tuple[float, float, float, float]]] = {}
        self.kv_samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self._families: dict[str, tuple[str, list[_Series]]] = {}
        self._index: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = {}
        # Cumulative vLLM histograms per (revision, pod): they live in the model server, not the
        # queue-proxy, so a queue-proxy restart does not reset them.
        self._vllm_histograms: dict[tuple[str, str], dict[str, list[float]]] = {}
        random_source = random.Random(seed)  # noqa: S311 - reproducible test data, not secrets
        for revision in revisions:
            for pod_index, pod in enumerate(revision.pods):
                self._play_pod(revision, pod, pod_index, random_source)

    # -- raw-data helpers for tests -------------------------------------------------------------

    def requests_between(self, revision: str, after: float, until: float) -> list[RequestRecord]:
        """Requests of ``revision`` counted at a scrape in (after, until]."""
        return [r for r in self.requests if r.revision == revision and after < r.tick <= until]

    def first_tick_at_or_after(self, moment: float) -> float:
        index = bisect.bisect_left(self.ticks, moment)
        return self.ticks[index]

    # -- rendering ------------------------------------------------------------------------------

    def openmetrics(self) -> str:
        """Timestamped OpenMetrics text of every series (for promtool backfill)."""
        return "".join(self._openmetrics_lines()) + "# EOF\n"

    def _openmetrics_lines(self) -> Iterator[str]:
        for family, (kind, series_list) in self._families.items():
            yield f"# TYPE {family} {kind}\n"
            for series in series_list:
                labels = ",".join(f'{key}="{escape_label(value)}"' for key, value in series.labels.items())
                prefix = f"{series.name}{{{labels}}} "
                for moment, value in series.samples:
                    yield f"{prefix}{format_number(value)} {moment:.3f}\n"

    # -- simulation -----------------------------------------------------------------------------

    def _series(self, family: str, kind: str, name: str, labels: dict[str, str]) -> _Series:
        key = (name, tuple(sorted(labels.items())))
        series = self._index.get(key)
        if series is None:
            series = _Series(name, labels)
            self._index[key] = series
            self._families.setdefault(family, (kind, []))[1].append(series)
        return series

    def _play_pod(self, revision: Revision, pod: Pod, pod_index: int, rng: random.Random) -> None:
        alive_ticks = [t for t in self.ticks if pod.alive(t)]
        self._play_requests(revision, pod, alive_ticks, rng)
        self._play_kube_state(revision, pod, alive_ticks)
        self._play_gpus(revision, pod, pod_index, alive_ticks, rng)
        if revision.vllm:
            self._play_kv_cache(revision, pod, alive_ticks, rng)

    def _play_requests(self, revision: Revision, pod: Pod, ticks: list[float], rng: random.Random) -> None:
        bounds = self._latency_bounds(revision)
        scale = 1000.0 if revision.requests_profile == "knative-opencensus" else 1.0
        proxy_resets = [r.at for r in pod.restarts if r.container == "queue-proxy"]
        server_resets = [r.at for r in pod.restarts if r.container == "kserve-container"]
        # Cumulative state since the queue-proxy's (the model server's) last (re)start: the histogram
        # around the breaker, the one inside it, and the model server's own.
        outer, inner, server = _Tally(), _Tally(), _Tally()
        previous = None
        for t in ticks:
            if previous is not None and any(previous < at <= t for at in proxy_resets):
                outer, inner = _Tally(), _Tally()
            if previous is not None and any(previous < at <= t for at in server_resets):
                server = _Tally()
            previous = t
            if not pod.serving(t):
                continue
            fresh = [
                self._request(revision, pod, t, rng)
                for _ in range(poisson(rng, revision.requests_per_second * self.step))
            ]
            self.requests.extend(fresh)
            for tally in (outer, inner, server):
                tally.open(OK_CODE, len(bounds))  # the success series exists from the first scrape
            for record in fresh:
                outer.observe(record.status, record.latency * scale, bounds)
                if not record.shed:
                    inner.observe(record.status, _inner_seconds(revision, record) * scale, bounds)
                    server.observe(record.status, record.app_latency, OTEL_BUCKETS)
                    if revision.vllm:
                        self._observe_vllm(revision, pod, record)
            self._emit_requests(revision, pod, t, outer, inner, server)
            if revision.vllm:
                self._emit_vllm(revision, pod, t)

    @staticmethod
    def _request(revision: Revision, pod: Pod, t: float, rng: random.Random) -> RequestRecord:
        """One request; the overload draws are made only for a revision that overloads, so that every
        other revision's requests stay what the seed made them."""
        if revision.shed_ratio > 0.0 and rng.random() < revision.shed_ratio:
            return RequestRecord(
                revision.name, revision.namespace, pod.name, t, BREAKER_REJECT_SECONDS, ERROR_CODE, shed=True
            )
        latency = revision.latency_median * math.exp(revision.latency_sigma * rng.gauss(0.0, 1.0))
        status = ERROR_CODE if rng.random() < revision.error_ratio else OK_CODE
        ttft = min(latency, 0.02 + latency * 0.3 * rng.random())
        e2e = latency * (4.0 + 8.0 * rng.random())
        queued = rng.expovariate(1.0 / revision.queue_seconds) if revision.queue_seconds > 0.0 else 0.0
        return RequestRecord(
            revision.name, revision.namespace, pod.name, t, latency + queued, status, ttft, e2e, queued
        )

    @staticmethod
    def _latency_bounds(revision: Revision) -> tuple[float, ...]:
        return OPENCENSUS_BUCKETS_MS if revision.requests_profile == "knative-opencensus" else OTEL_BUCKETS

    def _emit_requests(
        self, revision: Revision, pod: Pod, t: float, outer: _Tally, inner: _Tally, server: _Tally
    ) -> None:
        profile = revision.requests_profile
        if profile is None:
            return
        if profile == "knative-opencensus":
            self._emit_opencensus(revision, pod, t, outer)
            return
        self._emit_otel(inner_histogram(profile), QUEUE_PROXY_SCOPE, revision, pod, t, inner)
        self._emit_otel(OUTER_HISTOGRAM, OTELHTTP_SCOPE, revision, pod, t, outer)
        if revision.model_server_otel:  # scraped from the model server's own port
            model = {"namespace": revision.namespace, "pod": pod.name, "container": "kserve-container",
                     "job": "model-server"}  # fmt: skip
            for status in server.counts:
                labels = {**model, **otel_request_labels(MODEL_SERVER_SCOPE, status)}
                self._emit_histogram(OUTER_HISTOGRAM, OTEL_BUCKETS, labels, t, server, status)
        if revision.request_labels != "scraped":
            # helper.go addResourceTargetInfo: one target_info sample per push, at the batch's timestamp.
            info = otlp_resource(revision, pod.name)
            self._series(TARGET_INFO, "gauge", TARGET_INFO, info).samples.append((t, 1.0))

    def _emit_opencensus(self, revision: Revision, pod: Pod, t: float, tally: _Tally) -> None:
        for status, count in tally.counts.items():
            base = {
                "namespace_name": revision.namespace,
                "configuration_name": f"{revision.inference_service}-predictor",
                "revision_name": revision.name,
                "service_name": f"{revision.inference_service}-predictor",
                "pod_name": pod.name,
                "container_name": "queue-proxy",
                "response_code": status,
                "response_code_class": status[0] + "xx",
                "namespace": revision.namespace,
                "pod": pod.name,
                "job": "queue-proxy",
            }
            name = "revision_request_count"
            self._series(name, "counter", name, base).samples.append((t, float(count)))
            self._emit_histogram("revision_request_latencies", OPENCENSUS_BUCKETS_MS, base, t, tally, status)

    def _emit_otel(
        self, histogram: str, scope: str, revision: Revision, pod: Pod, t: float, tally: _Tally
    ) -> None:
        for status in tally.counts:
            base = _otel_labels(revision, pod, scope, status)
            self._emit_histogram(histogram, OTEL_BUCKETS, base, t, tally, status)

    def _emit_histogram(
        self, histogram: str, bounds: tuple[float, ...], base: dict[str, str], t: float, tally: _Tally,
        status: str,
    ) -> None:  # fmt: skip
        def sample(suffix: str, labels: dict[str, str], value: float) -> None:
            self._series(histogram, "histogram", f"{histogram}{suffix}", labels).samples.append((t, value))

        for index, bound in enumerate(bounds):
            sample("_bucket", {**base, "le": format_number(bound)}, float(tally.buckets[status][index]))
        sample("_bucket", {**base, "le": "+Inf"}, float(tally.counts[status]))
        sample("_sum", base, tally.sums[status])
        sample("_count", base, float(tally.counts[status]))

    def _observe_vllm(self, revision: Revision, pod: Pod, record: RequestRecord) -> None:
        key = (revision.name, pod.name)
        state = self._vllm_histograms.setdefault(
            key,
            {
                "ttft": [0.0] * (len(TTFT_BUCKETS) + 1),
                "e2e": [0.0] * (len(E2E_BUCKETS) + 1),
                "sums": [0.0, 0.0],
            },
        )
        for name, value, bounds in (("ttft", record.ttft, TTFT_BUCKETS), ("e2e", record.e2e, E2E_BUCKETS)):
            counts = state[name]
            for index, bound in enumerate(bounds):
                if value <= bound:
                    counts[index] += 1
            counts[-1] += 1
        state["sums"][0] += record.ttft
        state["sums"][1] += record.e2e

    def _emit_vllm(self, revision: Revision, pod: Pod, t: float) -> None:
        state = self._vllm_histograms.get((revision.name, pod.name))
        if state is None:
            return
        base = {"namespace": revision.namespace, "pod": pod.name, "model_name": revision.inference_service}
        for name, family, bounds, sum_index in (
            ("ttft", "vllm:time_to_first_token_seconds", TTFT_BUCKETS, 0),
            ("e2e", "vllm:e2e_request_latency_seconds", E2E_BUCKETS, 1),
        ):
            counts = state[name]
            for index, bound in enumerate(bounds):
                self._series(
                    family, "histogram", f"{family}_bucket", {**base, "le": format_number(bound)}
                ).samples.append((t, float(counts[index])))
            self._series(family, "histogram", f"{family}_bucket", {**base, "le": "+Inf"}).samples.append(
                (t, float(counts[-1]))
            )
            self._series(family, "histogram", f"{family}_count", base).samples.append((t, float(counts[-1])))
            self._series(family, "histogram", f"{family}_sum", base).samples.append(
                (t, state["sums"][sum_index])
            )

    def _play_kube_state(self, revision: Revision, pod: Pod, ticks: list[float]) -> None:
        base = {"namespace": revision.namespace, "pod": pod.name, "uid": pod.uid, "job": "kube-state-metrics"}
        container_label = "container"
        if revision.ksm_labels == "exported_pod":
            # A ServiceMonitor's target labels (kube-state-metrics' own pod) win over the exported ones.
            base = {
                "exported_namespace": revision.namespace,
                "exported_pod": pod.name,
                "uid": pod.uid,
                **_KSM_TARGET,
            }
            container_label = "exported_container"
        containers = ("kserve-container", "queue-proxy")
        for t in ticks:
            self._series("kube_pod_created", "gauge", "kube_pod_created", base).samples.append(
                (t, pod.created)
            )
            if pod.serving(t):
                assert pod.ready is not None
                self._series(
                    "kube_pod_status_ready_time", "gauge", "kube_pod_status_ready_time", base
                ).samples.append((t, pod.ready))
            for container in (*containers, "storage-initializer"):
                init = container == "storage-initializer"
                done = [r for r in pod.restarts if r.container == container and r.at <= t]
                prefix = "kube_pod_init_container" if init else "kube_pod_container"
                if not init or done:
                    name = f"{prefix}_status_restarts_total"
                    labels = {**base, container_label: container}
                    self._series(name, "counter", name, labels).samples.append((t, float(len(done))))
                if done:
                    name = f"{prefix}_status_last_terminated_reason"
                    labels = {**base, container_label: container, "reason": done[-1].reason}
                    self._series(name, "gauge", name, labels).samples.append((t, 1.0))

    def _play_gpus(
        self, revision: Revision, pod: Pod, pod_index: int, ticks: list[float], rng: random.Random
    ) -> None:
        if not ticks:
            return
        middle = ticks[len(ticks) // 2]
        for gpu in range(pod.gpus):
            gpu_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"gpu/{pod.name}/{gpu}"))
            if revision.gpu_labels == "exported_pod":
                placement = {
                    "namespace": "gpu-operator",
                    "pod": "nvidia-dcgm-exporter-x7k2p",
                    "container": "nvidia-dcgm-exporter",
                    "exported_namespace": revision.namespace,
                    "exported_pod": pod.name,
                    "exported_container": "kserve-container",
                }
            elif revision.gpu_labels == "pod_name":
                placement = {
                    "namespace": "gpu-operator",  # a ServiceMonitor's target labels: the exporter's pod
                    "pod": "nvidia-dcgm-exporter-x7k2p",
                    "pod_namespace": revision.namespace,
                    "pod_name": pod.name,
                    "container_name": "kserve-container",
                }
            else:
                placement = {
                    "namespace": revision.namespace,
                    "pod": pod.name,
                    "container": "kserve-container",
                }
            base = {
                "gpu": str(gpu),
                "UUID": f"GPU-{gpu_uuid}",
                "device": f"nvidia{gpu}",
                "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": f"gpu-node-{pod_index}",
                **placement,
            }
            samples = self.gpu_samples.setdefault((revision.name, pod.name, gpu), [])
            for t in ticks:
                loaded = min(1.0, (t - pod.created) / 120.0)  # the model loads over two minutes
                used = float(round(revision.gpu_used_mib * loaded * (0.97 + 0.03 * rng.random())))
                if pod_index == 0 and gpu == 0 and t == middle:
                    used += revision.gpu_spike_mib
                used = min(used, GPU_TOTAL_MIB - GPU_RESERVED_MIB)
                free = GPU_TOTAL_MIB - GPU_RESERVED_MIB - used
                samples.append((t, used, free, GPU_RESERVED_MIB))
                for name, value in (
                    ("DCGM_FI_DEV_FB_USED", used),
                    ("DCGM_FI_DEV_FB_FREE", free),
                    ("DCGM_FI_DEV_FB_RESERVED", GPU_RESERVED_MIB),
                ):
                    self._series(name, "gauge", name, base).samples.append((t, value))

    def _play_kv_cache(self, revision: Revision, pod: Pod, ticks: list[float], rng: random.Random) -> None:
        name = "vllm:gpu_cache_usage_perc" if revision.vllm_old_names else "vllm:kv_cache_usage_perc"
        base = {"namespace": revision.namespace, "pod": pod.name, "model_name": revision.inference_service}
        samples = self.kv_samples.setdefault((revision.name, pod.name), [])
        for t in ticks:
            if not pod.serving(t):
                continue
            level = min(1.0, max(0.0, revision.kv_cache_level + 0.1 * (rng.random() - 0.5)))
            samples.append((t, level))
            self._series(name, "gauge", name, base).samples.append((t, level))


def _inner_seconds(revision: Revision, record: RequestRecord) -> float:
    """What the queue-proxy's own histogram records for an admitted request. Knative 1.19-1.20's
    handler converts with ``float64(latency / time.Second)``: a Duration divided by a Duration, so
    whole seconds (knative/serving pkg/queue/request_metric.go, the kn.queueproxy.app.duration
    version, line 106). The >= 1.21 handler was not available to read: it is taken as exact."""
    if revision.requests_profile == "knative-otel-queueproxy":
        return float(math.floor(record.app_latency))
    return record.app_latency


TARGET_INFO = "target_info"
# The target labels a prometheus-operator ServiceMonitor gives kube-state-metrics' own pod.
_KSM_TARGET = {
    "namespace": "monitoring",
    "pod": "kube-state-metrics-7c9d8b6f5d-x2x4k",
    "container": "kube-state-metrics",
    "service": "kube-state-metrics",
    "endpoint": "http",
    "instance": "10.0.3.7:8080",
    "job": "kube-state-metrics",
}


def otlp_resource(revision: Revision, pod: str) -> dict[str, str]:
    """``target_info`` of a queue-proxy that pushes over OTLP: its resource attributes (knative/serving
    pkg/queue/sharedmain/otel.go ``res``, keys in pkg/metrics/newkey.go) as Prometheus stores them
    (prometheusremotewrite/helper.go ``addResourceTargetInfo``: the non-identifying attributes, with
    ``job``/``instance`` from service.name/service.instance.id; dots become underscores)."""
    service = f"{revision.inference_service}-predictor"  # the Knative Service KServe creates
    return {
        "job": service,  # service.name = SERVING_SERVICE
        "instance": pod,  # service.instance.id = the pod's name
        "k8s_namespace_name": revision.namespace,
        "kn_configuration_name": service,
        "kn_revision_name": revision.name,
        "kn_service_name": service,
        "service_version": "v1.21.0",
        "telemetry_sdk_language": "go",
        "telemetry_sdk_name": "opentelemetry",
        "telemetry_sdk_version": "1.37.0",
    }


def otlp_labels(revision: Revision, pod: str) -> dict[str, str]:
    """The labels every OTLP-pushed series of the queue-proxy carries besides its data point's
    attributes (helper.go ``createAttributes``): ``job``, ``instance``, and the promoted resource
    attributes (``request_labels="otlp"``: ``k8s.namespace.name``)."""
    resource = otlp_resource(revision, pod)
    labels = {"job": resource["job"], "instance": resource["instance"]}
    if revision.request_labels == "otlp":
        labels["k8s_namespace_name"] = resource["k8s_namespace_name"]
    return labels


def _otel_labels(revision: Revision, pod: Pod, scope: str, status: str) -> dict[str, str]:
    """One queue-proxy histogram's labels: its data point's attributes and scope, with the labels of a
    scrape (a PodMonitor's ``namespace``, ``pod``, ...) or of an OTLP push (``job``, ``instance``,
    promoted attributes; the scope is not promoted)."""
    point = otel_request_labels(scope, status)
    if revision.request_labels != "scraped":
        unscoped = {key: value for key, value in point.items() if not key.startswith("otel_scope_")}
        return {**otlp_labels(revision, pod.name), **unscoped}
    base = {
        "namespace": revision.namespace,
        "pod": pod.name,
        "container": "queue-proxy",
        "job": "queue-proxy",
    }
    if revision.revision_label:
        base[revision.revision_label] = revision.name
    return {**base, **point}


def poisson(rng: random.Random, mean: float) -> int:
    # Knuth's method is fine for the small means of a scrape interval.
    if mean <= 0:
        return 0
    limit = math.exp(-mean)
    count, product = 0, rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count


def escape_label(value: str) -> str:
    """A label value as the OpenMetrics text format writes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_number(value: float) -> str:
    """A sample value as the OpenMetrics text format writes it (integers without a fraction)."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))
