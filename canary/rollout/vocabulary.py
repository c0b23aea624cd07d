"""The one vocabulary of decisions: what the shell must do, how loud it is, why, and what happened.

The decision core, the notifications (Slack, webhook, Kubernetes Events), the controller and the demo
all speak these words; they are defined once, here, because the core may import only policy and
evidence while everything else may import the core.

* :class:`Action` — what the shell must do on the InferenceService (``wait``, ``advance``, ...); it is
  also the ``action`` of the state's decision history.
* :class:`NotificationAction` — what happened, told to people (``advanced``, ``rolled-back``, ...): the
  webhook payload's ``action``, a versioned public API (docs/notification-payload.schema.json).
* :class:`EventReason` — the Kubernetes Event reason (UpperCamelCase), also the notification's
  ``reason``.
* :class:`Severity` — ``info`` or ``warning``.
* :class:`CheckVerdict` — one check's outcome in one evaluation (docs/design.md §4: four outcomes).

:func:`notification_action` is the one table from a decision to what happened; :func:`decision_id`
the one way to name a decision.
"""

from __future__ import annotations

import hashlib
from enum import StrEnum

__all__ = [
    "DEFAULT_REASONS",
    "Action",
    "CheckVerdict",
    "EventReason",
    "NotificationAction",
    "Severity",
    "decision_id",
    "notification_action",
]


class Action(StrEnum):
    """What the shell must do on the InferenceService."""

    WAIT = "wait"  # write nothing
    START = "start"  # write the first step
    ADVANCE = "advance"  # write the next step
    PROMOTE = "promote"  # remove canaryTrafficPercent: the canary takes 100%
    ROLLBACK = "rollback"  # write 0: the stable revision takes 100%
    PAUSE = "pause"  # write nothing; a person must act

    @property
    def writes(self) -> bool:
        return self in _WRITING_ACTIONS


_WRITING_ACTIONS = frozenset({Action.START, Action.ADVANCE, Action.PROMOTE, Action.ROLLBACK})


class Severity(StrEnum):
    """How loud a decision is. Notification targets can ask for ``warning`` only (``minSeverity``)."""

    INFO = "info"
    WARNING = "warning"  # rollbacks, pauses and problems

    @property
    def rank(self) -> int:
        return 0 if self is Severity.INFO else 1

    def at_least(self, minimum: Severity) -> bool:
        return self.rank >= minimum.rank


class CheckVerdict(StrEnum):
    """A check's outcome in one evaluation: five outcomes, never confused with each other."""

    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    NOT_YET = "not-yet"  # counted checks: data flowing, neither limit shown broken nor met yet
    NO_DATA = "no-data"
    ERROR = "error"  # the query failed: the controller's problem, never the canary's


class EventReason(StrEnum):
    """Kubernetes Event reasons (UpperCamelCase), also the notification's ``reason``."""

    CANARY_STARTED = "CanaryStarted"
    CANARY_ADVANCED = "CanaryAdvanced"
    CANARY_PROMOTED = "CanaryPromoted"
    CANARY_BAKING = "CanaryBaking"
    CANARY_SUCCEEDED = "CanarySucceeded"
    CANARY_ROLLED_BACK = "CanaryRolledBack"
    CANARY_PAUSED = "CanaryPaused"
    CANARY_AWAITING_APPROVAL = "CanaryAwaitingApproval"
    CANARY_RESUMED = "CanaryResumed"
    CANARY_APPROVED = "CanaryApproved"  # an operator command (history only)
    CANARY_ABORTED = "CanaryAborted"  # an operator command (history only)
    CANARY_EVALUATED = "CanaryEvaluated"  # an evaluation passed; the step is not over yet
    CANARY_CHECK_FAILED = "CanaryCheckFailed"  # an evaluation failed, below failureLimit
    CANARY_INCONCLUSIVE = "CanaryInconclusive"
    CANARY_PENDING = "CanaryPending"  # the canary revision is not Ready yet
    CANARY_WAITING = "CanaryWaiting"
    EXTERNAL_TRAFFIC_CHANGE = "ExternalTrafficChange"
    UNGUARDED_ROLLOUT = "UnguardedRollout"
    PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
    SPEC_CHANGE_PENDING = "SpecChangePending"  # the spec changed; KServe has not created the revision
    REVISION_NOT_RETRIED = "RevisionNotRetried"
    FIRST_DEPLOYMENT = "FirstDeployment"
    UNSUPPORTED_DEPLOYMENT_MODE = "UnsupportedDeploymentMode"
    INFERENCE_SERVICE_NOT_FOUND = "InferenceServiceNotFound"
    CANARY_IDLE = "CanaryIdle"
    STATE_UNREADABLE = "StateUnreadable"  # the controller cannot read the state ConfigMap
    NOTIFICATION_FAILED = "NotificationFailed"  # a Slack/webhook delivery failed for good
    GATE_WAITING = "CanaryGateWaiting"  # a gate has not passed yet: the rollout holds
    GATE_FAILED = "CanaryGateFailed"  # a gate's deadline passed (failurePolicy hold): still holding


