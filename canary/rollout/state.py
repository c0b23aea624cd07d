"""The rollout state of one InferenceService: what the controller remembers between two decisions.

It is an immutable value. :func:`canary.rollout.core.decide` returns a new one; the shell stores it
(a ConfigMap next to the InferenceService) *before* it patches anything, so a crash at any point
resumes exactly where it was (docs/design.md §4). Everything in it is an observation or a decision of the
core with the time it happened at — never a wall-clock read.

The JSON form carries ``schemaVersion``. A newer controller reads older versions (through
:data:`_MIGRATIONS`); a version from the future is refused, because acting on a state one does not
fully understand could repeat or skip a step. Lists that grow with time (the decision history, the
rolled-back revisions) are bounded so the document stays well under a ConfigMap's 1 MiB.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, ConfigDict, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from canary.policy.model import GateStage
from canary.rollout.artefact import Artefact

__all__ = [
    "JSON_CONFIG",
    "MAX_HISTORY",
    "MAX_REASON_CHARS",
    "MAX_ROLLED_BACK",
    "SCHEMA_VERSION",
    "CommandKind",
    "EvaluationRecord",
    "EvaluationVerdict",
    "GateProgress",
    "HistoryEntry",
    "Pause",
    "PauseKind",
    "PendingCommand",
    "Phase",
    "RolledBackRevision",
    "RolloutState",
    "StateFormatError",
    "StepProgress",
    "UnsupportedStateVersion",
    "WeightRecord",
    "describe_time",
    "read_json_object",
]

SCHEMA_VERSION = 2
# Bounds that keep the serialised state small (well under 64 KiB even with 63-character names).
MAX_HISTORY = 100
MAX_ROLLED_BACK = 32
MAX_REASON_CHARS = 200

# The JSON form of every record in the state ConfigMap: camelCase, unknown fields ignored (a newer
# controller may have added some).
JSON_CONFIG = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Phase(StrEnum):
    IDLE = "Idle"  # no rollout: the newest revision is the rolled-out one (or not ours to manage)
    PENDING = "Pending"  # a rollout started; the canary revision is not Ready yet
    PROGRESSING = "Progressing"  # the canary holds a traffic step and is being evaluated
    PROMOTING = "Promoting"  # the percentage was removed; waiting for KServe to record the promotion
    BAKING = "Baking"  # promoted; absolute limits are still watched for ``bake``
    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"
    PAUSED = "Paused"  # stopped until a person acts; see :class:`Pause`

    @property
    def is_rollout_active(self) -> bool:
        """Whether a rollout is under way (a person can pause, abort or promote it)."""
        return self in _ACTIVE_PHASES


_ACTIVE_PHASES = frozenset({Phase.PENDING, Phase.PROGRESSING, Phase.PROMOTING, Phase.BAKING, Phase.PAUSED})


class PauseKind(StrEnum):
    """Why a rollout is paused; each kind has its own way out (see ``apply_command``)."""

    MANUAL = "manual"  # ``kserve-canary pause``
    APPROVAL = "approval"  # a step with ``approval: manual`` passed; waiting for ``approve``
    EXTERNAL_CHANGE = "external-change"  # someone else changed canaryTrafficPercent
    UNEXPECTED_START_VALUE = "unexpected-start-value"  # the new spec came with a percentage we cannot adopt
    NO_DATA = "no-data"  # onNoData.action: pause
    POLICY_CHANGED = "policy-changed"  # the current weight is no longer a step of the edited policy
    HORIZON = "horizon"  # at the step's horizon: atHorizon pause, or a limit the estimate cannot judge


class EvaluationVerdict(StrEnum):
    PASS = "pass"  # noqa: S105 - a verdict, not a password
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


class CommandKind(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    APPROVE = "approve"
    ABORT = "abort"
    PROMOTE = "promote"


@dataclass(frozen=True, slots=True)
class WeightRecord:
    """A value of ``spec.predictor.canaryTrafficPercent``; ``weight`` None is the field being absent."""

    __pydantic_config__ = JSON_CONFIG

    weight: int | None
    revision: str | None
    at: AwareDatetime
    by_controller: bool = True  # False: a value found in the spec and adopted, not written by us


@dataclass(frozen=True, slots=True)
class StepProgress:
    """Where the rollout is: the step, when status first showed its weight, when it passed."""

    __pydantic_config__ = JSON_CONFIG

    index: int
    weight: int
    started_at: AwareDatetime | None = None  # observed in status traffic, not when it was patched
    passed_at: AwareDatetime | None = None  # the evaluation that met window, minRequests and pass
    # The canary requests the step had counted when it first passed (not while a gate or an approval
    # held it after): what the highest step's fair share is measured against.
    counted: float | None = None
    # Seconds of the step's evaluations in which a check was deferred (its namespace's budget of
    # Prometheus time was spent): the step's horizon clock stood still for them.
    deferred: float = 0.0


@dataclass(frozen=True, slots=True)
class EvaluationRecord:
    """The latest evaluation and the counters the step semantics need."""

    __pydantic_config__ = JSON_CONFIG

    at: AwareDatetime | None = None
    verdict: EvaluationVerdict | None = None
    requests: float | None = None
    failed_checks: tuple[str, ...] = ()
    failure_streak: int = 0  # consecutive failed evaluations; a pass resets it
    query_error: bool = False  # a query of this evaluation failed (Prometheus, not the canary)
    last_conclusive_at: AwareDatetime | None = None
    # A query error or a resume restarts the onNoData clock: Prometheus being down is not the
    # canary's lack of data, and a person who resumed has seen the situation.
    no_data_clock_from: AwareDatetime | None = None


@dataclass(frozen=True, slots=True)
class Pause:
    __pydantic_config__ = JSON_CONFIG

    kind: PauseKind
    reason: str
    since: AwareDatetime
    resume_phase: Phase  # the phase to return to
    observed_weight: int | None = None  # for external changes: the value someone else set


@dataclass(frozen=True, slots=True)
class PendingCommand:
    """An operator command the next decision carries out (abort, promote, resume need the full picture)."""

    __pydantic_config__ = JSON_CONFIG

    kind: CommandKind
    at: AwareDatetime
    by: str | None = None


@dataclass(frozen=True, slots=True)
class RolledBackRevision:
    __pydantic_config__ = JSON_CONFIG

    revision: str
    at: AwareDatetime


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One decision, small: the full reasons go to events, logs and notifications."""

    __pydantic_config__ = JSON_CONFIG

    at: AwareDatetime
    action: str
    weight: int | None
    phase: Phase
    event: str
    reason: str
    id: str


