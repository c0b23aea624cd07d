"""The pure rollout decision core: state, decide(), judging checks, commands, the timeline.

Nothing in this package performs I/O, reads a clock or draws random numbers: the live controller,
the demo, simulations and backtests all run the very same decisions.
"""

from canary.rollout.commands import CommandResult, apply_command
from canary.rollout.core import Preparation, decide, evidence_request, landed_write, prepare
from canary.rollout.decision import Decision
from canary.rollout.judge import CheckVerdict, Evaluation, Judgement, judge_check, judge_evidence
from canary.rollout.ledger import LedgerFormatError, RollbackLedger, ledger_after
from canary.rollout.observed import DeploymentMode, ObservedInferenceService, TrafficTarget
from canary.rollout.state import (
    SCHEMA_VERSION,
    CommandKind,
    EvaluationVerdict,
    Pause,
    PauseKind,
    Phase,
    RolloutState,
    StateFormatError,
    UnsupportedStateVersion,
)
from canary.rollout.timeline import Timeline, TimelineEntry
from canary.rollout.vocabulary import (
    Action,
    EventReason,
    NotificationAction,
    Severity,
    decision_id,
    notification_action,
)

__all__ = [
    "SCHEMA_VERSION",
    "Action",
    "CheckVerdict",
    "CommandKind",
    "CommandResult",
    "Decision",
    "DeploymentMode",
    "Evaluation",
    "EvaluationVerdict",
    "EventReason",
    "Judgement",
    "LedgerFormatError",
    "NotificationAction",
    "ObservedInferenceService",
    "Pause",
    "PauseKind",
    "Phase",
    "Preparation",
    "RollbackLedger",
    "RolloutState",
    "Severity",
    "StateFormatError",
    "Timeline",
    "TimelineEntry",
    "TrafficTarget",
    "UnsupportedStateVersion",
    "apply_command",
    "decide",
    "decision_id",
    "evidence_request",
    "judge_check",
    "judge_evidence",
    "landed_write",
    "ledger_after",
    "notification_action",
    "prepare",
]
