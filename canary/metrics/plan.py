"""From evidence requests to as few queries as possible, and from answers back to measurements.

Pure functions, no I/O: :func:`plan_rollout` lists what one rollout needs (:class:`Need`: an evidence
key for a revision, and the :class:`GroupedAsk` or :class:`SingleAsk` that answers it);
:func:`merge_asks` merges equal asks so that one grouped query serves the canary and the stable
revision — and every rollout collected in the same tick whose window is the same —; the
``parse_*`` functions (:mod:`canary.metrics.answers`) and :func:`measurement_for` turn Prometheus
answers into :class:`~canary.evidence.Measurement` values.

Evidence keys
-------------
* :data:`~canary.evidence.REQUESTS` (``request-count``): requests the revision received in the window,
  an integer from the counter book (:mod:`canary.metrics.counting`: raw counter differences between
  the tick samples standing for the window's start and end; counter resets handled, no
  extrapolation). No request series at all is no-data; a series with no increase is ``0``.
  ``latency`` and ``error-rate`` come from the same counts (:class:`CountsAsk`): the 5xx share of the
  requests, and the quantile interpolated inside its latency bucket as ``histogram_quantile`` does;
  ``ttft`` and ``e2e-latency`` likewise from vLLM's histograms, sampled with the same query (their
  tallies travel in ``Evidence.counts`` under those names).
  ``restarts`` and ``oom-kills`` come from a counter book of kube-state-metrics' restart counters
  the same way (a pod born after the window's first sample counts all its restarts; an OOM kill is
  a restart counted while the container's last termination reason was OOMKilled); samples: pods.
* ``<check name>``: the check's value in its canonical unit; ``samples`` is what it rests on (requests
  for latency/error-rate/ttft/e2e-latency, pods for oom-kills/restarts/warm-up, GPUs for
  gpu-memory-peak, vLLM engines for kv-cache-usage).
* ``gpu-memory-peak``, ``kv-cache-usage`` and ``warmup-time`` come from the peak book
  (:class:`PeaksAsk`): one query per family per tick gives each series' peak since the previous tick
  (warm-up: per pod Ready, ready time - creation time); the window's value is the maximum of those
  peaks, ``samples`` the series (GPUs, engines, Ready pods) seen in the window.
* ``<check name>:fraction`` (:func:`fraction_key`) — gpu-memory-peak checks only: the peak over the
  window of used / (used + free + reserved) on the fullest GPU of the revision, a ratio in [0, 1]. This
  is what ``maxFraction`` is judged on; ``<check name>`` carries the peak in bytes on the fullest GPU.
  Check names cannot contain ``:``, so the key never collides with a check.

Checks with ``maxIncrease`` (and comparable to the stable revision) get a stable measurement under the
same key; ``request-count`` is reported for the stable revision whenever one is being compared.

Overrides (``spec.metrics.queries``) and custom ``promql`` checks are templates about *one* revision
(``{{ revision }}``): they are run once per revision, must return one series (or a scalar), and are
taken literally — an empty answer is no-data, with no "absent numerator" reading. An override of
gpu-memory-peak replaces the bytes value only; the fraction keeps coming from the builtin DCGM query.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from canary.evidence import (
    FRACTION_SUFFIX,
    REQUESTS,
    ErrorClass,
    EvidenceRequest,
    EvidenceStatus,
    Measurement,
    fraction_key,
)
from canary.metrics.answers import VALUE_FIELD, GroupedAnswer, parse_grouped, parse_single, shown
from canary.metrics.catalog import (
    DCGM_LABELS,
    FIELD_FRACTION,
    FIELD_SAMPLES,
    KIND_FAMILY,
    REQUESTS_PROFILES,
    BuiltinQuery,
    Family,
    RevisionKey,
    measure_unit,
)
from canary.metrics.client import QueryFailure, QueryOutcome
from canary.metrics.labels import JoinLabels, kube_state_labels, overridden, request_labels
from canary.metrics.promql import TemplateError, format_duration_seconds, render_template
from canary.metrics.tenancy import Tenancy, TenancyError, profile_metrics
from canary.metrics.tick_queries import PEAK_MEASURES, CounterQuery, PeakQuery
from canary.policy.model import (
    Check,
    GpuLabelStyle,
    KubeStateLabelStyle,
    MetricKind,
    MetricsSpec,
    PromotionPolicy,
    RequestLabelStyle,
    RequestsProfile,
)
from canary.policy.units import Unit

__all__ = [
    "COUNTED_MEASURES",
    "FRACTION_SUFFIX",
    "VALUE_FIELD",
    "CountsAsk",
    "GroupedAnswer",
    "GroupedAsk",
    "Need",
    "PeaksAsk",
    "QueryGrouping",
    "Resolution",
    "Side",
    "SingleAsk",
    "builtin_query",
    "families_needed",
    "family_labels",
    "fraction_key",
    "measurement_for",
    "merge_asks",
    "parse_grouped",
    "parse_single",
    "plan_rollout",
]

# Measures whose value is a statistic over requests: fewer requests than the minimum is no data.
_REQUEST_BASED = frozenset(
    {
        MetricKind.LATENCY.value,
        MetricKind.ERROR_RATE.value,
        MetricKind.TTFT.value,
        MetricKind.E2E_LATENCY.value,
    }
)


class Side(StrEnum):
    CANARY = "canary"
    STABLE = "stable"


class QueryGrouping(StrEnum):
    """How far queries are shared. The first two are the product; the last is the naive baseline."""

    PER_TICK = "per-tick"  # a builtin query serves every rollout collected together with the same window
    PER_ROLLOUT = "per-rollout"  # a builtin query serves the canary and stable revision of one rollout
    PER_REVISION = "per-revision"  # one query per check per revision (what peers do; for benchmarks)


@dataclass(frozen=True, slots=True)
class GroupedAsk:
    """A builtin query, before the revisions it will cover are known. Equal asks are merged."""

    query: BuiltinQuery
    at: datetime
    scope: tuple[object, ...] = ()  # () shares across rollouts; a rollout index keeps it private


@dataclass(frozen=True, slots=True)
class SingleAsk:
    """A rendered per-revision query (an override or a custom promql check)."""

    promql: str
    at: datetime


@dataclass(frozen=True, slots=True)
class CountsAsk:
    """A measure answered from the counter book (request-count, error-rate, latency): no query of its
    own; the tick's counter sample of its requests family (``counter``) serves every rollout."""

    counter: CounterQuery
    quantile: float | None = None  # latency only


