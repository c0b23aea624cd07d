"""``auto`` profiles: find out which request-metric family and which DCGM label style exist.

Real installs differ (Knative <= 1.18 OpenCensus names, the OpenTelemetry names of 1.19-1.20 and of
>= 1.21; DCGM behind a ServiceMonitor with or without ``honorLabels``), and a default query that
matches no series would read as "no data" forever. Detection asks Prometheus' label APIs — cheap, no
series data is read:

* requests: ``/api/v1/label/__name__/values`` with one ``match[]`` per candidate count metric;
* DCGM: ``/api/v1/labels?match[]=DCGM_FI_DEV_FB_USED`` — ``exported_pod`` present means a
  ServiceMonitor without honorLabels renamed the workload's labels; ``pod_name`` means dcgm-exporter
  runs with ``--use-old-namespace`` (then a ``pod`` label, if any, is the exporter's own pod);
* kube-state-metrics: ``/api/v1/labels?match[]=kube_pod_container_status_restarts_total`` — the same
  ``exported_pod`` rule;
* where the request series carry namespace and pod (:mod:`canary.metrics.labels`):
  ``/api/v1/labels`` of the profile's count metric — its scraped namespace label, OTLP's promoted
  ``k8s_namespace_name``, or ``job`` and ``instance`` with a ``target_info`` carrying
  ``k8s_namespace_name`` and ``kn_revision_name``.

When the metric exists but none of its series carry the labels a family joins on, every query would
match nothing: detection says so, with the setting to change, and the checks read no data with that
detail instead of a silent "no series".

Both look at ``[at - lookback, at]`` where ``at`` is the evaluation time (so a backtest detects what
existed then). Answers are cached: a positive one for ``ttl`` seconds, "nothing found" only for
``retry_missing_after`` seconds (a fresh install starts exporting later), and a failed look-up is not
cached at all. :meth:`ProfileDetector.report` gives the explain-ready picture.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import structlog

from canary.metrics.catalog import DCGM_LABELS, DCGM_USED, KSM_RESTARTS, REQUESTS_PROFILES, RequestsMetrics
from canary.metrics.client import PrometheusClient, QueryFailure, as_utc
from canary.metrics.labels import OTLP_NAMESPACE, OTLP_REVISION, TARGET_INFO
from canary.policy.model import GpuLabelStyle, KubeStateLabelStyle, RequestLabelStyle, RequestsProfile
from canary.repeats import Repeats

__all__ = [
    "ENABLE_EXPORT_HINT",
    "GPU_FAMILY",
    "KUBE_STATE_FAMILY",
    "REQUESTS_FAMILY",
    "REQUEST_LABELS_FAMILY",
    "Detection",
    "DetectionReport",
    "ProfileDetector",
]

_log = structlog.get_logger("canary.metrics.detect")

REQUESTS_FAMILY = "requests"
GPU_FAMILY = "gpuLabels"
REQUEST_LABELS_FAMILY = "requestLabels"
KUBE_STATE_FAMILY = "kubeStateLabels"

# When several request families are present (mid-upgrade: new pods carry the new queue-proxy), the
# newest wins: it is what new revisions — the canaries we judge — export.
_NEWEST_FIRST = (
    RequestsProfile.KNATIVE_OTEL_INVOCATION,
    RequestsProfile.KNATIVE_OTEL_QUEUEPROXY,
    RequestsProfile.KNATIVE_OPENCENSUS,
)

ENABLE_EXPORT_HINT = (
    "Knative >= 1.19 exports no request metrics until metrics export is enabled in its observability "
    "config (config-observability: metrics-protocol: prometheus) and the queue-proxy port is scraped"
)


@dataclass(frozen=True, slots=True)
class Detection:
    """What detection found for one family, ready for logs and ``kserve-canary explain``."""

    family: str  # "requests" | "gpuLabels"
    choice: str | None  # the profile / label style chosen; None when nothing matched or it failed
    looked_for: tuple[str, ...]  # metric names (or labels) searched for
    found: tuple[str, ...]
    detail: str
    at: datetime | None = None  # the evaluation time the look-up covered
    failure: QueryFailure | None = None  # the look-up itself failed (an error, never "no data")

    def as_dict(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "choice": self.choice,
            "lookedFor": list(self.looked_for),
            "found": list(self.found),
            "detail": self.detail,
            "at": self.at.isoformat() if self.at else None,
            "error": (
                {"class": self.failure.error_class.value, "detail": self.failure.detail}
                if self.failure
                else None
            ),
        }


@dataclass(frozen=True, slots=True)
class DetectionReport:
    detections: dict[str, Detection] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {family: detection.as_dict() for family, detection in sorted(self.detections.items())}


@dataclass(slots=True)
class _Cached:
    detection: Detection
    expires: float


class ProfileDetector:
    """Detects the request-metric family and DCGM label style of one Prometheus, with a cache."""

    def __init__(
        self,
        client: PrometheusClient,
        *,
        lookback: float = 900.0,
        ttl: float = 600.0,
        retry_missing_after: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._lookback = timedelta(seconds=lookback)
        self._ttl = ttl
        self._retry_missing_after = retry_missing_after
        self._clock = clock
        self._lock = threading.Lock()
        self._family_locks = {
            family: threading.Lock()
            for family in (REQUESTS_FAMILY, GPU_FAMILY, REQUEST_LABELS_FAMILY, KUBE_STATE_FAMILY)
        }
        self._cache: dict[str, _Cached] = {}
        self._repeats = Repeats()  # a failing or fruitless detection is logged once per change

    def requests_profile(self, at: datetime) -> tuple[Detection, int]:
        """The request family's detection (cached) and the HTTP round trips spent now (0 if cached)."""
        return self._cached(REQUESTS_FAMILY, at, self._detect_requests)

    def gpu_labels(self, at: datetime) -> tuple[Detection, int]:
        return self._cached(GPU_FAMILY, at, self._detect_gpu_labels)

    def request_labels(self, profile: RequestsProfile, at: datetime) -> tuple[Detection, int]:
        """Where ``profile``'s request series carry namespace and pod (a :class:`RequestLabelStyle`)."""
        detect = functools.partial(self._detect_request_labels, profile)
        return self._cached(REQUEST_LABELS_FAMILY, at, detect, key=f"{REQUEST_LABELS_FAMILY}/{profile.value}")

    def kube_state_labels(self, at: datetime) -> tuple[Detection, int]:
        """kube-state-metrics' label style; ``found`` is empty when it has no series at all."""
        return self._cached(KUBE_STATE_FAMILY, at, self._detect_kube_state_labels)

    def report(self) -> DetectionReport:
        with self._lock:
            return DetectionReport({family: cached.detection for family, cached in self._cache.items()})

    def forget(self) -> None:
        """Drop every cached answer: the next evaluation detects again."""
        with self._lock:
            self._cache.clear()

    # -- internals ------------------------------------------------------------------------------

    def _cached(
        self,
        family: str,
        at: datetime,
        detect: Callable[[datetime], tuple[Detection, int]],
        key: str | None = None,
    ) -> tuple[Detection, int]:
        # One look-up per family at a time: concurrent evaluations wait for it instead of repeating it.
        key = key or family
        with self._family_locks[family]:
            now = self._clock()
            with self._lock:
                cached = self._cache.get(key)
            if cached is not None and cached.expires > now:
                return cached.detection, 0
            detection, http_requests = detect(at)
            previous = cached.detection.choice if cached is not None else None
            if detection.failure is None:
                lifetime = self._ttl if detection.choice is not None else self._retry_missing_after
                with self._lock:
                    self._cache[key] = _Cached(detection, now + lifetime)
            self._log(detection, previous, first=cached is None)
            return detection, http_requests

    def _log(self, detection: Detection, previous: str | None, *, first: bool) -> None:
        fields = {
            "family": detection.family,
            "choice": detection.choice,
            "found": list(detection.found),
            "looked_for": list(detection.looked_for),
            "detail": detection.detail,
        }
        if detection.failure is not None or detection.choice is None:
            failure = detection.failure
            what = "metric profile detection failed" if failure is not None else "no metric profile matched"
            repeated = self._repeats.failed(detection.family, f"{what}: {detection.detail}")
            if repeated is not None:
                error_class = {"error_class": failure.error_class.value} if failure is not None else {}
                _log.warning(what, previousRepeated=repeated or None, **error_class, **fields)
            return
        repeated = self._repeats.ended(detection.family)
        if first or previous != detection.choice or repeated is not None:
            _log.info("metric profile detected", previous=previous, **fields)

    def _detect_requests(self, at: datetime) -> tuple[Detection, int]:
        candidates = {REQUESTS_PROFILES[profile].detection_metric: profile for profile in _NEWEST_FIRST}
        looked_for = tuple(candidates)
        end = as_utc(at)
        # The histogram the >= 1.19 checks read, asked for in the same call (by its scope: see
        # QUEUE_PROXY_SERVER_SCOPE): a generation found without it would read no requests.
        outer = sorted({s for s in (m.outer_selector for m in REQUESTS_PROFILES.values()) if s is not None})
        matches = (*looked_for, *outer)
        names, http_requests = self._client.label_values("__name__", matches, end - self._lookback, end)
        if isinstance(names, QueryFailure):
            detail = f"could not list metric names: {names.detail}"
            return Detection(REQUESTS_FAMILY, None, looked_for, (), detail, end, names), http_requests
        found = tuple(name for name in looked_for if name in set(names))
        if not found:
            described = ", ".join(
                f"{metrics.detection_metric} (Knative {metrics.knative})"
                for metrics in (REQUESTS_PROFILES[profile] for profile in reversed(_NEWEST_FIRST))
            )
            detail = (
                f"none of the request metric families was found in the last {_minutes(self._lookback)}: "
                f"looked for {described}. {ENABLE_EXPORT_HINT}; or set spec.metrics.requests and "
                "spec.metrics.queries in the policy"
            )
            return Detection(REQUESTS_FAMILY, None, looked_for, (), detail, end), http_requests
        chosen = candidates[found[0]]
        detail = f"{found[0]} found: Knative {REQUESTS_PROFILES[chosen].knative} ({chosen.value})"
        if len(found) > 1:
            detail += f"; also found {', '.join(found[1:])} (older pods?) — using the newest family"
        detail += _outer_missing(REQUESTS_PROFILES[chosen], set(names))
        return Detection(REQUESTS_FAMILY, chosen.value, looked_for, found, detail, end), http_requests

    def _detect_gpu_labels(self, at: datetime) -> tuple[Detection, int]:
        looked_for = tuple(f"{DCGM_USED}{{{DCGM_LABELS[style].pod_label}}}" for style in _GPU_STYLES)
        end = as_utc(at)
        labels, http_requests = self._client.label_names([DCGM_USED], end - self._lookback, end)
        if isinstance(labels, QueryFailure):
            detail = f"could not list DCGM labels: {labels.detail}"
            return Detection(GPU_FAMILY, None, looked_for, (), detail, end, labels), http_requests
        present = set(labels)
        if not present:
            detail = (
                f"no {DCGM_USED} series in the last {_minutes(self._lookback)}: is dcgm-exporter installed "
                "and scraped? Set spec.metrics.gpuLabels, or override the gpu-memory-peak query"
            )
            return Detection(GPU_FAMILY, None, looked_for, (), detail, end), http_requests
        for style in _GPU_STYLES:
            label = DCGM_LABELS[style].pod_label
            if label in present:
                detail = f"{DCGM_USED} has a {label!r} label: {_GPU_STYLE_WHY[style]}"
                return Detection(GPU_FAMILY, style.value, looked_for, (label,), detail, end), http_requests
        detail = (
            f"{DCGM_USED} series carry none of 'exported_pod', 'pod_name' and 'pod': enable dcgm-exporter's "
            "Kubernetes pod mapping"
        )
        return Detection(GPU_FAMILY, None, looked_for, (), detail, end), http_requests

    def _detect_request_labels(self, profile: RequestsProfile, at: datetime) -> tuple[Detection, int]:
        metric = REQUESTS_PROFILES[profile].count_metric
        selector = REQUESTS_PROFILES[profile].outer_selector or metric  # the queue-proxy's series only
        scraped = REQUESTS_PROFILES[profile].scraped_labels.namespace
        looked_for = (
            f"{metric}{{{scraped}}}",
            f"{metric}{{{OTLP_NAMESPACE}}}",
            f"{TARGET_INFO}{{{OTLP_NAMESPACE}}}",
        )
        end = as_utc(at)
        start = end - self._lookback
        labels, http_requests = self._client.label_names([selector], start, end)
        if isinstance(labels, QueryFailure):
            detail = f"could not list the labels of {metric}: {labels.detail}"
            return Detection(REQUEST_LABELS_FAMILY, None, looked_for, (), detail, end, labels), http_requests
        present = set(labels)
        style: RequestLabelStyle | None = None
        if scraped in present:
            style, why = RequestLabelStyle.SCRAPED, f"{metric} has a {scraped!r} label (scraped)"
        elif OTLP_NAMESPACE in present:
            style, why = RequestLabelStyle.OTLP, f"{metric} has {OTLP_NAMESPACE!r} (OTLP, promoted)"
        elif {"job", "instance"} <= present:
            info, more = self._client.label_names([TARGET_INFO], start, end)
            http_requests += more
            if isinstance(info, QueryFailure):
                detail = f"could not list the labels of {TARGET_INFO}: {info.detail}"
                return Detection(
                    REQUEST_LABELS_FAMILY, None, looked_for, (), detail, end, info
                ), http_requests
            if {OTLP_NAMESPACE, OTLP_REVISION} <= set(info):
                style = RequestLabelStyle.OTLP_TARGET_INFO
                why = (
                    f"{metric} has job and instance, {TARGET_INFO} has {OTLP_NAMESPACE} (OTLP, not promoted)"
                )
        if style is not None:
            return Detection(
                REQUEST_LABELS_FAMILY, style.value, looked_for, (metric,), why, end
            ), http_requests
        detail = _request_labels_missing(metric, scraped, bool(present), self._lookback)
        found = (metric,) if present else ()
        return Detection(REQUEST_LABELS_FAMILY, None, looked_for, found, detail, end), http_requests

    def _detect_kube_state_labels(self, at: datetime) -> tuple[Detection, int]:
        looked_for = (f"{KSM_RESTARTS}{{exported_pod}}", f"{KSM_RESTARTS}{{pod}}")
        end = as_utc(at)
        labels, http_requests = self._client.label_names([KSM_RESTARTS], end - self._lookback, end)
        if isinstance(labels, QueryFailure):
            detail = f"could not list kube-state-metrics labels: {labels.detail}"
            return Detection(KUBE_STATE_FAMILY, None, looked_for, (), detail, end, labels), http_requests
        present = set(labels)
        if not present:
            detail = (
                f"no {KSM_RESTARTS} series in the last {_minutes(self._lookback)}: is kube-state-metrics "
                "installed and scraped? Its standard labels are read until it is"
            )
            return Detection(KUBE_STATE_FAMILY, None, looked_for, (), detail, end), http_requests
        for style, why in _KSM_STYLE_WHY.items():
            if style.value in present:
                detail = f"{KSM_RESTARTS} has a {style.value!r} label: {why}"
                found = (KSM_RESTARTS,)
                return Detection(
                    KUBE_STATE_FAMILY, style.value, looked_for, found, detail, end
                ), http_requests
        detail = (
            f"{KSM_RESTARTS} series carry neither 'exported_pod' nor 'pod': the oom-kills, restarts and "
            "warm-up checks match nothing. Set spec.metrics.kubeStateLabels, or name the labels in "
            "spec.metrics.labels.kubeStateMetrics"
        )
        return Detection(KUBE_STATE_FAMILY, None, looked_for, (KSM_RESTARTS,), detail, end), http_requests


