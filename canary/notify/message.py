"""What the controller tells people about one decision: the :class:`Notification` value.

A notification is a plain, frozen value built by the controller from a decision of the core. It
holds no decision, only facts and texts, so the senders (Slack, webhook, Kubernetes Events) can be
developed and tested on their own: the controller maps its decision into this shape once, and every
channel renders the same facts. Its words (what happened, severity, reason) are the core's own
vocabulary (:mod:`canary.rollout.vocabulary`).

Every notification carries *the numbers behind the decision*: one :class:`CheckLine` per check
with the canary's value, the limit it was judged against, the stable revision's value and the
samples behind it (Flagger users had to dig those out of debug logs, flagger#1815).

Texts here are already formatted for people (``"612ms"``, ``"≤ 800ms"``); the optional numeric
fields carry the canonical values (seconds, fractions, bytes) for machines reading the webhook.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote

from canary.policy.units import Unit
from canary.rollout.artefact import Artefact, describe_artefact
from canary.rollout.vocabulary import DEFAULT_REASONS, CheckVerdict, NotificationAction, Severity

__all__ = [
    "ACTION_TITLES",
    "NOTIFICATION_API_VERSION",
    "NOTIFICATION_KIND",
    "NO_CONTEXT",
    "CheckLine",
    "CheckVerdict",
    "MessageContext",
    "Notification",
    "NotificationAction",
    "Severity",
    "samples_text",
    "story",
    "traffic_text",
    "weight_text",
]

# The version of the notification's shape. It is the webhook payload's ``apiVersion``; a field is
# only ever added (optional) within a version, anything else bumps it.
NOTIFICATION_API_VERSION = "kserve-canary.dev/v1alpha1"
NOTIFICATION_KIND = "RolloutNotification"

# Kubernetes event reasons are UpperCamelCase, machine-readable and short.
_CAMEL_CASE = re.compile(r"^[A-Z][A-Za-z0-9]{0,127}$")


# Short human titles, used in Slack headers and plain-text fallbacks.
ACTION_TITLES: dict[NotificationAction, str] = {
    NotificationAction.STARTED: "canary started",
    NotificationAction.ADVANCED: "canary advanced",
    NotificationAction.PROMOTED: "canary promoted",
    NotificationAction.SUCCEEDED: "rollout succeeded",
    NotificationAction.ROLLED_BACK: "canary rolled back",
    NotificationAction.PAUSED: "rollout paused",
    NotificationAction.RESUMED: "rollout resumed",
    NotificationAction.APPROVED: "step approved",
    NotificationAction.ABORTED: "rollout aborted",
    NotificationAction.INCONCLUSIVE: "evidence inconclusive",
    NotificationAction.WAITING: "waiting",
    NotificationAction.UNGUARDED_ROLLOUT: "unguarded rollout",
    NotificationAction.PROMETHEUS_UNAVAILABLE: "Prometheus unavailable",
    NotificationAction.NOTIFICATION_FAILED: "notification failed",
    NotificationAction.GATE_WAITING: "waiting for a gate",
    NotificationAction.GATE_FAILED: "gate past its deadline",
}


@dataclass(frozen=True, slots=True)
class CheckLine:
    """One check as it was judged, with the numbers, ready to be shown.

    ``limit`` is the condition the value had to meet, comparator first (``"≤ 800ms"``,
    ``"≤ 800ms and ≤ +20% vs stable"``), so a passing line reads ``612ms ≤ 800ms``.
    """

    name: str
    verdict: CheckVerdict
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
    # A counted check (error rate, latency quantile judged by a sequential test): the verdict as the
    # sentence the judge made, with its numbers ("p99 ≤ 800ms met at 95% (1,204 requests; …)").
    statement: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a check line needs a name")
        object.__setattr__(self, "verdict", CheckVerdict(self.verdict))
        if self.unit is not None:
            object.__setattr__(self, "unit", Unit(self.unit))

    def describe(self) -> str:
        """The line without its name or verdict symbol: ``612ms ≤ 800ms (stable 540ms)``.

        The phrasing follows the verdict so that the sentence is true: a failing value is "not"
        within its limit, and a missing value says why instead of showing a number.
        """
        stable = f" (stable {self.stable})" if self.stable else ""
        limit = self.limit or "no limit"
        if self.statement:
            return self.statement
        if self.verdict is CheckVerdict.NOT_YET:
            return f"not yet{': ' + self.detail if self.detail else ''} (limit {limit})"
        if self.verdict is CheckVerdict.PASS:
            text = f"{self.value or '?'} {limit}{stable}"
        elif self.verdict is CheckVerdict.FAIL:
            text = f"{self.value or '?'}, not {limit}{stable}"
        elif self.verdict is CheckVerdict.NO_DATA:
            text = f"no data{': ' + self.detail if self.detail else ''} (limit {limit}){stable}"
        else:
            text = f"query failed{': ' + self.detail if self.detail else ''} (limit {limit})"
        if self.samples:
            text += f", {samples_text(self.samples)}"
        return text


_BARE_COUNT = re.compile(r"^\d[\d,]*(?:\.0+)?$")


def samples_text(samples: str) -> str:
    """What a value rests on, with its unit: a bare count (``"1"``, ``"1,840.0"``) reads ``"1 sample"``,
    ``"1,840 samples"``; text that already names its unit (``"1840 requests"``) is kept.

    A bare number after a value ("oom 0 ≤ 0, 1") reads as a second value, not as the evidence."""
    text = samples.strip()
    if not _BARE_COUNT.match(text):
        return text
    count = int(float(text.replace(",", "")))
    return f"{count:,} sample" + ("" if count == 1 else "s")


def _sentence_key(text: str) -> str:
    return re.sub(r"[\s.…]+", " ", text).strip().casefold()


def story(notification: Notification) -> tuple[str, ...]:
    """The reasons that say something the summary does not: a reason repeating the summary (the
    core often states its verdict as both) or an earlier reason is left out, so no message repeats
    its first sentence."""
    seen = {_sentence_key(notification.summary)}
    kept = []
    for reason in notification.reasons:
        key = _sentence_key(reason)
        if not key or key in seen or any(key in earlier for earlier in seen):
            continue
        seen.add(key)
        kept.append(reason)
    return tuple(kept)


@dataclass(frozen=True, slots=True)
class MessageContext:
    """What the controller adds to every message it sends, whatever the decision: the cluster it runs
    in (``--cluster-name``) and where people can see the rollout (``--dashboard-url``). Both are
    operator settings, never secrets; empty means not configured."""

    cluster: str = ""
    dashboard_url: str = ""  # a base URL; the rollout's page is <base>/#/rollouts/<ns>/<name>

    def link(self, notification: Notification) -> str:
        """The dashboard's page of this rollout, or ``""`` without a dashboard."""
        if not self.dashboard_url:
            return ""
        base = self.dashboard_url.rstrip("/")
        namespace = quote(notification.namespace, safe="")
        name = quote(notification.inference_service, safe="")
        return f"{base}/#/rollouts/{namespace}/{name}"

    def where(self, notification: Notification) -> str:
        """``prod-eu ml/llama-chat`` with a cluster name, else ``ml/llama-chat``."""
        return f"{self.cluster} {notification.model}" if self.cluster else notification.model