@dataclass(frozen=True, slots=True)
class PeaksAsk:
    """A gauge peak answered from the peak book (gpu-memory-peak and its fraction, kv-cache-usage):
    one peak query per family per tick serves every rollout (canary.metrics.counting.peaks)."""

    peaks: PeakQuery


Ask = GroupedAsk | SingleAsk | CountsAsk | PeaksAsk

# The measures the counter book answers (canary.metrics.counting); the others are queried per window.
COUNTED_MEASURES = frozenset({REQUESTS, MetricKind.LATENCY.value, MetricKind.ERROR_RATE.value})
# vLLM's histograms come with the requests profile's counter sample when a profile is known.
VLLM_COUNTED = frozenset({MetricKind.TTFT.value, MetricKind.E2E_LATENCY.value})


@dataclass(frozen=True, slots=True)
class Need:
    """One measurement one rollout needs: an evidence key, for one revision."""

    rollout: int
    side: Side
    key: str
    revision: RevisionKey
    unit: Unit
    measure: str | None  # a builtin measure (MetricKind value or REQUESTS); None for a custom promql
    field: str | None = None  # None: the value; FIELD_FRACTION: the gpu-memory fraction
    ask: Ask | None = None
    settled: Measurement | None = None  # known without asking (nothing detected, a template error)


@dataclass(frozen=True, slots=True)
class Resolution:
    """A family's profile for one policy: a concrete choice, or the measurement every need of it gets."""

    choice: str | None = None
    unavailable: Measurement | None = None  # no-data (nothing detected) or error (detection failed)
    labels: JoinLabels | None = None  # the labels its series are joined on (None: the default ones)