class NotificationAction(StrEnum):
    """What happened, told to people. Additive: a payload consumer must accept new values."""

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
    GATE_WAITING = "gate-waiting"  # a gate has not passed yet: the rollout holds its step
    GATE_FAILED = "gate-failed"  # a gate's deadline passed without a pass (failurePolicy hold)


# What happened, from a decision: a write or a pause is named by its action; a wait by its reason.
# Anything not in the table is "waiting".
_HAPPENED: dict[Action | EventReason, NotificationAction] = {
    Action.START: NotificationAction.STARTED,
    Action.ADVANCE: NotificationAction.ADVANCED,
    Action.PROMOTE: NotificationAction.PROMOTED,
    Action.ROLLBACK: NotificationAction.ROLLED_BACK,
    Action.PAUSE: NotificationAction.PAUSED,
    EventReason.CANARY_STARTED: NotificationAction.STARTED,
    EventReason.CANARY_ADVANCED: NotificationAction.ADVANCED,
    EventReason.CANARY_PROMOTED: NotificationAction.PROMOTED,
    EventReason.CANARY_SUCCEEDED: NotificationAction.SUCCEEDED,
    EventReason.CANARY_ROLLED_BACK: NotificationAction.ROLLED_BACK,
    EventReason.CANARY_PAUSED: NotificationAction.PAUSED,
    EventReason.CANARY_AWAITING_APPROVAL: NotificationAction.PAUSED,
    EventReason.EXTERNAL_TRAFFIC_CHANGE: NotificationAction.PAUSED,
    EventReason.STATE_UNREADABLE: NotificationAction.PAUSED,
    EventReason.CANARY_RESUMED: NotificationAction.RESUMED,
    EventReason.CANARY_APPROVED: NotificationAction.APPROVED,
    EventReason.CANARY_ABORTED: NotificationAction.ABORTED,
    EventReason.CANARY_INCONCLUSIVE: NotificationAction.INCONCLUSIVE,
    EventReason.UNGUARDED_ROLLOUT: NotificationAction.UNGUARDED_ROLLOUT,
    EventReason.PROMETHEUS_UNAVAILABLE: NotificationAction.PROMETHEUS_UNAVAILABLE,
    EventReason.NOTIFICATION_FAILED: NotificationAction.NOTIFICATION_FAILED,
    EventReason.GATE_WAITING: NotificationAction.GATE_WAITING,
    EventReason.GATE_FAILED: NotificationAction.GATE_FAILED,
}


def notification_action(action: Action, reason: EventReason) -> NotificationAction:
    """What happened, for people: the action when it writes or pauses, else what the reason says."""
    return _HAPPENED.get(action) or _HAPPENED.get(reason, NotificationAction.WAITING)


# The reason a notification carries when it names none: the Event reason of what happened.
DEFAULT_REASONS: dict[NotificationAction, EventReason] = {
    NotificationAction.STARTED: EventReason.CANARY_STARTED,
    NotificationAction.ADVANCED: EventReason.CANARY_ADVANCED,
    NotificationAction.PROMOTED: EventReason.CANARY_PROMOTED,
    NotificationAction.SUCCEEDED: EventReason.CANARY_SUCCEEDED,
    NotificationAction.ROLLED_BACK: EventReason.CANARY_ROLLED_BACK,
    NotificationAction.PAUSED: EventReason.CANARY_PAUSED,
    NotificationAction.RESUMED: EventReason.CANARY_RESUMED,
    NotificationAction.APPROVED: EventReason.CANARY_APPROVED,
    NotificationAction.ABORTED: EventReason.CANARY_ABORTED,
    NotificationAction.INCONCLUSIVE: EventReason.CANARY_INCONCLUSIVE,
    NotificationAction.WAITING: EventReason.CANARY_WAITING,
    NotificationAction.UNGUARDED_ROLLOUT: EventReason.UNGUARDED_ROLLOUT,
    NotificationAction.PROMETHEUS_UNAVAILABLE: EventReason.PROMETHEUS_UNAVAILABLE,
    NotificationAction.NOTIFICATION_FAILED: EventReason.NOTIFICATION_FAILED,
    NotificationAction.GATE_WAITING: EventReason.GATE_WAITING,
    NotificationAction.GATE_FAILED: EventReason.GATE_FAILED,
}


def decision_id(*parts: object) -> str:
    """A deterministic, opaque decision id from the facts that make a decision unique.

    The same decision re-derived (the next tick, a restart, a write re-issued after a crash) gets the
    same id, so receivers, the dispatcher and the state's history can recognise it. The parts are
    joined with a separator no name contains, so ``("ab", "c")`` and ``("a", "bc")`` differ.
    """
    if not parts:
        raise ValueError("a decision id needs at least one part")
    digest = hashlib.sha256("\x1f".join(str(part) for part in parts).encode()).hexdigest()
    return f"d-{digest[:24]}"
