"""The PromotionPolicy: the declarative file a team keeps in Git, one per model.

The models validate *and normalise*: after validation every duration is seconds, every
percentage a fraction, every size bytes, and ``steps`` is a list of :class:`Step`. Unknown fields
are errors everywhere — a typo such as ``maxIncrase`` must never silently disable a check.
"""

from __future__ import annotations

import itertools
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from canary.policy.base import (
    _CHECK_NAME,
    _DNS1035_LABEL,
    _DNS1123_LABEL,
    _DNS1123_SUBDOMAIN,
    _LIMIT_JSON,
    _RATIO_JSON,
    _TEMPLATE_VAR,
    API_VERSION,
    KIND,
    TEMPLATE_VARIABLES,
    Duration,
    _Model,
)
from canary.policy.hooks import (
    MAX_GATE_TIMEOUT,
    DiscordTarget,
    Gate,
    GateFailurePolicy,
    GateStage,
    GateWebhook,
    NotifyTarget,
    SecretRef,
    SlackTarget,
    TeamsTarget,
    WebhookTarget,
)
from canary.policy.label_names import (
    _LABEL_NAME,
    GpuLabelStyle,
    JoinLabelNames,
    KubeStateLabelNames,
    KubeStateLabelStyle,
    MetricLabels,
    RequestLabelStyle,
)
from canary.policy.size import too_large
from canary.policy.units import (
    Unit,
    format_duration,
    parse_in_unit,
    parse_ratio,
    peer_unit_mistake,
    unit_text,
)

__all__ = [
    "API_VERSION",
    "KIND",
    "MAX_CUSTOM_QUERIES",
    "MAX_GATES",
    "MAX_GATE_TIMEOUT",
    "MAX_NOTIFY_ENTRIES",
    "TEMPLATE_VARIABLES",
    "Check",
    "DiscordTarget",
    "Duration",
    "Gate",
    "GateFailurePolicy",
    "GateStage",
    "GateWebhook",
    "GpuLabelStyle",
    "HorizonAction",
    "JoinLabelNames",
    "KubeStateLabelNames",
    "KubeStateLabelStyle",
    "MetricKind",
    "MetricLabels",
    "MetricsSpec",
    "NoDataAction",
    "NotifyTarget",
    "OnNoData",
    "PromotionPolicy",
    "RequestLabelStyle",
    "RequestsProfile",
    "SecretRef",
    "SlackTarget",
    "Step",
    "TeamsTarget",
    "WebhookTarget",
]

# ---------------------------------------------------------------------------------------------
# Metrics


class MetricKind(StrEnum):
    """Builtin metrics; each has a query per metric profile (see ``canary.metrics.catalog``)."""

    LATENCY = "latency"  # request latency quantile at the queue-proxy
    ERROR_RATE = "error-rate"  # 5xx / all requests
    OOM_KILLS = "oom-kills"  # container restarts whose last termination was OOMKilled
    RESTARTS = "restarts"  # container restarts of any reason (CUDA OOM exits with an error code)
    GPU_MEMORY_PEAK = "gpu-memory-peak"  # DCGM framebuffer used, peak over the window
    KV_CACHE_USAGE = "kv-cache-usage"  # vLLM KV-cache usage, peak over the window
    WARMUP_TIME = "warmup-time"  # pod created -> Ready, worst pod of the revision
    TTFT = "ttft"  # vLLM time to first token quantile
    E2E_LATENCY = "e2e-latency"  # vLLM end-to-end request latency quantile

    @property
    def unit(self) -> Unit:
        return _METRIC_UNITS[self]

    @property
    def has_quantile(self) -> bool:
        return self in {MetricKind.LATENCY, MetricKind.TTFT, MetricKind.E2E_LATENCY}

    @property
    def comparable_to_stable(self) -> bool:
        """Whether the stable revision has the same metric over the same window.

        Restarts, OOM kills and warm-up of the stable revision happened (or not) long before the
        canary's window, so comparing them is meaningless: absolute limits only.
        """
        return self not in {MetricKind.OOM_KILLS, MetricKind.RESTARTS, MetricKind.WARMUP_TIME}