def family_labels(
    spec: MetricsSpec,
    requests: str | None,
    request_style: str | None,
    gpu: str | None,
    kube_state: str | None,
) -> dict[Family, JoinLabels]:
    """The labels each family's series are joined on, from the profile and styles in use (configured or
    detected; a family whose choice is unknown is left out) and the policy's ``labels``."""
    labels: dict[Family, JoinLabels] = {}
    if requests in _REQUESTS_CHOICES and request_style in _REQUEST_STYLES:
        scraped = REQUESTS_PROFILES[RequestsProfile(requests)].scraped_labels
        labels[Family.REQUESTS] = request_labels(scraped, RequestLabelStyle(request_style), spec)
    if gpu in _GPU_CHOICES:
        labels[Family.DCGM] = overridden(DCGM_LABELS[GpuLabelStyle(gpu)].join_labels, spec.labels.gpu)
    if kube_state in _KSM_STYLES:
        labels[Family.KUBE_STATE] = kube_state_labels(KubeStateLabelStyle(kube_state), spec)
    return labels


_REQUESTS_CHOICES = frozenset(profile.value for profile in REQUESTS_PROFILES)
_REQUEST_STYLES = frozenset(style.value for style in RequestLabelStyle if style is not RequestLabelStyle.AUTO)
_GPU_CHOICES = frozenset(style.value for style in DCGM_LABELS)
_KSM_STYLES = frozenset(style.value for style in KubeStateLabelStyle if style is not KubeStateLabelStyle.AUTO)


def families_needed(policy: PromotionPolicy) -> set[Family]:
    """The metric families whose builtin queries this policy uses (overridden measures excluded)."""
    overrides = policy.spec.metrics.queries
    measures = {REQUESTS} | {check.metric.value for check in policy.spec.checks if check.metric is not None}
    needed = {KIND_FAMILY[measure] for measure in measures if measure not in overrides}
    if any(check.metric is MetricKind.GPU_MEMORY_PEAK for check in policy.spec.checks):
        needed.add(Family.DCGM)  # the fraction always comes from the builtin DCGM query
    custom = [check.promql for check in policy.spec.checks if check.promql] + list(overrides.values())
    if any("DCGM_" in template for template in custom):
        needed.add(Family.DCGM)  # its label style scopes a custom query on DCGM metrics (tenancy)
    return needed


def _wants_stable(check: Check, request: EvidenceRequest) -> bool:
    return (
        request.stable_revision is not None
        and request.compare_with_stable
        and check.max_increase is not None
        and check.comparable_to_stable
    )


def plan_rollout(
    rollout: int,
    policy: PromotionPolicy,
    request: EvidenceRequest,
    resolutions: Mapping[Family, Resolution],
    *,
    min_window: float,
    grouping: QueryGrouping,
    tenancy: Tenancy | None = None,
) -> list[Need]:
    """Everything one evaluation of one rollout needs, each with the ask that answers it (custom
    queries scoped to the policy's namespace by ``tenancy``, :mod:`canary.metrics.tenancy`)."""
    window = format_duration_seconds(max(min_window, request.window_seconds))
    variables = {
        "namespace": request.namespace,
        "inferenceService": request.inference_service,
        "stableRevision": request.stable_revision or "",
        "window": window,
        "interval": format_duration_seconds(policy.spec.interval),
    }
    planner = _Planner(
        rollout,
        request,
        resolutions,
        policy.spec.metrics,
        grouping,
        window,
        variables,
        tenancy or Tenancy(),
        _gpu_style(policy, resolutions),
        _resolved_tenancy(resolutions),
    )
    sides = _sides(request)
    needs: list[Need] = []
    for side, revision in sides:
        needs.extend(planner.measure_needs(side, REQUESTS, revision, REQUESTS, None))
    for check in policy.spec.checks:
        check_sides = sides if _wants_stable(check, request) else sides[:1]
        for side, revision in check_sides:
            if check.metric is not None:
                needs.extend(
                    planner.measure_needs(
                        side, check.name, revision, check.metric.value, check.effective_quantile
                    )
                )
            elif check.promql is not None:
                needs.append(
                    planner.template_need(side, check.name, revision, check.value_unit, None, check.promql)
                )
    return needs


