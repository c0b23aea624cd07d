"""Per check, a short PromQL query that returns the canary revision's value alone (``kserve-canary explain``).

The controller never runs these: its evidence comes from grouped queries over many revisions and from
raw counter samples per tick (:mod:`canary.metrics.catalog`, :mod:`canary.metrics.counting`), which
answer several series per revision and cannot be pasted into Prometheus to see one number. These are
for people: an instant query, evaluated at the evaluation's time (``request.at``, the end of the
window explain shows), that answers **one series** — the canary's value in the check's canonical
unit (seconds, a ratio, bytes, a count) — over the window the evaluation used:

* counted measures (``error-rate``, ``latency``, ``ttft``, ``e2e-latency``, ``restarts``,
  ``oom-kills``): the evaluated window, ``[request.window_start, request.at]``; a canary's restarts
  and OOM kills while it is pending and in its first step from the rollout's start
  (``request.canary_born``: its warm-up is counted there);
* gauges and warm-up (``gpu-memory-peak``, ``kv-cache-usage``, ``warmup-time``) and templates: the
  window at least ``min_window`` long, as the evidence source asks for them;
* custom ``promql`` checks and ``spec.metrics.queries`` overrides: the policy's own template rendered
  for the canary exactly as the evidence source renders it (:func:`canary.metrics.promql.render_template`,
  the same variables), so the text is the query the controller ran for the canary.

Label values (namespace, revision) are escaped with :func:`~canary.metrics.promql.string_literal`
and, inside a regex, :func:`~canary.metrics.promql.regex_literal` first — never formatted in raw —
so a name holding quotes, backslashes or newlines cannot leave its selector.

Differences from the judged value, said in each :class:`~canary.evidence.CanaryQuery`'s ``note``:
the judge counts raw counter differences between the tick samples standing for the window's ends
(canary/rollout/SEMANTICS.md, "How it decides"); ``increase()`` extrapolates to the window's edges,
so a ratio or a quantile of them can differ slightly (a quantile stays within the same bucket but
for requests near its edges). Restarts, OOM kills, gauges and warm-up are read without
extrapolation (``max_over_time`` and an ``offset`` sample) and answer the judged value (OOM kills:
see its note).

Cost: built for every evaluation the evidence source answers, so each query's text is memoised per
(policy object, rollout, profile) with stand-ins for its windows; an evaluation only puts its windows
in (26 µs for 10 checks, against about 200 µs rendering them all).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace

from canary.evidence import CanaryQuery, EvidenceRequest
from canary.metrics.catalog import (
    DCGM_USED,
    KSM_CREATED,
    KSM_READY_TIME,
    MODEL_CONTAINER,
    REQUESTS_PROFILES,
    STORAGE_INITIALIZER,
    VLLM_E2E,
    VLLM_KV_CACHE,
    VLLM_KV_CACHE_OLD,
    VLLM_TTFT,
    Family,
)
from canary.metrics.detect import GPU_FAMILY, KUBE_STATE_FAMILY, REQUEST_LABELS_FAMILY, REQUESTS_FAMILY
from canary.metrics.labels import KSM_LABELS, JoinLabels
from canary.metrics.plan import family_labels
from canary.metrics.podnames import pod_pattern
from canary.metrics.promql import (
    TemplateError,
    format_duration_seconds,
    render_template,
    string_literal,
)
from canary.metrics.tenancy import Tenancy, TenancyError
from canary.policy.model import Check, GpuLabelStyle, MetricKind, PromotionPolicy, RequestsProfile

__all__ = [
    "EXTRAPOLATED_NOTE",
    "LAST_TERMINATED_METRICS",
    "QUANTILE_NOTE",
    "RESTARTS_METRICS",
    "canary_queries",
    "duration",
    "render_canary_query",
    "stable_queries",
]

_MIB = 1048576  # DCGM reports MiB; the value is in bytes
# kube-state-metrics' restart counters and last termination reasons, of containers and init containers.
RESTARTS_METRICS = "kube_pod_(init_)?container_status_restarts_total"
LAST_TERMINATED_METRICS = "kube_pod_(init_)?container_status_last_terminated_reason"

EXTRAPOLATED_NOTE = (
    "increase() extrapolates to the window's edges, so this can differ slightly from the judged value, "
    "which comes from raw counter differences"
)
QUANTILE_NOTE = (
    "histogram_quantile() interpolates within a bucket as the judge does, over increase()s that "
    "Prometheus extrapolates to the window's edges: this can differ slightly from the judged value, "
    "which comes from raw bucket counts"
)
_OOM_NOTE = (
    "counts the window's restarts of containers last terminated OOMKilled in it; the judge counts "
    "restarts while that was the last reason, the same unless a container also restarted otherwise"
)


def duration(seconds: float) -> str:
    """A PromQL range for people: ``10m`` or ``1h`` when whole, else ``123s``; at least ``1s``."""
    whole = max(1, round(seconds))
    if whole % 3600 == 0:
        return f"{whole // 3600}h"
    if whole % 60 == 0:
        return f"{whole // 60}m"
    return f"{whole}s"


def _quoted(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal."""
    return f'"{string_literal(value)}"'


