"""Holding a rollout on its gates (the gates themselves, as values: :mod:`canary.rollout.gates`).

A pre-rollout gate holds a new revision at 0 before its first step, a step gate holds a passed step,
a pre-promotion gate holds the promotion. :func:`gates_hold` takes in the gate results supplied to
this tick and returns the draft to go on with when every gate at this point has passed, or the
decision that holds (asking for the gates' calls) or, past a deadline with ``failurePolicy:
rollback``, rolls back.
"""

from __future__ import annotations

from dataclasses import replace

from canary.policy.model import Gate, GateFailurePolicy, GateStage
from canary.policy.units import format_duration
from canary.rollout.draft import Draft, Outcome, Tick, duration, seconds
from canary.rollout.gates import GateCall, gate_body, gate_key, record_gate_result
from canary.rollout.outcomes import rollback, wait
from canary.rollout.state import GateProgress, describe_time
from canary.rollout.vocabulary import EventReason, Severity

__all__ = ["gate_names", "gated", "gates_hold", "gates_passed_headline"]

# A gate at one call point: its position in spec.gates, the gate, its progress.
_Waiting = tuple[int, Gate, GateProgress]


def gated(tick: Tick, stage: GateStage) -> bool:
    return any(gate.at is stage for gate in tick.spec.gates)


def gate_names(tick: Tick, stage: GateStage) -> list[str]:
    return [tick.spec.gate_name(index) for index, gate in enumerate(tick.spec.gates) if gate.at is stage]


def gates_passed_headline(tick: Tick, canary: str | None, first: int) -> str:
    names = ", ".join(gate_names(tick, GateStage.PRE_ROLLOUT))
    return f"Pre-rollout gate {names} passed: moving {canary} from 0% to the first step {first}%."


def gates_hold(tick: Tick, draft: Draft, stages: frozenset[GateStage], weight: int | None) -> Outcome:
    """The draft to go on with when every gate of ``stages`` at this point has passed; else the
    decision that holds the rollout (and asks for the gates' calls) or, past a deadline with
    failurePolicy rollback, rolls it back. ``weight``: the step's (None before the first step)."""
    waiting: list[_Waiting] = []
    for index, gate in enumerate(tick.spec.gates):
        if gate.at in stages:
            draft, progress = _gate_progress(tick, draft, index, gate, weight)
            if progress.passed_at is None:
                waiting.append((index, gate, progress))
    if not waiting:
        return draft
    expired = [
        (gate, progress)
        for _, gate, progress in waiting
        if tick.now - progress.since >= seconds(gate.deadline)
    ]
    for gate, progress in expired:
        if gate.failure_policy is GateFailurePolicy.ROLLBACK:
            return rollback(
                tick,
                draft,
                f"gate {progress.name} ({gate.at.value}) did not pass within its deadline "
                f"{format_duration(gate.deadline)} (first called {describe_time(progress.since)}): "
                f"{progress.attempts} failed attempts, latest {progress.describe_last()}; failurePolicy "
                "rollback.",
            )
    draft = draft.calling(
        [_gate_call(tick, draft, index, gate, progress) for index, gate, progress in waiting]
    )
    return _hold(tick, draft, waiting, expired, weight)


def _hold(
    tick: Tick,
    draft: Draft,
    waiting: list[_Waiting],
    expired: list[tuple[Gate, GateProgress]],
    weight: int | None,
) -> Outcome:
    """Hold the rollout while ``waiting`` gates have not passed (``expired``: past their deadline,
    with failurePolicy hold)."""
    revision = draft.state.revision
    where = (
        f"at 0% before its first step {tick.steps[0].weight}%"
        if weight is None
        else f"at {weight}%: the step passed"
    )
    texts = "; ".join(_waiting_text(tick, gate, progress) for _, gate, progress in waiting)
    headline = f"Holding {revision} {where}; waiting for gate {texts}."
    if not expired:
        return wait(tick, draft, headline, EventReason.GATE_WAITING, Severity.INFO)
    for _, progress in expired:
        if progress.deadline_passed_at is None:
            draft = _put_gate(draft, replace(progress, deadline_passed_at=tick.now))
    names = ", ".join(progress.name for _, progress in expired)
    headline = (
        f"Gate {names} did not pass within its deadline; failurePolicy hold: {revision} keeps "
        f"holding and the gate is called again (`kserve-canary promote` or `abort` decide instead). "
        f"{headline}"
    )
    return wait(tick, draft, headline, EventReason.GATE_FAILED, Severity.WARNING)