def _resolved_tenancy(resolutions: Mapping[Family, Resolution]) -> tuple[tuple[str, str], ...]:
    """Where a detected (or configured) label style names the namespace differently from the profile:
    OTLP's ``k8s_namespace_name`` on the request metrics, ``exported_namespace`` on kube-state-metrics'.
    Namespaces known only from ``target_info`` are not on the series: the profile's label stays (and
    matches nothing: closed)."""
    pairs: list[tuple[str, str]] = []
    requests = resolutions.get(Family.REQUESTS, Resolution())
    if (
        requests.labels is not None
        and not requests.labels.target_info
        and requests.choice in set(RequestsProfile)
    ):
        profile = REQUESTS_PROFILES.get(RequestsProfile(requests.choice))
        if profile is not None:
            pairs += [(name, requests.labels.namespace) for name in sorted(profile_metrics(profile))]
    kube_state = resolutions.get(Family.KUBE_STATE, Resolution()).labels
    if kube_state is not None:
        pairs.append(("kube_*", kube_state.namespace))
    return tuple(pairs)


def _gpu_style(policy: PromotionPolicy, resolutions: Mapping[Family, Resolution]) -> GpuLabelStyle | None:
    """The DCGM label style custom queries are scoped by: the policy's, else the detected one."""
    configured = policy.spec.metrics.gpu_labels
    if configured is not GpuLabelStyle.AUTO:
        return configured
    choice = resolutions.get(Family.DCGM, Resolution()).choice
    return GpuLabelStyle(choice) if choice else None


def _sides(request: EvidenceRequest) -> list[tuple[Side, RevisionKey]]:
    """The canary, and the stable revision when the rollout is compared with it."""
    canary = RevisionKey(request.namespace, request.canary_revision)
    if request.stable_revision is None or not request.compare_with_stable:
        return [(Side.CANARY, canary)]
    return [(Side.CANARY, canary), (Side.STABLE, RevisionKey(request.namespace, request.stable_revision))]


def builtin_query(
    measure: str,
    window: str,
    quantile: float | None,
    choice: str | None,
    revision_label: str | None,
    labels: JoinLabels | None = None,
) -> BuiltinQuery:
    """The catalog's query for ``measure`` with the profile (or DCGM label style) ``choice`` of its family,
    and the family's resolved ``labels`` (None: its default ones)."""
    family = KIND_FAMILY[measure]
    return BuiltinQuery(
        measure=measure,
        window=window,
        quantile=quantile,
        requests_profile=RequestsProfile(choice) if family is Family.REQUESTS and choice else None,
        revision_label=revision_label if family is Family.REQUESTS else None,
        gpu_labels=GpuLabelStyle(choice) if family is Family.DCGM and choice else None,
        labels=labels,
    )