def _pods_of(label: str, revision: str) -> str:
    """Matches exactly the names Knative and the apiserver give the revision's pods
    (:func:`canary.metrics.podnames.pod_pattern`: ``<revision>-deployment-<hash>-xxxxx`` while it
    fits in 63 characters, cut or md5-shortened beyond)."""
    return f"{label}=~{_quoted(pod_pattern(revision))}"


def _selector(metric: str, *matchers: str) -> str:
    return f"{metric}{_labels(*matchers)}"


def _labels(*matchers: str) -> str:
    return "{" + ", ".join(matchers) + "}"


# Stand-ins for the windows while a query's shape is memoised (private-use characters: escaping leaves
# them alone and no Kubernetes name holds them); each evaluation puts its own windows in.
_COUNTED = "\ue000counted\ue000"  # the evaluated window, for people (``10m``)
_RESTARTED = "\ue000restarted\ue000"  # the canary's restarts: the window, or since its birth (warm-up)
_SAMPLED = "\ue000sampled\ue000"  # at least min_window, for people
_TEMPLATED = "\ue000window\ue000"  # at least min_window, as {{ window }} is rendered (``600s``)
_MEMO_CAPACITY = 4096


class _Shapes:
    """Each check's query with stand-ins for the windows, per (policy, rollout, profile): the text
    does not change from one evaluation to the next, only the windows do (a few str.replace calls
    instead of rendering every query at every evaluation)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[object, ...], tuple[PromotionPolicy, dict[str, CanaryQuery | None]]] = {}

    def of(
        self, policy: PromotionPolicy, request: EvidenceRequest, profile: Mapping[str, str]
    ) -> dict[str, CanaryQuery | None]:
        key = (
            id(policy),
            request.namespace,
            request.inference_service,
            request.canary_revision,
            request.stable_revision,
            profile.get(REQUESTS_FAMILY),
            profile.get(REQUEST_LABELS_FAMILY),
            profile.get(GPU_FAMILY),
            profile.get(KUBE_STATE_FAMILY),
        )
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] is policy:  # the entry keeps its policy: no id reuse
                shapes = entry[1]
            else:
                if len(self._entries) >= _MEMO_CAPACITY:
                    self._entries.clear()
                shapes = {}
                self._entries[key] = (policy, shapes)
            for check in request.checks:
                if check.name not in shapes:
                    shapes[check.name] = _shape(check, policy, request, profile)
            return shapes


_SHAPES = _Shapes()


def canary_queries(
    policy: PromotionPolicy,
    request: EvidenceRequest,
    profile: Mapping[str, str],
    *,
    min_window: float,
    tenancy: Tenancy | None = None,
) -> dict[str, CanaryQuery]:
    """Per check of ``request`` (by name), the query returning the canary's value alone.

    ``profile`` is what the evidence source used (:attr:`~canary.evidence.Evidence.profile`: the
    requests profile and DCGM label style chosen or detected); a check whose metrics were not found
    (profile ``none``), whose template cannot be rendered or whose query ``tenancy`` refuses (its
    measurement says why) has no query; a custom query is shown scoped, as it is asked.
    """
    shapes = _SHAPES.of(policy, request, profile)
    windows = _windows(request, min_window)
    queries: dict[str, CanaryQuery] = {}
    for check in request.checks:
        shape = shapes.get(check.name)
        filled = (
            None
            if shape is None
            else _scoped(_filled(shape, windows), check, policy, request, profile, tenancy)
        )
        if filled is not None:
            queries[check.name] = filled
    return queries


def stable_queries(
    policy: PromotionPolicy,
    request: EvidenceRequest,
    profile: Mapping[str, str],
    *,
    min_window: float,
    tenancy: Tenancy | None = None,
) -> dict[str, CanaryQuery]:
    """The same queries for the stable revision alone (none without one), scoped alike: the
    dashboard draws the canary's and the stable's values side by side over the rollout."""
    if not request.stable_revision:
        return {}
    stable = replace(request, canary_revision=request.stable_revision, canary_born=None)
    return canary_queries(policy, stable, profile, min_window=min_window, tenancy=tenancy)


def _scoped(
    query: CanaryQuery,
    check: Check,
    policy: PromotionPolicy,
    request: EvidenceRequest,
    profile: Mapping[str, str],
    tenancy: Tenancy | None,
) -> CanaryQuery | None:
    """A custom query as it is asked: scoped to the namespace (None: refused)."""
    if not _templated(check, policy):
        return query
    style = profile.get(GPU_FAMILY)
    gpu = GpuLabelStyle(style) if style in set(GpuLabelStyle) else policy.spec.metrics.gpu_labels
    try:
        scoped = (tenancy or Tenancy()).scope(query.promql, request.namespace, _known(gpu))
    except TenancyError:
        return None
    return CanaryQuery(scoped, query.note)


def _templated(check: Check, policy: PromotionPolicy) -> bool:
    return check.promql is not None or (
        check.metric is not None and check.metric.value in policy.spec.metrics.queries
    )


def _known(gpu: GpuLabelStyle) -> GpuLabelStyle | None:
    return None if gpu is GpuLabelStyle.AUTO else gpu


def render_canary_query(
    check: Check,
    policy: PromotionPolicy,
    request: EvidenceRequest,
    profile: Mapping[str, str],
    *,
    min_window: float,
    tenancy: Tenancy | None = None,
) -> CanaryQuery | None:
    """The query for one check (see the module docstring); None when there is none to give."""
    shape = _shape(check, policy, request, profile)
    if shape is None:
        return None
    return _scoped(_filled(shape, _windows(request, min_window)), check, policy, request, profile, tenancy)


def _windows(request: EvidenceRequest, min_window: float) -> tuple[str, str, str, str]:
    seconds = request.window_seconds
    restarted = (request.at - request.restarts_start(side_is_canary=True)).total_seconds()
    return (
        duration(seconds),
        duration(max(min_window, seconds)),
        format_duration_seconds(max(min_window, seconds)),
        duration(restarted),
    )


def _filled(shape: CanaryQuery, windows: tuple[str, str, str, str]) -> CanaryQuery:
    counted, sampled, templated, restarted = windows
    promql = shape.promql.replace(_COUNTED, counted).replace(_SAMPLED, sampled).replace(_TEMPLATED, templated)
    return CanaryQuery(promql.replace(_RESTARTED, restarted), shape.note)


def _shape(
    check: Check, policy: PromotionPolicy, request: EvidenceRequest, profile: Mapping[str, str]
) -> CanaryQuery | None:
    """The query with stand-ins for its windows."""
    metrics = policy.spec.metrics
    template = check.promql
    if check.metric is not None:
        template = metrics.queries.get(check.metric.value, template)
    if template is not None:
        # As canary.metrics.plan.plan_rollout renders it for the canary.
        variables = {
            "namespace": request.namespace,
            "inferenceService": request.inference_service,
            "stableRevision": request.stable_revision or "",
            "window": _TEMPLATED,
            "interval": format_duration_seconds(policy.spec.interval),
            "revision": request.canary_revision,
        }
        try:
            return CanaryQuery(render_template(template, variables))
        except TemplateError:
            return None
    if check.metric is None:
        return None
    measure = check.metric
    namespace, revision = request.namespace, request.canary_revision
    counted, sampled = _COUNTED, _SAMPLED
    labels = family_labels(
        metrics,
        profile.get(REQUESTS_FAMILY),
        profile.get(REQUEST_LABELS_FAMILY, "scraped"),
        profile.get(GPU_FAMILY),
        profile.get(KUBE_STATE_FAMILY, "pod"),
    )
    if measure in {MetricKind.ERROR_RATE, MetricKind.LATENCY}:
        choice = profile.get(REQUESTS_FAMILY)
        if Family.REQUESTS not in labels or choice is None:
            return None
        return _requests(
            measure, RequestsProfile(choice), labels[Family.REQUESTS], namespace, revision, counted, check
        )
    ksm = labels.get(Family.KUBE_STATE, KSM_LABELS)
    if measure in {MetricKind.RESTARTS, MetricKind.OOM_KILLS, MetricKind.WARMUP_TIME}:
        return _kube_state(measure, ksm, namespace, revision, sampled)
    pods = ("namespace=" + _quoted(namespace), _pods_of("pod", revision))
    if measure in {MetricKind.TTFT, MetricKind.E2E_LATENCY}:
        histogram = VLLM_TTFT if measure is MetricKind.TTFT else VLLM_E2E
        buckets = f"sum by (le) (increase({_selector(histogram + '_bucket', *pods)}[{counted}]))"
        return CanaryQuery(f"histogram_quantile({check.effective_quantile!r}, {buckets})", QUANTILE_NOTE)
    if measure is MetricKind.KV_CACHE_USAGE:
        usage = " or ".join(
            f"max_over_time({_selector(metric, *pods)}[{sampled}])"
            for metric in (VLLM_KV_CACHE, VLLM_KV_CACHE_OLD)
        )
        return CanaryQuery(f"max({usage})")
    if measure is MetricKind.GPU_MEMORY_PEAK:
        gpu = labels.get(Family.DCGM)
        if gpu is None:
            return None
        gpus = (f"{gpu.namespace}={_quoted(namespace)}", _pods_of(gpu.pod, revision))
        return CanaryQuery(f"max(max_over_time({_selector(DCGM_USED, *gpus)}[{sampled}])) * {_MIB}")
    return None


def _kube_state(
    measure: MetricKind, labels: JoinLabels, namespace: str, revision: str, sampled: str
) -> CanaryQuery:
    """Restarts, OOM kills and warm-up, by kube-state-metrics' labels as they are (``exported_*`` too)."""
    pods = (f"{labels.namespace}={_quoted(namespace)}", _pods_of(labels.pod, revision))
    if measure is MetricKind.RESTARTS:
        return CanaryQuery(f"sum({_restarts(pods, _RESTARTED, labels)})")
    if measure is MetricKind.OOM_KILLS:
        return CanaryQuery(_oom_kills(pods, _RESTARTED, labels), _OOM_NOTE)
    per_pod = f"{labels.namespace}, {labels.pod}, uid"
    ready = f"max by ({per_pod}) (max_over_time({_selector(KSM_READY_TIME, *pods)}[{sampled}]))"
    created = f"max by ({per_pod}) (max_over_time({_selector(KSM_CREATED, *pods)}[{sampled}]))"
    return CanaryQuery(f"max({ready} - on ({per_pod}) {created})")


