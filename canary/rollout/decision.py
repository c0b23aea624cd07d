"""What one call of the decision core returns: the action, the state to store, and why."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from canary.rollout.gates import GateCall
from canary.rollout.judge import Judgement
from canary.rollout.state import EvaluationVerdict, Phase, RolloutState
from canary.rollout.vocabulary import Action, EventReason, Severity

__all__ = ["Action", "Decision", "EventReason", "Severity", "canary_percent_patch"]


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
    # The InferenceService's resourceVersion the decision was made on: the patch's precondition.
    resource_version: str | None = None
    # The gates this decision waits for (canary.rollout.gates): the shell calls them beside the
    # tick and hands their results to the next decision. Their progress is ``new_state.gates``.
    gate_calls: tuple[GateCall, ...] = ()

    @property
    def phase(self) -> Phase:
        return self.new_state.phase

    @property
    def summary(self) -> str:
        return self.reasons[0] if self.reasons else str(self.action)

    @property
    def patch(self) -> dict[str, Any] | None:
        """The JSON merge patch (RFC 7386) the shell sends as it is, or None when nothing is written."""
        if not self.action.writes:
            return None
        return canary_percent_patch(self.weight, self.resource_version)


def canary_percent_patch(weight: int | None, resource_version: str | None) -> dict[str, Any]:
    """The one write the controller makes: ``canaryTrafficPercent`` (None, JSON null, removes it: a
    promotion), conditional on ``resource_version`` so that a write based on a stale read fails with 409.

    Without a resourceVersion (a view built by hand, not read from the API) the patch has no
    precondition; the InferenceService client refuses to send such a patch.
    """
    patch: dict[str, Any] = {"spec": {"predictor": {"canaryTrafficPercent": weight}}}
    if resource_version is not None:
        patch = {"metadata": {"resourceVersion": resource_version}, **patch}
    return patch
