"""The per-tick queries of the evidence pipeline (:mod:`canary.metrics.counting`), grouped as the
catalog's builtin queries are (:mod:`canary.metrics.catalog`: output shape, selection by revision).

:func:`render_counters` samples *raw cumulative counters* — no ``rate``, no ``increase``, no range
selector — of every tracked revision at once: the request counter and latency buckets of a requests
profile summed by namespace, revision, pod and code class (and ``le``) (the class 2xx..5xx from the
status code; ``pod`` kept so that a queue-proxy restart is a reset of that pod's series), or
kube-state-metrics' restart counters per pod and container (:data:`RESTARTS_COUNTER`).
:func:`render_peaks` asks each GPU's / vLLM engine's peak since the previous tick. The revision is
read back from the pod name by one pattern per naming shape rather than one per revision
(``label_replace`` runs for every sample of every step of a backfill's range query); only revisions
whose Deployment name Knative md5-shortened add a join, on their pods' first 52 characters.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from canary.metrics.catalog import (
    FIELD_FRACTION,
    GROUP,
    KSM_CREATED,
    KSM_INIT_LAST_TERMINATED,
    KSM_INIT_RESTARTS,
    KSM_LAST_TERMINATED,
    KSM_READY_TIME,
    KSM_RESTARTS,
    MIB,
    MODEL_CONTAINER,
    POD_LABEL,
    POD_SELECTION,
    REQUESTS_PROFILES,
    RESERVED_PREFIX,
    STORAGE_INITIALIZER,
    VLLM_E2E,
    VLLM_KV_CACHE,
    VLLM_KV_CACHE_OLD,
    VLLM_TTFT,
    RequestsMetrics,
    RevisionKey,
    Selection,
    gpu_memory,
    pod_peak,
    relabel,
    requests_labels,
    union,
    with_field,
)
from canary.metrics.labels import KSM_LABELS, JoinLabels
from canary.metrics.promql import string_literal
from canary.policy.model import GpuLabelStyle, MetricKind, RequestsProfile

__all__ = [
    "BUCKET_FIELD",
    "CODE_CLASS_LABEL",
    "COUNTER_FIELD",
    "NEWEST_FIELD",
    "OOM_FIELD",
    "PEAK_FIELD",
    "PEAK_MEASURES",
    "RESTARTS_COUNTER",
    "CounterQuery",
    "PeakQuery",
    "render_counters",
    "render_peaks",
]

# Raw cumulative counters (the evidence pipeline's per-tick sample)

CODE_CLASS_LABEL = (
    RESERVED_PREFIX + "code_class"
)  # 1xx .. 5xx; absent when the exporter gave no readable code
COUNTER_FIELD = "count"  # evidence_field of the request counter's series
BUCKET_FIELD = "bucket"  # evidence_field of the latency histogram's bucket series
OOM_FIELD = "oom"  # evidence_field of a marker: this container's last termination was an OOM kill
# evidence_field of a revision's newest request-counter sample time (Unix seconds, Prometheus' own)
NEWEST_FIELD = "newest"
_COUNTER_GROUP = f"{GROUP}, {POD_LABEL}, {CODE_CLASS_LABEL}"


@dataclass(frozen=True, slots=True)
class CounterQuery:
    """What shapes a raw-counter query, except the revisions: one per tick each.

    The requests family of a profile (``profile``), or kube-state-metrics' container restart
    counters (``profile=None``: :data:`RESTARTS_COUNTER`).
    """

    profile: RequestsProfile | None
    revision_label: str | None = None  # OTel profiles: a relabelled revision label instead of pod names
    labels: JoinLabels | None = None  # the family's resolved labels; None: its default (scraped) ones

    @property
    def metrics(self) -> RequestsMetrics:
        if self.profile is None:
            raise ValueError("the restart counters have no requests profile")
        return REQUESTS_PROFILES[self.profile]

    @property
    def divisor(self) -> float:
        """What the ``le`` of the buckets is divided by to be in seconds."""
        return 1.0 if self.profile is None else self.metrics.latency_divisor

    @property
    def metric_name(self) -> str:
        return KSM_RESTARTS if self.profile is None else self.metrics.count_metric

    @property
    def name(self) -> str:
        if self.profile is None:
            return "restarts" + ("" if self.labels in (None, KSM_LABELS) else f"/{self.labels.pod}")
        return self.profile.value + (f"/{self.revision_label}" if self.revision_label else "")


# kube-state-metrics' restart counters per pod and container, in the counter book (the container
# travels as the series' code class; a tally's ``requests`` are then restarts).
RESTARTS_COUNTER = CounterQuery(None)


def render_counters(query: CounterQuery, revisions: Collection[RevisionKey]) -> str:
    """The raw cumulative request counters and latency buckets of every revision in ``revisions``.

    No ``rate``, no ``increase``, no range selector: the values as the exporters count them, summed
    only over labels that do not matter, by the reserved namespace, revision, pod and code class (and ``le``
    for the buckets), so a queue-proxy restart shows as a reset of that pod's series and a status
    code is read as its class. The counter's series carry ``evidence_field="count"``, the buckets'
    ``evidence_field="bucket"``; ``le`` is left as the exporter wrote it (OpenCensus: milliseconds).
    vLLM's time-to-first-token and end-to-end histograms come along (``bucket:ttft``,
    ``bucket:e2e-latency``, per pod and ``le`` in seconds) for the revisions that export them, and
    per revision the time of its newest counter sample (``newest``, Unix seconds).
    Valid as an instant query (one sample per series) and as a range query (the same, per step).
    """
    if not revisions:
        raise ValueError("a counter query needs at least one revision")
    if query.profile is None:
        return _restart_counters(revisions, query.labels or KSM_LABELS)
    if query.profile not in REQUESTS_PROFILES:
        raise ValueError(f"the counters need a concrete requests profile, got {query.profile}")
    metrics = query.metrics
    labels = requests_labels(metrics, query.labels, query.revision_label)
    selection = Selection(labels)

    def normalised(metric: str) -> str:
        series = f"{metric}{{{selection.matchers(revisions, metrics.scope_matcher(labels))}}}"
        relabelled = selection.by_revision(series, revisions)
        relabelled = relabel(relabelled, POD_LABEL, labels.pod, "(.+)")
        replacement = string_literal(metrics.code_replacement)
        return (
            f'label_replace({relabelled}, "{CODE_CLASS_LABEL}", "{replacement}", '
            f'"{metrics.code_label}", "{string_literal(metrics.code_pattern)}")'
        )

    counter = f"sum by ({_COUNTER_GROUP}) ({normalised(metrics.count_metric)})"
    buckets = f"sum by ({_COUNTER_GROUP}, le) ({normalised(metrics.bucket_metric)})"
    # How far each revision's evidence reaches: the time of its newest counter sample as Prometheus
    # holds it, behind any ingestion lag (remote write, Thanos, Mimir). timestamp() of a plain
    # selector reads the samples' own times (of any other expression, the evaluation time).
    # The same series as the counts (the queue-proxy's scope): a model server's own histogram in the
    # pod must not speak for how far the queue-proxy's evidence reaches.
    own = selection.matchers(revisions, metrics.scope_matcher(labels))
    stamped = selection.by_revision(f"timestamp({metrics.count_metric}{{{own}}})", revisions)
    newest = f"max by ({GROUP}) ({stamped})"
    parts = [
        with_field(counter, COUNTER_FIELD),
        with_field(buckets, BUCKET_FIELD),
        with_field(newest, NEWEST_FIELD),
    ]
    # vLLM's own histograms (in the model server, seconds; absent for other servers: no series).
    vllm_matchers = POD_SELECTION.matchers(revisions)
    for measure, histogram in ((MetricKind.TTFT.value, VLLM_TTFT), (MetricKind.E2E_LATENCY.value, VLLM_E2E)):
        series = POD_SELECTION.by_revision(f"{histogram}_bucket{{{vllm_matchers}}}", revisions)
        series = relabel(series, POD_LABEL, "pod", "(.+)")
        parts.append(with_field(f"sum by ({GROUP}, {POD_LABEL}, le) ({series})", f"{BUCKET_FIELD}:{measure}"))
    return union(*parts)


def _restart_counters(revisions: Collection[RevisionKey], labels: JoinLabels) -> str:
    """Restarts per pod and container (the init containers' too), raw: one series per container."""
    raw, selection = Selection(labels), POD_SELECTION
    parts = []
    for metric in (KSM_RESTARTS, KSM_INIT_RESTARTS):
        series = selection.by_revision(raw.canonical(f"{metric}{{{raw.matchers(revisions)}}}"), revisions)
        series = relabel(series, POD_LABEL, "pod", "(.+)")
        # Several kube-state-metrics replicas export the same counter: one value per container.
        parts.append(f"max by ({GROUP}, {POD_LABEL}, container) ({series})")
    restarts = relabel(" or ".join(f"({part})" for part in parts), CODE_CLASS_LABEL, "container")
    # Markers: the model container's (the storage-initializer's) last termination was an OOM kill.
    markers = []
    for reasons, container in (
        (KSM_LAST_TERMINATED, MODEL_CONTAINER),
        (KSM_INIT_LAST_TERMINATED, STORAGE_INITIALIZER),
    ):
        matchers = raw.matchers(revisions, f'{labels.container}="{container}", reason="OOMKilled"')
        series = selection.by_revision(raw.canonical(f"{reasons}{{{matchers}}} == 1"), revisions)
        series = relabel(series, POD_LABEL, "pod", "(.+)")
        markers.append(f"max by ({GROUP}, {POD_LABEL}, container) ({series})")
    oom = relabel(" or ".join(f"({part})" for part in markers), CODE_CLASS_LABEL, "container")
    return union(with_field(restarts, COUNTER_FIELD), with_field(oom, OOM_FIELD))


# ---------------------------------------------------------------------------------------------
# Gauge peaks per tick (the evidence pipeline's peak book, canary.metrics.counting.peaks.PeakBook)

PEAK_FIELD = "peak"  # evidence_field of a series' peak over the span (bytes for GPU memory)
PEAK_MEASURES = frozenset(
    {MetricKind.GPU_MEMORY_PEAK.value, MetricKind.KV_CACHE_USAGE.value, MetricKind.WARMUP_TIME.value}
)


@dataclass(frozen=True, slots=True)
class PeakQuery:
    """What shapes a gauge family's per-tick peak query, except the revisions and the span."""

    measure: str  # gpu-memory-peak or kv-cache-usage
    gpu_labels: GpuLabelStyle | None = None  # gpu-memory-peak only
    labels: JoinLabels | None = None  # gpu-memory-peak, warm-up: the resolved labels; None: the default


def render_peaks(query: PeakQuery, revisions: Collection[RevisionKey], span: str) -> str:
    """Per series (one GPU, one vLLM engine, one Ready pod) of every revision: its peak over the last
    ``span`` (warm-up: the pod's ready time minus its creation time).

    Not aggregated, so that the series seen over a window can be counted (the samples behind the
    value); every series carries ``namespace``, ``revision`` and ``evidence_field``: ``peak`` (GPU
    memory in bytes, KV cache as a fraction) and, for GPU memory, ``fraction`` — the peak of used /
    (used + free + reserved) on that GPU. The window's value is the maximum of the ticks' peaks.
    """
    if not revisions:
        raise ValueError("a peak query needs at least one revision")
    if query.measure == MetricKind.KV_CACHE_USAGE.value:
        matchers = POD_SELECTION.matchers(revisions)
        usage = (
            f"max_over_time({VLLM_KV_CACHE}{{{matchers}}}[{span}]) or "
            f"max_over_time({VLLM_KV_CACHE_OLD}{{{matchers}}}[{span}])"
        )
        return with_field(POD_SELECTION.by_revision(usage, revisions), PEAK_FIELD)
    if query.measure == MetricKind.WARMUP_TIME.value:
        # Per pod Ready in the span: ready time - creation time (one series per pod, replicas merged).
        raw = Selection(query.labels or KSM_LABELS)
        ready, created = (pod_peak(raw, metric, revisions, span) for metric in (KSM_READY_TIME, KSM_CREATED))
        each_pod = f"{ready} - on (namespace, pod, uid) {created}"
        return with_field(POD_SELECTION.by_revision(each_pod, revisions), PEAK_FIELD)
    if query.measure != MetricKind.GPU_MEMORY_PEAK.value:
        raise ValueError(f"{query.measure} has no per-tick peak")
    selection, peak_mib, total_mib = gpu_memory(query.gpu_labels, query.labels, revisions, span)
    peak_bytes = f"{selection.by_revision(peak_mib, revisions)} * {MIB}"
    fraction = selection.by_revision(f"{peak_mib} / {total_mib}", revisions)
    return union(with_field(peak_bytes, PEAK_FIELD), with_field(fraction, FIELD_FRACTION))