def _requests(
    measure: MetricKind,
    profile: RequestsProfile,
    labels: JoinLabels,
    namespace: str,
    revision: str,
    window: str,
    check: Check,
) -> CanaryQuery:
    family = REQUESTS_PROFILES[profile]
    own = [f"{labels.namespace}={_quoted(namespace)}"]
    own.append(
        f"{labels.revision}={_quoted(revision)}" if labels.revision else _pods_of(labels.pod, revision)
    )
    canary = [] if labels.target_info else list(own)  # target_info: the join selects the canary
    if family.series_matcher:
        canary.append(family.scope_matcher(labels))  # the queue-proxy's own series (Knative >= 1.19)

    def increase(*matchers: str, metric: str = family.count_metric) -> str:
        return labels.joined(f"increase({_selector(metric, *canary, *matchers)}[{window}])", own)

    if measure is MetricKind.ERROR_RATE:
        total = f"sum({increase()})"
        errors = f"sum({increase(family.server_error_matcher)})"
        # No 5xx series with requests present is 0 %; no request series at all is no answer.
        return CanaryQuery(f"({errors} or vector(0)) / {total}", EXTRAPOLATED_NOTE)
    buckets = f"sum by (le) ({increase(metric=family.bucket_metric)})"
    value = f"histogram_quantile({check.effective_quantile!r}, {buckets})"
    if family.latency_divisor != 1.0:
        value = f"{value} / {family.latency_divisor:g}"  # OpenCensus: milliseconds to seconds
    return CanaryQuery(value, QUANTILE_NOTE)