_METRIC_UNITS = {
    MetricKind.LATENCY: Unit.SECONDS,
    MetricKind.ERROR_RATE: Unit.RATIO,
    MetricKind.OOM_KILLS: Unit.COUNT,
    MetricKind.RESTARTS: Unit.COUNT,
    MetricKind.GPU_MEMORY_PEAK: Unit.BYTES,
    MetricKind.KV_CACHE_USAGE: Unit.RATIO,
    MetricKind.WARMUP_TIME: Unit.SECONDS,
    MetricKind.TTFT: Unit.SECONDS,
    MetricKind.E2E_LATENCY: Unit.SECONDS,
}


class RequestsProfile(StrEnum):
    """Which request/latency metric family the Knative install exports."""

    AUTO = "auto"
    KNATIVE_OPENCENSUS = "knative-opencensus"  # Knative <= 1.18: revision_request_count, ..._latencies
    KNATIVE_OTEL_QUEUEPROXY = "knative-otel-queueproxy"  # 1.19-1.20: kn_queueproxy_app_duration_seconds
    KNATIVE_OTEL_INVOCATION = "knative-otel-invocation"  # >= 1.21: kn_serving_invocation_duration_seconds


# A query template can be overridden per builtin metric, and for the request count that gates
# every step (minRequests) and tells "no requests" apart from "no errors".
OVERRIDABLE_QUERIES = frozenset({*(kind.value for kind in MetricKind), "request-count"})


# Per-policy quotas (docs/security.md, "Fairness between namespaces"). Each notify entry is a
# delivery lane, each gate a call per call point, each custom query one query per revision every
# evaluation: what one policy may ask of the controller's shared lanes, workers and Prometheus time.
MAX_NOTIFY_ENTRIES = 8
MAX_GATES = 8
MAX_CUSTOM_QUERIES = 8


def _refuse_peer_mistake(value: object, unit: Unit | None, *, relative: bool = False) -> None:
    """Bare numbers that a Flagger user means in another unit (latency ms, percentages) are errors."""
    mistake = None if unit is None else peer_unit_mistake(value, unit, relative=relative)
    if mistake is not None:
        raise ValueError(mistake)


def _check_template(template: str) -> str:
    unknown = sorted({name for name in _TEMPLATE_VAR.findall(template) if name not in TEMPLATE_VARIABLES})
    if unknown:
        raise ValueError(
            f"unknown template variable(s) {', '.join(unknown)}; "
            f"available: {', '.join(sorted(TEMPLATE_VARIABLES))}"
        )
    if "{{" in _TEMPLATE_VAR.sub("", template) or "}}" in _TEMPLATE_VAR.sub("", template):
        raise ValueError("unbalanced '{{' or '}}' in the query template")
    return template


class MetricsSpec(_Model):
    """Metric profile selection and query overrides for one policy."""

    requests: RequestsProfile = Field(
        default=RequestsProfile.AUTO, description="Request/latency metric family; auto detects it."
    )
    gpu_labels: GpuLabelStyle = Field(
        default=GpuLabelStyle.AUTO, description="DCGM pod label style; auto detects it."
    )
    request_labels: RequestLabelStyle = Field(
        default=RequestLabelStyle.AUTO,
        description=(
            "Where request series carry namespace and pod: scraped (the profile's labels), otlp "
            "(k8s_namespace_name and instance: resource attributes promoted), otlp-target-info "
            "(joined with target_info on job and instance); auto detects it."
        ),
    )
    kube_state_labels: KubeStateLabelStyle = Field(
        default=KubeStateLabelStyle.AUTO,
        description=(
            "kube-state-metrics pod label style (exported_pod: scraped without honorLabels); auto detects it."
        ),
    )
    labels: MetricLabels = Field(
        default_factory=MetricLabels, description="Label names replacing a family's built-in ones."
    )
    revision_label: str | None = Field(
        default=None,
        pattern=_LABEL_NAME,
        description=(
            "On the OpenTelemetry profiles (Knative >= 1.19) the revision is not a label: by default it is "
            "selected by pod name. Name a relabelled label carrying the revision name here instead."
        ),
    )
    queries: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Query templates replacing the builtin ones, keyed by metric kind or 'request-count'. "
            "Template variables: " + ", ".join(sorted(TEMPLATE_VARIABLES)) + "."
        ),
    )

    @field_validator("queries")
    @classmethod
    def _known_queries(cls, queries: dict[str, str]) -> dict[str, str]:
        for key, template in queries.items():
            if key not in OVERRIDABLE_QUERIES:
                raise ValueError(
                    f"unknown query {key!r}; overridable: {', '.join(sorted(OVERRIDABLE_QUERIES))}"
                )
            if not template.strip():
                raise ValueError(f"query {key!r} is empty")
            try:
                _check_template(template)
            except ValueError as error:
                raise ValueError(f"query {key!r}: {error}") from None
        return queries