def _request_labels_missing(metric: str, scraped: str, exists: bool, lookback: timedelta) -> str:
    if not exists:
        return f"no {metric} series in the last {_minutes(lookback)}"
    return (
        f"{metric} series exist but carry none of the labels the request checks join on: no {scraped!r} "
        f"(scraped by a PodMonitor), no {OTLP_NAMESPACE!r} (pushed over OTLP with k8s.namespace.name "
        f"promoted), and no {TARGET_INFO} with {OTLP_NAMESPACE!r} and {OTLP_REVISION!r} to join on job and "
        "instance: every latency and error-rate query would match nothing. Set spec.metrics.requestLabels "
        "(scraped, otlp or otlp-target-info), or name the labels in spec.metrics.labels.requests"
    )


# exported_pod first: behind a ServiceMonitor without honorLabels the target's own `pod` is there too.
_KSM_STYLE_WHY = {
    KubeStateLabelStyle.EXPORTED_POD: "scraped without honorLabels: the workload labels are exported_*",
    KubeStateLabelStyle.POD: "the workload's pod and namespace labels are kept",
}

# The order matters: behind a ServiceMonitor the target's own `pod` label (the exporter's pod) is
# there too, so the workload's labels are looked for first.
_GPU_STYLES = (GpuLabelStyle.EXPORTED_POD, GpuLabelStyle.POD_NAME, GpuLabelStyle.POD)
_GPU_STYLE_WHY = {
    GpuLabelStyle.EXPORTED_POD: "a ServiceMonitor without honorLabels renamed the workload labels",
    GpuLabelStyle.POD_NAME: "dcgm-exporter runs with --use-old-namespace (pod_name/pod_namespace)",
    GpuLabelStyle.POD: "the workload's pod and namespace labels are kept",
}


def _outer_missing(metrics: RequestsMetrics, names: set[str]) -> str:
    """What to say when a generation is found without the histogram its checks read."""
    if metrics.outer_selector is None or metrics.count_metric in names:
        return ""
    return (
        f". WARNING: no {metrics.outer_selector} series: the error-rate and latency checks read the "
        "queue-proxy's server histogram (it alone sees the breaker's 503s and the time queued) and "
        "find no requests; it comes from the same queue-proxy port, so check that no metric "
        "relabelling drops it"
    )


def _minutes(span: timedelta) -> str:
    seconds = span.total_seconds()
    return f"{seconds / 60:g}m" if seconds >= 60 else f"{seconds:g}s"
