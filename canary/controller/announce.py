"""Which decisions are worth telling people about, and how a Decision becomes a Notification.

Every decision is logged. People are told about what changes something — a weight written, a
pause, a rollback — and about *transitions* into a worrying condition (inconclusive evidence,
Prometheus failing, an unguarded rollout), not about every tick that condition lasts: Flagger's
duplicate Slack messages (#1515) are the counter-example.
"""

from __future__ import annotations

from datetime import datetime

from canary.notify import Action as NotifyAction
from canary.notify import CheckLine, Notification, Verdict
from canary.notify import Severity as NotifySeverity
from canary.policy import PromotionPolicy
from canary.policy.units import format_value
from canary.rollout.decision import Action, Decision, EventReason, Severity

__all__ = ["is_announced", "to_notification"]

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
    }
)

_ACTIONS = {
    EventReason.CANARY_STARTED: NotifyAction.STARTED,
    EventReason.CANARY_ADVANCED: NotifyAction.ADVANCED,
    EventReason.CANARY_PROMOTED: NotifyAction.PROMOTED,
    EventReason.CANARY_SUCCEEDED: NotifyAction.SUCCEEDED,
    EventReason.CANARY_ROLLED_BACK: NotifyAction.ROLLED_BACK,
    EventReason.CANARY_PAUSED: NotifyAction.PAUSED,
    EventReason.CANARY_AWAITING_APPROVAL: NotifyAction.PAUSED,
    EventReason.EXTERNAL_TRAFFIC_CHANGE: NotifyAction.PAUSED,
    EventReason.CANARY_RESUMED: NotifyAction.RESUMED,
    EventReason.CANARY_INCONCLUSIVE: NotifyAction.INCONCLUSIVE,
    EventReason.UNGUARDED_ROLLOUT: NotifyAction.UNGUARDED_ROLLOUT,
    EventReason.PROMETHEUS_UNAVAILABLE: NotifyAction.PROMETHEUS_UNAVAILABLE,
}
_BY_ACTION = {
    Action.START: NotifyAction.STARTED,
    Action.ADVANCE: NotifyAction.ADVANCED,
    Action.PROMOTE: NotifyAction.PROMOTED,
    Action.ROLLBACK: NotifyAction.ROLLED_BACK,
    Action.PAUSE: NotifyAction.PAUSED,
}


def is_announced(decision: Decision, already_told: set[tuple[str, int | None]]) -> bool:
    """Whether to tell people: every write and pause; a worrying condition once per step.

    ``already_told`` holds the (reason, step) pairs announced for the current revision; the caller
    clears it when the revision changes. Inconclusive evidence that comes and goes within a step is
    one message, not one per evaluation.
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


def to_notification(
    decision: Decision,
    policy: PromotionPolicy,
    now: datetime,
    *,
    inference_service_uid: str | None = None,
) -> Notification:
    action = _BY_ACTION.get(decision.action) or _ACTIONS.get(decision.event_reason, NotifyAction.WAITING)
    checks = tuple(
        CheckLine(
            name=judgement.name,
            verdict=Verdict(str(judgement.verdict)),
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
        action=action,
        severity=NotifySeverity.WARNING if decision.severity is Severity.WARNING else NotifySeverity.INFO,
        phase=str(decision.phase),
        summary=decision.summary,
        from_weight=decision.previous_weight,
        to_weight=to_weight,
        reason=str(decision.event_reason),
        reasons=decision.reasons,
        checks=checks,
        inference_service_uid=inference_service_uid,
    )