# ---------------------------------------------------------------------------------------------
# Checks


class Check(_Model):
    """One thing measured about the canary, judged against absolute limits and/or the stable revision.

    Limits are normalised to the metric's canonical unit (seconds, fraction, bytes, count).
    """

    name: str = Field(description="Unique within the policy; appears in every decision and notification.")
    metric: MetricKind | None = Field(default=None, description="A builtin metric (or use promql).")
    promql: str | None = Field(
        default=None,
        description=(
            "A custom PromQL query template returning one value for the revision in {{ revision }}. "
            "Relative limits need the template to use {{ revision }} so it can also run for the stable one."
        ),
    )
    unit: Unit | None = Field(
        default=None, description="Unit of a custom promql check's value (builtin metrics know theirs)."
    )
    quantile: float | None = Field(
        default=None, gt=0, lt=1, description="For latency, ttft and e2e-latency: 0.99 for p99 (default)."
    )
    max: Annotated[float | None, _LIMIT_JSON] = Field(
        default=None, description="The canary fails above this."
    )
    min: Annotated[float | None, _LIMIT_JSON] = Field(
        default=None, description="The canary fails below this."
    )
    max_increase: Annotated[float | None, _RATIO_JSON] = Field(
        default=None,
        description='Relative to the stable revision: "20%" means canary <= 1.2 x stable.',
    )
    min_stable: Annotated[float | None, _LIMIT_JSON] = Field(
        default=None,
        description="maxIncrease is not applied while the stable value is below this floor.",
    )
    max_fraction: Annotated[float | None, _RATIO_JSON] = Field(
        default=None,
        description="gpu-memory-peak only: used / (used + free + reserved) must stay at or below this.",
    )
    critical: bool = Field(default=False, description="A failure rolls back at once, whatever failureLimit.")
    tolerance: Annotated[float, _RATIO_JSON] = Field(
        default=0.1,
        description=(
            "Error rates and latency quantiles: a canary is bad at or above a limit L and good at or below "
            "L / (1 + tolerance); in between either decision is right. Smaller tolerances need more "
            "requests (`kserve-canary validate` prints how many at most)."
        ),
    )

    @field_validator("name")
    @classmethod
    def _name_shape(cls, name: str) -> str:
        if not _CHECK_NAME.match(name) or len(name) > 63:
            raise ValueError(
                "must be 1-63 letters, digits, '-', '_' or '.', starting and ending alphanumeric"
            )
        return name

    @field_validator("promql")
    @classmethod
    def _promql_template(cls, promql: str | None) -> str | None:
        if promql is not None:
            if not promql.strip():
                raise ValueError("must not be empty")
            _check_template(promql)
        return promql

    @property
    def value_unit(self) -> Unit:
        if self.metric is not None:
            return self.metric.unit
        return self.unit or Unit.NONE

    @field_validator("max", "min", "min_stable", mode="before")
    @classmethod
    def _limit_in_unit(cls, value: object, info: ValidationInfo) -> object:
        if value is None:
            return None
        metric = info.data.get("metric")
        unit = info.data.get("unit")
        if metric is None and info.data.get("promql") is None:
            # The check's kind is missing or invalid (reported on its own field); its unit is
            # unknown, so do not pile a second, misleading error onto the limit.
            return 0.0
        if isinstance(metric, MetricKind):
            unit = metric.unit if metric.has_quantile or metric.unit is Unit.RATIO else None
            _refuse_peer_mistake(value, unit)
            return parse_in_unit(value, metric.unit)
        if isinstance(unit, Unit):
            _refuse_peer_mistake(value, unit if unit is Unit.RATIO else None)
            return parse_in_unit(value, unit)
        return parse_in_unit(value, Unit.NONE)

    @field_serializer("max", "min", "min_stable", when_used="json")
    def _limit_text(self, value: float | None) -> float | str | None:
        # As a policy file would say it: a dumped policy reads back as itself (never as a bare latency).
        return None if value is None else unit_text(value, self.value_unit)

    @field_serializer("max_increase", when_used="json")
    def _increase_text(self, value: float | None) -> float | str | None:
        return None if value is None else unit_text(value, Unit.RATIO, relative=True)

    @field_validator("max_increase", mode="before")
    @classmethod
    def _increase(cls, value: object) -> object:
        if value is None:
            return None
        _refuse_peer_mistake(value, Unit.RATIO, relative=True)
        return parse_ratio(value, allow_above_one=True)

    @field_validator("max_fraction", mode="before")
    @classmethod
    def _fraction(cls, value: object) -> object:
        return None if value is None else parse_ratio(value)

    @field_validator("tolerance", mode="before")
    @classmethod
    def _tolerance(cls, value: object) -> object:
        tolerance = parse_ratio(value, allow_above_one=True)
        if not 0.01 <= tolerance <= 10:
            raise ValueError(f"must be between 1% and 1000% (got {value!r})")
        return tolerance

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.metric is None) == (self.promql is None):
            raise ValueError(
                "a check needs exactly one of 'metric' (a builtin metric) or 'promql' (a custom query)"
                + (", not both" if self.metric is not None else "")
            )
        if self.metric is not None:
            if self.unit is not None:
                raise ValueError(
                    f"'unit' is only for promql checks; {self.metric.value} is in {self.metric.unit}"
                )
            if self.quantile is not None and not self.metric.has_quantile:
                raise ValueError(f"'quantile' does not apply to metric {self.metric.value}")
            if self.max_fraction is not None and self.metric is not MetricKind.GPU_MEMORY_PEAK:
                raise ValueError("'maxFraction' applies only to metric gpu-memory-peak")
        elif self.quantile is not None:
            raise ValueError("'quantile' applies to builtin latency metrics; write it into the promql")
        elif self.max_fraction is not None:
            raise ValueError("'maxFraction' applies only to metric gpu-memory-peak")
        relative = self.max_increase is not None or self.min_stable is not None
        if relative and not self.comparable_to_stable:
            what = (
                f"metric {self.metric.value}"
                if self.metric is not None
                else "a promql without {{ revision }}"
            )
            raise ValueError(
                f"'maxIncrease'/'minStable' compare with the stable revision, which has no comparable value "
                f"for {what}; use an absolute limit (max/min)"
            )
        if self.min_stable is not None and self.max_increase is None:
            raise ValueError("'minStable' is the floor of 'maxIncrease'; set maxIncrease too")
        if self.max is None and self.min is None and self.max_increase is None and self.max_fraction is None:
            raise ValueError("a check needs a limit: max, min, maxIncrease or maxFraction")
        if self.max is not None and self.min is not None and self.min > self.max:
            raise ValueError(f"'min' ({self.min}) is above 'max' ({self.max})")
        return self

    @property
    def comparable_to_stable(self) -> bool:
        if self.metric is not None:
            return self.metric.comparable_to_stable
        return self.promql is not None and "revision" in _TEMPLATE_VAR.findall(self.promql)

    @property
    def effective_quantile(self) -> float | None:
        if self.metric is not None and self.metric.has_quantile:
            return self.quantile if self.quantile is not None else 0.99
        return None


