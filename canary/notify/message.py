"""What the controller tells people about one decision: the :class:`Notification` value.

A notification is a plain, frozen value built by the controller from a decision of the core. It is
deliberately independent of the core's own types so the senders (Slack, webhook, Kubernetes
Events) can be developed, tested and versioned on their own: the controller maps its decision into
this shape once, and every channel renders the same facts.

Every notification carries *the numbers behind the decision*: one :class:`CheckLine` per check
with the canary's value, the limit it was judged against, the stable revision's value and the
samples behind it (Flagger users had to dig those out of debug logs, flagger#1815).

Texts here are already formatted for people (``"612ms"``, ``"≤ 800ms"``); the optional numeric
fields carry the canonical values (seconds, fractions, bytes) for machines reading the webhook.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

from canary.policy.units import Unit

__all__ = [
    "ACTION_TITLES",
    "DEFAULT_REASONS",
    "NOTIFICATION_API_VERSION",
    "NOTIFICATION_KIND",
    "Action",
    "CheckLine",
    "EventReason",
    "Notification",
    "Severity",
    "Verdict",
    "make_decision_id",
    "traffic_text",
    "weight_text",
]

# The version of the notification's shape. It is the webhook payload's ``apiVersion``; a field is
# only ever added (optional) within a version, anything else bumps it.
NOTIFICATION_API_VERSION = "kserve-canary.dev/v1alpha1"
NOTIFICATION_KIND = "RolloutNotification"

# Kubernetes event reasons are UpperCamelCase, machine-readable and short.
_CAMEL_CASE = re.compile(r"^[A-Z][A-Za-z0-9]{0,127}$")


class Severity(StrEnum):
    """How loud a notification is. Targets can ask for ``warning`` only (``minSeverity``)."""

    INFO = "info"
    WARNING = "warning"

    @property
    def rank(self) -> int:
        return 0 if self is Severity.INFO else 1

    def at_least(self, minimum: Severity) -> bool:
        return self.rank >= minimum.rank


class Action(StrEnum):
    """What happened. Additive: the controller may gain actions, a payload consumer must accept new ones."""

    STARTED = "started"  # the first step was written for a new revision
    ADVANCED = "advanced"  # a step passed; the canary's weight went up
    PROMOTED = "promoted"  # canaryTrafficPercent removed: the canary is the new stable revision
    SUCCEEDED = "succeeded"  # the bake period after promotion passed
    ROLLED_BACK = "rolled-back"  # canaryTrafficPercent set to 0
    PAUSED = "paused"  # stopped until a person resumes (manual change, approval, onNoData: pause)
    RESUMED = "resumed"
    APPROVED = "approved"
    ABORTED = "aborted"  # a person aborted the rollout
    INCONCLUSIVE = "inconclusive"  # no data or query errors: the step cannot pass yet
    WAITING = "waiting"  # e.g. the canary revision is not Ready yet
    UNGUARDED_ROLLOUT = "unguarded-rollout"  # the new revision was already serving 100% when seen
    PROMETHEUS_UNAVAILABLE = "prometheus-unavailable"  # evidence could not be collected
    NOTIFICATION_FAILED = "notification-failed"  # a Slack/webhook delivery failed for good


class EventReason(StrEnum):
    """The Kubernetes Event reasons the controller uses. A notification may carry any CamelCase reason."""

    CANARY_STARTED = "CanaryStarted"
    CANARY_ADVANCED = "CanaryAdvanced"
    CANARY_PROMOTED = "CanaryPromoted"
    CANARY_SUCCEEDED = "CanarySucceeded"
    CANARY_ROLLED_BACK = "CanaryRolledBack"
    CANARY_PAUSED = "CanaryPaused"
    CANARY_RESUMED = "CanaryResumed"
    CANARY_APPROVED = "CanaryApproved"
    CANARY_ABORTED = "CanaryAborted"
    CANARY_INCONCLUSIVE = "CanaryInconclusive"
    CANARY_WAITING = "CanaryWaiting"
    UNGUARDED_ROLLOUT = "UnguardedRollout"
    PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
    NOTIFICATION_FAILED = "NotificationFailed"


DEFAULT_REASONS: dict[Action, EventReason] = {
    Action.STARTED: EventReason.CANARY_STARTED,
    Action.ADVANCED: EventReason.CANARY_ADVANCED,
    Action.PROMOTED: EventReason.CANARY_PROMOTED,
    Action.SUCCEEDED: EventReason.CANARY_SUCCEEDED,
    Action.ROLLED_BACK: EventReason.CANARY_ROLLED_BACK,
    Action.PAUSED: EventReason.CANARY_PAUSED,
    Action.RESUMED: EventReason.CANARY_RESUMED,
    Action.APPROVED: EventReason.CANARY_APPROVED,
    Action.ABORTED: EventReason.CANARY_ABORTED,
    Action.INCONCLUSIVE: EventReason.CANARY_INCONCLUSIVE,
    Action.WAITING: EventReason.CANARY_WAITING,
    Action.UNGUARDED_ROLLOUT: EventReason.UNGUARDED_ROLLOUT,
    Action.PROMETHEUS_UNAVAILABLE: EventReason.PROMETHEUS_UNAVAILABLE,
    Action.NOTIFICATION_FAILED: EventReason.NOTIFICATION_FAILED,
}

# Short human titles, used in Slack headers and plain-text fallbacks.
ACTION_TITLES: dict[Action, str] = {
    Action.STARTED: "canary started",
    Action.ADVANCED: "canary advanced",
    Action.PROMOTED: "canary promoted",
    Action.SUCCEEDED: "rollout succeeded",
    Action.ROLLED_BACK: "canary rolled back",
    Action.PAUSED: "rollout paused",
    Action.RESUMED: "rollout resumed",
    Action.APPROVED: "step approved",
    Action.ABORTED: "rollout aborted",
    Action.INCONCLUSIVE: "evidence inconclusive",
    Action.WAITING: "waiting",
    Action.UNGUARDED_ROLLOUT: "unguarded rollout",
    Action.PROMETHEUS_UNAVAILABLE: "Prometheus unavailable",
    Action.NOTIFICATION_FAILED: "notification failed",
}


class Verdict(StrEnum):
    """A check's outcome in one evaluation (see docs/design.md §4: four outcomes, never confused)."""

    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    NO_DATA = "no-data"
    ERROR = "error"  # the query failed: the controller's problem, never the canary's


