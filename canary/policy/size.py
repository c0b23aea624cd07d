"""Whether a policy's evaluation can be stored whole: an estimate from its checks and their PromQL.

The controller keeps the latest evaluation (``explain.json``) beside the rollout's state and the record
of past rollouts in one ConfigMap of at most ``MAX_STATE_BYTES`` (canary/kserve/store.py, 512 KiB).
The record of past rollouts takes at most 192 KiB (canary/rollout/past.py, ``MAX_RECORD_BYTES``), the
state at most about 64 KiB (100 history entries of at most 200 characters of reason, plus their fields:
canary/rollout/state.py), so an evaluation has :data:`MAX_EVALUATION_BYTES` (256 KiB) for itself.
What does not fit is shortened (``ExplainDocument.fitted_json``), and a policy that could never have
its evaluation stored whole is refused where it is written: at ``validate`` and in the controller.

Per check an evaluation keeps its numbers and statement (:data:`CHECK_BYTES`) and up to three queries:
the query as run, the canary's, the stable's (the last two at most 4,096 characters each,
canary/rollout/records.py). A built-in metric's queries come from the catalog
(:data:`BUILTIN_QUERY_BYTES` each, the largest grouped one); a custom one is its PromQL as written
(``{{ ... }}`` variables expand to names of at most 63 characters).

Fairness quotas (at most 8 custom queries per policy, branch ``fair``) and this bound agree: 8 custom
checks of 10 KiB of PromQL each estimate at 8 × (1 KiB + 10 KiB + 2 × 4 KiB) = 152 KiB, within
256 KiB; this bound therefore only refuses what no quota lets through — many built-in checks (about
40 and more) or custom PromQL of tens of kilobytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the model calls this module from its validator
    from canary.policy.model import Check, PolicySpec

__all__ = ["BUILTIN_QUERY_BYTES", "CHECK_BYTES", "MAX_EVALUATION_BYTES", "evaluation_bytes", "too_large"]

MAX_EVALUATION_BYTES = 256 * 1024
CHECK_BYTES = 1024  # a check's numbers, limit, statement and field names, as stored
BUILTIN_QUERY_BYTES = 2048  # the catalog's largest grouped query for one check (about 1,900 characters)
KEPT_QUERY_CHARS = 4096  # canary and stable queries beyond this are not kept (records.MAX_CANARY_QUERY_CHARS)
_VARIABLE_GROWTH = 63  # a {{ variable }} expands to at most a Kubernetes name


def _query_bytes(check: Check, spec: PolicySpec) -> int:
    template = check.promql
    if check.metric is not None:
        template = spec.metrics.queries.get(check.metric.value, template)
    if template is None:
        return BUILTIN_QUERY_BYTES
    return len(template.encode()) + template.count("{{") * _VARIABLE_GROWTH


def evaluation_bytes(spec: PolicySpec) -> int:
    """The estimated size of one evaluation of ``spec`` stored whole, queries included."""
    total = 0
    for check in spec.checks:
        query = _query_bytes(check, spec)
        total += CHECK_BYTES + 2 * len(check.name.encode()) + query + 2 * min(query, KEPT_QUERY_CHARS)
    return total


def too_large(spec: PolicySpec) -> str | None:
    """Why ``spec``'s evaluation could not be stored whole, with the fix; None when it fits."""
    size = evaluation_bytes(spec)
    if size <= MAX_EVALUATION_BYTES:
        return None
    return (
        f"its evaluation could not be stored: {len(spec.checks)} checks and their PromQL need about "
        f"{size:,} bytes, more than the {MAX_EVALUATION_BYTES:,} the rollout's state ConfigMap has for "
        "it; use fewer checks or shorter custom queries (split the InferenceService's checks across "
        "fewer, broader queries)"
    )