# ---------------------------------------------------------------------------------------------
# Steps, no-data, notifications


class Step(_Model):
    """One traffic step: the canary's weight and how long / how much traffic it must be held for."""

    weight: int = Field(ge=1, le=100, description="Canary traffic percentage; 100 is the promotion.")
    window: Duration | None = Field(default=None, description="Overrides spec.window for this step.")
    horizon: Duration | None = Field(default=None, description="Overrides spec.horizon for this step.")
    min_requests: int | None = Field(
        default=None, ge=0, description="Overrides spec.minRequests for this step."
    )
    approval: Literal["auto", "manual"] = Field(
        default="auto", description="manual: pause before leaving this step until `kserve-canary approve`."
    )

    @model_validator(mode="after")
    def _promotion_step(self) -> Self:
        if self.weight == 100 and self.window is not None:
            # Who writes {weight: 100, window: 30m} almost always means "keep watching for 30m after
            # promotion", which is bake; moving the window to the step before is the other reading.
            raise ValueError(
                "the 100 step is the promotion itself and is not held: to keep watching the promoted "
                f"revision for {format_duration(self.window)}, set spec.bake: "
                f"{format_duration(self.window)} (absolute limits keep being checked, and a breach rolls "
                "back); to hold the canary longer before promotion, put the window on the step before it"
            )
        if self.weight == 100 and (
            self.min_requests is not None or self.approval != "auto" or self.horizon is not None
        ):
            raise ValueError(
                "the 100 step is the promotion itself and is not held; put minRequests, approval or "
                "horizon on the step before it"
            )
        return self