@dataclass(frozen=True, slots=True)
class CheckLine:
    """One check as it was judged, with the numbers, ready to be shown.

    ``limit`` is the condition the value had to meet, comparator first (``"≤ 800ms"``,
    ``"≤ 800ms and ≤ +20% vs stable"``), so a passing line reads ``612ms ≤ 800ms``.
    """

    name: str
    verdict: Verdict
    value: str = ""  # the canary's value, formatted ("612ms"); empty without a value
    limit: str = ""  # the condition, comparator first
    stable: str = ""  # the stable revision's value, formatted; empty when not compared
    samples: str = ""  # what the value rests on ("1,234 requests")
    critical: bool = False  # a failure rolls back at once
    detail: str = ""  # why there is no data, or what failed ("12 requests < minRequests 100")
    # Canonical numbers for machines (seconds, fractions, bytes, counts), when known.
    value_number: float | None = None
    stable_number: float | None = None
    unit: Unit | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a check line needs a name")
        object.__setattr__(self, "verdict", Verdict(self.verdict))
        if self.unit is not None:
            object.__setattr__(self, "unit", Unit(self.unit))

    def describe(self) -> str:
        """The line without its name or verdict symbol: ``612ms ≤ 800ms (stable 540ms)``.

        The phrasing follows the verdict so that the sentence is true: a failing value is "not"
        within its limit, and a missing value says why instead of showing a number.
        """
        stable = f" (stable {self.stable})" if self.stable else ""
        limit = self.limit or "no limit"
        if self.verdict is Verdict.PASS:
            text = f"{self.value or '?'} {limit}{stable}"
        elif self.verdict is Verdict.FAIL:
            text = f"{self.value or '?'}, not {limit}{stable}"
        elif self.verdict is Verdict.NO_DATA:
            text = f"no data{': ' + self.detail if self.detail else ''} (limit {limit}){stable}"
        else:
            text = f"query failed{': ' + self.detail if self.detail else ''} (limit {limit})"
        if self.samples:
            text += f", {self.samples}"
        return text


