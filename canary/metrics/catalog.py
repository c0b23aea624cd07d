"""The metric catalog: every builtin metric kind, for every metric profile, as grouped PromQL.

Each builtin query answers **many revisions at once**: it selects the series of every revision asked
for (in every namespace asked for) and aggregates them by namespace and revision. One HTTP round
trip therefore answers the canary and the stable revision of a rollout — and, when the windows
agree, every rollout evaluated in the same tick.

Output shape (what :mod:`canary.metrics.prometheus` parses)
------------------------------------------------------------
Every series of a builtin query carries the labels ``kserve_canary_namespace`` and
``kserve_canary_revision`` (written with ``label_replace`` from whatever the source labels are
called), and an optional ``kserve_canary_field`` label. The routing labels carry a prefix of their
own (:data:`RESERVED_PREFIX`, below "evidence_field" stands for that field label): were they called
``revision``, a workload exporting a ``revision`` label of its own would be misattributed, or make
two series of one labelset and the whole grouped query refused.

========================= ====================================================================
``evidence_field``        meaning
========================= ====================================================================
(absent)                  the value, already in the metric's canonical unit
``samples``               what the value rests on: requests, pods or GPUs seen in the window
``fraction``              gpu-memory-peak only: peak of used / (used + free + reserved) per GPU
========================= ====================================================================

Semantics built into the PromQL
-------------------------------
* **An absent numerator is zero, an absent denominator is no data.** Error rate: the 5xx rate is
  ``or``-ed with ``0 * total`` so a revision with requests and no 5xx series reads 0, while a revision
  without request series has no result at all (no data); 0 requests make 0/0 = NaN (no data). OOM
  kills and restarts: ``or 0 * pods`` — with pods present and no OOMKilled series the answer is 0; no
  pods, no result.
* Restarts and OOM kills are **exact integers**: restarts in the window are ``max_over_time`` of the
  restart counter minus its value at the window's start (0 for a pod born inside the window), not
  ``increase()``, whose extrapolation would report 1.03 OOM kills.
* Latencies are in seconds (OpenCensus' milliseconds are divided by 1000 in the query) and GPU memory
  in bytes (DCGM's MiB multiplied by 2**20), so the resolved PromQL returns exactly the evidence value.
* A latency quantile that falls into the ``+Inf`` bucket reads as the highest finite bucket bound
  (``histogram_quantile``'s rule): a lower bound of the truth.
* Requests are counted where the client's view is recorded: around the queue-proxy's breaker. On
  Knative >= 1.19 that is otelhttp's ``http_server_request_duration_seconds``, selected by its
  instrumentation scope (:data:`QUEUE_PROXY_SERVER_SCOPE` says why); the generation's own histogram
  only tells which Knative runs.
* Revisions are selected by a revision label (Knative <= 1.18: ``revision_name``; a relabelled label on
  the OpenTelemetry profiles when ``metrics.revisionLabel`` is set) or by pod name everywhere else:
  the exact names Knative and the apiserver give a revision's pods (:mod:`canary.metrics.podnames`,
  which says why not the ``serving.knative.dev/revision`` label), not ``<revision>-deployment-...``,
  which a 31-character InferenceService name already defeats.
* Which labels name the namespace, pod and revision is a family's :class:`~canary.metrics.labels.JoinLabels`
  (scraped, OTLP with promoted attributes, a ``target_info`` join, kube-state-metrics' and DCGM's
  ``exported_*``): the queries select and group on them and normalise them to ``namespace``,
  ``revision`` (and ``pod``, ``container``) before any aggregation that needs them.

Per-tick queries (the evidence pipeline, :mod:`canary.metrics.counting`)
------------------------------------------------------------------------
:func:`render_counters` samples *raw cumulative counters* — no ``rate``, no ``increase``, no range
selector — of every tracked revision at once: the request counter and latency buckets of a requests
profile summed by namespace, revision, pod and code class (and ``le``) (the class 2xx..5xx from the
status code; ``pod`` kept so that a queue-proxy restart is a reset of that pod's series), or
kube-state-metrics' restart counters per pod and container (:data:`RESTARTS_COUNTER`).
:func:`render_peaks` asks each GPU's / vLLM engine's peak since the previous tick. The revision is
read back from the pod name by one pattern per naming shape rather than one per revision
(``label_replace`` runs for every sample of every step of a backfill's range query); only revisions
whose Deployment name Knative md5-shortened add a join, on their pods' first 52 characters.

Approximations documented rather than hidden: kube-state-metrics keeps only the *last* termination
reason, so a container OOMKilled and then restarted for another reason in the same window counts its
restarts as OOM kills while the OOMKilled reason was seen in the window; warm-up counts only pods that
became Ready (kube_pod_status_ready_time exists only while a pod is Ready), so a revision whose pods
never get Ready has no warm-up value — the progress deadline judges that.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from canary.evidence import REQUESTS
from canary.metrics.families import (  # noqa: F401 - re-exported: the catalog is where callers look
    _OUTER_SERIES,
    _OUTER_SERIES_OR_UNSCOPED,
    DCGM_LABELS,
    KIND_FAMILY,
    OUTER_HISTOGRAM,
    QUEUE_PROXY_SERVER_SCOPE,
    REQUESTS_PROFILES,
    Family,
    GpuLabels,
    RequestsMetrics,
    measure_unit,
)
from canary.metrics.labels import KSM_LABELS, JoinLabels
from canary.metrics.podnames import CUT_REVISION, HASHED_KEY, KEPT_REVISION, PodNaming, hashed_key, naming
from canary.metrics.podnames import pods_pattern as _pods_pattern
from canary.metrics.promql import regex_alternation, string_literal
from canary.policy.model import GpuLabelStyle, MetricKind, RequestsProfile

__all__ = [
    "BUCKET_FIELD",
    "CODE_CLASS_LABEL",
    "COUNTER_FIELD",
    "DCGM_LABELS",
    "DCGM_METRICS",
    "FIELD_FRACTION",
    "FIELD_LABEL",
    "FIELD_SAMPLES",
    "KIND_FAMILY",
    "NAMESPACE_LABEL",
    "NEWEST_FIELD",
    "OOM_FIELD",
    "OUTER_HISTOGRAM",
    "PEAK_FIELD",
    "PEAK_MEASURES",
    "POD_LABEL",
    "QUEUE_PROXY_SERVER_SCOPE",
    "REQUESTS_PROFILES",
    "RESERVED_PREFIX",
    "RESTARTS_COUNTER",
    "REVISION_LABEL",
    "BuiltinQuery",
    "CounterQuery",
    "Family",
    "GpuLabels",
    "PeakQuery",
    "RequestsMetrics",
    "RevisionKey",
    "measure_unit",
    "render_builtin",
    "render_counters",
    "render_peaks",
]

# The labels a grouped query routes its answer by. label_replace writes them onto the workloads' own
# series, so they carry a prefix no exporter uses: a workload that exports a `revision` or
# `namespace` label of its own must neither be misattributed nor make two series of one labelset
# (Prometheus refuses such a query with "vector cannot contain metrics with the same labelset").
RESERVED_PREFIX = "kserve_canary_"
NAMESPACE_LABEL = RESERVED_PREFIX + "namespace"
REVISION_LABEL = RESERVED_PREFIX + "revision"
POD_LABEL = RESERVED_PREFIX + "pod"
# The label that tells a value series from its companions (see the module docstring).
FIELD_LABEL = RESERVED_PREFIX + "field"
FIELD_SAMPLES = "samples"
FIELD_FRACTION = "fraction"

_MIB = 1048576  # DCGM reports framebuffer memory in MiB; evidence is in bytes


DCGM_USED = "DCGM_FI_DEV_FB_USED"
DCGM_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_RESERVED = "DCGM_FI_DEV_FB_RESERVED"  # absent before DCGM 3; then the fraction is used/(used+free)
DCGM_METRICS = (DCGM_USED, DCGM_FREE, DCGM_RESERVED)

KSM_RESTARTS = "kube_pod_container_status_restarts_total"
KSM_INIT_RESTARTS = "kube_pod_init_container_status_restarts_total"
KSM_LAST_TERMINATED = "kube_pod_container_status_last_terminated_reason"
KSM_INIT_LAST_TERMINATED = "kube_pod_init_container_status_last_terminated_reason"
KSM_CREATED = "kube_pod_created"
KSM_READY_TIME = "kube_pod_status_ready_time"
MODEL_CONTAINER = "kserve-container"
STORAGE_INITIALIZER = "storage-initializer"

VLLM_KV_CACHE = "vllm:kv_cache_usage_perc"  # vLLM >= 0.10; a fraction despite the name
VLLM_KV_CACHE_OLD = "vllm:gpu_cache_usage_perc"  # older vLLM
VLLM_TTFT = "vllm:time_to_first_token_seconds"
VLLM_E2E = "vllm:e2e_request_latency_seconds"


@dataclass(frozen=True, slots=True, order=True)
class RevisionKey:
    """A revision, qualified by its namespace: the unit every builtin query groups by."""

    namespace: str
    revision: str


@dataclass(frozen=True, slots=True)
class BuiltinQuery:
    """A builtin measure with everything that shapes its PromQL except the revisions.

    Two rollouts whose needs produce equal ``BuiltinQuery`` values (same measure, profile and window)
    can be answered by one query over the union of their revisions.
    """

    measure: str  # a MetricKind value or REQUESTS
    window: str  # a PromQL duration, e.g. "300s"
    quantile: float | None = None
    requests_profile: RequestsProfile | None = None  # for the requests family
    revision_label: str | None = None  # OTel profiles: a relabelled revision label instead of pod names
    gpu_labels: GpuLabelStyle | None = None  # for the DCGM family
    labels: JoinLabels | None = None  # the family's resolved labels; None: its default (scraped) ones

    @property
    def family(self) -> Family:
        return KIND_FAMILY[self.measure]


# ---------------------------------------------------------------------------------------------
# Selecting and grouping series by revision


def _matcher(label: str, values: Collection[str]) -> str:
    unique = sorted(set(values))
    if len(unique) == 1:
        return f'{label}="{string_literal(unique[0])}"'
    return f'{label}=~"{string_literal(regex_alternation(unique))}"'


def _relabel(expression: str, target: str, source: str, pattern: str = "(.*)") -> str:
    if target == source:
        return expression
    return f'label_replace({expression}, "{target}", "$1", "{source}", "{string_literal(pattern)}")'


@dataclass(frozen=True, slots=True)
class _Selection:
    """How a family's series are attributed to (namespace, revision): by its :class:`JoinLabels`."""

    labels: JoinLabels

    def _revision_matchers(self, revisions: Collection[RevisionKey]) -> list[str]:
        names = [key.revision for key in revisions]
        parts = [_matcher(self.labels.namespace, [key.namespace for key in revisions])]
        if self.labels.revision is not None:
            parts.append(_matcher(self.labels.revision, names))
        else:
            parts.append(f'{self.labels.pod}=~"{string_literal(_pods_pattern(names))}"')
        return parts

    def matchers(self, revisions: Collection[RevisionKey], extra: str = "") -> str:
        """The series' matchers; with ``target_info`` the revisions are selected by the join
        (:meth:`by_revision`) and the series only by ``extra``."""
        parts = [] if self.labels.target_info else self._revision_matchers(revisions)
        if extra:
            parts.append(extra)
        return ", ".join(parts)

    def canonical(self, expression: str) -> str:
        """``expression`` with the workload's labels also under ``namespace``, ``pod``, ``container``."""
        for target, source in (
            ("namespace", self.labels.namespace),
            ("pod", self.labels.pod),
            ("container", self.labels.container),
        ):
            expression = _relabel(expression, target, source, "(.+)")
        return expression

    def by_revision(self, expression: str, revisions: Collection[RevisionKey]) -> str:
        """``expression`` relabelled so that it carries ``namespace`` and ``revision`` labels.

        With ``target_info`` the join adds them first (and keeps only the revisions asked for). By pod
        name: the selection already picked exactly the revisions' pods, so the revision is read back by
        one pattern per naming shape, not one per revision (:func:`_revision_from_pod`).
        """
        joined = self.labels.joined(expression, self._revision_matchers(revisions))
        relabelled = _relabel(joined, NAMESPACE_LABEL, self.labels.namespace)
        if self.labels.revision is not None:
            return _relabel(relabelled, REVISION_LABEL, self.labels.revision)
        return _revision_from_pod(relabelled, self.labels.pod, {key.revision for key in revisions})


