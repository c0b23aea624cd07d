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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from canary.evidence import Evidence, EvidenceRequest
from canary.policy.model import (
    Check,
    Gate,
    GateFailurePolicy,
    GateStage,
    HorizonAction,
    NoDataAction,
    PromotionPolicy,
    Step,
)
from canary.policy.units import format_duration
from canary.rollout.bookkeeping import (
    EvaluationMode,
    is_conclusive,
    is_due,
    no_data_clock_from,
    record_evaluation,
    step_passed,
)
from canary.rollout.decision import Decision
from canary.rollout.gates import GateCall, GateResult, gate_body, gate_key, record_gate_result
from canary.rollout.horizon import Horizon, HorizonOutcome, evidence_time
from canary.rollout.intent import (
    controller_weights,
    found_in_spec,
    heading_for,
    reconcile_spec_weight,
    record_write,
    reissued_action,
)
from canary.rollout.judge import CheckVerdict, CountContext, Evaluation, has_absolute_limit, judge_evidence
from canary.rollout.ledger import RollbackLedger
from canary.rollout.memo import IdentityMemo
from canary.rollout.observed import DeploymentMode, ObservedInferenceService
from canary.rollout.sampled import ErrorBudget
from canary.rollout.state import (
    MAX_HISTORY,
    MAX_REASON_CHARS,
    MAX_ROLLED_BACK,
    CommandKind,
    EvaluationRecord,
    EvaluationVerdict,
    GateProgress,
    HistoryEntry,
    Pause,
    PauseKind,
    Phase,
    RolledBackRevision,
    RolloutState,
    StepProgress,
    WeightRecord,
    describe_time,
)
from canary.rollout.vocabulary import Action, EventReason, Severity, decision_id