def weight_text(weight: int | None) -> str:
    """A canaryTrafficPercent for people; ``None`` is the field being absent."""
    return "unset" if weight is None else f"{weight}%"


def traffic_text(from_weight: int | None, to_weight: int | None, action: Action) -> str:
    """``"10% → 30%"``; a promotion reads ``"50% → 100% (promoted)"``; empty when nothing moved."""
    if action is Action.PROMOTED and to_weight is None:
        return f"{weight_text(from_weight)} → 100% (promoted)"
    if from_weight == to_weight:
        return "" if from_weight is None else f"{from_weight}% (unchanged)"
    return f"{weight_text(from_weight)} → {weight_text(to_weight)}"


def make_decision_id(*parts: object) -> str:
    """A deterministic, opaque decision id from the facts that make a decision unique.

    The controller passes e.g. namespace, InferenceService, canary revision, action, step and the
    evaluation time: the same decision re-derived after a restart gets the same id, so receivers
    (and the dispatcher) can de-duplicate it.
    """
    if not parts:
        raise ValueError("a decision id needs at least one part")
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).hexdigest()
    return f"d-{digest[:24]}"


@dataclass(frozen=True, slots=True)
class Notification:
    """One decision, told to people. Built by the controller; rendered by every sender."""

    id: str  # deterministic decision id: the de-duplication and idempotency key
    time: datetime  # when the decision was made (aware; normalised to UTC)
    namespace: str
    inference_service: str
    policy: str  # the PromotionPolicy's name
    canary_revision: str | None
    stable_revision: str | None
    action: Action
    severity: Severity
    phase: str  # the rollout's phase after the decision (Progressing, RolledBack, ...)
    summary: str  # one sentence: what happened and why
    from_weight: int | None = None  # canaryTrafficPercent before; None = the field was absent
    to_weight: int | None = None  # canaryTrafficPercent after; None = removed (promoted) or absent
    reason: str = ""  # Kubernetes event reason (CamelCase); defaults from the action
    reasons: tuple[str, ...] = ()  # sentences with the numbers behind the decision
    checks: tuple[CheckLine, ...] = ()
    inference_service_uid: str | None = None  # lets the Event point at this exact object
    schema_version: str = field(default=NOTIFICATION_API_VERSION)

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a notification needs a decision id")
        if self.time.tzinfo is None or self.time.utcoffset() is None:
            # A naive time is ambiguous in every receiver's timezone: refuse it early.
            raise ValueError("Notification.time must be timezone-aware")
        object.__setattr__(self, "time", self.time.astimezone(UTC))
        object.__setattr__(self, "action", Action(self.action))
        object.__setattr__(self, "severity", Severity(self.severity))
        reason = self.reason or DEFAULT_REASONS[self.action].value
        if not _CAMEL_CASE.match(reason):
            raise ValueError(f"event reason {reason!r} must be UpperCamelCase (e.g. CanaryAdvanced)")
        object.__setattr__(self, "reason", reason)
        for label, weight in (("from_weight", self.from_weight), ("to_weight", self.to_weight)):
            if weight is not None and not 0 <= weight <= 100:
                raise ValueError(f"{label} must be within 0..100, got {weight}")
        # Lists are accepted for convenience; stored as tuples so the value stays immutable.
        object.__setattr__(self, "reasons", tuple(self.reasons))
        object.__setattr__(self, "checks", tuple(self.checks))

    @property
    def title(self) -> str:
        return ACTION_TITLES.get(self.action, self.action.value)

    @property
    def traffic(self) -> str:
        return traffic_text(self.from_weight, self.to_weight, self.action)

    @property
    def model(self) -> str:
        """``namespace/name`` of the InferenceService."""
        return f"{self.namespace}/{self.inference_service}"