_POD_KEY = RESERVED_PREFIX + "pod_key"  # the first 52 characters of a hashed revision's pod, while joining
_HASHED_REVISION = RESERVED_PREFIX + "hashed_revision"


def _revision_from_pod(expression: str, pod_label: str, revisions: Collection[str]) -> str:
    """The ``revision`` label read from the pod name (see :mod:`canary.metrics.podnames`).

    Kept and cut revisions' pods start with the revision's name: one ``label_replace`` each reads it.
    A hashed revision's pods only share their first 52 characters (its first 20 and its md5): they
    are joined with a constant vector mapping those to the name; every other series meets
    ``vector(1)`` there, so the join drops nothing and changes no value.
    """
    shapes = {naming(revision) for revision in revisions}
    if PodNaming.KEPT in shapes:
        expression = _relabel(expression, REVISION_LABEL, pod_label, KEPT_REVISION)
    if PodNaming.CUT in shapes:
        expression = _relabel(expression, REVISION_LABEL, pod_label, CUT_REVISION)
    hashed = sorted(revision for revision in revisions if naming(revision) is PodNaming.HASHED)
    if not hashed:
        return expression
    keyed = _relabel(expression, _POD_KEY, pod_label, HASHED_KEY)
    entries = ["vector(1)"]
    for revision in hashed:
        entry = f'label_replace(vector(1), "{_POD_KEY}", "{string_literal(hashed_key(revision))}", "", "")'
        entries.append(f'label_replace({entry}, "{_HASHED_REVISION}", "{string_literal(revision)}", "", "")')
    joined = f"{keyed} * on ({_POD_KEY}) group_left ({_HASHED_REVISION}) ({' or '.join(entries)})"
    named = _relabel(joined, REVISION_LABEL, _HASHED_REVISION, "(.+)")
    return _drop(_drop(named, _POD_KEY), _HASHED_REVISION)


