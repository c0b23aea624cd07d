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

Per-tick queries (raw counters and peaks) are :mod:`canary.metrics.tick_queries`'.

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
    "DCGM_LABELS",
    "DCGM_METRICS",
    "FIELD_FRACTION",
    "FIELD_LABEL",
    "FIELD_SAMPLES",
    "KIND_FAMILY",
    "NAMESPACE_LABEL",
    "OUTER_HISTOGRAM",
    "POD_LABEL",
    "QUEUE_PROXY_SERVER_SCOPE",
    "REQUESTS_PROFILES",
    "RESERVED_PREFIX",
    "REVISION_LABEL",
    "BuiltinQuery",
    "Family",
    "GpuLabels",
    "RequestsMetrics",
    "RevisionKey",
    "measure_unit",
    "render_builtin",
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

MIB = 1048576  # DCGM reports framebuffer memory in MiB; evidence is in bytes


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


def relabel(expression: str, target: str, source: str, pattern: str = "(.*)") -> str:
    if target == source:
        return expression
    return f'label_replace({expression}, "{target}", "$1", "{source}", "{string_literal(pattern)}")'


@dataclass(frozen=True, slots=True)
class Selection:
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
            expression = relabel(expression, target, source, "(.+)")
        return expression

    def by_revision(self, expression: str, revisions: Collection[RevisionKey]) -> str:
        """``expression`` relabelled so that it carries ``namespace`` and ``revision`` labels.

        With ``target_info`` the join adds them first (and keeps only the revisions asked for). By pod
        name: the selection already picked exactly the revisions' pods, so the revision is read back by
        one pattern per naming shape, not one per revision (:func:`_revision_from_pod`).
        """
        joined = self.labels.joined(expression, self._revision_matchers(revisions))
        relabelled = relabel(joined, NAMESPACE_LABEL, self.labels.namespace)
        if self.labels.revision is not None:
            return relabel(relabelled, REVISION_LABEL, self.labels.revision)
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
        expression = relabel(expression, REVISION_LABEL, pod_label, KEPT_REVISION)
    if PodNaming.CUT in shapes:
        expression = relabel(expression, REVISION_LABEL, pod_label, CUT_REVISION)
    hashed = sorted(revision for revision in revisions if naming(revision) is PodNaming.HASHED)
    if not hashed:
        return expression
    keyed = relabel(expression, _POD_KEY, pod_label, HASHED_KEY)
    entries = ["vector(1)"]
    for revision in hashed:
        entry = f'label_replace(vector(1), "{_POD_KEY}", "{string_literal(hashed_key(revision))}", "", "")'
        entries.append(f'label_replace({entry}, "{_HASHED_REVISION}", "{string_literal(revision)}", "", "")')
    joined = f"{keyed} * on ({_POD_KEY}) group_left ({_HASHED_REVISION}) ({' or '.join(entries)})"
    named = relabel(joined, REVISION_LABEL, _HASHED_REVISION, "(.+)")
    return _drop(_drop(named, _POD_KEY), _HASHED_REVISION)


def _drop(expression: str, label: str) -> str:
    return f'label_replace({expression}, "{label}", "", "", "")'


POD_SELECTION = Selection(JoinLabels())
GROUP = f"{NAMESPACE_LABEL}, {REVISION_LABEL}"


def with_field(expression: str, field: str) -> str:
    return f'label_replace({expression}, "{FIELD_LABEL}", "{field}", "", "")'


def union(*expressions: str) -> str:
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