@dataclass(frozen=True, slots=True)
class _Planner:
    """What the needs of one rollout are planned from: :func:`plan_rollout`'s arguments, the window as
    PromQL and the template variables every revision shares."""

    rollout: int
    request: EvidenceRequest
    resolutions: Mapping[Family, Resolution]
    metrics: MetricsSpec
    grouping: QueryGrouping
    window: str
    variables: Mapping[str, str]
    tenancy: Tenancy
    gpu: GpuLabelStyle | None
    resolved: tuple[tuple[str, str], ...]  # metric glob -> tenancy label, from the detected label styles

    def measure_needs(
        self, side: Side, key: str, revision: RevisionKey, measure: str, quantile: float | None
    ) -> list[Need]:
        """The need of a builtin measure (or of its override), and of a gpu check's fraction."""
        override = self.metrics.queries.get(measure)
        if override is not None:
            needs = [self.template_need(side, key, revision, measure_unit(measure), measure, override)]
        else:
            needs = [self._builtin_need(side, key, revision, measure, quantile, None)]
        if measure == MetricKind.GPU_MEMORY_PEAK.value:
            needs.append(self._builtin_need(side, fraction_key(key), revision, measure, None, FIELD_FRACTION))
        return needs

    def template_need(
        self, side: Side, key: str, revision: RevisionKey, unit: Unit, measure: str | None, template: str
    ) -> Need:
        """A need answered by a query template rendered for ``revision`` (settled on a template error)."""
        variables = {**self.variables, "revision": revision.revision}
        try:
            promql = render_template(template, variables)
        except TemplateError as error:
            settled = Measurement.error(
                ErrorClass.BAD_QUERY, f"query template: {error}", unit, query=template
            )
            return Need(self.rollout, side, key, revision, unit, measure, settled=settled)
        try:
            promql = self.tenancy.scope(promql, self.request.namespace, self.gpu, self.resolved)
        except TenancyError as error:
            detail = f"refused, not asked: {error}"
            settled = Measurement.error(ErrorClass.BAD_QUERY, detail, unit, query=promql)
            return Need(self.rollout, side, key, revision, unit, measure, settled=settled)
        return Need(self.rollout, side, key, revision, unit, measure, ask=SingleAsk(promql, self.request.at))

    def _builtin_need(
        self,
        side: Side,
        key: str,
        revision: RevisionKey,
        measure: str,
        quantile: float | None,
        field: str | None,
    ) -> Need:
        unit = Unit.RATIO if field == FIELD_FRACTION else measure_unit(measure)
        resolution = self.resolutions.get(KIND_FAMILY[measure], Resolution())
        if resolution.unavailable is not None:
            settled = _relabelled(resolution.unavailable, unit)
            return Need(self.rollout, side, key, revision, unit, measure, field, settled=settled)
        ask = self._builtin_ask(side, key, measure, quantile, resolution)
        return Need(self.rollout, side, key, revision, unit, measure, field, ask=ask)

    def _builtin_ask(
        self, side: Side, key: str, measure: str, quantile: float | None, resolution: Resolution
    ) -> Ask:
        """The book or the query that answers a builtin measure, given its family's profile."""
        family = KIND_FAMILY[measure]
        choice, labels = resolution.choice, resolution.labels
        if measure in {MetricKind.RESTARTS.value, MetricKind.OOM_KILLS.value}:
            return CountsAsk(CounterQuery(None, labels=labels))
        if measure in COUNTED_MEASURES and choice:
            return CountsAsk(
                CounterQuery(RequestsProfile(choice), self.metrics.revision_label, labels), quantile
            )
        requests = self.resolutions.get(Family.REQUESTS, Resolution())
        if measure in VLLM_COUNTED and requests.choice:
            # vLLM's histograms travel in the requests profile's counter sample (the same tallies).
            counter = CounterQuery(
                RequestsProfile(requests.choice), self.metrics.revision_label, requests.labels
            )
            return CountsAsk(counter, quantile)
        if measure in PEAK_MEASURES and (family is not Family.DCGM or choice):
            gpu = GpuLabelStyle(choice) if family is Family.DCGM and choice else None
            return PeaksAsk(PeakQuery(measure, gpu, labels if family is not Family.VLLM else None))
        query = builtin_query(measure, self.window, quantile, choice, self.metrics.revision_label, labels)
        # A gpu check's value and fraction come from one query, whatever the grouping.
        return GroupedAsk(query, self.request.at, self._scope(side, key.removesuffix(FRACTION_SUFFIX)))

    def _scope(self, side: Side, key: str) -> tuple[object, ...]:
        if self.grouping is QueryGrouping.PER_TICK:
            return ()
        if self.grouping is QueryGrouping.PER_ROLLOUT:
            return (self.rollout,)
        return (self.rollout, side.value, key)


def _relabelled(measurement: Measurement, unit: Unit) -> Measurement:
    if measurement.status is EvidenceStatus.ERROR and measurement.error_class is not None:
        return Measurement.error(measurement.error_class, measurement.detail, unit, query=measurement.query)
    return Measurement.no_data(measurement.detail, unit, query=measurement.query)


