"""A simulated serving fleet behind a (real or emulated) Kubernetes API, exported to Prometheus.

:class:`SimulatedFleet` follows the cluster through the official client: which revisions exist, which
pods each has and whether they are Ready, and the traffic split KServe published in
``status.components.predictor.traffic``. Every tick it routes each model's request rate by that split
onto the Ready pods of each revision and lets each pod's :class:`PodSimulator` answer. The exporter
renders exactly the series a production install exposes — Knative queue-proxy (``requests_profile``:
OpenCensus names, or on >= 1.19 its own histogram inside the breaker and otelhttp's around it, each
with its ``otel_scope_name``), kube-state-metrics and the DCGM exporter — for a real Prometheus to
scrape.

Which behaviour a revision gets is decided by the spec that created it (its ``storageUri``): the
fleet remembers, for each new ``latestCreatedRevision``, the predictor's storageUri at that moment.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from kubernetes import client

from canary_sandbox.exporter import IngestionLag
from canary_sandbox.fleet.behaviour import KNATIVE_LATENCY_BUCKETS_MS, PodSimulator, RevisionBehaviour
from canary_sandbox.kserve_metrics import (
    OTEL_BUCKETS,
    OTELHTTP_SCOPE,
    OUTER_HISTOGRAM,
    QUEUE_PROXY_SCOPE,
    inner_histogram,
    otel_request_labels,
)

__all__ = ["ModelTraffic", "SimulatedFleet", "storage_uri"]


def storage_uri(isvc: Mapping[str, Any]) -> str:
    predictor = (isvc.get("spec") or {}).get("predictor") or {}
    model = predictor.get("model") or {}
    if model.get("storageUri"):
        return str(model["storageUri"])
    containers = predictor.get("containers") or [{}]
    return str(predictor.get("storageUri") or containers[0].get("image") or "")


@dataclass(frozen=True)
class ModelTraffic:
    namespace: str
    inference_service: str
    requests_per_second: float
    # storageUri -> behaviour; a revision whose storageUri is not listed gets ``default``.
    behaviours: Mapping[str, RevisionBehaviour] = field(default_factory=dict)
    default: RevisionBehaviour = field(default_factory=RevisionBehaviour)


@dataclass
class _RevisionInfo:
    behaviour: RevisionBehaviour
    storage_uri: str


def _pod_ready(pod: client.V1Pod) -> tuple[bool, datetime | None]:
    for condition in (pod.status.conditions if pod.status else None) or []:
        if condition.type == "Ready":
            return condition.status == "True", condition.last_transition_time
    return False, None


class SimulatedFleet:
    def __init__(
        self,
        api_client: client.ApiClient,
        models: list[ModelTraffic],
        *,
        seed: int = 7,
        gpu_label_style: str = "pod",
        ksm_label_style: str = "pod",
        on_new_revision: Callable[[str, str, str, RevisionBehaviour], None] | None = None,
        requests_profile: str = "knative-opencensus",  # or knative-otel-queueproxy / -invocation
    ):
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)
        self._models = {(m.namespace, m.inference_service): m for m in models}
        self._seed = seed
        self._gpu_label_style = gpu_label_style
        self._requests_profile = requests_profile
        self._ksm_label_style = ksm_label_style  # "exported_pod": scraped without honorLabels
        self._on_new_revision = on_new_revision
        self._revisions: dict[tuple[str, str], _RevisionInfo] = {}  # (namespace, revision)
        self._pods: dict[tuple[str, str], PodSimulator] = {}  # (namespace, pod)
        self._owner: dict[tuple[str, str], str] = {}  # (namespace, pod) -> InferenceService
        self._of_model: dict[tuple[str, str], set[tuple[str, str]]] = {}  # (namespace, isvc) -> pods
        self._pod_meta: dict[tuple[str, str], tuple[str, float, float | None]] = {}  # uid, created, ready
        self._carry: dict[tuple[str, str], float] = {}  # fractional requests per revision
        self._shares: dict[tuple[str, str, str], float] = {}  # (ns, isvc, revision) -> last share
        self._lock = threading.Lock()
        # What a workload adds to its own exposition (the hostile-tenant suite: a counter exported a
        # second time with a `revision` label of its own): the rendered text in, the served text out.
        self.rewrite: Callable[[str], str] | None = None

    # -- simulation --------------------------------------------------------------------------------

    def tick(self, dt: float) -> None:
        """Advance the world by ``dt`` seconds of traffic.

        One list of InferenceServices and one of pods per namespace (not a GET per model): the same
        objects, so a fleet of a thousand models costs two requests per tick instead of two thousand.
        """
        namespaces = sorted({namespace for namespace, _ in self._models})
        for namespace in namespaces:
            try:
                listed = cast(
                    dict[str, Any],
                    self._custom.list_namespaced_custom_object(
                        "serving.kserve.io", "v1beta1", namespace, "inferenceservices", _request_timeout=10
                    ),
                )
                pods = self._core.list_namespaced_pod(namespace, _request_timeout=10).items
            except client.ApiException:
                continue
            isvcs = {item["metadata"]["name"]: item for item in listed.get("items") or []}
            by_model: dict[str, list[client.V1Pod]] = {}
            for pod in pods:
                owner = ((pod.metadata.labels if pod.metadata else None) or {}).get(
                    "serving.kserve.io/inferenceservice"
                )
                if owner:
                    by_model.setdefault(owner, []).append(pod)
            for (model_namespace, name), model in self._models.items():
                isvc = isvcs.get(name) if model_namespace == namespace else None
                if isvc is None:
                    continue
                self._learn_revision(namespace, name, isvc, model)
                with self._lock:
                    self._sync_pods(namespace, name, by_model.get(name, []))
                    for key in sorted(self._of_model.get((namespace, name), ())):
                        if self._pod_meta[key][2] is None:  # not Ready: still loading
                            self._pods[key].load(dt)
                    self._route(namespace, name, isvc, model, dt)

    def _learn_revision(
        self, namespace: str, name: str, isvc: Mapping[str, Any], model: ModelTraffic
    ) -> None:
        predictor = ((isvc.get("status") or {}).get("components") or {}).get("predictor") or {}
        created = predictor.get("latestCreatedRevision")
        if not created or (namespace, created) in self._revisions:
            return
        uri = storage_uri(isvc)
        behaviour = model.behaviours.get(uri, model.default)
        self._revisions[(namespace, created)] = _RevisionInfo(behaviour, uri)
        if self._on_new_revision is not None:
            self._on_new_revision(namespace, name, created, behaviour)

    def _sync_pods(self, namespace: str, name: str, pods: list[client.V1Pod]) -> None:
        """Follow the pods of one InferenceService: new pods get a simulator, deleted ones go."""
        seen = set()
        for pod in pods:
            meta = pod.metadata
            if meta is None or meta.name is None:
                continue
            revision = (meta.labels or {}).get("serving.knative.dev/revision", "")
            key = (namespace, meta.name)
            seen.add(key)
            if key not in self._pods:
                info = self._revisions.get((namespace, revision))
                if info is None:
                    # Knative creates a revision's pods a reconcile before KServe's status names it
                    # (latestCreatedRevision), which is where its behaviour is learnt: wait for that,
                    # or the pod would serve with the default behaviour for good.
                    continue
                otel = self._requests_profile != "knative-opencensus"
                self._pods[key] = PodSimulator(
                    meta.name,
                    revision,
                    namespace,
                    info.behaviour,
                    seed=self._seed ^ zlib.crc32(meta.name.encode()),
                    bounds_ms=_OTEL_BOUNDS_MS if otel else KNATIVE_LATENCY_BUCKETS_MS,
                    keeps_inner=otel,
                    inner_whole_seconds=self._requests_profile == "knative-otel-queueproxy",
                )
                self._owner[key] = name
                self._of_model.setdefault((namespace, name), set()).add(key)
            ready, ready_since = _pod_ready(pod)
            created = meta.creation_timestamp.timestamp() if meta.creation_timestamp else 0.0
            ready_time = ready_since.timestamp() if ready and ready_since else None
            self._pod_meta[key] = (meta.uid or "", created, ready_time)
        mine = self._of_model.get((namespace, name), set())
        for key in sorted(mine - seen):
            del self._pods[key]
            del self._owner[key]
            self._pod_meta.pop(key, None)
            mine.discard(key)

    def _route(
        self, namespace: str, name: str, isvc: Mapping[str, Any], model: ModelTraffic, dt: float
    ) -> None:
        predictor = ((isvc.get("status") or {}).get("components") or {}).get("predictor") or {}
        latest_ready = predictor.get("latestReadyRevision")
        shares: dict[str, float] = {}
        for entry in predictor.get("traffic") or []:
            revision = latest_ready if entry.get("latestRevision") else entry.get("revisionName")
            if revision:
                shares[revision] = shares.get(revision, 0.0) + float(entry.get("percent") or 0) / 100.0
        for revision, share in shares.items():
            self._shares[(namespace, name, revision)] = share
            ready_pods = [
                self._pods[key]
                for key in sorted(self._of_model.get((namespace, name), ()))
                if self._pods[key].revision == revision and self._pod_meta[key][2] is not None
            ]
            if not ready_pods:
                continue
            wanted = model.requests_per_second * dt * share + self._carry.get((namespace, revision), 0.0)
            whole = int(wanted)
            self._carry[(namespace, revision)] = wanted - whole
            per_pod, extra = divmod(whole, len(ready_pods))
            for index, simulator in enumerate(ready_pods):
                simulator.serve(per_pod + (1 if index < extra else 0), share)

    # -- exposition --------------------------------------------------------------------------------

    def render(self) -> str:
        with self._lock:
            text = _render(
                self._pods,
                self._pod_meta,
                self._gpu_label_style,
                self._ksm_label_style,
                self._requests_profile,
            )
        return text if self.rewrite is None else self.rewrite(text)

    def serve(
        self, host: str = "127.0.0.1", port: int = 0, *, ingestion_lag: float = 0.0
    ) -> ThreadingHTTPServer:
        """Serve ``/metrics`` on a background thread; returns the server (``server_address`` has the port).

        ``ingestion_lag``: Prometheus holds each sample that many seconds late (:class:`IngestionLag`)."""
        render = IngestionLag(self.render, ingestion_lag) if ingestion_lag > 0 else self.render

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="fleet-exporter", daemon=True).start()
        return server


def _labels(pairs: Mapping[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{key}="{escape(value)}"' for key, value in pairs.items()) + "}"


_OTEL_BOUNDS_MS = tuple(bound * 1000.0 for bound in OTEL_BUCKETS)


def _opencensus_lines(pod: PodSimulator) -> list[str]:
    """revision_request_count and revision_request_latencies: recorded around the breaker."""
    service = pod.revision.rsplit("-", 1)[0] if "-" in pod.revision else pod.revision
    queue = {
        "namespace_name": pod.namespace,
        "service_name": service,
        "configuration_name": service,
        "revision_name": pod.revision,
        "pod_name": pod.name,
        "container_name": "queue-proxy",
    }
    lines = []
    for code_class, count in pod.requests.items():
        code = "200" if code_class == "2xx" else "503"
        labels = {**queue, "response_code": code, "response_code_class": code_class}
        lines.append(f"revision_request_count{_labels(labels)} {count:.0f}")
    # The histograms are cumulative already, as Prometheus histograms are.
    for bound, count in zip(pod.bounds_ms, pod.buckets, strict=True):
        lines.append(f"revision_request_latencies_bucket{_labels({**queue, 'le': f'{bound:g}'})} {count:.0f}")
    lines.append(
        f"revision_request_latencies_bucket{_labels({**queue, 'le': '+Inf'})} {pod.latency_count:.0f}"
    )
    lines.append(f"revision_request_latencies_sum{_labels(queue)} {pod.latency_sum_ms:.3f}")
    lines.append(f"revision_request_latencies_count{_labels(queue)} {pod.latency_count:.0f}")
    return lines


def _otel_lines(pod: PodSimulator, profile: str) -> list[str]:
    """Knative >= 1.19: the queue-proxy's own histogram, inside the breaker, and otelhttp's around
    the whole handler chain (tests/sandbox/test_queue_proxy_histograms.py cites the sources), in
    seconds, one series per status code: the success one from the start, a 5xx one from its first."""
    target = {"namespace": pod.namespace, "pod": pod.name, "container": "queue-proxy", "job": "queue-proxy"}
    lines = []
    for name, scope, histogram in (
        (inner_histogram(profile), QUEUE_PROXY_SCOPE, pod.inner),
        (OUTER_HISTOGRAM, OTELHTTP_SCOPE, pod.outer),
    ):
        for code_class, count in histogram.counts.items():
            base = {**target, **otel_request_labels(scope, "200" if code_class == "2xx" else "503")}
            for bound, below in zip(OTEL_BUCKETS, histogram.bucket_counts(code_class), strict=True):
                lines.append(f"{name}_bucket{_labels({**base, 'le': f'{bound:g}'})} {below:.0f}")
            lines.append(f"{name}_bucket{_labels({**base, 'le': '+Inf'})} {count:.0f}")
            lines.append(f"{name}_sum{_labels(base)} {histogram.sums_ms.get(code_class, 0.0) / 1000.0:.6f}")
            lines.append(f"{name}_count{_labels(base)} {count:.0f}")
    return lines


def _render(
    pods: Mapping[tuple[str, str], PodSimulator],
    meta: Mapping[tuple[str, str], tuple[str, float, float | None]],
    gpu_label_style: str,
    ksm_label_style: str = "pod",
    requests_profile: str = "knative-opencensus",
) -> str:
    otel = requests_profile != "knative-opencensus"
    families = (
        [f"# TYPE {inner_histogram(requests_profile)} histogram", f"# TYPE {OUTER_HISTOGRAM} histogram"]
        if otel
        else ["# TYPE revision_request_count counter", "# TYPE revision_request_latencies histogram"]
    )
    lines: list[str] = [
        *families,
        "# TYPE kube_pod_container_status_restarts_total counter",
        "# TYPE kube_pod_container_status_last_terminated_reason gauge",
        "# TYPE kube_pod_created gauge",
        "# TYPE kube_pod_status_ready_time gauge",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        "# TYPE DCGM_FI_DEV_FB_FREE gauge",
        "# TYPE DCGM_FI_DEV_FB_RESERVED gauge",
    ]
    for key in sorted(pods):
        pod = pods[key]
        uid, created, ready_time = meta.get(key, ("", 0.0, None))
        lines.extend(_otel_lines(pod, requests_profile) if otel else _opencensus_lines(pod))

        ksm = {"namespace": pod.namespace, "pod": pod.name, "uid": uid}
        container = {**ksm, "container": "kserve-container"}
        if ksm_label_style == "exported_pod":
            # A ServiceMonitor without honorLabels: its target labels (this exporter) take the plain names.
            target = {
                "namespace": "monitoring",
                "pod": "kube-state-metrics-0",
                "container": "kube-state-metrics",
            }
            ksm = {"exported_namespace": pod.namespace, "exported_pod": pod.name, "uid": uid, **target}
            container = {**ksm, "exported_container": "kserve-container"}
        lines.append(f"kube_pod_container_status_restarts_total{_labels(container)} {pod.restarts}")
        if pod.last_terminated_reason:
            reason = {**container, "reason": pod.last_terminated_reason}
            lines.append(f"kube_pod_container_status_last_terminated_reason{_labels(reason)} 1")
        lines.append(f"kube_pod_created{_labels(ksm)} {created:.0f}")
        if ready_time is not None:
            lines.append(f"kube_pod_status_ready_time{_labels(ksm)} {ready_time:.0f}")

        prefix = "exported_" if gpu_label_style == "exported_pod" else ""
        gpu = {
            "gpu": "0",
            "UUID": f"GPU-{zlib.crc32(pod.name.encode()):08x}",
            "device": "nvidia0",
            "modelName": "NVIDIA A100-SXM4-80GB",
            "Hostname": "gpu-node-1",
            f"{prefix}pod": pod.name,
            f"{prefix}namespace": pod.namespace,
            f"{prefix}container": "kserve-container",
        }
        lines.append(f"DCGM_FI_DEV_FB_USED{_labels(gpu)} {pod.gpu_used_mib:.0f}")
        lines.append(f"DCGM_FI_DEV_FB_FREE{_labels(gpu)} {pod.gpu_free_mib:.0f}")
        lines.append(f"DCGM_FI_DEV_FB_RESERVED{_labels(gpu)} {pod.behaviour.gpu_reserved_mib:.0f}")
    return "\n".join(lines) + "\n"