__all__ = ["decide", "evidence_request", "landed_write"]


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
    """
    return _Tick(
        policy, observed, state, evidence, now, probing=False, ledger=ledger, gates=gates, alarm=alarm
    ).run()


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
    return _Tick(policy, observed, state, None, now, probing=False).landed()


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
    tick = _Tick(policy, observed, state, None, now, probing=True, ledger=ledger, gates=gates, alarm=alarm)
    tick.run()
    return tick.requested


@dataclass(frozen=True, slots=True)
class _PolicyPlan:
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
    def of(cls, policy: PromotionPolicy) -> _PolicyPlan:
        spec = policy.spec
        steps = tuple(spec.canary_steps)
        return cls(
            key=policy.key,
            steps=steps,
            checks=tuple(spec.checks),
            absolute_checks=tuple(check for check in spec.checks if has_absolute_limit(check)),
            windows=tuple(_seconds(spec.step_window(step)) for step in steps),
            window_texts=tuple(format_duration(spec.step_window(step)) for step in steps),
            min_requests=tuple(spec.step_min_requests(step) for step in steps),
            interval=_seconds(spec.interval),
            progress_deadline=_seconds(spec.progress_deadline),
            bake=_seconds(spec.bake),
            budget=ErrorBudget.of(policy),
            fair_shares=tuple(
                step.weight / sum(earlier.weight for earlier in steps[: index + 1])
                for index, step in enumerate(steps)
            ),
            horizons=tuple(_seconds(spec.step_horizon(step)) for step in steps),
        )


# Derived once per (immutable) PromotionPolicy object: see canary.rollout.memo.
_plan = IdentityMemo(_PolicyPlan.of, capacity=1024)


class _Tick:
    """One decision. Mutable only inside itself; what leaves it is the immutable :class:`Decision`."""

    def __init__(
        self,
        policy: PromotionPolicy,
        observed: ObservedInferenceService,
        state: RolloutState,
        evidence: Evidence | None,
        now: datetime,
        *,
        probing: bool,
        ledger: RollbackLedger | None = None,
        gates: Sequence[GateResult] = (),
        alarm: bool = False,
    ) -> None:
        if now.tzinfo is None or now.utcoffset() is None:
            raise ValueError("decide() needs a timezone-aware 'now'")
        self.policy = policy
        self.spec = policy.spec
        self.plan = _plan(policy)
        self.steps = self.plan.steps
        self.observed = observed
        self.original = state
        self.state = state
        self.evidence = evidence
        self.now = now
        self.probing = probing
        self.alarm = alarm
        self.ledger = (ledger or RollbackLedger()).for_inference_service(observed.uid)
        self.gate_results = tuple(gates)
        self.gate_calls: list[GateCall] = []
        self.requested: EvidenceRequest | None = None
        self.horizon: Horizon | None = None  # where the step stands against its horizon, once judged
        self.reasons: list[str] = []
        self.severity = Severity.INFO
        self.evaluation: Evaluation | None = None
        self.evaluated_at: datetime | None = None
        self.resumed_by: str | None = None
        # A finding that outranks the wait's own headline (a failed evaluation, an onNoData hold).
        self.lead: str | None = None

    # ------------------------------------------------------------------------------------------
    # Entry

    def run(self) -> Decision:
        decision = self.decide()
        revision = decision.revision
        if (
            decision.action.writes
            and decision.action is not Action.ROLLBACK
            and revision is not None
            and self.rolled_back_before(revision)
        ):
            # The last word, whatever path led here (a resume restoring a value adopted after the
            # state was lost, a command, a restored copy): a rolled-back revision gets no traffic
            # from the controller again. What was about to be written is said, then nothing is.
            refused = f"{decision.action} {decision.weight if decision.weight is not None else 'unset'}"
            self.reasons = []
            self.severity = Severity.WARNING
            self.lead = None
            self.resumed_by = None
            self.reasons.append(f"Not writing {refused} for {revision}: it was rolled back before.")
            return self.not_retried(revision)
        return decision

    def decide(self) -> Decision:
        observed = self.observed
        if not observed.exists:
            return self.wait(
                f"InferenceService {self.policy.key} does not exist; policy {self.policy.metadata.name} "
                "governs nothing until it is created.",
                EventReason.INFERENCE_SERVICE_NOT_FOUND,
                Severity.WARNING,
            )
        self.bind_to_object()
        if observed.deployment_mode is not DeploymentMode.KNATIVE:
            return self.unsupported_mode()
        canary = observed.latest_created_revision
        if canary is None or observed.predictor_fingerprint is None:
            return self.wait(
                f"KServe has not reported a predictor revision for {self.policy.key} yet.",
                EventReason.CANARY_WAITING,
            )
        state = self.state
        same_revision = state.revision is not None and canary == state.revision
        spec_changed = same_revision and observed.predictor_fingerprint != state.fingerprint
        if spec_changed and state.spec_change_seen_at is None:
            self.state = state = replace(state, spec_change_seen_at=self.now)
        elif not spec_changed and state.spec_change_seen_at is not None:
            self.state = state = replace(state, spec_change_seen_at=None)

        command = state.command
        if command is not None and command.kind is CommandKind.ABORT:
            # A rollback is always safe, even while KServe lags behind a changed spec. An abort
            # issued for a revision that a newer one has replaced since is moot: the new revision
            # starts its own rollout (and can be aborted in turn).
            if same_revision and state.rollout_active:
                who = f" by {command.by}" if command.by else ""
                return self.rollback(
                    f"Rollout of {state.revision} aborted{who} (command at {describe_time(command.at)})."
                )
            self.reasons.append(f"The abort requested at {describe_time(command.at)} no longer applies.")
            self.state = state = replace(state, command=None)

        recorded = self.ledger.entry(canary)
        if same_revision and state.rollout_active and recorded is not None:
            # The state lost the rollback (restored from a copy, a write that did not land): the
            # ledger, written before the rollback's patch, has the last word.
            return self.rollback(
                f"the rollback ledger records {canary} as rolled back at {describe_time(recorded.at)}, "
                f"which the state did not remember; a rolled-back revision is never rolled out again."
            )

        if state.revision is None:
            return self.first_sight(canary)
        if not same_revision:
            return self.new_revision(canary)
        if spec_changed:
            return self.spec_change_pending(canary)

        command = self.state.command
        if command is not None and command.kind is CommandKind.RESUME:
            self.resume()
        command = self.state.command
        if command is not None and command.kind is CommandKind.PROMOTE:
            promoted = self.promote_by_command()
            if promoted is not None:
                return promoted
        external = self.reconcile_spec_weight()
        if external is not None:
            return external
        return self.by_phase()

    def unsupported_mode(self) -> Decision:
        observed = self.observed
        if observed.deployment_mode is DeploymentMode.UNKNOWN and observed.deployment_mode_reported is None:
            return self.wait(
                f"KServe has not reported the deployment mode of {self.policy.key} yet.",
                EventReason.CANARY_WAITING,
            )
        mode = observed.deployment_mode_reported or observed.deployment_mode.value
        return self.wait(
            f"{self.policy.key} runs in {mode} mode: canaryTrafficPercent only works in Knative "
            "(Serverless) mode and KServe silently ignores it elsewhere, so kserve-canary does not "
            "manage this InferenceService (KServe >= 0.20 offers spec.canary[] for Standard mode).",
            EventReason.UNSUPPORTED_DEPLOYMENT_MODE,
            Severity.WARNING,
        )

    # ------------------------------------------------------------------------------------------
    # Identity: which revision, which spec

    def bind_to_object(self) -> None:
        """The state describes this InferenceService object (its uid), or it is not used at all."""
        state, uid = self.state, self.observed.uid
        if uid is None or state.inference_service_uid == uid:
            return
        if state.inference_service_uid is not None:
            # A model deleted and re-created under the same name: its revision names start again
            # at 00001, so nothing of the old object's state may be taken for the new one's.
            self.reasons.append(
                f"The stored state describes another InferenceService object (uid "
                f"{state.inference_service_uid}; this one is {uid}): it is not used."
            )
            state = RolloutState()
        self.state = replace(state, inference_service_uid=uid)

    def first_sight(self, canary: str) -> Decision:
        """No state yet: adopt a steady InferenceService, or start on a canary already under way."""
        observed = self.observed
        if self.ledger.has(canary):
            return self.not_retried(canary)
        if observed.latest_rolledout_revision is None:
            return self.first_deployment(canary)
        if canary == observed.latest_rolledout_revision:
            self.state = replace(
                self.state,
                phase=Phase.IDLE,
                revision=canary,
                fingerprint=observed.predictor_fingerprint,
                spec_weight=self.observed_weight_record(),
            )
            return self.wait(
                f"Now watching {self.policy.key}: {canary} is the rolled-out revision; a new predictor "
                "revision will start a rollout.",
                EventReason.CANARY_IDLE,
            )
        return self.start(canary, first_sight=True)

    def first_deployment(self, canary: str) -> Decision:
        return self.wait(
            f"{canary} is the first deployment of {self.policy.key}: KServe sends it 100% and there is "
            "no stable revision to compare with, so there is nothing to roll out.",
            EventReason.FIRST_DEPLOYMENT,
        )

    def rolled_back_before(self, revision: str) -> bool:
        """In the state's memory of rollbacks or in the ledger's (which survives losing the state)."""
        return self.state.was_rolled_back(revision) or self.ledger.has(revision)

    def not_retried(self, canary: str) -> Decision:
        state = self.state
        rolled_back = state.rolled_back
        recorded = self.ledger.entry(canary)
        if recorded is not None and not state.was_rolled_back(canary):
            rolled_back = (*rolled_back, RolledBackRevision(canary, recorded.at))[-MAX_ROLLED_BACK:]
            self.reasons.append(
                f"The rollback ledger records {canary} as rolled back at {describe_time(recorded.at)} "
                "(the rollout state did not remember it)."
            )
        self.state = RolloutState(
            phase=Phase.ROLLED_BACK,
            inference_service_uid=state.inference_service_uid,
            revision=canary,
            fingerprint=self.observed.predictor_fingerprint,
            spec_weight=self.observed_weight_record(),
            rolled_back=rolled_back,
            history=state.history,
        )
        return self.wait(
            f"{canary} was rolled back before and is never retried; push a new spec to try again.",
            EventReason.REVISION_NOT_RETRIED,
        )

    def new_revision(self, canary: str) -> Decision:
        if self.rolled_back_before(canary):
            return self.not_retried(canary)
        if self.observed.latest_rolledout_revision is None:
            return self.first_deployment(canary)
        return self.start(canary)

    def spec_change_pending(self, canary: str) -> Decision:
        """The spec changed but KServe still reports the old revision: judge nothing, wait."""
        since = self.state.spec_change_seen_at or self.now
        waited = self.now - since
        severity = Severity.INFO
        if waited >= self.plan.progress_deadline:
            severity = Severity.WARNING
            self.reasons.append(
                f"KServe has created no revision for the changed spec for {_duration(waited)} "
                f"(progressDeadline {format_duration(self.spec.progress_deadline)}); check the "
                "InferenceService's conditions."
            )
        return self.wait(
            f"The predictor spec of {self.policy.key} changed (since {describe_time(since)}) but KServe "
            f"still reports {canary} as the latest revision: waiting for the new revision before judging "
            "or promoting anything.",
            EventReason.SPEC_CHANGE_PENDING,
            severity,
        )

    # ------------------------------------------------------------------------------------------
    # Starting a rollout (docs/design.md §2.2)

    def start(self, canary: str, *, first_sight: bool = False) -> Decision:
        """A new revision: a fresh rollout, begun according to the percentage the spec came with.

        On first sight (no state: never seen, or the state was lost) a percentage is not taken for
        a plan: a Ready revision at 0 may be one rolled back before the state was lost, and any
        other value may be a step of a rollout whose analysis is gone. Both pause, saying so.
        """
        previous = self.state
        first = self.steps[0].weight
        spec_weight = self.observed.canary_traffic_percent
        ours = controller_weights(previous)
        self.begin_rollout(canary, previous)
        if self.gated(GateStage.PRE_ROLLOUT) and spec_weight != 0:
            leftover = spec_weight is not None and spec_weight in ours
            if spec_weight == first or leftover or (spec_weight is None and self.spec.auto_start):
                return self.start_pinned(canary, first, spec_weight)
        if spec_weight == first:
            return self.start_at_first_step(canary, first, ours)
        if spec_weight == 0:
            if first_sight and self.observed.canary_ready:
                return self.pause_unexplained_zero(canary)
            return self.start_dark_launch(canary, first)
        leftover = spec_weight is not None and spec_weight in ours
        if spec_weight is None or leftover:
            return self.start_by_writing(canary, first, spec_weight, leftover=leftover)
        if first_sight:
            return self.pause_on_first_sight_value(canary, first, spec_weight)
        return self.pause_on_start_value(canary, first, spec_weight)

    def pause_unexplained_zero(self, canary: str) -> Decision:
        """No state, no ledger entry, and a Ready revision at 0 that KServe has not rolled out."""
        rolled_out = self.observed.latest_rolledout_revision
        reason = (
            f"{canary} is Ready at 0 % (canaryTrafficPercent 0) and is not the rolled-out revision "
            f"({rolled_out}); no rollout state or rollback ledger was found that says why (a rollback "
            f"whose state was lost, or a dark launch): paused without writing. Run `kserve-canary "
            f"resume` to start its rollout at {self.steps[0].weight}% or `abort` to keep it at 0 %."
        )
        return self.pause(PauseKind.UNEXPECTED_START_VALUE, reason, resume_phase=self.state.phase)

    def pause_on_first_sight_value(self, canary: str, first: int, spec_weight: int) -> Decision:
        """No state, and a percentage the spec was not given by this policy's first step."""
        rolled_out = self.observed.latest_rolledout_revision
        reason = (
            f"No rollout state was found for {self.policy.key}, and canaryTrafficPercent is "
            f"{spec_weight} for revision {canary} (the rolled-out revision is {rolled_out}): a rollout "
            f"whose state was lost, or a value set by hand. Paused without writing: `kserve-canary "
            f"resume` starts its rollout from the first step {first}%, `abort` rolls it back."
        )
        return self.pause(PauseKind.UNEXPECTED_START_VALUE, reason, resume_phase=self.state.phase)

    def begin_rollout(self, canary: str, previous: RolloutState) -> None:
        """The state of a rollout of ``canary`` at its first step, and why it begins."""
        observed = self.observed
        stable = observed.stable_for(canary)
        if previous.rollout_active and previous.revision is not None:
            at = _weight_text(previous.spec_weight.weight) if previous.spec_weight else "an unknown weight"
            self.reasons.append(
                f"{canary} replaces {previous.revision}, whose rollout was {previous.phase} at {at}: the "
                "analysis restarts from the first step for the new revision."
            )
        self.reasons.append(
            f"New revision {canary} (predictor spec {observed.predictor_fingerprint}); stable revision "
            f"{stable or 'unknown'}."
        )
        if stable is not None and self.rolled_back_before(stable):
            self.severity = Severity.WARNING
            self.reasons.append(
                f"KServe routes the remaining traffic to {stable}, which was rolled back earlier (KServe "
                "still tracks it as rolled out after a post-promotion rollback)."
            )
        self.state = RolloutState(
            phase=Phase.PROGRESSING if observed.canary_ready else Phase.PENDING,
            inference_service_uid=previous.inference_service_uid,
            revision=canary,
            fingerprint=observed.predictor_fingerprint,
            stable_revision=stable,
            started_at=self.now,
            started_generation=observed.generation,
            step=StepProgress(0, self.steps[0].weight),
            spec_weight=self.observed_weight_record(),
            rolled_back=previous.rolled_back,
            history=previous.history,
        )

    def start_at_first_step(self, canary: str, first: int, ours: set[int | None]) -> Decision:
        """The spec already has the first step: nothing to write."""
        ready = self.observed.canary_ready
        origin = "left from the previous rollout" if first in ours else "set with the spec"
        self.reasons.append(f"canaryTrafficPercent is already the first step {first}% ({origin}).")
        if ready and self.observed.weight_of(canary) == first:
            # Its clock starts now, as it would on the next tick: decide() is idempotent.
            self.state = replace(
                self.state,
                step=StepProgress(0, first, started_at=self.now),
                evidence_since=self.state.evidence_since or self.now,
            )
        return self.wait(
            f"Rollout of {canary} started at the first step {first}% ({origin}); "
            + ("evaluating once status traffic shows it." if ready else "waiting for it to become Ready."),
            EventReason.CANARY_STARTED,
        )

    def start_pinned(self, canary: str, first: int, spec_weight: int | None) -> Decision:
        """A pre-rollout gate: 0 is written at once (KServe would send a revision without a
        percentage everything once Ready), the first step only after the gate passed."""
        names = ", ".join(self.gate_names(GateStage.PRE_ROLLOUT))
        self.state = replace(self.state, phase=Phase.PENDING)
        if self.observed.canary_ready and self.observed.weight_of(canary) > 0:
            self.severity = Severity.WARNING
            self.reasons.append(
                f"{canary} was already Ready with {self.observed.weight_of(canary)}% before the controller "
                f"acted; 0% pins all traffic back to {self.state.stable_revision or 'the previous revision'}."
            )
        return self.write(
            Action.START,
            0,
            f"Starting the rollout of {canary}: writing 0% ("
            + (
                "the spec had no canaryTrafficPercent"
                if spec_weight is None
                else f"the spec had {spec_weight}%"
            )
            + f") so that it gets no traffic before its pre-rollout gate {names} passes; the first step "
            f"{first}% follows.",
            EventReason.CANARY_STARTED,
            phase=Phase.PENDING,
        )

    def start_dark_launch(self, canary: str, first: int) -> Decision:
        """``canaryTrafficPercent: 0``: the first step once the canary is Ready."""
        if self.observed.canary_ready and self.gated(GateStage.PRE_ROLLOUT):
            self.state = replace(self.state, phase=Phase.PENDING)
            held = self.gates_hold(frozenset({GateStage.PRE_ROLLOUT}), None)
            if held is not None:
                return held
            return self.end_dark_launch(first, self.gates_passed_headline(canary, first))
        if self.observed.canary_ready:
            return self.end_dark_launch(
                first,
                f"Dark-launched revision {canary} is Ready: starting its rollout at the first step {first}%.",
            )
        return self.wait(
            f"Rollout of {canary} started as a dark launch (canaryTrafficPercent 0): it moves to the "
            f"first step {first}% once Ready.",
            EventReason.CANARY_STARTED,
        )

    def end_dark_launch(self, first: int, headline: str) -> Decision:
        """A dark-launched canary (``canaryTrafficPercent: 0``) is Ready: write the first step."""
        return self.write(Action.START, first, headline, EventReason.CANARY_STARTED, phase=Phase.PROGRESSING)

    def start_by_writing(
        self, canary: str, first: int, spec_weight: int | None, *, leftover: bool
    ) -> Decision:
        """No percentage (autoStart), or our own from the previous rollout: write the first step."""
        observed = self.observed
        ready = observed.canary_ready
        if spec_weight is None and not self.spec.auto_start:
            self.state = replace(
                self.state, phase=Phase.IDLE, step=None, stable_revision=None, started_at=None
            )
            return self.wait(
                f"New revision {canary} has no canaryTrafficPercent and autoStart is off: KServe sends "
                "it 100% once Ready, unguarded. Put the first step in the spec, or enable autoStart.",
                EventReason.UNGUARDED_ROLLOUT,
                Severity.WARNING,
            )
        exposed = observed.weight_of(canary)
        event = EventReason.CANARY_STARTED
        if ready and (spec_weight is None or exposed > first):
            self.severity = Severity.WARNING
            event = EventReason.UNGUARDED_ROLLOUT
            self.state = replace(self.state, unguarded=True)
            self.reasons.append(
                f"Unguarded rollout: {canary} was already Ready with "
                f"{_weight_text(spec_weight) if spec_weight is not None else '100% (no field)'} before "
                f"the controller acted (status shows {exposed}%); the first step pins {100 - first}% "
                f"back to {self.state.stable_revision or 'the previous revision'} while its pods are still "
                "there."
            )
        elif leftover:
            self.reasons.append(
                f"canaryTrafficPercent {spec_weight} is the controller's own value from the previous "
                "rollout, not a value set with the spec."
            )
        return self.write(
            Action.START,
            first,
            f"Starting the rollout of {canary}: writing the first step {first}%"
            + ("." if ready else " before it becomes Ready."),
            event,
        )

    def pause_on_start_value(self, canary: str, first: int, spec_weight: int) -> Decision:
        """A percentage that is neither the first step nor 0: a person must say what was meant."""
        reason = (
            f"New revision {canary} came with canaryTrafficPercent {spec_weight}, which is neither the "
            f"policy's first step ({first}) nor 0 (dark launch). Paused without writing: set it to {first} "
            f"or remove it in Git, or `kserve-canary resume` to start from {first}%."
        )
        return self.pause(PauseKind.UNEXPECTED_START_VALUE, reason, resume_phase=self.state.phase)

    # ------------------------------------------------------------------------------------------
    # Who wrote the percentage (docs/design.md §2.4)

    def observed_weight_record(self) -> WeightRecord:
        return found_in_spec(self.observed, self.now)

    def reconcile_spec_weight(self) -> Decision | None:
        reconciled = reconcile_spec_weight(self.state, self.observed, self.now)
        if reconciled is None:
            return self.external_change(self.observed.canary_traffic_percent)
        self.state = reconciled
        return None

    def external_change(self, observed_weight: int | None) -> Decision:
        state = self.state
        written = (state.intent or state.spec_weight or WeightRecord(None, None, self.now)).weight
        headline = (
            f"canaryTrafficPercent of {self.policy.key} was changed by someone else: observed "
            f"{_weight_text(observed_weight)}, the controller wrote {_weight_text(written)}. Paused: nothing "
            "is written until `kserve-canary resume` (restores the controller's value), `abort` or `promote`."
        )
        pause = state.pause
        if (
            state.phase is Phase.PAUSED
            and pause is not None
            and pause.kind is PauseKind.EXTERNAL_CHANGE
            and pause.observed_weight == observed_weight
        ):
            return self.wait(pause.reason, EventReason.EXTERNAL_TRAFFIC_CHANGE, Severity.WARNING)
        resume_phase = (
            pause.resume_phase if state.phase is Phase.PAUSED and pause is not None else state.phase
        )
        return self.pause(
            PauseKind.EXTERNAL_CHANGE,
            headline,
            resume_phase=resume_phase,
            observed_weight=observed_weight,
            event=EventReason.EXTERNAL_TRAFFIC_CHANGE,
        )

    # ------------------------------------------------------------------------------------------
    # Commands that need the full picture (apply_command records them; they happen here)

    def resume(self) -> None:
        state = self.state
        command = state.command
        assert command is not None
        self.resumed_by = command.by or "an operator"
        pause = state.pause
        if state.phase is not Phase.PAUSED or pause is None:
            self.state = replace(state, command=None)
            return
        evaluation = replace(state.evaluation, no_data_clock_from=self.now)
        target_phase = pause.resume_phase
        state = replace(state, phase=target_phase, pause=None, command=None, evaluation=evaluation)
        self.reasons.append(
            f"Resumed by {self.resumed_by} (command at {describe_time(command.at)}) from: {pause.reason}"
        )
        if pause.kind is PauseKind.EXTERNAL_CHANGE:
            # Restore the value the rollout had; the step's clock restarts once status shows it.
            before = state.intent or state.spec_weight
            state = replace(state, spec_weight=self.observed_weight_record())
            if target_phase is not Phase.IDLE and before is not None:
                state = self.with_intent(state, before.weight)
        elif pause.kind is PauseKind.UNEXPECTED_START_VALUE:
            state = replace(
                state, spec_weight=self.observed_weight_record(), step=StepProgress(0, self.steps[0].weight)
            )
            if self.gated(GateStage.PRE_ROLLOUT):
                # Pinned at 0 until the pre-rollout gate passes, as a fresh start would be.
                state = self.with_intent(replace(state, phase=Phase.PENDING), 0)
            else:
                state = self.with_intent(state, self.steps[0].weight)
        elif pause.kind is PauseKind.HORIZON and state.step is not None:
            # Another horizon on fresh evidence: the step's clock restarts once status shows it.
            state = replace(state, step=StepProgress(state.step.index, state.step.weight))
        elif pause.kind is PauseKind.POLICY_CHANGED and state.step is not None:
            index = _step_at_or_below(self.steps, state.step.weight)
            state = replace(state, step=StepProgress(index, self.steps[index].weight))
            state = self.with_intent(state, self.steps[index].weight)
        self.state = state

    def with_intent(self, state: RolloutState, weight: int | None) -> RolloutState:
        return heading_for(state, weight, self.observed, self.now)

    def promote_by_command(self) -> Decision | None:
        state = self.state
        command = state.command
        assert command is not None
        if state.underlying_phase in (Phase.PROMOTING, Phase.BAKING) or not state.rollout_active:
            self.state = replace(state, command=None)
            return None
        if not self.observed.canary_ready:
            return self.wait(
                f"Promotion of {state.revision} requested by {command.by or 'an operator'}: waiting for it "
                "to be Ready (KServe would send 100% to the previous revision otherwise).",
                EventReason.CANARY_WAITING,
            )
        self.state = replace(state, command=None, pause=None, spec_weight=self.observed_weight_record())
        return self.promote(
            f"Promoting {state.revision} on command from {command.by or 'an operator'} "
            f"({describe_time(command.at)}), skipping the remaining analysis: removing canaryTrafficPercent."
        )

    # ------------------------------------------------------------------------------------------
    # Phases

    def by_phase(self) -> Decision:
        state = self.state
        phase = state.phase
        if phase is Phase.PAUSED:
            assert state.pause is not None
            if state.pause.kind is PauseKind.APPROVAL:
                return self.progressing(awaiting_approval=True)
            return self.wait(state.pause.reason, EventReason.CANARY_PAUSED, Severity.WARNING)
        if state.intent is not None:
            return self.reissue()
        if phase is Phase.PENDING:
            return self.pending()
        if phase is Phase.PROGRESSING:
            return self.progressing(awaiting_approval=False)
        if phase is Phase.PROMOTING:
            return self.promoting()
        if phase is Phase.BAKING:
            return self.baking()
        if phase is Phase.ROLLED_BACK:
            return self.wait(
                f"{state.revision} was rolled back; it is not retried. Revert or fix the spec in Git: a "
                "new revision starts a new rollout.",
                EventReason.CANARY_IDLE,
            )
        if phase is Phase.SUCCEEDED:
            return self.wait(f"{state.revision} was rolled out successfully.", EventReason.CANARY_IDLE)
        return self.wait(
            f"No rollout in progress; {state.revision} is the current revision.", EventReason.CANARY_IDLE
        )

    def reissue(self) -> Decision:
        """The intent recorded earlier has not reached the spec: write it again (idempotent)."""
        intent = self.state.intent
        assert intent is not None
        return self.recorded_write(
            intent, "Writing", f"; the spec still shows {_weight_text(self.observed.canary_traffic_percent)}."
        )

    def landed(self) -> Decision:
        """The intent recorded earlier is in the spec: the write it describes, told again."""
        intent = self.state.intent
        assert intent is not None
        told = self.recorded_write(
            intent,
            "Wrote",
            "; the spec shows it. Told again: the controller that wrote it may have stopped before "
            "telling it (a restart, a lost answer).",
        )
        # The value it replaced is the one known before the intent (the spec already shows the new one).
        before = self.state.spec_weight
        return replace(told, previous_weight=before.weight if before is not None else None)

    def recorded_write(self, intent: WeightRecord, verb: str, ending: str) -> Decision:
        """The decision that recorded ``intent``: its action, its id and — the evaluation that
        recorded the intent was stored with it (same write, same moment) — its verdict and requests,
        so a write is never told without the numbers behind it, even when the process that decided
        it died before it could log or notify."""
        state = self.state
        action, event = reissued_action(intent, state.step)
        if intent.weight == 0 and state.phase is Phase.PENDING:
            # The 0 of a pre-rollout gate (start_pinned): a start, never a rollback (the ledger
            # would otherwise remember a revision that was never rolled back).
            action, event = Action.START, EventReason.CANARY_STARTED
        severity = Severity.WARNING if action is Action.ROLLBACK else Severity.INFO
        record = state.evaluation
        decided_on = record if record.at is not None and record.at == intent.at else None
        basis = (
            f", decided on a {decided_on.verdict} evaluation with {_requests_of(decided_on.requests)}"
            if decided_on is not None and decided_on.verdict is not None
            else ""
        )
        return self.finish(
            action,
            event,
            f"{verb} canaryTrafficPercent {_weight_text(intent.weight)} for {state.revision} "
            f"(intent recorded {describe_time(intent.at)}{basis}){ending}",
            weight=intent.weight,
            severity=severity,
            id_time=intent.at,
            decided_on=decided_on,
        )

    def pending(self) -> Decision:
        paused = self.check_policy_step()
        if paused is not None:
            return paused
        state = self.state
        assert state.started_at is not None
        assert state.step is not None
        observed = self.observed
        waited = self.now - state.started_at
        if observed.canary_ready:
            self.reasons.append(
                f"{state.revision} became Ready {_duration(waited)} after its rollout started."
            )
            if state.spec_weight is not None and state.spec_weight.weight == 0:
                held = self.gates_hold(frozenset({GateStage.PRE_ROLLOUT}), None)
                if held is not None:
                    return held
                if self.gated(GateStage.PRE_ROLLOUT):
                    return self.end_dark_launch(
                        state.step.weight, self.gates_passed_headline(state.revision, state.step.weight)
                    )
                return self.end_dark_launch(
                    state.step.weight,
                    f"Dark-launched revision {state.revision} is Ready: moving it to the first step "
                    f"{state.step.weight}%.",
                )
            self.state = replace(state, phase=Phase.PROGRESSING)
            return self.progressing(awaiting_approval=False)
        rolled_back = self.evaluate(EvaluationMode.PENDING, state.started_at, None)
        if rolled_back is not None:
            return rolled_back
        failure = f" Knative reports: {observed.revision_failure}" if observed.revision_failure else ""
        deadline = self.spec.progress_deadline
        if waited >= self.plan.progress_deadline:
            return self.rollback(
                f"{state.revision} did not become Ready within progressDeadline {format_duration(deadline)} "
                f"(rollout started {describe_time(state.started_at)}).{failure}"
            )
        return self.wait(
            f"Waiting for {state.revision} to become Ready: {_duration(waited)} of progressDeadline "
            f"{format_duration(deadline)}.{failure}",
            EventReason.CANARY_PENDING,
            Severity.WARNING if observed.revision_failure else Severity.INFO,
        )

    def progressing(self, *, awaiting_approval: bool) -> Decision:
        paused = self.check_policy_step()
        if paused is not None:
            return paused
        state = self.state
        step = state.step
        assert step is not None
        observed = self.observed
        revision = state.revision
        if not observed.canary_ready:
            return self.hold_unready()
        if state.unready_since is not None:
            self.reasons.append(
                f"{revision} is Ready again (it was not since {describe_time(state.unready_since)})."
            )
            self.state = state = replace(state, unready_since=None)
        stable = observed.stable_for(revision) if revision is not None else None
        if stable is not None and stable != state.stable_revision:
            self.reasons.append(
                f"KServe routes the rest of the traffic to {stable} (was {state.stable_revision})."
            )
            self.state = state = replace(state, stable_revision=stable)
        if step.started_at is None:
            shown = observed.weight_of(revision)
            if shown != step.weight:
                return self.wait(
                    f"Waiting for status traffic to show {step.weight}% for {revision} (it shows "
                    f"{shown}%); the step's clock starts then.",
                    EventReason.CANARY_WAITING,
                )
            # Nothing can be due at the very moment the step starts: its window is empty.
            self.state = replace(
                state,
                step=replace(step, started_at=self.now),
                evidence_since=state.evidence_since or self.now,
            )
            window = self.plan.window_texts[step.index]
            return self.wait(
                f"Step {step.index + 1} of {len(self.steps)} ({step.weight}%) of {revision} started: status "
                f"traffic shows it at {describe_time(self.now)}; holding it for {window}.",
                EventReason.CANARY_WAITING,
                awaiting=awaiting_approval,
            )
        decided = self.evaluate(EvaluationMode.STEP, step.started_at, state.stable_revision)
        if decided is not None:
            return decided
        step = self.state.step
        assert step is not None
        if step.passed_at is None:
            return self.wait(
                self.step_progress_text(step), self.evaluation_event(), awaiting=awaiting_approval
            )
        final = step.index + 1 >= len(self.steps)
        stages = {GateStage.STEP, GateStage.PRE_PROMOTION} if final else {GateStage.STEP}
        held = self.gates_hold(frozenset(stages), step.weight)
        if held is not None:
            return held
        policy_step = self.steps[step.index]
        if policy_step.approval == "manual" and step.weight not in self.state.approvals:
            text = (
                f"Step {step.weight}% of {revision} passed and needs approval before the rollout leaves it: "
                f"`kserve-canary approve {self.policy.key}`. Evaluations continue meanwhile; a failure "
                "still rolls back."
            )
            if awaiting_approval:
                return self.wait(text, EventReason.CANARY_AWAITING_APPROVAL)
            return self.pause(
                PauseKind.APPROVAL,
                text,
                resume_phase=Phase.PROGRESSING,
                event=EventReason.CANARY_AWAITING_APPROVAL,
            )
        return self.leave_step(step)

    def hold_unready(self) -> Decision:
        """A canary that turned un-Ready mid-rollout holds its step; the progress deadline applies."""
        state = self.state
        since = state.unready_since or self.now
        self.state = state = replace(state, unready_since=since)
        step = state.step
        assert step is not None
        failure = (
            f" Knative reports: {self.observed.revision_failure}" if self.observed.revision_failure else ""
        )
        if step.started_at is not None:
            # Keep judging: the restarts or OOM kills that made it un-Ready are evidence.
            decided = self.evaluate(EvaluationMode.STEP, step.started_at, state.stable_revision)
            if decided is not None:
                return decided
            # A step never passes while its canary is un-Ready.
            state = self.state
            if state.step is not None and state.step.passed_at is not None:
                self.state = state = replace(state, step=replace(state.step, passed_at=None))
        unready_for = self.now - since
        deadline = self.spec.progress_deadline
        if unready_for >= self.plan.progress_deadline:
            return self.rollback(
                f"{state.revision} has not been Ready for {_duration(unready_for)} "
                f"(since {describe_time(since)}), beyond progressDeadline {format_duration(deadline)}."
                f"{failure}"
            )
        return self.wait(
            f"{state.revision} is not Ready (since {describe_time(since)}): holding step {step.weight}%; "
            f"rollback after progressDeadline {format_duration(deadline)}.{failure}",
            EventReason.CANARY_WAITING,
            Severity.WARNING,
        )

    def leave_step(self, step: StepProgress) -> Decision:
        assert step.started_at is not None
        assert step.passed_at is not None
        requests = self.state.evaluation.requests
        final = step.index + 1 >= len(self.steps)
        verdict = self.state.evaluation.verdict
        shown = (
            f"latest evaluation passed at {describe_time(step.passed_at)}"
            if final or verdict is EvaluationVerdict.PASS
            else f"nothing failed or lacked data at {describe_time(step.passed_at)} (checks not decided yet "
            "are judged again at the next step, on its own evidence, and pooled for the promotion)"
        )
        passed = (
            f"Step {step.weight}% passed: held {_duration(step.passed_at - step.started_at)} (window "
            f"{self.plan.window_texts[step.index]}), {(requests or 0):.0f} canary requests "
            f"(minRequests {self.plan.min_requests[step.index]}), {shown}."
        )
        self.reasons.insert(0, passed)
        if step.index + 1 < len(self.steps):
            following = self.steps[step.index + 1].weight
            counted = self.state.counted_requests + (step.counted or requests or 0.0)
            self.state = replace(
                self.state, step=StepProgress(step.index + 1, following), counted_requests=counted
            )
            return self.write(
                Action.ADVANCE,
                following,
                f"Advancing {self.state.revision} from {step.weight}% to {following}%.",
                EventReason.CANARY_ADVANCED,
                phase=Phase.PROGRESSING,
            )
        return self.promote(
            f"Promoting {self.state.revision}: its last step {step.weight}% passed; removing "
            "canaryTrafficPercent."
        )

    def promoting(self) -> Decision:
        observed = self.observed
        revision = self.state.revision
        if not self.promotion_recorded():
            return self.wait(
                f"Waiting for KServe to record the promotion of {revision} (latestRolledoutRevision is "
                f"{observed.latest_rolledout_revision or 'unset'}, {revision} receives "
                f"{observed.weight_of(revision)}%).",
                EventReason.CANARY_WAITING,
            )
        event, text = self.after_promotion()
        return self.wait(text, event)

    def promotion_recorded(self) -> bool:
        """KServe routes 100% to the canary and records it as the rolled-out revision."""
        observed = self.observed
        revision = self.state.revision
        return (
            observed.latest_rolledout_revision == revision
            and observed.weight_of(revision) == 100
            and observed.canary_traffic_percent is None
        )

    def after_promotion(self) -> tuple[EventReason, str]:
        """Move on from a recorded promotion: bake, or done."""
        revision = self.state.revision
        if self.spec.bake > 0:
            self.state = replace(self.state, phase=Phase.BAKING, bake_started_at=self.now)
            return EventReason.CANARY_BAKING, (
                f"KServe recorded the promotion of {revision}; baking for {format_duration(self.spec.bake)}: "
                "absolute limits are still watched and a failure rolls back (to a cold previous revision)."
            )
        self.state = replace(self.state, phase=Phase.SUCCEEDED)
        return EventReason.CANARY_SUCCEEDED, (
            f"Rollout of {revision} succeeded: KServe records it as the rolled-out revision at 100%."
        )

    def baking(self) -> Decision:
        state = self.state
        bake_start = state.bake_started_at
        assert bake_start is not None
        decided = self.evaluate(EvaluationMode.BAKE, bake_start, None)
        if decided is not None:
            return decided
        state = self.state
        bake_end = bake_start + self.plan.bake
        last = state.evaluation
        if not self.plan.absolute_checks:
            # Only relative limits, and the stable revision gets no traffic any more: nothing to watch.
            finished = self.now >= bake_end
        else:
            finished = (
                last.at is not None
                and last.at >= bake_end
                and last.verdict is not EvaluationVerdict.FAIL
                and not last.query_error
            )
        if finished:
            self.state = replace(state, phase=Phase.SUCCEEDED)
            return self.wait(
                f"Rollout of {state.revision} succeeded: the {format_duration(self.spec.bake)} bake is over "
                "without a failure.",
                EventReason.CANARY_SUCCEEDED,
            )
        return self.wait(
            f"Baking {state.revision}: {_duration(self.now - bake_start)} of "
            f"{format_duration(self.spec.bake)}.",
            self.evaluation_event(default=EventReason.CANARY_BAKING),
        )

    def check_policy_step(self) -> Decision | None:
        """The policy may have been edited: find the current weight among its steps, or pause."""
        state = self.state
        step = state.step
        assert step is not None
        if step.index < len(self.steps) and self.steps[step.index].weight == step.weight:
            return None
        for index, candidate in enumerate(self.steps):
            if candidate.weight == step.weight:
                self.state = replace(state, step=replace(step, index=index))
                self.reasons.append(
                    f"The policy was edited: {step.weight}% is now step {index + 1} of {len(self.steps)}."
                )
                return None
        weights = ", ".join(f"{candidate.weight}%" for candidate in self.steps)
        return self.pause(
            PauseKind.POLICY_CHANGED,
            f"The policy was edited: the current weight {step.weight}% is no longer one of its steps "
            f"({weights}). "
            f"Paused; `kserve-canary resume` continues from "
            f"{self.steps[_step_at_or_below(self.steps, step.weight)].weight}%.",
            resume_phase=state.phase if state.phase is not Phase.PAUSED else Phase.PROGRESSING,
        )

    # ------------------------------------------------------------------------------------------
    # Gates (canary/rollout/gates.py)

    def gated(self, stage: GateStage) -> bool:
        return any(gate.at is stage for gate in self.spec.gates)

    def gates_passed_headline(self, canary: str | None, first: int) -> str:
        names = ", ".join(self.gate_names(GateStage.PRE_ROLLOUT))
        return f"Pre-rollout gate {names} passed: moving {canary} from 0% to the first step {first}%."

    def gate_names(self, stage: GateStage) -> list[str]:
        return [self.spec.gate_name(index) for index, gate in enumerate(self.spec.gates) if gate.at is stage]

    def gates_hold(self, stages: frozenset[GateStage], weight: int | None) -> Decision | None:
        """None when every gate of ``stages`` at this point has passed; else the decision that holds
        the rollout (and asks for the gates' calls) or, past a deadline with failurePolicy rollback,
        rolls it back. ``weight``: the step's (None before the first step)."""
        applicable = [(index, gate) for index, gate in enumerate(self.spec.gates) if gate.at in stages]
        if not applicable:
            return None
        waiting: list[tuple[int, Gate, GateProgress]] = []
        for index, gate in applicable:
            progress = self.gate_progress(index, gate, weight)
            if progress.passed_at is None:
                waiting.append((index, gate, progress))
        if not waiting:
            return None
        revision = self.state.revision
        expired: list[tuple[Gate, GateProgress]] = []
        texts: list[str] = []
        for _, gate, progress in waiting:
            deadline = _seconds(gate.deadline)
            held = self.now - progress.since
            if held >= deadline:
                expired.append((gate, progress))
            attempts = f"{progress.attempts} failed attempt{'s' if progress.attempts != 1 else ''}"
            then = gate.failure_policy.value
            texts.append(
                f"{progress.name} ({gate.at.value}): {attempts}, latest {progress.describe_last()}; waiting "
                f"{_duration(held)} of deadline {format_duration(gate.deadline)} (then {then})"
            )
        for gate, progress in expired:
            if gate.failure_policy is GateFailurePolicy.ROLLBACK:
                return self.rollback(
                    f"gate {progress.name} ({gate.at.value}) did not pass within its deadline "
                    f"{format_duration(gate.deadline)} (first called {describe_time(progress.since)}): "
                    f"{progress.attempts} failed attempts, latest {progress.describe_last()}; failurePolicy "
                    "rollback."
                )
        for index, gate, progress in waiting:
            self.gate_calls.append(self.gate_call(index, gate, progress))
        where = (
            f"at 0% before its first step {self.steps[0].weight}%"
            if weight is None
            else f"at {weight}%: the step passed"
        )
        headline = f"Holding {revision} {where}; waiting for gate {'; '.join(texts)}."
        event = EventReason.GATE_WAITING
        severity = Severity.INFO
        if expired:
            for _, progress in expired:
                if progress.deadline_passed_at is None:
                    self.put_gate(replace(progress, deadline_passed_at=self.now))
            names = ", ".join(progress.name for _, progress in expired)
            headline = (
                f"Gate {names} did not pass within its deadline; failurePolicy hold: {revision} keeps "
                f"holding and the gate is called again (`kserve-canary promote` or `abort` decide instead). "
                f"{headline}"
            )
            event, severity = EventReason.GATE_FAILED, Severity.WARNING
        return self.wait(headline, event, severity)

    def gate_progress(self, index: int, gate: Gate, weight: int | None) -> GateProgress:
        """The state's progress of ``gate`` at this point (created now when first reached), with the
        results supplied to this decision taken in."""
        key = gate_key(gate.at, index, weight if gate.at is GateStage.STEP else None)
        found = next((progress for progress in self.state.gates if progress.key == key), None)
        progress = found or GateProgress(
            key=key,
            name=self.spec.gate_name(index),
            stage=gate.at,
            since=self.now,
            weight=weight if gate.at is GateStage.STEP else None,
        )
        for result in sorted(self.gate_results, key=lambda result: result.at):
            if result.revision == self.state.revision and result.at <= self.now:
                progress = record_gate_result(progress, result)
        passed = progress.passed_at
        if passed is not None and (found is None or found.passed_at is None):
            self.reasons.append(
                f"Gate {progress.name} ({gate.at.value}) passed: answered {progress.last_status} at "
                f"{describe_time(passed)}, {_duration(passed - progress.since)} after it was first called "
                f"({progress.attempts} failed attempts before)."
            )
        if progress != found:
            self.put_gate(progress)
        return progress

    def put_gate(self, progress: GateProgress) -> None:
        kept = tuple(entry for entry in self.state.gates if entry.key != progress.key)
        self.state = replace(self.state, gates=(*kept, progress))

    def gate_call(self, index: int, gate: Gate, progress: GateProgress) -> GateCall:
        state, observed = self.state, self.observed
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
            {"index": step.index, "weight": step.weight, "of": len(self.steps)}
            if step is not None and progress.stage is not GateStage.PRE_ROLLOUT
            else None
        )
        deadline = _seconds(gate.deadline)
        return GateCall(
            policy_key=self.plan.key,
            revision=state.revision,
            key=progress.key,
            index=index,
            name=progress.name,
            stage=gate.at,
            timeout=gate.webhook.timeout,
            since=progress.since,
            deadline=deadline,
            body=gate_body(
                policy_key=self.plan.key,
                policy_name=self.policy.metadata.name,
                namespace=self.policy.metadata.namespace,
                inference_service=self.spec.target.inference_service,
                uid=observed.uid,
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

    # ------------------------------------------------------------------------------------------
    # Evaluations

    def evaluate(self, mode: EvaluationMode, window_start: datetime, stable: str | None) -> Decision | None:
        """Judge the evidence if it is the evaluation due now; may decide a rollback or a pause."""
        compare = mode is EvaluationMode.STEP
        checks = self.plan.checks if compare else self.plan.absolute_checks
        if not checks:
            return None
        window_end = self.window_end(mode, window_start)
        if self.probing:
            if self.due(self.now, window_start, window_end):
                self.requested = self.request(checks, window_start, stable if compare else None, compare)
            return None
        evidence = self.evidence
        if evidence is None:
            if self.due(self.now, window_start, window_end):
                self.reasons.append("An evaluation is due but no evidence was supplied.")
            return None
        asked = evidence.request
        if (
            asked.canary_revision != self.state.revision
            or asked.window_start != window_start
            or asked.compare_with_stable != compare
            or (compare and asked.stable_revision != stable)
            or asked.at > self.now
            or not self.due(asked.at, window_start, window_end)
        ):
            return None
        return self.record_evaluation(mode, checks, evidence, window_start)

    def window_end(self, mode: EvaluationMode, window_start: datetime) -> datetime | None:
        if mode is EvaluationMode.STEP:
            step = self.state.step
            assert step is not None
            return window_start + self.plan.windows[step.index]
        if mode is EvaluationMode.BAKE:
            return window_start + self.plan.bake
        return None

    def due(self, at: datetime, window_start: datetime, window_end: datetime | None) -> bool:
        last = self.state.evaluation.at
        if self.alarm and at > window_start and (last is None or at > last):
            return True  # an extra look, now: a critical signal moved (see decide)
        return is_due(at, window_start, window_end, last, self.plan.interval)

    def request(
        self, checks: tuple[Check, ...], window_start: datetime, stable: str | None, compare: bool
    ) -> EvidenceRequest:
        assert self.state.revision is not None
        since = self.state.evidence_since if compare else None
        return EvidenceRequest(
            namespace=self.policy.metadata.namespace,
            inference_service=self.spec.target.inference_service,
            canary_revision=self.state.revision,
            stable_revision=stable,
            window_start=window_start,
            at=self.now,
            checks=checks,
            compare_with_stable=compare,
            history_start=since if since is not None and since < window_start else None,
            # Pending and the first step: the canary's warm-up is its own evidence (never while baking).
            canary_born=self.state.started_at if self.state.warm_up_counted else None,
        )

    def record_evaluation(
        self,
        mode: EvaluationMode,
        checks: tuple[Check, ...],
        evidence: Evidence,
        window_start: datetime,
    ) -> Decision | None:
        at = evidence.request.at
        compare = mode is EvaluationMode.STEP
        state = self.state
        step = state.step
        final = compare and step is not None and step.index == len(self.steps) - 1
        horizon = None
        if compare and step is not None:
            covered = evidence_time((evidence.counts or {}).get("canary"), window_start)
            ended = step.started_at is not None and at - step.started_at >= self.plan.windows[step.index]
            horizon = Horizon(self.plan.horizons[step.index], covered, at, self.spec.at_horizon, ended)
            self.horizon = horizon
        context = CountContext(
            step_start=window_start,
            budget=self.plan.budget,
            confidence=self.spec.confidence,
            final_step=final,
            horizon=horizon,
        )
        evaluation = judge_evidence(
            checks,
            evidence.canary,
            evidence.stable,
            compare_with_stable=compare,
            counts=evidence.counts,
            context=context,
        )
        self.evaluation, self.evaluated_at = evaluation, at
        has_error = evaluation.has_error
        failed = evaluation.measured_failures
        min_requests = self.plan.min_requests[step.index] if compare and step else 0
        enough_requests = evaluation.requests is not None and evaluation.requests >= min_requests
        previous = state.evaluation
        # Requests arrived since the previous evaluation of this window: "not yet" with data flowing
        # is not silence (onNoData counts only time without new requests or without series).
        earlier = previous.requests if previous.at is not None and previous.at > window_start else 0.0
        flowing = evaluation.requests is not None and evaluation.requests > (earlier or 0.0)
        conclusive = is_conclusive(mode, evaluation, flowing)
        record = record_evaluation(previous, evaluation, at, conclusive=conclusive)
        streak = record.failure_streak
        if mode is EvaluationMode.STEP:
            assert step is not None
            assert step.started_at is not None
            passed = step_passed(
                evaluation,
                enough_requests,
                at - step.started_at,
                self.plan.windows[step.index],
                final_step=final,
            ) and (not final or self.carries_share(evaluation, step.index))
            counted = (step.counted if step.passed_at is not None else None) or evaluation.requests
            step = replace(step, passed_at=at if passed else None, counted=counted if passed else None)
        self.state = state = replace(state, evaluation=record, step=step)
        if mode is EvaluationMode.STEP:
            what = f"step {step.weight}%" if step else "step"
        else:
            what = (
                "while not Ready, absolute limits"
                if mode is EvaluationMode.PENDING
                else "bake, absolute limits"
            )
        self.reasons.append(
            f"Evaluation at {describe_time(at)} over {_duration(at - window_start)} ({what}): "
            f"{evaluation.summary()}."
        )
        for judgement in evaluation.judgements:
            # A counted check's statement says what was shown, met or not; a measured check's
            # value is news only when it is not a pass.
            if judgement.counted or judgement.verdict is not CheckVerdict.PASS:
                self.reasons.append(judgement.describe())

        critical = evaluation.critical_failures
        if not any(judgement.horizon is HorizonOutcome.NONE for judgement in critical):
            paused = self.pause_at_horizon(evaluation, final)
            if paused is not None:
                return paused
        if critical:
            counted = all(judgement.counted and not judgement.critical for judgement in critical)
            return self.rollback(
                ("Limit broken: " if counted else "Critical check failed: ")
                + "; ".join(f"{j.name}: {j.detail}" for j in critical)
                + "."
            )
        if failed:
            failures = "; ".join(f"{j.name}: {j.detail}" for j in failed)
            if streak >= self.spec.failure_limit:
                return self.rollback(
                    f"{streak} consecutive failed evaluations (failureLimit {self.spec.failure_limit}): "
                    f"{failures}."
                )
            self.severity = Severity.WARNING
            self.lead = (
                f"Evaluation failed ({streak} of failureLimit {self.spec.failure_limit} in a row): "
                f"{failures}."
            )
        if has_error:
            self.severity = Severity.WARNING
            self.reasons.append(
                "Prometheus queries failed: the rollout holds and retries; query errors never count as "
                "failures and never trigger onNoData."
            )
        if mode is not EvaluationMode.STEP or conclusive or has_error:
            return None
        assert step is not None
        return self.no_data(at, step)

    def carries_share(self, evaluation: Evaluation, index: int) -> bool:
        """The highest step carries its fair share of the requests the steps counted (each counted
        when it passed), unless a check was decided at the horizon on this step's own estimate. Only
        counted checks pool the steps' evidence: without them there is no share to carry."""
        if not any(judgement.counted for judgement in evaluation.judgements):
            return True
        if any(judgement.horizon is HorizonOutcome.ESTIMATE for judgement in evaluation.judgements):
            return True
        share = self.plan.fair_shares[index]
        earlier = self.state.counted_requests
        needed = math.ceil(share / (1.0 - share) * earlier) if share < 1.0 else 0
        requests = evaluation.requests or 0.0
        if requests >= needed:
            return True
        self.reasons.append(
            f"This step has {requests:,.0f} canary requests; as the highest step it must carry at least "
            f"{share:.0%} of the requests the steps counted ({earlier:,.0f} before it): {needed:,} "
            f"(about {needed - requests:,.0f} more)."
        )
        return False

    def pause_at_horizon(self, evaluation: Evaluation, final: bool) -> Decision | None:
        """``atHorizon: pause`` with a check decided on its estimate, or, at the highest step, a check
        the estimate cannot judge: a person decides, with the numbers."""
        decided = [j for j in evaluation.judgements if j.horizon is HorizonOutcome.ESTIMATE]
        stuck = [j for j in evaluation.judgements if j.horizon is HorizonOutcome.UNJUDGEABLE] if final else []
        if not stuck and not (decided and self.spec.at_horizon is HorizonAction.PAUSE):
            return None
        named = "; ".join(f"{j.name}: {j.detail}" for j in stuck or decided)
        return self.pause(
            PauseKind.HORIZON,
            f"At the step's horizon: {named}. Paused for a person: `kserve-canary promote`, `abort`, or "
            "`resume` (another horizon on fresh evidence).",
            resume_phase=Phase.PROGRESSING,
            event=EventReason.CANARY_INCONCLUSIVE,
        )

    def no_data(self, at: datetime, step: StepProgress) -> Decision | None:
        """``onNoData``: counted from the last conclusive evaluation, the step's start, or the last
        query error or resume, whichever is latest."""
        assert step.started_at is not None
        clock_from = no_data_clock_from(step.started_at, self.state.evaluation)
        silent = at - clock_from
        after = self.spec.on_no_data.after
        action = self.spec.on_no_data.action
        if silent < _seconds(after):
            self.reasons.append(
                f"No conclusive evidence for {_duration(silent)}; onNoData ({action}) applies after "
                f"{format_duration(after)}."
            )
            return None
        text = (
            f"No conclusive evidence for {step.weight}% of {self.state.revision} for {_duration(silent)} "
            f"(since {describe_time(clock_from)}; onNoData.after {format_duration(after)})"
        )
        if action is NoDataAction.ROLLBACK:
            return self.rollback(f"{text}: onNoData rolls back.")
        if action is NoDataAction.PAUSE:
            return self.pause(
                PauseKind.NO_DATA,
                f"{text}: paused until `kserve-canary resume`.",
                resume_phase=Phase.PROGRESSING,
                event=EventReason.CANARY_INCONCLUSIVE,
            )
        self.severity = Severity.WARNING
        self.lead = f"{text}: holding the step and evaluating again (onNoData: hold)."
        return None

    def evaluation_event(self, default: EventReason = EventReason.CANARY_WAITING) -> EventReason:
        evaluation = self.evaluation
        if evaluation is None:
            return default
        if evaluation.verdict is EvaluationVerdict.FAIL:
            return EventReason.CANARY_CHECK_FAILED
        if evaluation.has_error:
            return EventReason.PROMETHEUS_UNAVAILABLE
        if evaluation.verdict is EvaluationVerdict.INCONCLUSIVE:
            return EventReason.CANARY_INCONCLUSIVE
        return EventReason.CANARY_EVALUATED

    def step_progress_text(self, step: StepProgress) -> str:
        assert step.started_at is not None
        held = self.now - step.started_at
        record = self.state.evaluation
        current = record.at is not None and record.at >= step.started_at
        requests = f"{record.requests:.0f}" if current and record.requests is not None else "?"
        verdict = record.verdict if current and record.verdict else "none yet"
        waiting = ""
        evaluation = self.evaluation
        if evaluation is not None and step.index + 1 == len(self.steps):
            undecided = [j.name for j in evaluation.judgements if j.verdict is CheckVerdict.NOT_YET]
            if undecided:
                waiting = (
                    f" Before the promotion every limit must be shown met on the evidence pooled over the "
                    f"steps; not yet: {', '.join(undecided)}."
                )
        horizon = self.horizon
        if horizon is not None and not horizon.reached:
            waiting += (
                f" Decided by {describe_time(horizon.by)} at the latest (the step's horizon: "
                f"{_duration(horizon.length)} of evidence, {_duration(horizon.covered)} so far)."
            )
        return (
            f"Holding {self.state.revision} at {step.weight}% (step {step.index + 1} of "
            f"{len(self.steps)}): held {_duration(held)} of {self.plan.window_texts[step.index]}, "
            f"{requests} of {self.plan.min_requests[step.index]} canary requests, latest evaluation "
            f"{verdict}.{waiting}"
        )

    # ------------------------------------------------------------------------------------------
    # Outcomes

    def write(
        self,
        action: Action,
        weight: int | None,
        headline: str,
        event: EventReason,
        *,
        phase: Phase | None = None,
    ) -> Decision:
        state = record_write(self.state, weight, self.observed, self.now)
        self.state = replace(state, phase=phase or state.phase, pause=None)
        return self.finish(action, event, headline, weight=weight)

    def promote(self, headline: str) -> Decision:
        decision = self.write(
            Action.PROMOTE, None, headline, EventReason.CANARY_PROMOTED, phase=Phase.PROMOTING
        )
        if self.observed.canary_traffic_percent is None and self.promotion_recorded():
            # The field was already gone and KServe already routes 100% to the canary (someone
            # removed it by hand, then asked to promote): move on now, as the next tick would.
            _, text = self.after_promotion()
            return replace(decision, new_state=self.state, reasons=(*decision.reasons, text))
        return decision

    def rollback(self, headline: str) -> Decision:
        state = self.state
        revision = state.revision
        rolled_back = state.rolled_back
        if revision is not None and not state.was_rolled_back(revision):
            rolled_back = (*rolled_back, RolledBackRevision(revision, self.now))[-MAX_ROLLED_BACK:]
        self.state = replace(state, command=None, rolled_back=rolled_back, unready_since=None)
        self.severity = Severity.WARNING
        return self.write(
            Action.ROLLBACK,
            0,
            f"Rolling back {revision}: {headline}",
            EventReason.CANARY_ROLLED_BACK,
            phase=Phase.ROLLED_BACK,
        )

    def pause(
        self,
        kind: PauseKind,
        reason: str,
        *,
        resume_phase: Phase,
        observed_weight: int | None = None,
        event: EventReason = EventReason.CANARY_PAUSED,
    ) -> Decision:
        self.state = replace(
            self.state,
            phase=Phase.PAUSED,
            pause=Pause(kind, reason, self.now, resume_phase, observed_weight),
        )
        severity = Severity.INFO if kind is PauseKind.APPROVAL else Severity.WARNING
        return self.finish(Action.PAUSE, event, reason, severity=severity)

    def wait(
        self,
        headline: str,
        event: EventReason,
        severity: Severity = Severity.INFO,
        *,
        awaiting: bool = False,
    ) -> Decision:
        if self.resumed_by is not None and event in (
            EventReason.CANARY_WAITING,
            EventReason.CANARY_EVALUATED,
        ):
            event = EventReason.CANARY_RESUMED
        if awaiting:
            headline = f"{headline} Awaiting approval once the step passes."
        if self.lead is not None:
            self.reasons.insert(0, headline)
            headline = self.lead
        return self.finish(Action.WAIT, event, headline, severity=severity)

    def finish(
        self,
        action: Action,
        event: EventReason,
        headline: str,
        *,
        weight: int | None = None,
        severity: Severity = Severity.INFO,
        id_time: datetime | None = None,
        decided_on: EvaluationRecord | None = None,
    ) -> Decision:
        """The decision, with this reconcile's evaluation — or, for a write re-issued after a crash,
        the stored record of the evaluation that made it (``decided_on``)."""
        if self.severity is Severity.WARNING:
            severity = Severity.WARNING
        state = self.state
        step_index = state.step.index if state.step else -1
        moment = id_time or self.now
        # Not the event: a write re-issued after a crash keeps the id of the original decision.
        identity = decision_id(
            self.plan.key, state.revision, action, step_index, weight, repr(moment.timestamp())
        )
        if action is not Action.WAIT or state.phase is not self.original.phase:
            history = state.history
            if not history or history[-1].id != identity:
                entry = HistoryEntry(
                    at=self.now,
                    action=action.value,
                    weight=weight,
                    phase=state.phase,
                    event=event.value,
                    reason=_shorten(headline),
                    id=identity,
                )
                state = replace(state, history=(*history, entry)[-MAX_HISTORY:])
                self.state = state
        evaluation = self.evaluation
        return Decision(
            action=action,
            weight=weight if action.writes else None,
            new_state=state,
            reasons=(headline, *self.reasons),
            event_reason=event,
            severity=severity,
            id=identity,
            revision=state.revision,
            stable_revision=state.stable_revision,
            previous_weight=self.observed.canary_traffic_percent,
            judgements=evaluation.judgements if evaluation else (),
            verdict=evaluation.verdict if evaluation else decided_on.verdict if decided_on else None,
            requests=evaluation.requests if evaluation else decided_on.requests if decided_on else None,
            evaluated_at=self.evaluated_at or (decided_on.at if decided_on else None),
            resource_version=self.observed.resource_version,
            gate_calls=tuple(self.gate_calls) if action is Action.WAIT else (),
        )


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def _duration(delta: timedelta) -> str:
    return format_duration(delta.total_seconds())


def _requests_of(requests: float | None) -> str:
    return "an unknown number of requests" if requests is None else f"{requests:,.0f} requests"


def _weight_text(weight: int | None) -> str:
    return "unset (field absent)" if weight is None else f"{weight}%"


def _shorten(text: str) -> str:
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


def _step_at_or_below(steps: tuple[Step, ...], weight: int) -> int:
    """The index of the highest step not above ``weight`` (the first step when all are above)."""
    index = 0
    for position, step in enumerate(steps):
        if step.weight <= weight:
            index = position
    return index
