"""What the demo watches: each model as the cluster and the controller's state show it.

The live view, the plain log and the report's traffic chart are all drawn from :class:`ModelView`
snapshots read over the same APIs a person would use — the InferenceService (spec and KServe's
status) and the controller's state ConfigMap (phase, step, history, latest evaluation) — so the demo
shows what the controller did, not what the demo expected it to do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from canary.kserve.store import ConfigMapStateStore
from canary.policy import PromotionPolicy
from canary.policy.units import format_value
from canary.rollout.records import ExplainDocument
from canary.rollout.state import RolloutState, StateFormatError
from canary_sandbox.stack import Stack

__all__ = ["CheckReading", "ModelView", "TrafficSample", "observe", "traffic_shares"]


@dataclass(frozen=True)
class CheckReading:
    """One check of the latest evaluation, formatted for people."""

    name: str
    verdict: str  # pass | fail | no-data | error
    value: str  # the canary's value ("" without one)
    stable: str  # the stable revision's value ("" when not compared)
    detail: str  # why there is no data, or what failed


@dataclass(frozen=True)
class ModelView:
    name: str
    at: float  # epoch seconds of the observation
    phase: str  # the controller's phase; "—" before it has written any state
    stable_revision: str | None
    canary_revision: str | None  # the new version's revision, once KServe has created it
    canary_ready: bool
    spec_weight: int | None  # spec.predictor.canaryTrafficPercent (None: the field is absent)
    canary_share: float  # percent of traffic KServe routes to the new revision (status.traffic)
    step: str  # "2/3 · 30%" while progressing
    timer: tuple[float, float] | None  # (elapsed, limit) seconds of the step's window or the deadline
    timer_kind: str  # "window" or "deadline"
    checks: tuple[CheckReading, ...]
    evaluated_requests: float | None
    latest: str  # the first reason of the latest evaluation: where the step stands and why
    history: tuple[Mapping[str, Any], ...]  # the state's decision history (JSON form)
    # The weight of the state's current step (None outside a step): what the phase says v2 serves.
    step_weight: int | None = None

    @property
    def last_decision(self) -> Mapping[str, Any] | None:
        return self.history[-1] if self.history else None

    @property
    def finished(self) -> bool:
        return self.phase in {"Succeeded", "RolledBack"}


@dataclass
class TrafficSample:
    at: float
    canary_share: float
    spec_weight: int | None


@dataclass
class ModelTimeline:
    """Every observation's traffic numbers, for the report's weight chart."""

    samples: list[TrafficSample] = field(default_factory=list)

    def add(self, view: ModelView) -> None:
        self.samples.append(TrafficSample(view.at, view.canary_share, view.spec_weight))


def traffic_shares(predictor_status: Mapping[str, Any]) -> dict[str, float]:
    """Percent of traffic per revision, as KServe published it.

    ``latestRevision: true`` resolves to the latest *Ready* revision, so a canary that is not Ready
    gets nothing even with a percentage in the spec.
    """
    latest_ready = predictor_status.get("latestReadyRevision")
    shares: dict[str, float] = {}
    for entry in predictor_status.get("traffic") or []:
        revision = latest_ready if entry.get("latestRevision") else entry.get("revisionName")
        if revision:
            shares[revision] = shares.get(revision, 0.0) + float(entry.get("percent") or 0)
    return shares


def _checks(explain: ExplainDocument | None) -> tuple[CheckReading, ...]:
    if explain is None:
        return ()
    return tuple(
        CheckReading(
            name=check.name,
            verdict=check.verdict,
            value="" if check.value is None else format_value(check.value, check.unit),
            stable="" if check.stable is None else format_value(check.stable, check.unit),
            detail=check.detail,
        )
        for check in explain.checks
    )


def observe(stack: Stack, policy: PromotionPolicy, stable_revision: str | None) -> ModelView:
    """Read one model now. ``stable_revision`` is the revision before the story's new version."""
    namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
    now = time.time()
    isvc = stack.get(namespace, name)
    predictor_spec = isvc["spec"]["predictor"]
    predictor = ((isvc.get("status") or {}).get("components") or {}).get("predictor") or {}
    created = predictor.get("latestCreatedRevision")
    canary = created if created and created != stable_revision else None
    shares = traffic_shares(predictor)
    weight = predictor_spec.get("canaryTrafficPercent")

    assert stack.api is not None, "the stack is started"
    stored = ConfigMapStateStore(stack.api).load(namespace, name)
    state: RolloutState | None = None
    explain: ExplainDocument | None = None
    if stored.state_json is not None:
        try:
            state = stored.state()
            explain = stored.explain()
        except StateFormatError:
            pass  # the view shows what it could read; the controller reports the rest
    # The explain document is the latest *evaluation*; one of an earlier revision is not this story's.
    if explain is not None and canary is not None and explain.revision != canary:
        explain = None

    step, timer, timer_kind = "", None, ""
    step_weight = state.step.weight if state is not None and state.step is not None else None
    if state is not None:
        if state.phase == "Pending" and state.started_at is not None:
            timer = (now - state.started_at.timestamp(), policy.spec.progress_deadline)
            timer_kind = "deadline"
        elif state.phase == "Progressing" and state.step is not None:
            steps = policy.spec.canary_steps
            total = len(steps)
            step = f"{state.step.index + 1}/{total} · {state.step.weight}%"
            if state.step.started_at is not None and state.step.index < total:
                window = policy.spec.step_window(steps[state.step.index])
                timer = (now - state.step.started_at.timestamp(), window)
                timer_kind = "window"
    history = tuple(json.loads(state.to_json())["history"]) if state is not None else ()
    return ModelView(
        name=name,
        at=now,
        phase=str(state.phase) if state is not None else "—",
        stable_revision=stable_revision,
        canary_revision=canary,
        canary_ready=canary is not None and predictor.get("latestReadyRevision") == canary,
        spec_weight=None if weight is None else int(weight),
        canary_share=shares.get(canary, 0.0) if canary else 0.0,
        step=step,
        timer=timer,
        timer_kind=timer_kind,
        checks=_checks(explain),
        evaluated_requests=None if explain is None else explain.requests,
        latest=explain.reasons[0] if explain is not None and explain.reasons else "",
        history=history,
        step_weight=step_weight,
    )


def notifications_for(payloads: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    return [p for p in payloads if (p.get("inferenceService") or {}).get("name") == name]
