"""The replay: the policy's decisions over one recorded period, with the live controller's own code.

For one :class:`~canary.backtest.history.Period` the replay keeps a small model of the
InferenceService as the policy would have driven it (:class:`ReplayWorld`: the stable revision
rolled out, the canary created, the percentages the policy writes shown in status at once, as KServe
does within a reconcile) and runs, every ``interval`` of recorded time, exactly what one tick of the
controller runs for one rollout (``canary.controller.reconciler``):

``evidence_request(policy, observed, state, now)`` → ``PrometheusEvidenceSource.collect`` at that
historical time → ``decide(policy, observed, state, evidence, now)`` (the request taken from
``prepare``, which ``decide`` is handed so as not to run the rules up to the evaluation again: the
same request and decision as the pair).

The evidence is the recorded one: the same counter pipeline (raw cumulative counters, the past
filled once by range queries, then one instant sample per evaluation, ``at`` in the past) and the
same judge. The replay cannot move traffic: it judges the shares that actually served, whatever the
policy's own step says, and it says so. It stops at the policy's rollback, when KServe would have
recorded its promotion (after ``bake``), at a pause, or where the recorded period ends.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from canary.backtest.history import History, Period, TrafficPoint
from canary.evidence import Evidence, EvidenceSource
from canary.policy.model import PromotionPolicy
from canary.rollout import (
    Action,
    Decision,
    DeploymentMode,
    ObservedInferenceService,
    Phase,
    RollbackLedger,
    RolloutState,
    TrafficTarget,
    decide,
    ledger_after,
    prepare,
)

__all__ = [
    "CheckPoint",
    "Replay",
    "ReplayWorld",
    "Tick",
    "compare",
    "describe_actual",
    "point_at",
    "replay_period",
]

UID = "backtest"


@dataclass
class ReplayWorld:
    """The InferenceService as the policy would have driven it (pure, in memory)."""

    namespace: str
    name: str
    stable: str
    canary: str
    created: bool = False
    ready: bool = False
    percent: int | None = None  # spec.predictor.canaryTrafficPercent
    promoted: bool = False
    generation: int = 1

    def create_canary(self) -> None:
        self.created, self.generation = True, self.generation + 1

    def make_ready(self) -> None:
        self.ready = True

    def write(self, weight: int | None) -> None:
        """The decision's patch; status shows it at once (KServe reconciles within seconds)."""
        self.percent = weight
        self.generation += 1
        if weight is None and self.ready:
            self.promoted = True

    def observe(self) -> ObservedInferenceService:
        if not self.created:
            return ObservedInferenceService(
                self.namespace, self.name, uid=UID, generation=self.generation,
                predictor_fingerprint=f"{UID}:{self.stable}",
                latest_created_revision=self.stable, latest_ready_revision=self.stable,
                latest_rolledout_revision=self.stable,
                traffic=(TrafficTarget(100, self.stable, latest_revision=True),), predictor_ready=True,
                deployment_mode=DeploymentMode.KNATIVE,
            )  # fmt: skip
        if self.promoted:
            traffic: tuple[TrafficTarget, ...] = (TrafficTarget(100, self.canary, latest_revision=True),)
            rolled_out, previous = self.canary, self.stable
        else:
            rolled_out, previous = self.stable, None
            routed = self.canary if self.ready else self.stable
            if self.percent is None or self.percent >= 100:
                traffic = (TrafficTarget(100, routed, latest_revision=True),)
            else:
                traffic = (
                    TrafficTarget(self.percent, routed, latest_revision=True),
                    TrafficTarget(100 - self.percent, self.stable, tag="prev"),
                )
        return ObservedInferenceService(
            self.namespace, self.name, uid=UID, generation=self.generation,
            predictor_fingerprint=f"{UID}:{self.canary}", canary_traffic_percent=self.percent,
            latest_created_revision=self.canary,
            latest_ready_revision=self.canary if self.ready else self.stable,
            latest_rolledout_revision=rolled_out, previous_rolledout_revision=previous,
            traffic=traffic, predictor_ready=True if self.ready else None,
            deployment_mode=DeploymentMode.KNATIVE,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class CheckPoint:
    """One check at one evaluation: the canary's value against its limit, and the stable value."""

    name: str
    verdict: str
    value: float | None
    unit: str
    limit: str
    stable_value: float | None
    max_allowed: float | None
    min_allowed: float | None
    samples: float | None
    detail: str
    counted: bool


@dataclass(frozen=True, slots=True)
class Tick:
    """One decision of the replay, with what actually served at that moment."""

    at: datetime
    action: str
    phase: str
    weight: int | None  # the percentage the policy's spec holds after the decision (None: absent)
    step: str  # "2/3" while progressing
    reason: str
    event: str
    verdict: str | None
    requests: float | None  # canary requests in the step, as judged
    checks: tuple[CheckPoint, ...]
    actual_share: float | None  # the canary's share of requests as recorded (None: none or missing)
    controller_weight: float | None  # the weight a live controller exported, if any
    missing: bool  # no sample at all was recorded at this moment
    queries: int = 0


@dataclass(frozen=True)
class Replay:
    """The policy's decisions over one period, and how they compare with what happened."""

    period: Period
    policy_name: str
    interval: float
    ticks: tuple[Tick, ...]
    outcome: str  # "rolled-back" | "promoted" | "paused" | "undecided"
    decided_at: datetime | None  # when the policy rolled back, promoted or paused
    summary: str
    actual: str  # what the recorded traffic did, in words
    notes: tuple[str, ...] = ()
    weights: tuple[tuple[datetime, int | None], ...] = field(default=())  # every write: (at, weight)
    recorded: str | None = None  # what the controller's record of past rollouts says happened
    comparison: str = ""  # how the policy's outcome differs from what happened, in one sentence


def replay_period(
    policy: PromotionPolicy,
    history: History,
    period: Period,
    source: EvidenceSource,
    *,
    notes: Sequence[str] = (),
) -> Replay:
    """Replay ``policy`` over ``period`` of ``history`` with evidence from ``source``."""
    spec = policy.spec
    interval = timedelta(seconds=spec.interval)
    world = ReplayWorld(history.namespace, history.inference_service, period.stable, period.canary)
    state = RolloutState(inference_service_uid=UID)
    ledger = RollbackLedger()
    ticks: list[Tick] = []
    weights: list[tuple[datetime, int | None]] = []
    # The end of the replay: the period's last step, or bake beyond a promotion within the range.
    end = period.end
    decided: tuple[str, datetime] | None = None

    def run(now: datetime) -> Decision:
        nonlocal state, ledger
        observed = world.observe()
        prepared = prepare(policy, observed, state, now, ledger=ledger)
        request = prepared.request
        evidence = source.collect(policy, request) if request is not None else None
        decision = decide(policy, observed, state, evidence, now, ledger=ledger, prepared=prepared)
        recorded = ledger_after(decision, ledger, UID)
        if recorded is not None:
            ledger = recorded
        state = decision.new_state
        ticks.append(_tick(now, decision, world, history, period, evidence, len(spec.canary_steps)))
        if decision.action.writes:
            world.write(decision.weight)
            weights.append((now, decision.weight))
        return decision

    # Before the canary: the steady InferenceService is adopted; then the new revision appears, and
    # the first step is written before it is Ready (auto-start; or Git carries it), one interval
    # before it first served.
    first = period.start
    run(first - 2 * interval)
    world.create_canary()
    if not spec.auto_start:
        # Without auto-start the first step comes with the spec from Git (docs/design.md §2.2).
        world.percent = spec.canary_steps[0].weight
    run(first - interval)
    world.make_ready()
    now = first
    while now <= end:
        decision = run(now)
        # A write shows in status at once: decide again at the same moment, as the next tick would.
        for _ in range(3):
            if not decision.action.writes:
                break
            decision = run(now)
        phase = state.phase
        if decided is not None and decided[0] == "promoted" and phase is Phase.ROLLED_BACK:
            decided = ("rolled-back", now)  # a failed bake: the promotion is undone
        elif decided is None:
            if phase is Phase.ROLLED_BACK:
                decided = ("rolled-back", now)
            elif phase is Phase.PAUSED:
                decided = ("paused", now)
            elif decision.action is Action.PROMOTE or phase in (
                Phase.PROMOTING,
                Phase.BAKING,
                Phase.SUCCEEDED,
            ):
                decided = ("promoted", now)
                end = min(history.end, max(end, now + timedelta(seconds=spec.bake)))
        if phase in (Phase.ROLLED_BACK, Phase.PAUSED, Phase.SUCCEEDED):
            break
        now += interval
    return _summarise(policy, period, history, ticks, weights, decided, tuple(notes))


def _tick(
    now: datetime,
    decision: Decision,
    world: ReplayWorld,
    history: History,
    period: Period,
    evidence: Evidence | None,
    steps: int,
) -> Tick:
    state = decision.new_state
    step = f"{state.step.index + 1}/{steps}" if state.step is not None else ""
    point = point_at(history, now)
    checks = tuple(
        CheckPoint(
            j.name,
            j.verdict.value,
            j.value,
            j.unit.value,
            j.limit,
            j.stable_value,
            j.max_allowed,
            j.min_allowed,
            j.samples,
            j.detail,
            j.counted,
        )
        for j in decision.judgements
    )
    return Tick(
        at=now,
        action=decision.action.value,
        phase=state.phase.value,
        weight=decision.weight if decision.action.writes else world.percent,
        step=step,
        reason=decision.summary,
        event=decision.event_reason.value,
        verdict=decision.verdict.value if decision.verdict is not None else None,
        requests=decision.requests,
        checks=checks,
        actual_share=point.share(period.canary, period.stable) if point is not None else None,
        controller_weight=point.controller_weight if point is not None else None,
        missing=point is None or point.missing,
        queries=evidence.queries if evidence is not None else 0,
    )


def point_at(history: History, moment: datetime) -> TrafficPoint | None:
    """The recorded point at ``moment``: the latest at or before it, within one step."""
    index = bisect.bisect_right([point.at for point in history.points], moment) - 1
    if index < 0:
        return None
    best = history.points[index]
    return best if (moment - best.at).total_seconds() <= history.step else None


def _summarise(
    policy: PromotionPolicy,
    period: Period,
    history: History,
    ticks: list[Tick],
    weights: list[tuple[datetime, int | None]],
    decided: tuple[str, datetime] | None,
    notes: tuple[str, ...],
) -> Replay:
    served = period.start
    if decided is None:
        last = ticks[-1]
        holding = f"step {last.step} ({last.weight}%)" if last.step else last.phase
        outcome, at = "undecided", None
        summary = (
            f"The recorded period ends at {_when(period.end)} before the policy decided: it was holding "
            f"{period.canary} at {holding}; last reason: {last.reason}"
        )
    else:
        outcome, at = decided
        at_then = [tick for tick in ticks if tick.at == at]
        decision = next((tick for tick in at_then if tick.action != Action.WAIT.value), at_then[-1])
        verb = {"rolled-back": "rolled back", "promoted": "promoted", "paused": "paused"}[outcome]
        summary = (
            f"The policy would have {verb} {period.canary} at {_when(at)} "
            f"({_duration((at - served).total_seconds())} after it first served): {decision.reason}"
        )
    failed = sum(1 for tick in ticks if any(check.verdict == "error" for check in tick.checks))
    if failed:
        # An outage then (or now) is never a verdict: those evaluations held, as the controller would.
        evaluated = sum(1 for tick in ticks if tick.checks)
        summary += (
            f" ({failed} of {evaluated} evaluations had a check Prometheus could not answer: they held, "
            "neither passing nor failing)"
        )
    return Replay(
        period=period,
        policy_name=policy.metadata.name,
        interval=policy.spec.interval,
        ticks=tuple(ticks),
        outcome=outcome,
        decided_at=at,
        summary=summary,
        actual=describe_actual(history, period),
        notes=notes,
        weights=tuple(weights),
        comparison=compare(period, outcome, at),
    )


def compare(period: Period, outcome: str, at: datetime | None) -> str:
    """How the policy's outcome differs from what happened, in one sentence with its times."""
    canary, end = period.canary, _when(period.end)
    served = _duration((period.end - period.start).total_seconds())
    actually = {
        "canary-took-over": f"in fact {canary} went on to serve alone after {end} ({served} beside stable)",
        "stable-kept": f"in fact {canary} stopped serving after {end} ({served}): rolled back",
        "open": f"in fact both still served at {end}, where the range ends",
    }[period.outcome]
    if at is None:
        return f"The policy had not decided when the period ended; {actually}."
    delta = (period.end - at).total_seconds()
    when = f"{_duration(abs(delta))} {'before' if delta >= 0 else 'after'} that"
    verb = {"rolled-back": "rollback", "promoted": "promotion", "paused": "pause"}[outcome]
    lead = {
        ("rolled-back", "stable-kept"): "Both roll back",
        ("promoted", "canary-took-over"): "Both promote",
        ("rolled-back", "canary-took-over"): "The policy would have rolled back a release that was promoted",
        ("promoted", "stable-kept"): "The policy would have promoted a release that was rolled back",
    }.get((outcome, period.outcome), f"The policy would have {outcome.replace('-', ' ')}")
    return f"{lead}: {actually}; the policy's {verb} comes {when}."


def describe_actual(history: History, period: Period) -> str:
    """What the recorded traffic did during ``period``, in words, with its numbers."""
    points = history.between(period.start, period.end)
    source = "the controller's exported weight"
    values = [point.controller_weight for point in points if point.controller_weight is not None]
    values = [value for value in values if value >= 0]
    if not values:
        source = "the canary's share of requests, to the nearest 5%, held for 3 points or more"
        values = [
            share for point in points if (share := point.share(period.canary, period.stable)) is not None
        ]
        values = [5.0 * round(value / 5.0) for value in values]
    levels = _levels([round(value) for value in values], min_run=3)
    shares = " → ".join(f"{level}%" for level in levels) if levels else "no share could be read"
    ending = {
        "canary-took-over": f"then {period.canary} served alone (promoted)",
        "stable-kept": f"then {period.stable} served alone (rolled back)",
        "open": "and the recorded range ends with both serving",
    }[period.outcome]
    missing = (
        f"; {period.missing_steps} step(s) without any sample (missing, not filled)"
        if period.missing_steps
        else ""
    )
    return (
        f"{period.canary} served beside {period.stable} from {_when(period.start)} to {_when(period.end)} "
        f"({_duration((period.end - period.start).total_seconds())}): {shares} ({source}), {ending}{missing}."
    )


def _levels(values: list[int], *, min_run: int) -> list[int]:
    """The levels the values held for at least ``min_run`` points in a row (a noisy share's steps),
    in order, each once per run."""
    runs: list[tuple[int, int]] = []
    for value in values:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    held = [value for value, length in runs if length >= min_run] or [value for value, _ in runs]
    levels: list[int] = []
    for value in held:
        if not levels or levels[-1] != value:
            levels.append(value)
    return levels


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s" if secs else f"{minutes}m"
    return f"{secs}s"