NO_CONTEXT = MessageContext()


def weight_text(weight: int | None) -> str:
    """A canaryTrafficPercent for people; ``None`` is the field being absent."""
    return "unset" if weight is None else f"{weight}%"


def traffic_text(from_weight: int | None, to_weight: int | None, action: NotificationAction) -> str:
    """``"10% → 30%"``; a promotion reads ``"50% → 100% (promoted)"``; empty when nothing moved."""
    if action is NotificationAction.PROMOTED and to_weight is None:
        return f"{weight_text(from_weight)} → 100% (promoted)"
    if from_weight == to_weight:
        return "" if from_weight is None else f"{from_weight}% (unchanged)"
    return f"{weight_text(from_weight)} → {weight_text(to_weight)}"


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
    action: NotificationAction
    severity: Severity
    phase: str  # the rollout's phase after the decision (Progressing, RolledBack, ...)
    summary: str  # one sentence: what happened and why
    from_weight: int | None = None  # canaryTrafficPercent before; None = the field was absent
    to_weight: int | None = None  # canaryTrafficPercent after; None = removed (promoted) or absent
    reason: str = ""  # Kubernetes event reason (CamelCase); defaults from the action
    reasons: tuple[str, ...] = ()  # sentences with the numbers behind the decision
    checks: tuple[CheckLine, ...] = ()
    inference_service_uid: str | None = None  # lets the Event point at this exact object
    # What each revision serves (storageUri or image, runtime, format), URIs without credentials;
    # None: unknown (the controller has not recorded it).
    canary_artefact: Artefact | None = None
    stable_artefact: Artefact | None = None
    schema_version: str = field(default=NOTIFICATION_API_VERSION)

    def __post_init__(self) -> None:
        if not self.id:
            raise ValueError("a notification needs a decision id")
        if self.time.tzinfo is None or self.time.utcoffset() is None:
            # A naive time is ambiguous in every receiver's timezone: refuse it early.
            raise ValueError("Notification.time must be timezone-aware")
        object.__setattr__(self, "time", self.time.astimezone(UTC))
        object.__setattr__(self, "action", NotificationAction(self.action))
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

    def served(self, role: str) -> str:
        """``"s3://models/llm/v3 (runtime vllm)"``: what the ``canary`` or ``stable`` revision serves;
        empty without that revision."""
        if role == "canary":
            revision, artefact = self.canary_revision, self.canary_artefact
        else:
            revision, artefact = self.stable_revision, self.stable_artefact
        return describe_artefact(artefact) if revision else ""

    @property
    def model(self) -> str:
        """``namespace/name`` of the InferenceService."""
        return f"{self.namespace}/{self.inference_service}"