def _drop(expression: str, label: str) -> str:
    return f'label_replace({expression}, "{label}", "", "", "")'


_POD_SELECTION = _Selection(JoinLabels())
_GROUP = f"{NAMESPACE_LABEL}, {REVISION_LABEL}"


def _with_field(expression: str, field: str) -> str:
    return f'label_replace({expression}, "{FIELD_LABEL}", "{field}", "", "")'


def _union(*expressions: str) -> str:
    return " or ".join(f"({expression})" for expression in expressions)


# ---------------------------------------------------------------------------------------------
# The builtin queries


def render_builtin(query: BuiltinQuery, revisions: Collection[RevisionKey]) -> str:
    """The PromQL answering ``query`` for every revision in ``revisions`` (see the module docstring)."""
    if not revisions:
        raise ValueError("a builtin query needs at least one revision")
    if query.family is Family.REQUESTS:
        return _requests_query(query, revisions)
    if query.family is Family.KUBE_STATE:
        return _kube_state_query(query, revisions)
    if query.family is Family.DCGM:
        return _gpu_memory_query(query, revisions)
    return _vllm_query(query, revisions)


def _requests_labels(
    metrics: RequestsMetrics, labels: JoinLabels | None, revision_label: str | None
) -> JoinLabels:
    """The resolved labels, or the profile's scraped ones with the policy's ``revisionLabel``."""
    if labels is not None:
        return labels
    scraped = metrics.scraped_labels
    return (
        scraped
        if scraped.revision is not None or not revision_label
        else replace(scraped, revision=revision_label)
    )


