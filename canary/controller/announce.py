"""Which decisions are worth telling people about, and how a Decision becomes a Notification.

Every decision is logged. People are told about what changes something — a weight written, a
pause, a rollback — and about *transitions* into a worrying condition (inconclusive evidence,
Prometheus failing, an unguarded rollout), not about every tick that condition lasts: Flagger's
duplicate Slack messages (#1515) are the counter-example. :class:`Announcements` is the one memory
of what people were told; the dispatcher only drops re-submissions of the very same decision id.
"""

from __future__ import annotations

from datetime import datetime

from canary.kserve.store import state_configmap_name
from canary.notify import CheckLine, Notification
from canary.policy import PromotionPolicy
from canary.policy.units import format_value
from canary.rollout.decision import Decision
from canary.rollout.vocabulary import (
    Action,
    EventReason,
    Severity,
    decision_id,
    notification_action,
)

__all__ = [
    "Announcements",
    "is_announced",
    "policy_removed_notification",
    "to_notification",
    "unreadable_state_notification",
]

# Announced once per step of a revision when the rollout enters them.
_ANNOUNCED_ON_TRANSITION = frozenset(
    {
        EventReason.CANARY_INCONCLUSIVE,
        EventReason.PROMETHEUS_UNAVAILABLE,
        EventReason.CANARY_CHECK_FAILED,
        EventReason.UNGUARDED_ROLLOUT,
        EventReason.EXTERNAL_TRAFFIC_CHANGE,
        EventReason.REVISION_NOT_RETRIED,
        EventReason.UNSUPPORTED_DEPLOYMENT_MODE,
        EventReason.CANARY_BAKING,
        EventReason.CANARY_SUCCEEDED,
        EventReason.CANARY_AWAITING_APPROVAL,
        EventReason.CANARY_RESUMED,
        EventReason.CANARY_PAUSED,
        EventReason.GATE_WAITING,
        EventReason.GATE_FAILED,
    }
)

# A (reason, step index) pair people were told about; the step is None outside a step.
Marker = tuple[str, int | None]
_UNREADABLE: Marker = (EventReason.STATE_UNREADABLE.value, None)


def is_announced(decision: Decision, already_told: set[Marker]) -> bool:
    """Whether to tell people: every write and pause; a worrying condition once per step.

    ``already_told`` holds the (reason, step) pairs announced for the current revision (it gains this
    decision's pair); :class:`Announcements` keeps one per rollout. Inconclusive evidence that comes
    and goes within a step is one message, not one per evaluation.
    """
    if decision.action is not Action.WAIT:
        return True
    if decision.event_reason not in _ANNOUNCED_ON_TRANSITION:
        return False
    step = decision.new_state.step.index if decision.new_state.step is not None else None
    marker = (str(decision.event_reason), step)
    if marker in already_told:
        return False
    already_told.add(marker)
    return True


class Announcements:
    """What people were told about, per rollout (``namespace/name``): the told-once memory.

    Recurring conditions are told once: a worrying condition once per step of a revision (a new
    revision starts afresh), an unreadable state once until a decision could be made again.
    """

    def __init__(self) -> None:
        self._told: dict[str, tuple[str | None, set[Marker]]] = {}

    def tell(self, key: str, decision: Decision) -> bool:
        """Whether people hear about ``decision`` (remembered as told when they do)."""
        revision, told = self._told.get(key, (None, set()))
        if revision != decision.revision:
            told = set()
        told.discard(_UNREADABLE)  # a decision was made: the state is readable again
        self._told[key] = (decision.revision, told)
        return is_announced(decision, told)

    def tell_unreadable(self, key: str) -> bool:
        """Whether people hear that the state of ``key`` cannot be read: once, not every interval."""
        _, told = self._told.setdefault(key, (None, set()))
        if _UNREADABLE in told:
            return False
        told.add(_UNREADABLE)
        return True


def to_notification(
    decision: Decision,
    policy: PromotionPolicy,
    now: datetime,
    *,
    inference_service_uid: str | None = None,
) -> Notification:
    checks = tuple(
        CheckLine(
            name=judgement.name,
            verdict=judgement.verdict,
            value="" if judgement.value is None else format_value(judgement.value, judgement.unit),
            limit=judgement.limit,
            stable=""
            if judgement.stable_value is None
            else format_value(judgement.stable_value, judgement.unit),
            samples="" if judgement.samples is None else f"{judgement.samples:,.0f}",
            critical=judgement.critical,
            detail=judgement.detail,
            value_number=judgement.value,
            stable_number=judgement.stable_value,
            unit=judgement.unit,
            statement=judgement.detail if judgement.counted else "",
        )
        for judgement in decision.judgements
    )
    to_weight = decision.weight if decision.action.writes else decision.previous_weight
    return Notification(
        id=decision.id,
        time=now,
        namespace=policy.metadata.namespace,
        inference_service=policy.spec.target.inference_service,
        policy=policy.metadata.name,
        canary_revision=decision.revision,
        stable_revision=decision.stable_revision,
        action=notification_action(decision.action, decision.event_reason),
        severity=decision.severity,
        phase=str(decision.phase),
        summary=decision.summary,
        from_weight=decision.previous_weight,
        to_weight=to_weight,
        reason=str(decision.event_reason),
        reasons=decision.reasons,
        checks=checks,
        inference_service_uid=inference_service_uid,
        canary_artefact=decision.new_state.artefact_of(decision.revision),
        stable_artefact=decision.new_state.artefact_of(decision.stable_revision),
    )


def unreadable_state_notification(
    policy: PromotionPolicy, error: str, now: datetime, uid: str | None
) -> Notification:
    """The state ConfigMap cannot be read (corrupt, or written by a newer controller): say so loudly."""
    name = policy.spec.target.inference_service
    reason = EventReason.STATE_UNREADABLE
    return Notification(
        id=decision_id(policy.key, "state-unreadable", error),
        time=now,
        namespace=policy.metadata.namespace,
        inference_service=name,
        policy=policy.metadata.name,
        canary_revision=None,
        stable_revision=None,
        action=notification_action(Action.WAIT, reason),
        severity=Severity.WARNING,
        phase="Paused",
        summary=(
            f"The rollout state of {policy.key} cannot be read, so kserve-canary will not touch this "
            f"InferenceService until the ConfigMap {state_configmap_name(name)} is fixed or deleted: {error}"
        ),
        reason=reason.value,
        inference_service_uid=uid,
    )


def policy_removed_notification(
    policy: PromotionPolicy,
    revision: str | None,
    stable: str | None,
    message: str,
    now: datetime,
    uid: str | None,
) -> Notification:
    """The policy of an active rollout was removed: the rollout is paused (never rolled back); say so
    on the InferenceService, since the policy's own destinations went with it."""
    reason = EventReason.CANARY_PAUSED
    return Notification(
        id=decision_id(policy.key, "policy-removed", revision, now.isoformat()),
        time=now,
        namespace=policy.metadata.namespace,
        inference_service=policy.spec.target.inference_service,
        policy=policy.metadata.name,
        canary_revision=revision,
        stable_revision=stable,
        action=notification_action(Action.PAUSE, reason),
        severity=Severity.WARNING,
        phase="Paused",
        summary=(
            f"The policy {policy.metadata.name} of {policy.key} was removed: the rollout of {revision} is "
            f"paused where it is, never rolled back ({message}). Restore the policy and run "
            "`kserve-canary resume`, or `abort`."
        ),
        reason=reason.value,
        inference_service_uid=uid,
    )