def merge_asks(needs: Sequence[Need]) -> tuple[dict[GroupedAsk, set[RevisionKey]], list[SingleAsk]]:
    """Unique grouped asks with the revisions each must cover, and unique single asks."""
    grouped: dict[GroupedAsk, set[RevisionKey]] = {}
    singles: dict[SingleAsk, None] = {}
    for need in needs:
        if isinstance(need.ask, GroupedAsk):  # CountsAsk needs no query of their own
            grouped.setdefault(need.ask, set()).add(need.revision)
        elif isinstance(need.ask, SingleAsk):
            singles[need.ask] = None
    return grouped, list(singles)


# ---------------------------------------------------------------------------------------------
# Measurements from answers


def _no_data_detail(need: Need) -> str:
    where = f"revision {need.revision.revision!r} in namespace {need.revision.namespace!r}"
    measure = need.measure
    if measure is None:
        return "the query returned no series"
    if measure == REQUESTS:
        return (
            f"no request series for {where} in the window (no requests yet, or its metrics are not scraped)"
        )
    if measure == MetricKind.ERROR_RATE.value:
        return f"no request series for {where} in the window: an error rate needs requests"
    if measure in _REQUEST_BASED:
        return f"no latency series for {where} in the window"
    if measure in {MetricKind.OOM_KILLS.value, MetricKind.RESTARTS.value}:
        return f"kube-state-metrics shows no pods of {where} in the window"
    if measure == MetricKind.WARMUP_TIME.value:
        return f"no pod of {where} was Ready in the window"
    if measure == MetricKind.GPU_MEMORY_PEAK.value:
        return f"no DCGM framebuffer series for the pods of {where} in the window"
    return f"no vLLM KV-cache series for the pods of {where} in the window"


def measurement_for(
    need: Need,
    outcome: QueryOutcome | None,
    parsed: GroupedAnswer | float | QueryFailure | None,
    *,
    min_requests: float,
) -> Measurement:
    """The measurement ``need`` gets from its ask's outcome (already parsed)."""
    if need.settled is not None:
        return need.settled
    query = outcome.promql if outcome is not None else ""
    duration = outcome.duration if outcome is not None else 0.0
    unit = need.unit
    if isinstance(parsed, QueryFailure):
        return Measurement.error(parsed.error_class, parsed.detail, unit, query=query, duration=duration)
    samples: float | None = None
    if isinstance(parsed, GroupedAnswer) and need.revision in parsed.failures:
        failure = parsed.failures[need.revision]
        return Measurement.error(failure.error_class, failure.detail, unit, query=query, duration=duration)
    if isinstance(parsed, GroupedAnswer):
        fields = parsed.values.get(need.revision, {})
        value = fields.get(need.field or VALUE_FIELD)
        samples = value if need.measure == REQUESTS else fields.get(FIELD_SAMPLES)
    else:
        value = parsed
    if value is None:
        return Measurement.no_data(
            _no_data_detail(need), unit, samples=samples, query=query, duration=duration
        )
    if samples is not None and not math.isfinite(samples):
        detail = f"Prometheus answered {shown(samples)} for the {_samples_word(need)}" + (
            "" if need.measure == REQUESTS else " behind the value"
        )
        return Measurement.invalid(detail, unit, query=query, duration=duration)
    if need.measure in _REQUEST_BASED and samples is not None and round(samples) < min_requests:
        # Before the NaN test: 0/0 from a window without requests is no data, not an invalid value.
        counted = "no requests" if round(samples) == 0 else f"{samples:g} requests"
        detail = f"{counted} in the window; a value needs at least {min_requests:g}"
        return Measurement.no_data(detail, unit, samples=samples, query=query, duration=duration)
    if not math.isfinite(value):
        # NaN, +Inf, -Inf: nothing a limit can be judged on (and +Inf would "fail" any max, -Inf pass
        # it): the check holds as on a query problem, and says which value it got.
        detail = f"Prometheus answered {shown(value)}, which no limit can be judged on"
        return Measurement.invalid(detail, unit, samples=samples, query=query, duration=duration)
    return Measurement.ok(value, unit, samples=samples, query=query, duration=duration)


def _samples_word(need: Need) -> str:
    if need.measure == REQUESTS or need.measure in _REQUEST_BASED:
        return "request count"
    return "sample count"