def _requests_query(query: BuiltinQuery, revisions: Collection[RevisionKey]) -> str:
    if query.requests_profile is None or query.requests_profile not in REQUESTS_PROFILES:
        raise ValueError(f"{query.measure} needs a concrete requests profile, got {query.requests_profile}")
    metrics = REQUESTS_PROFILES[query.requests_profile]
    selection = _Selection(_requests_labels(metrics, query.labels, query.revision_label))
    window = query.window

    def summed(function: str, metric: str, extra: str = "", by: str = _GROUP) -> str:
        scope = metrics.scope_matcher(selection.labels)
        matchers = selection.matchers(revisions, ", ".join(filter(None, (scope, extra))))
        series = f"{function}({metric}{{{matchers}}}[{window}])"
        return f"sum by ({by}) ({selection.by_revision(series, revisions)})"

    requests = summed("increase", metrics.count_metric)
    if query.measure == REQUESTS:
        return requests
    if query.measure == MetricKind.ERROR_RATE.value:
        total_rate = summed("rate", metrics.count_metric)
        errors_rate = summed("rate", metrics.count_metric, metrics.server_error_matcher)
        # No 5xx series with requests present is a 0% error rate, not missing data.
        value = f"({errors_rate} or 0 * {total_rate}) / {total_rate}"
        return _union(value, _with_field(requests, FIELD_SAMPLES))
    if query.measure == MetricKind.LATENCY.value:
        buckets = summed("rate", metrics.bucket_metric, by=f"{_GROUP}, le")
        value = f"histogram_quantile({query.quantile!r}, {buckets})"
        if metrics.latency_divisor != 1.0:
            value = f"{value} / {metrics.latency_divisor:g}"
        behind = summed("increase", metrics.histogram_count_metric)
        return _union(value, _with_field(behind, FIELD_SAMPLES))
    raise ValueError(f"{query.measure} is not a request metric")


