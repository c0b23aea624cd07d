"""``status`` of a PromotionPolicy object: what the controller reports about the rollout it governs.

This module is the contract between the controller (which writes ``status`` through the
``promotionpolicies/status`` subresource) and everything that reads it: ``kubectl get pp`` (the
CRD's printer columns), ``kubectl wait``, Argo CD's health check (``deploy/argocd``) and Flux's
kstatus. The CRD's status schema is generated from :class:`PromotionPolicyStatus`
(``canary.policy.crd``), so a field added here is a field the API server accepts.

Writing it::

    status = PromotionPolicyStatus(
        observed_generation=policy_object_generation,
        phase=PolicyPhase.PROGRESSING,
        canary_revision="llama-predictor-00002",
        stable_revision="llama-predictor-00001",
        weight=30,
        step=step_text(1, 3),  # "2/3": the second of three held steps
        conditions=set_condition(old.conditions, Condition.of(
            ConditionType.PROMOTED, ConditionStatus.FALSE, "Progressing",
            "revision llama-predictor-00002 holds step 2/3 at 30%", now, generation)),
    )
    body = {"status": status.to_api()}  # JSON-ready, camelCase, no nulls

The vocabulary mirrors ``canary.rollout`` (phase values are ``rollout.state.Phase``'s, the
decision's action ``rollout.vocabulary.Action``'s, verdicts ``EvaluationVerdict``'s and
``CheckVerdict``'s) but is spelled out here, because ``canary.policy`` is the bottom layer and
imports nothing above it; ``tests/policy/test_crd_schema.py`` checks the two stay equal.

Conditions follow the Kubernetes API conventions (``metav1.Condition``: type, status
``True``/``False``/``Unknown``, a CamelCase reason, a message, lastTransitionTime, observedGeneration).
``metav1.Condition`` has no room for a revision, so **every message names the canary revision it
speaks of**, and ``status.canaryRevision`` / ``status.targetGeneration`` say which one is current.

The condition types and what the controller promises about each (the controller sets all seven on
every status write, so a reader never sees a half-updated set):

``PolicyValid``
    True (reason ``Valid``) when the spec validates; False (reason ``InvalidSpec``) with the located
    errors in the message (unknown fields never reach it: the API server refuses or prunes them).
``Conflict`` (abnormal-true)
    True (reason ``TargetClaimed``) when another policy already governs the same InferenceService;
    this one is ignored until that is resolved. False (reason ``NoConflict``) otherwise.
``Promoted``
    About the revision in ``status.canaryRevision``. **As soon as the controller sees a new revision
    it sets Promoted=False with reason ``Progressing`` before anything else** (in the same write that
    sets ``canaryRevision`` and ``targetGeneration``), so a Promoted=True left over from the previous
    revision is never read as this one's. True with reason ``Baking`` once the canary has 100% and
    ``bake`` is still running, ``Succeeded`` when the rollout is over, ``NoRollout`` when the
    InferenceService's newest revision was already rolled out when the policy took it over. False
    with ``Progressing``, ``Paused``, ``AwaitingApproval`` or ``RolledBack``.
``RolledBack`` (abnormal-true)
    True when the canary revision was rolled back (reason: the event reason, e.g.
    ``CanaryRolledBack``; the message says which checks failed); False (``NotRolledBack``) otherwise
    and again as soon as a new revision starts.
``Reconciling`` (kstatus, abnormal-true)
    True while a rollout is under way and will go on by itself or by an expected approval: phases
    Pending, Progressing, Promoting, Baking, and Paused for ``approval``/``manual``; the reason is the
    phase (``Pending``, ``Progressing``, ...) or ``AwaitingApproval``/``Paused``.
``Stalled`` (kstatus, abnormal-true)
    True when nothing moves without a person fixing something: an invalid spec (``InvalidSpec``),
    a conflict (``TargetClaimed``), a rollback (``RolledBack``: Git asks for a revision that is not
    served), or a pause for a problem (``ExternalTrafficChange``, ``NoData``, ...).
``Ready``
    True exactly when Reconciling and Stalled are both False (reasons ``Idle``, ``Succeeded``);
    otherwise False with the reason of the one that is True. kstatus (Flux) reads Ready, Reconciling,
    Stalled and ``observedGeneration``: a policy is *Current* when its rollout is over and good,
    *InProgress* while it runs, *Failed* when it stalled.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

__all__ = [
    "CONDITION_REASON_PATTERN",
    "CONDITION_TYPE_PATTERN",
    "ArtefactStatus",
    "CheckStatus",
    "CheckVerdict",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "DecisionAction",
    "DecisionVerdict",
    "GateOutcome",
    "GateStatus",
    "LastDecision",
    "PolicyPhase",
    "PromotionPolicyStatus",
    "find_condition",
    "set_condition",
    "step_text",
]

# metav1.Condition's validation, as the API server applies it to every built-in type's conditions.
CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
_STEP_PATTERN = r"^[0-9]+/[0-9]+$"


class PolicyPhase(StrEnum):
    """``status.phase``: the rollout's phase (``canary.rollout.state.Phase``) plus ``Invalid``."""

    IDLE = "Idle"
    PENDING = "Pending"
    PROGRESSING = "Progressing"
    PROMOTING = "Promoting"
    BAKING = "Baking"
    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"
    PAUSED = "Paused"
    # Not a rollout phase: the spec does not validate (or conflicts), so no rollout runs under it.
    INVALID = "Invalid"