def _step_before(value: object) -> object:
    # Short form: a bare number is a step with the policy's default window and minRequests.
    if isinstance(value, int) and not isinstance(value, bool):
        return {"weight": value}
    return value


StepItem = Annotated[
    Step,
    BeforeValidator(_step_before, json_schema_input_type=Annotated[int, Field(ge=1, le=100)] | Step),
]


class NoDataAction(StrEnum):
    HOLD = "hold"
    PAUSE = "pause"
    ROLLBACK = "rollback"


class HorizonAction(StrEnum):
    DECIDE = "decide"
    PAUSE = "pause"


class OnNoData(_Model):
    after: Duration = Field(
        default=900.0, description="How long without a conclusive evaluation before the action applies."
    )
    action: NoDataAction = Field(
        default=NoDataAction.HOLD,
        description="hold: keep evaluating; pause: stop until resumed; rollback: roll back.",
    )


# ---------------------------------------------------------------------------------------------
# The policy


class Target(_Model):
    inference_service: str = Field(description="Name of the InferenceService in metadata.namespace.")

    @field_validator("inference_service")
    @classmethod
    def _dns1035(cls, name: str) -> str:
        if len(name) > 63 or not _DNS1035_LABEL.match(name):
            raise ValueError(f"{name!r} is not a valid InferenceService name (a lowercase DNS-1035 label)")
        return name


class Metadata(_Model):
    name: str = Field(description="The policy's name (a Kubernetes object name).")
    namespace: str = Field(
        description=(
            "The InferenceService's namespace. Taken from the policy's directory (`DIR/<namespace>/`) "
            "when omitted; if given, it must equal that directory. Required only when the controller "
            "runs with `--policy-namespaces metadata`."
        )
    )
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
            raise ValueError(
                f"{name!r} is not a valid Kubernetes name: lowercase letters, digits, '-' and '.', "
                "starting and ending with a letter or digit, at most 253 characters"
            )
        return name

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, namespace: str) -> str:
        if len(namespace) > 63 or not _DNS1123_LABEL.match(namespace):
            raise ValueError(f"{namespace!r} is not a valid namespace name (a DNS-1123 label)")
        return namespace