def _per_pod(raw: _Selection, metric: str, revisions: Collection[RevisionKey], window: str) -> str:
    """A kube-state-metrics gauge's peak over the window per pod, under canonical labels."""
    series = f"max_over_time({metric}{{{raw.matchers(revisions)}}}[{window}])"
    return f"max by (namespace, pod, uid) ({raw.canonical(series)})"


def _restarts_in_window(metric: str, matchers: str, window: str) -> str:
    # Exact restarts inside the window: the counter's peak minus its value at the window's start;
    # a pod born inside the window has no value at the start and counts from zero.
    series = f"{metric}{{{matchers}}}"
    peak = f"max_over_time({series}[{window}])"
    return f"({peak} - ({series} offset {window} or 0 * {peak}))"


def _kube_state_query(query: BuiltinQuery, revisions: Collection[RevisionKey]) -> str:
    # The series as exported (the workload's labels may be exported_*), read under canonical names.
    raw = _Selection(query.labels or KSM_LABELS)
    selection = _POD_SELECTION
    window = query.window
    pods_matchers = raw.matchers(revisions)
    # One series per pod seen in the window (several kube-state-metrics replicas collapse into one).
    created = _per_pod(raw, KSM_CREATED, revisions, window)
    pods = f"count by ({_GROUP}) ({selection.by_revision(created, revisions)})"
    if query.measure == MetricKind.WARMUP_TIME.value:
        ready = _per_pod(raw, KSM_READY_TIME, revisions, window)
        per_pod = f"{ready} - on (namespace, pod, uid) {created}"
        value = f"max by ({_GROUP}) ({selection.by_revision(per_pod, revisions)})"
        measured = f"count by ({_GROUP}) ({selection.by_revision(ready, revisions)})"
        return _union(value, _with_field(measured, FIELD_SAMPLES))
    if query.measure == MetricKind.OOM_KILLS.value:
        parts = []
        for restarts, reasons, container in (
            (KSM_RESTARTS, KSM_LAST_TERMINATED, MODEL_CONTAINER),
            (KSM_INIT_RESTARTS, KSM_INIT_LAST_TERMINATED, STORAGE_INITIALIZER),
        ):
            matchers = raw.matchers(revisions, f'{raw.labels.container}="{container}"')
            reason = raw.canonical(f'max_over_time({reasons}{{{matchers}, reason="OOMKilled"}}[{window}])')
            oom_seen = f"max by (namespace, pod, container) ({reason} == 1)"
            parts.append(
                f"{raw.canonical(_restarts_in_window(restarts, matchers, window))} "
                f"* on (namespace, pod, container) group_left () {oom_seen}"
            )
        killed = " or ".join(f"({part})" for part in parts)
    elif query.measure == MetricKind.RESTARTS.value:
        killed = " or ".join(
            raw.canonical(_restarts_in_window(metric, pods_matchers, window))
            for metric in (KSM_RESTARTS, KSM_INIT_RESTARTS)
        )
    else:
        raise ValueError(f"{query.measure} is not a kube-state-metrics measure")
    # No OOMKilled (or restart) series with pods present is zero, not missing data.
    value = f"sum by ({_GROUP}) ({selection.by_revision(killed, revisions)}) or 0 * {pods}"
    return _union(value, _with_field(pods, FIELD_SAMPLES))


