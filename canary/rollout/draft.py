"""The decision in progress, as values: what a tick is about (:class:`Tick`), how far it got (:class:`Draft`).

The rules of :mod:`canary.rollout.core` are pure functions of a :class:`Tick` (the inputs, fixed for
the whole decision) and a :class:`Draft` (what the decision has found so far: the state it would
store, its reasons, its severity, the gates it waits for, the evaluation it judged). A rule returns a
new draft to go on with, or a :class:`Final`: the decision, with the draft it was made from (the
last word of :func:`canary.rollout.core.decide` may still overrule a write).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple, TypeAlias

from canary.policy.model import Check, PolicySpec, PromotionPolicy, Step
from canary.policy.units import format_duration
from canary.rollout.decision import Decision
from canary.rollout.gates import GateCall, GateResult
from canary.rollout.judge import Evaluation, has_absolute_limit
from canary.rollout.ledger import RollbackLedger
from canary.rollout.memo import IdentityMemo
from canary.rollout.observed import ObservedInferenceService
from canary.rollout.sampled import ErrorBudget
from canary.rollout.state import MAX_REASON_CHARS, RolloutState
from canary.rollout.vocabulary import Severity

__all__ = [
    "Draft",
    "Final",
    "Outcome",
    "PolicyPlan",
    "Tick",
    "duration",
    "requests_of",
    "seconds",
    "shorten",
    "step_at_or_below",
    "weight_text",
]


@dataclass(frozen=True, slots=True)
class PolicyPlan:
    """What the core derives from a policy, once per policy object rather than once per decision."""

    key: str  # namespace/inferenceService
    steps: tuple[Step, ...]  # the held steps (below 100)
    checks: tuple[Check, ...]
    absolute_checks: tuple[Check, ...]  # judged while pending or baking
    windows: tuple[timedelta, ...]  # per step
    window_texts: tuple[str, ...]  # per step, for messages
    min_requests: tuple[int, ...]  # per step
    interval: timedelta
    progress_deadline: timedelta
    bake: timedelta
    budget: ErrorBudget
    # Per step: its weight's share of the weights up to it — the share of the requests the steps
    # counted that the highest step must carry before a promotion on the tests.
    fair_shares: tuple[float, ...]
    horizons: tuple[timedelta, ...]  # per step: the evidence time after which the estimate decides

    @classmethod
    def of(cls, policy: PromotionPolicy) -> PolicyPlan:
        spec = policy.spec
        steps = tuple(spec.canary_steps)
        return cls(
            key=policy.key,
            steps=steps,
            checks=tuple(spec.checks),
            absolute_checks=tuple(check for check in spec.checks if has_absolute_limit(check)),
            windows=tuple(seconds(spec.step_window(step)) for step in steps),
            window_texts=tuple(format_duration(spec.step_window(step)) for step in steps),
            min_requests=tuple(spec.step_min_requests(step) for step in steps),
            interval=seconds(spec.interval),
            progress_deadline=seconds(spec.progress_deadline),
            bake=seconds(spec.bake),
            budget=ErrorBudget.of(policy),
            fair_shares=tuple(
                step.weight / sum(earlier.weight for earlier in steps[: index + 1])
                for index, step in enumerate(steps)
            ),
            horizons=tuple(seconds(spec.step_horizon(step)) for step in steps),
        )


# Derived once per (immutable) PromotionPolicy object: see canary.rollout.memo.
_plan = IdentityMemo(PolicyPlan.of, capacity=1024)


class Tick(NamedTuple):
    """What one decision is about: the same from its first rule to its last."""

    policy: PromotionPolicy
    spec: PolicySpec
    plan: PolicyPlan
    steps: tuple[Step, ...]  # the plan's: the held steps (below 100)
    observed: ObservedInferenceService
    original: RolloutState  # the state as given (a wait that changes the phase is history)
    now: datetime
    ledger: RollbackLedger  # the entries of this InferenceService object only
    gate_results: tuple[GateResult, ...]
    alarm: bool  # an evaluation is due now, before its interval (see decide)

    @classmethod
    def of(
        cls,
        policy: PromotionPolicy,
        observed: ObservedInferenceService,
        state: RolloutState,
        now: datetime,
        *,
        ledger: RollbackLedger | None = None,
        gates: Sequence[GateResult] = (),
        alarm: bool = False,
    ) -> Tick:
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError("decide() needs a timezone-aware 'now'")
        plan = _plan(policy)
        return cls(
            policy,
            policy.spec,
            plan,
            plan.steps,
            observed,
            state,
            now,
            (ledger or RollbackLedger()).for_inference_service(observed.uid),
            tuple(gates),
            alarm,
        )


class Draft(NamedTuple):
    """What the decision has found so far. Every change makes a new draft."""

    state: RolloutState  # the state the decision would store
    reasons: tuple[str, ...] = ()  # why, after the headline
    severity: Severity = Severity.INFO  # at least this
    # A finding that outranks a wait's own headline (a failed evaluation, an onNoData hold).
    lead: str | None = None
    resumed_by: str | None = None  # a resume command taken in this tick (a wait is "resumed")
    gate_calls: tuple[GateCall, ...] = ()  # the gates a wait waits for
    evaluation: Evaluation | None = None  # the evidence judged in this tick
    evaluated_at: datetime | None = None

    # A named tuple, built by its constructor rather than _replace: a draft changes a few times in
    # every decision, and decide() runs thousands of times a second (a frozen dataclass costs
    # several times as much to build).

    def with_state(self, state: RolloutState) -> Draft:
        return Draft(
            state, self.reasons, self.severity, self.lead, self.resumed_by, self.gate_calls,
            self.evaluation, self.evaluated_at,
        )  # fmt: skip

    def noting(self, *reasons: str) -> Draft:
        """With ``reasons`` added after those found so far."""
        return Draft(
            self.state, (*self.reasons, *reasons), self.severity, self.lead, self.resumed_by,
            self.gate_calls, self.evaluation, self.evaluated_at,
        )  # fmt: skip

    def noting_first(self, reason: str) -> Draft:
        """With ``reason`` before those found so far."""
        return Draft(
            self.state, (reason, *self.reasons), self.severity, self.lead, self.resumed_by,
            self.gate_calls, self.evaluation, self.evaluated_at,
        )  # fmt: skip

    def warning(self, *reasons: str) -> Draft:
        """At least a warning, with ``reasons`` added."""
        return Draft(
            self.state, (*self.reasons, *reasons), Severity.WARNING, self.lead, self.resumed_by,
            self.gate_calls, self.evaluation, self.evaluated_at,
        )  # fmt: skip

    def leading(self, lead: str) -> Draft:
        """A warning whose ``lead`` outranks the headline of the wait that follows."""
        return Draft(
            self.state, self.reasons, Severity.WARNING, lead, self.resumed_by, self.gate_calls,
            self.evaluation, self.evaluated_at,
        )  # fmt: skip

    def resumed(self, by: str) -> Draft:
        return Draft(
            self.state, self.reasons, self.severity, self.lead, by, self.gate_calls, self.evaluation,
            self.evaluated_at,
        )  # fmt: skip

    def calling(self, calls: Sequence[GateCall]) -> Draft:
        """With the gate ``calls`` the decision waits for."""
        return Draft(
            self.state, self.reasons, self.severity, self.lead, self.resumed_by,
            (*self.gate_calls, *calls), self.evaluation, self.evaluated_at,
        )  # fmt: skip

    def evaluated(self, evaluation: Evaluation, at: datetime, state: RolloutState) -> Draft:
        """With ``evaluation`` (of evidence at ``at``) judged, and ``state`` recording it."""
        return Draft(
            state, self.reasons, self.severity, self.lead, self.resumed_by, self.gate_calls, evaluation, at
        )

    def overruled(self, reason: str) -> Draft:
        """Only ``reason``, as a warning: what was found before no longer explains the decision."""
        return Draft(
            self.state, (reason,), Severity.WARNING, None, None, self.gate_calls, self.evaluation,
            self.evaluated_at,
        )  # fmt: skip


class Final(NamedTuple):
    """A decision, with the draft it was made from."""

    decision: Decision
    draft: Draft


# What a rule returns: a draft to go on with, or the decision.
Outcome: TypeAlias = Draft | Final


# ------------------------------------------------------------------------------------------------
# Small helpers shared by the tick's modules


def seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def duration(delta: timedelta) -> str:
    return format_duration(delta.total_seconds())


def requests_of(requests: float | None) -> str:
    return "an unknown number of requests" if requests is None else f"{requests:,.0f} requests"


def weight_text(weight: int | None) -> str:
    return "unset (field absent)" if weight is None else f"{weight}%"


def shorten(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def step_at_or_below(steps: tuple[Step, ...], weight: int) -> int:
    """The index of the highest step not above ``weight`` (the first step when all are above)."""
    index = 0
    for position, step in enumerate(steps):
        if step.weight <= weight:
            index = position
    return index
