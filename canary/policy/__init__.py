"""The promotion policy language: models, units and loading with located errors."""

from canary.policy.loader import LoadedPolicy, LoadResult, PolicyError, load_paths, load_text
from canary.policy.model import Check, MetricKind, PromotionPolicy, Step

__all__ = [
    "Check",
    "LoadResult",
    "LoadedPolicy",
    "MetricKind",
    "PolicyError",
    "PromotionPolicy",
    "Step",
    "load_paths",
    "load_text",
]