def _gpu_memory_query(query: BuiltinQuery, revisions: Collection[RevisionKey]) -> str:
    if query.gpu_labels is None or query.gpu_labels not in DCGM_LABELS:
        raise ValueError(f"gpu-memory-peak needs a concrete DCGM label style, got {query.gpu_labels}")
    selection = _Selection(query.labels or DCGM_LABELS[query.gpu_labels].join_labels)
    matchers = selection.matchers(revisions)
    window = query.window

    def over_window(function: str, metric: str) -> str:
        return f"{function}({metric}{{{matchers}}}[{window}])"

    peak_mib = over_window("max_over_time", DCGM_USED)
    # used + free + reserved is the GPU's framebuffer size: constant, so window averages add up to it.
    total_mib = (
        f"({over_window('avg_over_time', DCGM_USED)} + {over_window('avg_over_time', DCGM_FREE)} + "
        f"({over_window('avg_over_time', DCGM_RESERVED)} or 0 * {over_window('avg_over_time', DCGM_USED)}))"
    )
    peak_bytes = f"max by ({_GROUP}) ({selection.by_revision(peak_mib, revisions)}) * {_MIB}"
    fraction = f"max by ({_GROUP}) ({selection.by_revision(f'{peak_mib} / {total_mib}', revisions)})"
    gpus = f"count by ({_GROUP}) ({selection.by_revision(peak_mib, revisions)})"
    return _union(peak_bytes, _with_field(fraction, FIELD_FRACTION), _with_field(gpus, FIELD_SAMPLES))


def _vllm_query(query: BuiltinQuery, revisions: Collection[RevisionKey]) -> str:
    selection = _POD_SELECTION
    matchers = selection.matchers(revisions)
    window = query.window
    if query.measure == MetricKind.KV_CACHE_USAGE.value:
        # Old and new names: a pod exports one or the other (the vLLM version is per revision).
        usage = (
            f"max_over_time({VLLM_KV_CACHE}{{{matchers}}}[{window}]) or "
            f"max_over_time({VLLM_KV_CACHE_OLD}{{{matchers}}}[{window}])"
        )
        value = f"max by ({_GROUP}) ({selection.by_revision(usage, revisions)})"
        engines = f"count by ({_GROUP}) ({selection.by_revision(usage, revisions)})"
        return _union(value, _with_field(engines, FIELD_SAMPLES))
    histogram = {MetricKind.TTFT.value: VLLM_TTFT, MetricKind.E2E_LATENCY.value: VLLM_E2E}.get(query.measure)
    if histogram is None:
        raise ValueError(f"{query.measure} is not a vLLM measure")
    buckets = (
        f"sum by ({_GROUP}, le) "
        f"({selection.by_revision(f'rate({histogram}_bucket{{{matchers}}}[{window}])', revisions)})"
    )
    value = f"histogram_quantile({query.quantile!r}, {buckets})"
    behind = (
        f"sum by ({_GROUP}) "
        f"({selection.by_revision(f'increase({histogram}_count{{{matchers}}}[{window}])', revisions)})"
    )
    return _union(value, _with_field(behind, FIELD_SAMPLES))


# ---------------------------------------------------------------------------------------------
# Raw cumulative counters (the evidence pipeline's per-tick sample, canary.metrics.counting)

CODE_CLASS_LABEL = (
    RESERVED_PREFIX + "code_class"
)  # 1xx .. 5xx; absent when the exporter gave no readable code
COUNTER_FIELD = "count"  # evidence_field of the request counter's series
BUCKET_FIELD = "bucket"  # evidence_field of the latency histogram's bucket series
OOM_FIELD = "oom"  # evidence_field of a marker: this container's last termination was an OOM kill
# evidence_field of a revision's newest request-counter sample time (Unix seconds, Prometheus' own)
NEWEST_FIELD = "newest"
_COUNTER_GROUP = f"{_GROUP}, {POD_LABEL}, {CODE_CLASS_LABEL}"


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
    labels = _requests_labels(metrics, query.labels, query.revision_label)
    selection = _Selection(labels)

    def normalised(metric: str) -> str:
        series = f"{metric}{{{selection.matchers(revisions, metrics.scope_matcher(labels))}}}"
        relabelled = selection.by_revision(series, revisions)
        relabelled = _relabel(relabelled, POD_LABEL, labels.pod, "(.+)")
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
    newest = f"max by ({_GROUP}) ({stamped})"
    parts = [
        _with_field(counter, COUNTER_FIELD),
        _with_field(buckets, BUCKET_FIELD),
        _with_field(newest, NEWEST_FIELD),
    ]
    # vLLM's own histograms (in the model server, seconds; absent for other servers: no series).
    vllm_matchers = _POD_SELECTION.matchers(revisions)
    for measure, histogram in ((MetricKind.TTFT.value, VLLM_TTFT), (MetricKind.E2E_LATENCY.value, VLLM_E2E)):
        series = _POD_SELECTION.by_revision(f"{histogram}_bucket{{{vllm_matchers}}}", revisions)
        series = _relabel(series, POD_LABEL, "pod", "(.+)")
        parts.append(
            _with_field(f"sum by ({_GROUP}, {POD_LABEL}, le) ({series})", f"{BUCKET_FIELD}:{measure}")
        )
    return _union(*parts)