def requests_labels(
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
    selection = Selection(requests_labels(metrics, query.labels, query.revision_label))
    window = query.window

    def summed(function: str, metric: str, extra: str = "", by: str = GROUP) -> str:
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
        return union(value, with_field(requests, FIELD_SAMPLES))
    if query.measure == MetricKind.LATENCY.value:
        buckets = summed("rate", metrics.bucket_metric, by=f"{GROUP}, le")
        value = f"histogram_quantile({query.quantile!r}, {buckets})"
        if metrics.latency_divisor != 1.0:
            value = f"{value} / {metrics.latency_divisor:g}"
        behind = summed("increase", metrics.histogram_count_metric)
        return union(value, with_field(behind, FIELD_SAMPLES))
    raise ValueError(f"{query.measure} is not a request metric")


def pod_peak(raw: Selection, metric: str, revisions: Collection[RevisionKey], window: str) -> str:
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
    raw = Selection(query.labels or KSM_LABELS)
    selection = POD_SELECTION
    window = query.window
    pods_matchers = raw.matchers(revisions)
    # One series per pod seen in the window (several kube-state-metrics replicas collapse into one).
    created = pod_peak(raw, KSM_CREATED, revisions, window)
    pods = f"count by ({GROUP}) ({selection.by_revision(created, revisions)})"
    if query.measure == MetricKind.WARMUP_TIME.value:
        ready = pod_peak(raw, KSM_READY_TIME, revisions, window)
        each_pod = f"{ready} - on (namespace, pod, uid) {created}"
        value = f"max by ({GROUP}) ({selection.by_revision(each_pod, revisions)})"
        measured = f"count by ({GROUP}) ({selection.by_revision(ready, revisions)})"
        return union(value, with_field(measured, FIELD_SAMPLES))
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
    value = f"sum by ({GROUP}) ({selection.by_revision(killed, revisions)}) or 0 * {pods}"
    return union(value, with_field(pods, FIELD_SAMPLES))


def _gpu_memory_query(query: BuiltinQuery, revisions: Collection[RevisionKey]) -> str:
    selection, peak_mib, total_mib = gpu_memory(query.gpu_labels, query.labels, revisions, query.window)
    peak_bytes = f"max by ({GROUP}) ({selection.by_revision(peak_mib, revisions)}) * {MIB}"
    fraction = f"max by ({GROUP}) ({selection.by_revision(f'{peak_mib} / {total_mib}', revisions)})"
    gpus = f"count by ({GROUP}) ({selection.by_revision(peak_mib, revisions)})"
    return union(peak_bytes, with_field(fraction, FIELD_FRACTION), with_field(gpus, FIELD_SAMPLES))


def gpu_memory(
    style: GpuLabelStyle | None, labels: JoinLabels | None, revisions: Collection[RevisionKey], span: str
) -> tuple[Selection, str, str]:
    """DCGM's selection in label ``style`` (or the resolved ``labels``), each GPU's peak framebuffer
    use over ``span`` and its framebuffer size, in MiB, per series."""
    if style is None or style not in DCGM_LABELS:
        raise ValueError(f"gpu-memory-peak needs a concrete DCGM label style, got {style}")
    selection = Selection(labels or DCGM_LABELS[style].join_labels)
    matchers = selection.matchers(revisions)

    def over(function: str, metric: str) -> str:
        return f"{function}({metric}{{{matchers}}}[{span}])"

    # used + free + reserved is the GPU's framebuffer size: constant, so window averages add up to it.
    total_mib = (
        f"({over('avg_over_time', DCGM_USED)} + {over('avg_over_time', DCGM_FREE)} + "
        f"({over('avg_over_time', DCGM_RESERVED)} or 0 * {over('avg_over_time', DCGM_USED)}))"
    )
    return selection, over("max_over_time", DCGM_USED), total_mib


def _vllm_query(query: BuiltinQuery, revisions: Collection[RevisionKey]) -> str:
    selection = POD_SELECTION
    matchers = selection.matchers(revisions)
    window = query.window
    if query.measure == MetricKind.KV_CACHE_USAGE.value:
        # Old and new names: a pod exports one or the other (the vLLM version is per revision).
        usage = (
            f"max_over_time({VLLM_KV_CACHE}{{{matchers}}}[{window}]) or "
            f"max_over_time({VLLM_KV_CACHE_OLD}{{{matchers}}}[{window}])"
        )
        value = f"max by ({GROUP}) ({selection.by_revision(usage, revisions)})"
        engines = f"count by ({GROUP}) ({selection.by_revision(usage, revisions)})"
        return union(value, with_field(engines, FIELD_SAMPLES))
    histogram = {MetricKind.TTFT.value: VLLM_TTFT, MetricKind.E2E_LATENCY.value: VLLM_E2E}.get(query.measure)
    if histogram is None:
        raise ValueError(f"{query.measure} is not a vLLM measure")
    buckets = (
        f"sum by ({GROUP}, le) "
        f"({selection.by_revision(f'rate({histogram}_bucket{{{matchers}}}[{window}])', revisions)})"
    )
    value = f"histogram_quantile({query.quantile!r}, {buckets})"
    behind = (
        f"sum by ({GROUP}) "
        f"({selection.by_revision(f'increase({histogram}_count{{{matchers}}}[{window}])', revisions)})"
    )
    return union(value, with_field(behind, FIELD_SAMPLES))