@dataclass(frozen=True, slots=True)
class GateProgress:
    """What the state remembers of one gate at one call point (:mod:`canary.rollout.gates`): a
    passed gate is never called again, and its deadline counts from ``since`` across restarts."""

    __pydantic_config__ = JSON_CONFIG

    key: str  # canary.rollout.gates.gate_key
    name: str
    stage: GateStage
    since: AwareDatetime  # first asked
    weight: int | None = None  # the step's weight (step gates)
    passed_at: AwareDatetime | None = None
    attempts: int = 0  # failed attempts recorded
    last_at: AwareDatetime | None = None  # the latest attempt recorded, passed or not
    last_status: int | None = None  # its HTTP status (None: no answer)
    last_detail: str = ""  # why, in a few words, never a secret
    deadline_passed_at: AwareDatetime | None = None  # failurePolicy hold took over then

    def describe_last(self) -> str:
        """The latest attempt in words: ``answered 503 at 2026-03-01T12:00:00Z (Service Unavailable)``."""
        if self.last_at is None:
            return "no answer yet"
        answer = f"answered {self.last_status}" if self.last_status is not None else "no answer"
        detail = f" ({self.last_detail})" if self.last_detail else ""
        return f"{answer} at {describe_time(self.last_at)}{detail}"


@dataclass(frozen=True, slots=True)
class RolloutState:
    """Everything the core remembers about one InferenceService's rollouts."""

    __pydantic_config__ = JSON_CONFIG

    phase: Phase = Phase.IDLE
    # metadata.uid of the InferenceService object this state describes. A model deleted and
    # re-created under the same name is another object (Knative numbers its revisions from 00001
    # again): a state of another uid is stale and never used (see :meth:`bound_to`).
    inference_service_uid: str | None = None
    # The revision under management (the canary during a rollout, the last known one otherwise)
    # and the fingerprint of the predictor spec that produced it.
    revision: str | None = None
    fingerprint: str | None = None
    stable_revision: str | None = None
    # What ``revision`` serves (read with its fingerprint) and what ``stable_revision`` served: KServe
    # keeps only the newest spec, so the stable one's is remembered from the rollout before. None:
    # unknown (a state written before artefacts were recorded, or a rollout first seen under way).
    artefact: Artefact | None = None
    stable_artefact: Artefact | None = None
    started_at: AwareDatetime | None = None  # when the rollout of ``revision`` began
    # The InferenceService's metadata.generation when the rollout began (before the controller's own
    # first write): the generation the author's apply produced. A PromotionPolicy's
    # status.targetGeneration shows it, so `kubectl wait` can tell this rollout from the previous.
    started_generation: int | None = None
    step: StepProgress | None = None
    # When the first step's clock started: the counts pooled for the promotion begin here (and a
    # restarted controller backfills them from Prometheus, so they are never stored).
    evidence_since: AwareDatetime | None = None
    # The canary requests the steps left so far counted (each ``StepProgress.counted``).
    counted_requests: float = 0.0
    evaluation: EvaluationRecord = field(default_factory=EvaluationRecord)
    unready_since: AwareDatetime | None = None  # the canary turned un-Ready mid-rollout at
    spec_change_seen_at: AwareDatetime | None = None  # spec changed, KServe has not created a revision yet
    bake_started_at: AwareDatetime | None = None
    pause: Pause | None = None
    command: PendingCommand | None = None
    # Write-ahead intent: recorded before the shell patches, so after a crash the next decision
    # recognises the write as its own. ``spec_weight`` is the value known to be in the spec.
    intent: WeightRecord | None = None
    spec_weight: WeightRecord | None = None
    unguarded: bool = False  # the canary got more than the first step before the controller acted
    approvals: tuple[int, ...] = ()  # step weights approved for this revision
    # The gates of this rollout reached so far (canary.rollout.gates), one per call point.
    gates: tuple[GateProgress, ...] = ()
    rolled_back: tuple[RolledBackRevision, ...] = ()
    history: tuple[HistoryEntry, ...] = ()

    # -- JSON --------------------------------------------------------------------------------

    def to_json(self) -> str:
        """The state as a compact JSON document with ``schemaVersion`` first."""
        body = _ADAPTER.dump_python(self, mode="json", by_alias=True)
        return json.dumps({"schemaVersion": SCHEMA_VERSION, **body}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> RolloutState:
        """Read a state written by this or an older controller.

        Raises :class:`UnsupportedStateVersion` for a state written by a newer controller and
        :class:`StateFormatError` for anything that is not a valid state.
        """
        document = read_json_object(text, "the rollout state", StateFormatError)
        version = document.pop("schemaVersion", None)
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise StateFormatError(f"the rollout state has no valid schemaVersion (found {version!r})")
        if version > SCHEMA_VERSION:
            raise UnsupportedStateVersion(version)
        while version < SCHEMA_VERSION:
            document = _MIGRATIONS[version](document)
            version += 1
        try:
            state = _ADAPTER.validate_python(document)
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise StateFormatError(f"the rollout state is invalid at {where}: {first['msg']}") from None
        except RecursionError:
            raise StateFormatError("the rollout state is nested too deeply to be read") from None
        return state.bounded()

    def bounded(self) -> RolloutState:
        """This state with its growing lists cut to their bounds (newest kept)."""
        if len(self.history) <= MAX_HISTORY and len(self.rolled_back) <= MAX_ROLLED_BACK:
            return self
        return replace(
            self, history=self.history[-MAX_HISTORY:], rolled_back=self.rolled_back[-MAX_ROLLED_BACK:]
        )

    @property
    def underlying_phase(self) -> Phase:
        """The phase, looking through a pause at the phase it interrupted."""
        if self.phase is Phase.PAUSED and self.pause is not None:
            return self.pause.resume_phase
        return self.phase

    @property
    def rollout_active(self) -> bool:
        """Whether a rollout is under way (paused or not)."""
        return self.underlying_phase.is_rollout_active

    @property
    def warm_up_counted(self) -> bool:
        """Whether the canary's warm-up is part of what is judged now: while it is Pending and in the
        first step, its restarts and OOM kills count from the rollout's start (``started_at``;
        EvidenceRequest.canary_born, docs/design.md §3.5). Later steps and the bake judge their own
        window only."""
        step = self.step
        return (
            self.phase in (Phase.PENDING, Phase.PROGRESSING)
            and step is not None
            and step.index == 0
            and self.started_at is not None
        )

    def artefact_of(self, revision: str | None) -> Artefact | None:
        """What ``revision`` serves, when it is the canary or the stable revision of this state."""
        if revision is None:
            return None
        if revision == self.revision:
            return self.artefact
        return self.stable_artefact if revision == self.stable_revision else None

    def was_rolled_back(self, revision: str) -> bool:
        return any(entry.revision == revision for entry in self.rolled_back)

    def bound_to(self, uid: str | None, *, owner_uid: str | None) -> RolloutState | None:
        """This state for the InferenceService object ``uid`` — None when it describes another object.

        A state records its object's uid. One that does not (schemaVersion 1, or never saved) is
        adopted only if its ConfigMap's owner reference names ``uid`` (``owner_uid``), or if it is
        empty; anything else is stale. With ``uid`` unknown (no object) the state is kept as it is.
        """
        if uid is None or self.inference_service_uid == uid:
            return self
        if self.inference_service_uid is None and (owner_uid == uid or self == RolloutState()):
            return replace(self, inference_service_uid=uid)
        return None


class StateFormatError(ValueError):
    """The stored rollout state cannot be read."""


class UnsupportedStateVersion(StateFormatError):
    def __init__(self, version: int) -> None:
        super().__init__(
            f"the rollout state was written by a newer kserve-canary (schemaVersion {version}); this "
            f"controller understands schemaVersion {SCHEMA_VERSION} and older. It will not act on a state "
            "it does not understand: upgrade the controller (or delete the state ConfigMap to start over)."
        )
        self.version = version


def _from_version_1(document: dict[str, Any]) -> dict[str, Any]:
    """Version 1 did not record the InferenceService's uid: it stays unknown (None), and the shell
    adopts the state only if its ConfigMap's owner reference names the current object
    (:meth:`RolloutState.bound_to`)."""
    return {key: value for key, value in document.items() if key != "inferenceServiceUid"}


# schemaVersion N -> N+1. A change to the state's shape adds a function here and bumps
# SCHEMA_VERSION, and tests keep a document of every old version.
_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _from_version_1}

_ADAPTER: TypeAdapter[RolloutState] = TypeAdapter(RolloutState)


def read_json_object(text: str | bytes, what: str, error: type[StateFormatError]) -> dict[str, Any]:
    """The JSON object in ``text``; anything else (not JSON, too deep, not an object) raises ``error``."""
    try:
        document = json.loads(text)
    except ValueError as problem:
        raise error(f"{what} is not valid JSON: {problem}") from None
    except RecursionError:
        # json gives up on deep nesting ([[[[...]]]]) with RecursionError, which is no ValueError.
        raise error(f"{what} is nested too deeply to be read") from None
    if not isinstance(document, dict):
        raise error(f"{what} is not a JSON object (found {type(document).__name__})")
    return document


def describe_time(moment: datetime | None) -> str:
    """A timestamp for people: ``2026-03-01T12:00:00Z`` (UTC, whole seconds)."""
    if moment is None:
        return "never"
    try:
        utc = moment.astimezone(UTC)
    except OverflowError:  # "0001-01-01T00:00+23:59" in a hand-written command.json has no UTC time
        return moment.isoformat(timespec="seconds")
    return utc.replace(tzinfo=None).isoformat(timespec="seconds") + "Z"
