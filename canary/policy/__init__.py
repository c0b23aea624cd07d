"""The promotion policy language: models, units and loading with located errors."""

from canary.policy.loader import LoadedPolicy, LoadResult, PolicyError, load_paths, load_text
from canary.policy.model import Check, MetricKind, PromotionPolicy, Step
from canary.policy.status import Condition, ConditionStatus, ConditionType, PolicyPhase, PromotionPolicyStatus

__all__ = [
    "Check",
    "Condition",
    "ConditionStatus",
    "ConditionType",
    "LoadResult",
    "LoadedPolicy",
    "MetricKind",
    "PolicyError",
    "PolicyPhase",
    "PromotionPolicy",
    "PromotionPolicyStatus",
    "Step",
    "load_paths",
    "load_text",
]
