"""The decision core: one pure function from (policy, InferenceService, state, evidence, now) to a decision.

The same code runs in the live controller, the demo, simulations and backtests: no I/O, no clock
reads, no randomness. The shell calls, on every tick::

    request = evidence_request(policy, observed, state, now)      # None: nothing to measure now
    evidence = source.collect(policy, request) if request else None
    decision = decide(policy, observed, state, evidence, now)
    store(decision.new_state)                                      # write-ahead: before patching
    if decision.action.writes: patch(decision.patch)

The rules, in the order they are applied (docs/design.md §2 and §4):

1. No InferenceService, a deployment mode other than Knative, no revision yet, a first deployment:
   nothing to do, with a clear reason.
2. An operator's ``abort`` of the current canary rolls back before anything else (a rollback is
   always safe, even while KServe lags behind a changed spec).
3. Identity: a revision we have not seen starts a new rollout (unless it was rolled back before); a
   spec that changed while KServe still reports the old revision means *wait* — never judge or
   promote a canary whose spec is no longer the one in the InferenceService.
4. The percentage in the spec is checked against the write-ahead intent and the last known value:
   our own write is recognised; anyone else's pauses the rollout.
5. Then the phase: Pending waits for Ready (deadline), Progressing holds steps and judges evidence,
   Promoting waits for KServe to record the promotion, Baking watches absolute limits.
6. Gates (canary/rollout/gates.py): a pre-rollout gate pins a new revision at 0 and holds its first
   step until it passes; step gates hold a passed step; pre-promotion gates hold the promotion. Their
   results are inputs (``gates``), like evidence; the calls the decision waits for are
   ``Decision.gate_calls``.

This module keeps the entry points, the identity rules (1–4) and the phase dispatch (5). The rules
are pure functions over values (:mod:`canary.rollout.draft`): starting a rollout in
:mod:`~canary.rollout.starting`, the phases that judge evidence in :mod:`~canary.rollout.phases`,
gates in :mod:`~canary.rollout.gating`, evaluations in :mod:`~canary.rollout.evaluation`, commands
and someone else's percentage in :mod:`~canary.rollout.interventions`, and how a decision ends
(wait, write, promote, roll back, pause, bake) in :mod:`~canary.rollout.outcomes`.

Both entry points run the rules up to the evaluation the decision depends on (:func:`prepare`): the
request is read off that point, and the decision judges the evidence there and goes on. A caller
that holds the :class:`Preparation` of :func:`evidence_request`'s inputs passes it to :func:`decide`
(``prepared=``), which then runs only the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from canary.evidence import Evidence, EvidenceRequest
from canary.policy.model import PromotionPolicy
from canary.policy.units import format_duration
from canary.rollout.decision import Decision
from canary.rollout.draft import Draft, Final, Tick, duration
from canary.rollout.evaluation import Judging, judged, request_at
from canary.rollout.gates import GateResult
from canary.rollout.intent import reconcile_spec_weight
from canary.rollout.interventions import external_change, promote_by_command, resume
from canary.rollout.ledger import RollbackLedger
from canary.rollout.observed import DeploymentMode, ObservedInferenceService
from canary.rollout.outcomes import landed, promoting, reissue, rollback, wait
from canary.rollout.phases import baking, pending, progressing
from canary.rollout.starting import first_sight, new_revision, not_retried, rolled_back_before
from canary.rollout.state import CommandKind, PauseKind, Phase, RolloutState, describe_time
from canary.rollout.vocabulary import Action, EventReason, Severity

__all__ = ["Preparation", "decide", "evidence_request", "landed_write", "prepare"]


def decide(
    policy: PromotionPolicy,
    observed: ObservedInferenceService,
    state: RolloutState,
    evidence: Evidence | None,
    now: datetime,
    *,
    ledger: RollbackLedger | None = None,
    gates: Sequence[GateResult] = (),
    alarm: bool = False,
    prepared: Preparation | None = None,
) -> Decision:
    """Decide what to do with one InferenceService now. Pure: same inputs, same decision.

    ``evidence`` is the answer to :func:`evidence_request` (or None); evidence for another revision,
    another window, or an evaluation that is not due is ignored, never judged. ``now`` must be
    timezone-aware. ``ledger`` is the rollback ledger (kept apart from the state, so losing the
    state cannot undo a rollback): a revision in it is never started, advanced or promoted again;
    a ledger of another InferenceService object (uid) is ignored. ``gates`` are the finished
    attempts of gate calls (:mod:`canary.rollout.gates`); results of another revision, of a call
    point not reached, or already recorded in the state change nothing. ``alarm``: the shell saw a
    critical signal move for the canary (an OOM kill in the evidence pipeline's latest sample), and
    an evaluation is due now, before its interval — an extra look, judged like any other (the
    sequential tests stay valid however often they look); it never skips a step's hold.

    ``prepared``: the :func:`prepare` of these very inputs (the same objects, or equal ones), whose
    rules up to the evaluation are then not run again; one prepared from other inputs is not used.
    Either way the decision is the same.
    """
    if prepared is not None and prepared.made_of(policy, observed, state, now, ledger, gates, alarm):
        tick, reached = prepared.tick, prepared.reached
    else:
        tick = Tick.of(policy, observed, state, now, ledger=ledger, gates=gates, alarm=alarm)
        reached = _reach(tick)
    final = reached if isinstance(reached, Final) else judged(tick, reached, evidence)
    return _last_word(tick, final)


def evidence_request(
    policy: PromotionPolicy,
    observed: ObservedInferenceService,
    state: RolloutState,
    now: datetime,
    *,
    ledger: RollbackLedger | None = None,
    gates: Sequence[GateResult] = (),
    alarm: bool = False,
) -> EvidenceRequest | None:
    """What :func:`decide` would judge now: revisions, window ``[start, now]`` and checks — or None.

    It runs the same rules as :func:`decide` (so a step whose start is observed in this very tick
    is accounted for) and reports the evaluation that is due, if any (``alarm``: as :func:`decide`).
    """
    tick = Tick.of(policy, observed, state, now, ledger=ledger, gates=gates, alarm=alarm)
    reached = _reach(tick)
    return request_at(tick, reached) if isinstance(reached, Judging) else None


def prepare(
    policy: PromotionPolicy,
    observed: ObservedInferenceService,
    state: RolloutState,
    now: datetime,
    *,
    ledger: RollbackLedger | None = None,
    gates: Sequence[GateResult] = (),
    alarm: bool = False,
) -> Preparation:
    """The rules run up to the evaluation the decision depends on: its ``request`` is
    :func:`evidence_request`'s answer; passed to :func:`decide` as ``prepared``, the decision on
    the evidence collected for it runs only the rest. Pure, like both."""
    tick = Tick.of(policy, observed, state, now, ledger=ledger, gates=gates, alarm=alarm)
    reached = _reach(tick)
    request = request_at(tick, reached) if isinstance(reached, Judging) else None
    return Preparation(tick, reached, request, ledger)


@dataclass(frozen=True, slots=True)
class Preparation:
    """A decision prepared up to its evaluation (:func:`prepare`)."""

    tick: Tick
    reached: Final | Judging  # the decision already, or the evaluation it depends on
    request: EvidenceRequest | None  # the evidence that evaluation needs now, if it is due
    ledger: RollbackLedger | None  # as given (the tick keeps this object's entries only)

    def made_of(
        self,
        policy: PromotionPolicy,
        observed: ObservedInferenceService,
        state: RolloutState,
        now: datetime,
        ledger: RollbackLedger | None,
        gates: Sequence[GateResult],
        alarm: bool,
    ) -> bool:
        """Whether this was prepared from these inputs (then it is what :func:`prepare` would return)."""
        tick = self.tick
        return (
            _same(tick.policy, policy)
            and _same(tick.observed, observed)
            and _same(tick.original, state)
            and _same(self.ledger, ledger)
            and now == tick.now
            and now.tzinfo is tick.now.tzinfo
            and tick.gate_results == tuple(gates)
            and tick.alarm == alarm
        )


def _same(held: Any, given: Any) -> bool:
    return held is given or held == given


def landed_write(
    policy: PromotionPolicy, observed: ObservedInferenceService, state: RolloutState, now: datetime
) -> Decision | None:
    """The write ``state`` (as stored) records as its intent, when the spec already shows it — or None.

    For the shell to tell a write that a controller made and may not have told: one killed between
    its patch and its log line or notification, or whose patch answer was lost. Same action, id and
    numbers as the decision that recorded the intent (a receiver de-duplicates by id). Nothing in it
    is to be written: the spec has it, and the next :func:`decide` adopts it.
    """
    intent = state.intent
    if intent is None or observed.canary_traffic_percent != intent.weight:
        return None
    return landed(Tick.of(policy, observed, state, now), Draft(state))


def _last_word(tick: Tick, final: Final) -> Decision:
    """Whatever path led to a write (a resume restoring a value adopted after the state was lost, a
    command, a restored copy), a rolled-back revision gets no traffic from the controller again:
    what was about to be written is said, then nothing is."""
    decision = final.decision
    revision = decision.revision
    if (
        decision.action.writes
        and decision.action is not Action.ROLLBACK
        and revision is not None
        and rolled_back_before(tick, final.draft.state, revision)
    ):
        refused = f"{decision.action} {decision.weight if decision.weight is not None else 'unset'}"
        draft = final.draft.overruled(f"Not writing {refused} for {revision}: it was rolled back before.")
        return not_retried(tick, draft, revision).decision
    return decision


# ------------------------------------------------------------------------------------------------
# Identity: which object, which revision, which spec


def _reach(tick: Tick) -> Final | Judging:
    """The rules, up to the decision or to the evaluation it depends on."""
    observed = tick.observed
    draft = Draft(tick.original)
    if not observed.exists:
        return wait(
            tick,
            draft,
            f"InferenceService {tick.policy.key} does not exist; policy {tick.policy.metadata.name} "
            "governs nothing until it is created.",
            EventReason.INFERENCE_SERVICE_NOT_FOUND,
            Severity.WARNING,
        )
    draft = _bind_to_object(tick, draft)
    if observed.deployment_mode is not DeploymentMode.KNATIVE:
        return _unsupported_mode(tick, draft)
    canary = observed.latest_created_revision
    if canary is None or observed.predictor_fingerprint is None:
        return wait(
            tick,
            draft,
            f"KServe has not reported a predictor revision for {tick.policy.key} yet.",
            EventReason.CANARY_WAITING,
        )
    return _identify(tick, draft, canary)


def _bind_to_object(tick: Tick, draft: Draft) -> Draft:
    """The state describes this InferenceService object (its uid), or it is not used at all."""
    state, uid = draft.state, tick.observed.uid
    if uid is None or state.inference_service_uid == uid:
        return draft
    if state.inference_service_uid is not None:
        # A model deleted and re-created under the same name: its revision names start again
        # at 00001, so nothing of the old object's state may be taken for the new one's.
        draft = draft.noting(
            f"The stored state describes another InferenceService object (uid "
            f"{state.inference_service_uid}; this one is {uid}): it is not used."
        )
        state = RolloutState()
    return draft.with_state(replace(state, inference_service_uid=uid))


def _unsupported_mode(tick: Tick, draft: Draft) -> Final:
    observed = tick.observed
    if observed.deployment_mode is DeploymentMode.UNKNOWN and observed.deployment_mode_reported is None:
        return wait(
            tick,
            draft,
            f"KServe has not reported the deployment mode of {tick.policy.key} yet.",
            EventReason.CANARY_WAITING,
        )
    mode = observed.deployment_mode_reported or observed.deployment_mode.value
    return wait(
        tick,
        draft,
        f"{tick.policy.key} runs in {mode} mode: canaryTrafficPercent only works in Knative "
        "(Serverless) mode and KServe silently ignores it elsewhere, so kserve-canary does not "
        "manage this InferenceService (KServe >= 0.20 offers spec.canary[] for Standard mode).",
        EventReason.UNSUPPORTED_DEPLOYMENT_MODE,
        Severity.WARNING,
    )


def _identify(tick: Tick, draft: Draft, canary: str) -> Final | Judging:
    """An abort first; then a new revision starts, a changed spec waits, the same one goes on."""
    state = draft.state
    same_revision = state.revision is not None and canary == state.revision
    spec_changed = same_revision and tick.observed.predictor_fingerprint != state.fingerprint
    if spec_changed and state.spec_change_seen_at is None:
        draft = draft.with_state(state := replace(state, spec_change_seen_at=tick.now))
    elif not spec_changed and state.spec_change_seen_at is not None:
        draft = draft.with_state(state := replace(state, spec_change_seen_at=None))
    command = state.command
    if command is not None and command.kind is CommandKind.ABORT:
        # A rollback is always safe, even while KServe lags behind a changed spec. An abort
        # issued for a revision that a newer one has replaced since is moot: the new revision
        # starts its own rollout (and can be aborted in turn).
        if same_revision and state.rollout_active:
            who = f" by {command.by}" if command.by else ""
            return rollback(
                tick,
                draft,
                f"Rollout of {state.revision} aborted{who} (command at {describe_time(command.at)}).",
            )
        draft = draft.noting(f"The abort requested at {describe_time(command.at)} no longer applies.")
        draft = draft.with_state(state := replace(state, command=None))
    recorded = tick.ledger.entry(canary)
    if same_revision and state.rollout_active and recorded is not None:
        # The state lost the rollback (restored from a copy, a write that did not land): the
        # ledger, written before the rollback's patch, has the last word.
        return rollback(
            tick,
            draft,
            f"the rollback ledger records {canary} as rolled back at {describe_time(recorded.at)}, "
            f"which the state did not remember; a rolled-back revision is never rolled out again.",
        )
    if state.revision is None:
        return first_sight(tick, draft, canary)
    if not same_revision:
        return new_revision(tick, draft, canary)
    if spec_changed:
        return _spec_change_pending(tick, draft, canary)
    return _same_revision(tick, draft)


def _spec_change_pending(tick: Tick, draft: Draft, canary: str) -> Final:
    """The spec changed but KServe still reports the old revision: judge nothing, wait."""
    since = draft.state.spec_change_seen_at or tick.now
    waited = tick.now - since
    severity = Severity.INFO
    if waited >= tick.plan.progress_deadline:
        severity = Severity.WARNING
        draft = draft.noting(
            f"KServe has created no revision for the changed spec for {duration(waited)} "
            f"(progressDeadline {format_duration(tick.spec.progress_deadline)}); check the "
            "InferenceService's conditions."
        )
    return wait(
        tick,
        draft,
        f"The predictor spec of {tick.policy.key} changed (since {describe_time(since)}) but KServe "
        f"still reports {canary} as the latest revision: waiting for the new revision before judging "
        "or promoting anything.",
        EventReason.SPEC_CHANGE_PENDING,
        severity,
    )


def _same_revision(tick: Tick, draft: Draft) -> Final | Judging:
    """The revision under way: commands that need the full picture, who wrote the percentage,
    then the phase."""
    command = draft.state.command
    if command is not None and command.kind is CommandKind.RESUME:
        draft = resume(tick, draft)
    command = draft.state.command
    if command is not None and command.kind is CommandKind.PROMOTE:
        promoted = promote_by_command(tick, draft)
        if isinstance(promoted, Final):
            return promoted
        draft = promoted
    reconciled = reconcile_spec_weight(draft.state, tick.observed, tick.now)
    if reconciled is None:
        return external_change(tick, draft, tick.observed.canary_traffic_percent)
    return _by_phase(tick, draft.with_state(reconciled))


# ------------------------------------------------------------------------------------------------
# Phases


def _by_phase(tick: Tick, draft: Draft) -> Final | Judging:
    state = draft.state
    phase = state.phase
    if phase is Phase.PAUSED:
        assert state.pause is not None
        if state.pause.kind is PauseKind.APPROVAL:
            return progressing(tick, draft, awaiting_approval=True)
        return wait(tick, draft, state.pause.reason, EventReason.CANARY_PAUSED, Severity.WARNING)
    if state.intent is not None:
        return reissue(tick, draft)
    if phase is Phase.PENDING:
        return pending(tick, draft)
    if phase is Phase.PROGRESSING:
        return progressing(tick, draft, awaiting_approval=False)
    if phase is Phase.PROMOTING:
        return promoting(tick, draft)
    if phase is Phase.BAKING:
        return baking(tick, draft)
    if phase is Phase.ROLLED_BACK:
        return wait(
            tick,
            draft,
            f"{state.revision} was rolled back; it is not retried. Revert or fix the spec in Git: a "
            "new revision starts a new rollout.",
            EventReason.CANARY_IDLE,
        )
    if phase is Phase.SUCCEEDED:
        return wait(tick, draft, f"{state.revision} was rolled out successfully.", EventReason.CANARY_IDLE)
    return wait(
        tick,
        draft,
        f"No rollout in progress; {state.revision} is the current revision.",
        EventReason.CANARY_IDLE,
    )
