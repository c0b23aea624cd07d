"""What one call of the decision core returns: the action, the state to store, and why."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from canary.rollout.judge import Judgement
from canary.rollout.state import EvaluationVerdict, Phase, RolloutState

__all__ = ["Action", "Decision", "EventReason", "Severity"]


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
    INFO = "info"
    WARNING = "warning"  # rollbacks, pauses and problems


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


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of :func:`canary.rollout.core.decide`.

    The shell stores ``new_state`` first (it carries the write-ahead intent), then, if
    ``action.writes``, applies :attr:`patch` to the InferenceService.
    """

    action: Action
    weight: int | None  # the value to write for start/advance/rollback; None for promote and non-writes
    new_state: RolloutState
    reasons: tuple[str, ...]
    event_reason: EventReason
    severity: Severity
    id: str  # deterministic: the same decision (revision, action, step, time) has the same id
    revision: str | None = None  # the canary revision the decision is about
    stable_revision: str | None = None
    previous_weight: int | None = None  # canaryTrafficPercent in the spec before the decision
    judgements: tuple[Judgement, ...] = ()
    verdict: EvaluationVerdict | None = None  # None when no evaluation took place
    requests: float | None = None
    evaluated_at: datetime | None = None

    @property
    def phase(self) -> Phase:
        return self.new_state.phase

    @property
    def summary(self) -> str:
        return self.reasons[0] if self.reasons else str(self.action)

    @property
    def patch(self) -> dict[str, Any] | None:
        """The JSON merge patch (RFC 7386) to apply, or None when nothing is written."""
        if not self.action.writes:
            return None
        return {"spec": {"predictor": {"canaryTrafficPercent": self.weight}}}