def _waiting_text(tick: Tick, gate: Gate, progress: GateProgress) -> str:
    attempts = f"{progress.attempts} failed attempt{'s' if progress.attempts != 1 else ''}"
    return (
        f"{progress.name} ({gate.at.value}): {attempts}, latest {progress.describe_last()}; waiting "
        f"{duration(tick.now - progress.since)} of deadline {format_duration(gate.deadline)} "
        f"(then {gate.failure_policy.value})"
    )


def _gate_progress(
    tick: Tick, draft: Draft, index: int, gate: Gate, weight: int | None
) -> tuple[Draft, GateProgress]:
    """The state's progress of ``gate`` at this point (created now when first reached), with the
    results supplied to this decision taken in."""
    key = gate_key(gate.at, index, weight if gate.at is GateStage.STEP else None)
    found = next((progress for progress in draft.state.gates if progress.key == key), None)
    progress = found or GateProgress(
        key=key,
        name=tick.spec.gate_name(index),
        stage=gate.at,
        since=tick.now,
        weight=weight if gate.at is GateStage.STEP else None,
    )
    for result in sorted(tick.gate_results, key=lambda result: result.at):
        if result.revision == draft.state.revision and result.at <= tick.now:
            progress = record_gate_result(progress, result)
    passed = progress.passed_at
    if passed is not None and (found is None or found.passed_at is None):
        draft = draft.noting(
            f"Gate {progress.name} ({gate.at.value}) passed: answered {progress.last_status} at "
            f"{describe_time(passed)}, {duration(passed - progress.since)} after it was first called "
            f"({progress.attempts} failed attempts before)."
        )
    if progress != found:
        draft = _put_gate(draft, progress)
    return draft, progress


def _put_gate(draft: Draft, progress: GateProgress) -> Draft:
    kept = tuple(entry for entry in draft.state.gates if entry.key != progress.key)
    return draft.with_state(replace(draft.state, gates=(*kept, progress)))


def _gate_call(tick: Tick, draft: Draft, index: int, gate: Gate, progress: GateProgress) -> GateCall:
    state = draft.state
    assert state.revision is not None
    record = state.evaluation
    evidence = (
        {
            "at": describe_time(record.at),
            "verdict": str(record.verdict) if record.verdict else None,
            "requests": round(record.requests) if record.requests is not None else None,
            "failedChecks": list(record.failed_checks),
        }
        if record.at is not None
        else None
    )
    step = state.step
    step_document = (
        {"index": step.index, "weight": step.weight, "of": len(tick.steps)}
        if step is not None and progress.stage is not GateStage.PRE_ROLLOUT
        else None
    )
    deadline = seconds(gate.deadline)
    return GateCall(
        policy_key=tick.plan.key,
        revision=state.revision,
        key=progress.key,
        index=index,
        name=progress.name,
        stage=gate.at,
        timeout=gate.webhook.timeout,
        since=progress.since,
        deadline=deadline,
        body=gate_body(
            policy_key=tick.plan.key,
            policy_name=tick.policy.metadata.name,
            namespace=tick.policy.metadata.namespace,
            inference_service=tick.spec.target.inference_service,
            uid=tick.observed.uid,
            revision=state.revision,
            stable=state.stable_revision,
            key=progress.key,
            index=index,
            name=progress.name,
            stage=gate.at,
            step=step_document,
            since=progress.since,
            deadline=deadline,
            evidence=evidence,
        ),
    )