class PolicySpec(_Model):
    target: Target
    steps: list[StepItem] = Field(
        default_factory=lambda: [Step(weight=w) for w in (10, 30, 50, 100)],
        description="Traffic steps, strictly increasing; a final 100 is the promotion.",
        min_length=1,
    )
    window: Duration = Field(default=600.0, description="Default hold per step.")
    horizon: Duration | None = Field(
        default=None,
        description="Evidence time after which a step's undecided error-rate and latency checks are "
        "decided on their estimate (default: the step's window and one more window).",
    )
    at_horizon: HorizonAction = Field(
        default=HorizonAction.DECIDE,
        description="decide: judge each undecided check's estimate against its limit; pause: stop with "
        "the numbers until a person promotes, aborts or resumes (another horizon).",
    )
    interval: Duration = Field(default=60.0, description="Evaluation cadence.")
    min_requests: int = Field(default=100, ge=0, description="Canary requests per step before it can pass.")
    progress_deadline: Duration = Field(
        default=600.0,
        description="The canary must be Ready by then. Knative fails a revision not Ready within its "
        "own progress deadline (600 s unless annotated serving.knative.dev/progress-deadline) sooner.",
    )
    failure_limit: int = Field(
        default=2,
        ge=1,
        description=(
            "Consecutive failed evaluations of checks judged on a value (gauges, counts, custom PromQL) "
            "-> rollback. Error rates and latencies are judged by sequential tests and fail at once."
        ),
    )
    confidence: Annotated[float, _RATIO_JSON] = Field(
        default=0.95,
        description=(
            "The rollout's error budget: a canary that meets every limit within its tolerance is rolled "
            "back with probability at most 1 - confidence, one that breaks a limit is promoted with "
            "probability at most 1 - confidence (checks estimated from requests)."
        ),
    )
    on_no_data: OnNoData = Field(default_factory=OnNoData)
    bake: Duration = Field(default=0.0, description="Keep evaluating absolute limits after promotion.")
    auto_start: bool = Field(
        default=True,
        description="Write the first step as soon as a new revision appears (recommended with GitOps).",
    )
    metrics: MetricsSpec = Field(default_factory=MetricsSpec)
    checks: list[Check] = Field(min_length=1, description="At least one check.")
    notify: list[NotifyTarget] = Field(
        default_factory=list,
        description=f"Where decisions are told; at most {MAX_NOTIFY_ENTRIES} entries.",
        json_schema_extra={"maxItems": MAX_NOTIFY_ENTRIES},
    )
    gates: list[Gate] = Field(
        default_factory=list,
        description="Webhooks the rollout waits for before its first step, at each step, or before "
        f"the promotion; at most {MAX_GATES}.",
        json_schema_extra={"maxItems": MAX_GATES},
    )

    @field_validator("notify")
    @classmethod
    def _notify_quota(cls, notify: list[NotifyTarget]) -> list[NotifyTarget]:
        if len(notify) > MAX_NOTIFY_ENTRIES:
            raise ValueError(
                f"{len(notify)} notify entries; at most {MAX_NOTIFY_ENTRIES} per policy (each is a delivery "
                "lane of the namespace's share): send to one webhook that fans out, or drop entries"
            )
        return notify

    @field_validator("gates")
    @classmethod
    def _gates_quota(cls, gates: list[Gate]) -> list[Gate]:
        if len(gates) > MAX_GATES:
            raise ValueError(
                f"{len(gates)} gates; at most {MAX_GATES} per policy (each call holds one of the namespace's "
                "gate workers): let one gate webhook run several checks, or drop gates"
            )
        return gates

    @property
    def custom_queries(self) -> int:
        """The policy's own PromQL: custom ``promql`` checks and ``metrics.queries`` overrides."""
        return sum(1 for check in self.checks if check.promql is not None) + len(self.metrics.queries)

    @field_validator("confidence", mode="before")
    @classmethod
    def _confidence(cls, value: object) -> object:
        confidence = parse_ratio(value)
        if not 0.5 <= confidence <= 0.9999:
            raise ValueError(f"must be between 50% and 99.99% (got {value!r})")
        return confidence

    @field_validator("interval")
    @classmethod
    def _interval(cls, interval: float) -> float:
        if interval < 1:
            raise ValueError("must be at least 1s")
        return interval

    @field_validator("progress_deadline")
    @classmethod
    def _deadline(cls, deadline: float) -> float:
        if deadline <= 0:
            raise ValueError("must be longer than 0s")
        return deadline

    @field_validator("steps")
    @classmethod
    def _increasing(cls, steps: list[Step]) -> list[Step]:
        weights = [step.weight for step in steps]
        for earlier, later in itertools.pairwise(weights):
            if later <= earlier:
                raise ValueError(f"steps must be strictly increasing: {later} follows {earlier} in {weights}")
        if weights == [100]:
            raise ValueError("needs at least one canary step below 100 (100 is the promotion)")
        return steps

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        if self.window < self.interval:
            raise ValueError(
                f"window ({format_duration(self.window)}) must be at least interval "
                f"({format_duration(self.interval)}): a step needs at least one evaluation"
            )
        for index, step in enumerate(self.steps):
            if step.window is not None and step.window < self.interval:
                raise ValueError(
                    f"steps[{index}].window ({format_duration(step.window)}) must be at least interval "
                    f"({format_duration(self.interval)})"
                )
            if step.weight < 100 and self.step_horizon(step) < self.step_window(step):
                raise ValueError(
                    f"steps[{index}]: the horizon ({format_duration(self.step_horizon(step))}) must be at "
                    f"least the step's window ({format_duration(self.step_window(step))}): a step is "
                    "decided on its estimate only after it was held"
                )
        if self.custom_queries > MAX_CUSTOM_QUERIES:
            raise ValueError(
                f"{self.custom_queries} custom queries (checks with 'promql' and 'metrics.queries' "
                f"overrides); at most {MAX_CUSTOM_QUERIES} per policy (each is asked per revision every "
                "evaluation, within the namespace's Prometheus time per tick): combine queries, or use "
                "builtin metrics"
            )
        seen: set[str] = set()
        for check in self.checks:
            if check.name in seen:
                raise ValueError(f"check name {check.name!r} is used twice; check names must be unique")
            seen.add(check.name)
        oversized = too_large(self)
        if oversized is not None:
            raise ValueError(oversized)
        names: set[str] = set()
        for index in range(len(self.gates)):
            name = self.gate_name(index)
            if name in names:
                raise ValueError(f"gate name {name!r} is used twice; gate names must be unique")
            names.add(name)
        return self

    # -- derived views used by the core -------------------------------------------------------

    @property
    def canary_steps(self) -> list[Step]:
        """The held steps: every step below 100. Passing the last one promotes."""
        return [step for step in self.steps if step.weight < 100]

    @property
    def approval_steps(self) -> frozenset[int]:
        """The weights of the steps that wait for ``approve``."""
        return frozenset(step.weight for step in self.canary_steps if step.approval == "manual")

    def step_window(self, step: Step) -> float:
        return step.window if step.window is not None else self.window

    def step_horizon(self, step: Step) -> float:
        """The evidence time after which the step's undecided checks are decided on their estimate."""
        if step.horizon is not None:
            return step.horizon
        return self.horizon if self.horizon is not None else 2.0 * self.step_window(step)

    def step_min_requests(self, step: Step) -> int:
        return step.min_requests if step.min_requests is not None else self.min_requests

    def gate_name(self, index: int) -> str:
        """The name of ``gates[index]``: its own, or ``<at>-<position>`` (``pre-rollout-1``)."""
        gate = self.gates[index]
        return gate.name or f"{gate.at.value}-{index + 1}"


class PromotionPolicy(_Model):
    """A promotion policy: how one InferenceService's new revisions are rolled out."""

    api_version: Literal["kserve-canary.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["PromotionPolicy"]
    metadata: Metadata
    spec: PolicySpec

    @property
    def key(self) -> str:
        """``namespace/inferenceService`` — what the policy governs; at most one policy per key."""
        return f"{self.metadata.namespace}/{self.spec.target.inference_service}"