def _containers(labels: JoinLabels) -> str:
    return f"{labels.namespace}, {labels.pod}, {labels.container}"


def _restarts(pods: tuple[str, ...], window: str, labels: JoinLabels) -> str:
    """Restarts per container (init containers too) in the window, exact: the counter's peak minus its
    value at the window's start (a container born in the window counts from zero); several
    kube-state-metrics replicas count once."""
    series = _labels(f"__name__=~{_quoted(RESTARTS_METRICS)}", *pods)
    peak = f"max_over_time({series}[{window}])"
    return f"max by ({_containers(labels)}) ({peak} - ({series} offset {window} or 0 * {peak}))"


def _oom_kills(pods: tuple[str, ...], window: str, labels: JoinLabels) -> str:
    """The restarts of the model container and the storage-initializer whose last termination in the
    window was OOMKilled (the ``on`` match keeps only those containers); 0 when the pods are seen
    without one."""
    containers = f"{labels.container}=~{_quoted(f'{MODEL_CONTAINER}|{STORAGE_INITIALIZER}')}"
    reasons = _labels(
        f"__name__=~{_quoted(LAST_TERMINATED_METRICS)}", *pods, containers, 'reason="OOMKilled"'
    )
    killed = f"max by ({_containers(labels)}) (max_over_time({reasons}[{window}])) == 1"
    seen = _labels(f"__name__=~{_quoted(RESTARTS_METRICS)}", *pods)
    return (
        f"sum({_restarts(pods, window, labels)} * on ({_containers(labels)}) ({killed})) "
        f"or 0 * count(max_over_time({seen}[{window}]))"
    )