class DecisionAction(StrEnum):
    """``status.lastDecision.action``: ``canary.rollout.vocabulary.Action``'s values."""

    WAIT = "wait"
    START = "start"
    ADVANCE = "advance"
    PROMOTE = "promote"
    ROLLBACK = "rollback"
    PAUSE = "pause"


class DecisionVerdict(StrEnum):
    """``status.lastDecision.verdict``: the evaluation's verdict (``EvaluationVerdict``)."""

    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class CheckVerdict(StrEnum):
    """``status.checks[].verdict``: ``canary.rollout.vocabulary.CheckVerdict``'s values."""

    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    NOT_YET = "not-yet"
    NO_DATA = "no-data"
    ERROR = "error"


class ConditionType(StrEnum):
    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"
    PROMOTED = "Promoted"
    ROLLED_BACK = "RolledBack"
    POLICY_VALID = "PolicyValid"
    CONFLICT = "Conflict"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


def _aware_utc(moment: datetime) -> datetime:
    # A naive datetime would be written as if it were UTC whatever it meant: refuse it.
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("must be timezone-aware")
    # Second precision, as metav1.Time stores it: what is read back equals what was written.
    return moment.astimezone(UTC).replace(microsecond=0)


def _rfc3339(moment: datetime) -> str:
    # metav1.Time is serialised with second precision ("2026-12-01T14:36:18Z"); writing the same keeps
    # an unchanged condition byte-for-byte unchanged, so a status write without news is a no-op.
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Timestamp = Annotated[
    datetime,
    AfterValidator(_aware_utc),
    PlainSerializer(_rfc3339, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]


class _StatusModel(BaseModel):
    model_config = ConfigDict(
        extra="forbid",  # a misspelt field is a controller bug; the CRD would prune it silently
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
    )


class Condition(_StatusModel):
    """One ``metav1.Condition``. The message names the canary revision it is about."""

    type: str = Field(max_length=316, pattern=CONDITION_TYPE_PATTERN, description="One of ConditionType.")
    status: ConditionStatus
    observed_generation: int | None = Field(
        default=None, ge=0, description="The policy's metadata.generation the condition was set from."
    )
    last_transition_time: Timestamp = Field(description="When status last changed (not reason or message).")
    reason: str = Field(
        min_length=1,
        max_length=1024,
        pattern=CONDITION_REASON_PATTERN,
        description="CamelCase, stable: for programs.",
    )
    message: str = Field(max_length=32768, description="For people; names the canary revision.")

    @classmethod
    def of(
        cls,
        type_: ConditionType | str,
        status: ConditionStatus | bool,
        reason: str,
        message: str,
        at: datetime,
        observed_generation: int | None = None,
    ) -> Self:
        """A condition from positional parts; a bool status is True/False."""
        if isinstance(status, bool):
            status = ConditionStatus.TRUE if status else ConditionStatus.FALSE
        return cls(
            type=str(type_),
            status=status,
            reason=reason,
            message=message,
            last_transition_time=at,
            observed_generation=observed_generation,
        )


class LastDecision(_StatusModel):
    """The controller's latest decision about the canary revision."""

    action: DecisionAction
    verdict: DecisionVerdict | None = Field(
        default=None, description="The evaluation's verdict; absent when the decision took none."
    )
    reason: str = Field(
        min_length=1,
        pattern=CONDITION_REASON_PATTERN,
        description="The decision's event reason, CamelCase (CanaryAdvanced, CanaryRolledBack, ...).",
    )
    message: str | None = Field(default=None, description="The decision's first reason, for people.")
    at: Timestamp


class CheckStatus(_StatusModel):
    """One check's outcome in the latest evaluation."""

    name: str
    verdict: CheckVerdict
    value: str | None = Field(
        default=None,
        description='The measured value in the check\'s unit ("812ms", "0.4%"); absent without data.',
    )
    limit: str | None = Field(default=None, description='The limit it was judged against ("<= 800ms").')
    statement: str | None = Field(default=None, description="The judgement in one sentence.")


class ArtefactStatus(_StatusModel):
    """What a revision serves, as the controller recorded it from the InferenceService spec (URIs
    without userinfo or query string): ``canary.rollout.artefact.Artefact``'s fields."""

    storage_uri: str | None = Field(default=None, description="storageUri (or storageUris, STORAGE_URI).")
    image: str | None = Field(default=None, description="The predictor container's image.")
    runtime: str | None = Field(default=None, description="The ServingRuntime the spec names.")
    model_format: str | None = Field(default=None, description="modelFormat, name or name:version.")


class GateOutcome(StrEnum):
    PASSED = "Passed"
    WAITING = "Waiting"  # called (and retried) until it passes or its deadline passes
    DEADLINE_PASSED = "DeadlinePassed"  # failurePolicy hold: still holding and calling


class GateStatus(_StatusModel):
    """One gate of the current rollout at one call point (spec.gates)."""

    name: str
    at: str = Field(description="pre-rollout, step or pre-promotion.")
    step: str | None = Field(default=None, description='The step\'s weight for step gates ("30%").')
    result: GateOutcome
    attempts: int = Field(default=0, ge=0, description="Failed attempts so far.")
    message: str = Field(description="The latest attempt in words (status, time, why), never a URL.")
    since: Timestamp = Field(description="First called: the deadline counts from here.")


class PromotionPolicyStatus(_StatusModel):
    """``status`` of a PromotionPolicy. Every field is optional: an empty status is a valid one."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The policy's metadata.generation this status was computed from."
    )
    phase: PolicyPhase | None = None
    canary_revision: str | None = Field(
        default=None, description="The revision being (or last) rolled out; every condition names it."
    )
    stable_revision: str | None = Field(default=None, description="The revision serving the rest.")
    canary_artefact: ArtefactStatus | None = Field(
        default=None, description="What canaryRevision serves; absent: not recorded."
    )
    stable_artefact: ArtefactStatus | None = Field(
        default=None,
        description="What stableRevision serves, recorded while it was rolled out (KServe keeps no "
        "previous spec); absent: unknown.",
    )
    target_generation: int | None = Field(
        default=None,
        ge=0,
        description=(
            "The InferenceService's metadata.generation when the rollout of canaryRevision began, before "
            "the controller's first write: the change that created it. The controller's own "
            "canaryTrafficPercent writes do not move it."
        ),
    )
    weight: int | None = Field(default=None, ge=0, le=100, description="The canary's traffic percentage.")
    step: str | None = Field(
        default=None, pattern=_STEP_PATTERN, description='The held step, "2/3": the second of three.'
    )
    last_decision: LastDecision | None = None
    checks: list[CheckStatus] = Field(default_factory=list, description="The latest evaluation, per check.")
    gates: list[GateStatus] = Field(
        default_factory=list, description="The current rollout's gates reached so far, per call point."
    )
    conditions: list[Condition] = Field(default_factory=list)

    def condition(self, type_: ConditionType | str) -> Condition | None:
        return find_condition(self.conditions, type_)

    def to_api(self) -> dict[str, Any]:
        """The JSON body of ``status``: camelCase, RFC 3339 times, no nulls (an absent field is unset)."""
        body: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return body


def step_text(index: int, count: int) -> str:
    """``"2/3"`` for index 1 (zero-based) of three held steps."""
    if not 0 <= index < count:
        raise ValueError(f"step index {index} is outside 0..{count - 1}")
    return f"{index + 1}/{count}"


def find_condition(conditions: Iterable[Condition], type_: ConditionType | str) -> Condition | None:
    wanted = str(type_)
    return next((condition for condition in conditions if condition.type == wanted), None)


def set_condition(conditions: Iterable[Condition], new: Condition) -> list[Condition]:
    """``meta.SetStatusCondition``: replace the condition of ``new.type``, keeping its
    lastTransitionTime when the status did not change (a new reason or message is no transition)."""
    result: list[Condition] = []
    replaced = False
    for condition in conditions:
        if condition.type != new.type:
            result.append(condition)
            continue
        replaced = True
        if condition.status == new.status:
            new = new.model_copy(update={"last_transition_time": condition.last_transition_time})
        result.append(new)
    if not replaced:
        result.append(new)
    return result