def _restart_counters(revisions: Collection[RevisionKey], labels: JoinLabels) -> str:
    """Restarts per pod and container (the init containers' too), raw: one series per container."""
    raw, selection = _Selection(labels), _POD_SELECTION
    parts = []
    for metric in (KSM_RESTARTS, KSM_INIT_RESTARTS):
        series = selection.by_revision(raw.canonical(f"{metric}{{{raw.matchers(revisions)}}}"), revisions)
        series = _relabel(series, POD_LABEL, "pod", "(.+)")
        # Several kube-state-metrics replicas export the same counter: one value per container.
        parts.append(f"max by ({_GROUP}, {POD_LABEL}, container) ({series})")
    restarts = _relabel(" or ".join(f"({part})" for part in parts), CODE_CLASS_LABEL, "container")
    # Markers: the model container's (the storage-initializer's) last termination was an OOM kill.
    markers = []
    for reasons, container in (
        (KSM_LAST_TERMINATED, MODEL_CONTAINER),
        (KSM_INIT_LAST_TERMINATED, STORAGE_INITIALIZER),
    ):
        matchers = raw.matchers(revisions, f'{labels.container}="{container}", reason="OOMKilled"')
        series = selection.by_revision(raw.canonical(f"{reasons}{{{matchers}}} == 1"), revisions)
        series = _relabel(series, POD_LABEL, "pod", "(.+)")
        markers.append(f"max by ({_GROUP}, {POD_LABEL}, container) ({series})")
    oom = _relabel(" or ".join(f"({part})" for part in markers), CODE_CLASS_LABEL, "container")
    return _union(_with_field(restarts, COUNTER_FIELD), _with_field(oom, OOM_FIELD))


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
        matchers = _POD_SELECTION.matchers(revisions)
        usage = (
            f"max_over_time({VLLM_KV_CACHE}{{{matchers}}}[{span}]) or "
            f"max_over_time({VLLM_KV_CACHE_OLD}{{{matchers}}}[{span}])"
        )
        return _with_field(_POD_SELECTION.by_revision(usage, revisions), PEAK_FIELD)
    if query.measure == MetricKind.WARMUP_TIME.value:
        # Per pod Ready in the span: ready time - creation time (one series per pod, replicas merged).
        raw = _Selection(query.labels or KSM_LABELS)
        ready, created = (_per_pod(raw, metric, revisions, span) for metric in (KSM_READY_TIME, KSM_CREATED))
        per_pod = f"{ready} - on (namespace, pod, uid) {created}"
        return _with_field(_POD_SELECTION.by_revision(per_pod, revisions), PEAK_FIELD)
    if query.measure != MetricKind.GPU_MEMORY_PEAK.value:
        raise ValueError(f"{query.measure} has no per-tick peak")
    if query.gpu_labels is None or query.gpu_labels not in DCGM_LABELS:
        raise ValueError(f"gpu-memory-peak needs a concrete DCGM label style, got {query.gpu_labels}")
    selection = _Selection(query.labels or DCGM_LABELS[query.gpu_labels].join_labels)
    matchers = selection.matchers(revisions)

    def over(function: str, metric: str) -> str:
        return f"{function}({metric}{{{matchers}}}[{span}])"

    peak_mib = over("max_over_time", DCGM_USED)
    total_mib = (
        f"({over('avg_over_time', DCGM_USED)} + {over('avg_over_time', DCGM_FREE)} + "
        f"({over('avg_over_time', DCGM_RESERVED)} or 0 * {over('avg_over_time', DCGM_USED)}))"
    )
    peak_bytes = f"{selection.by_revision(peak_mib, revisions)} * {_MIB}"
    fraction = selection.by_revision(f"{peak_mib} / {total_mib}", revisions)
    return _union(_with_field(peak_bytes, PEAK_FIELD), _with_field(fraction, FIELD_FRACTION))
