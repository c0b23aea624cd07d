"""One reconcile of one InferenceService: read, decide, remember, write, tell.

The order is the safety argument (docs/design.md §2.4, §4):

1. read the InferenceService, then the stored state (and any operator command waiting in it) and
   the rollback ledger; the state must describe this very object (its uid): a state of an
   InferenceService deleted and re-created under the same name is never used, only replaced;
2. ask the pure core what to measure, collect that evidence, ask the core what to do;
3. a rollback is first recorded in the rollback ledger (its own ConfigMap, which deleting the state
   leaves); then store the new state — it carries the write-ahead intent — under the
   resourceVersion read in 1;
4. only then patch ``canaryTrafficPercent``, with the InferenceService's resourceVersion from 1 as a
   precondition; a 409 means somebody changed it: nothing is written, the next reconcile re-reads;
5. log, export and announce the decision with its numbers.

Every write is fenced by the leader elector. A crash between 3 and 4 leaves an intent the next
decision recognises; a crash before 3 leaves nothing. Nothing here raises for a bad rollout: a
broken state, an apiserver error or a failing Prometheus ends this reconcile for this model only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import structlog
from kubernetes.client.exceptions import ApiException
from structlog.typing import FilteringBoundLogger

from canary.controller.announce import (
    Announcements,
    policy_removed_notification,
    to_notification,
    unreadable_state_notification,
)
from canary.controller.caches import DirectReads, Reads
from canary.controller.gates import GateRunner, explain_with_gates
from canary.controller.leader import NotLeader
from canary.controller.observability import ControllerMetrics
from canary.evidence import Evidence, EvidenceRequest, EvidenceSource, EvidenceStatus
from canary.kserve.client import ConflictError, InferenceServiceClient
from canary.kserve.ledger_store import ConfigMapLedgerStore, StoredLedger
from canary.kserve.store import ConfigMapStateStore, StoredState
from canary.kserve.view import observe
from canary.notify import Destination, Notification, NotificationDispatcher
from canary.policy import LoadedPolicy, PromotionPolicy
from canary.rollout.commands import apply_command
from canary.rollout.core import Preparation, decide, landed_write, prepare
from canary.rollout.decision import Decision
from canary.rollout.gates import GateResult
from canary.rollout.knative import KnativeDeadline
from canary.rollout.ledger import RollbackLedger, ledger_after
from canary.rollout.observed import ObservedInferenceService
from canary.rollout.past import ends_rollout, record_after
from canary.rollout.persistence import (
    DEFAULT_EXPLAIN_EVERY_INTERVALS,
    explain_due,
    restarted,
    store_reason,
    text_shape,
)
from canary.rollout.records import CommandFormatError, CommandOutcome, ExplainDocument
from canary.rollout.state import CommandKind, RolloutState, StateFormatError
from canary.rollout.vocabulary import Action, Severity

__all__ = ["Prepared", "ReconcileOutcome", "Reconciler"]

log: FilteringBoundLogger = structlog.get_logger("kserve_canary.reconciler")


@dataclass
class ReconcileOutcome:
    key: str
    decision: Decision | None = None
    wrote_state: bool = False
    patched: bool = False
    error: str | None = None
    retry_soon: bool = False  # a conflict: re-read and decide again without waiting a whole interval
    notifications: list[Notification] = field(default_factory=list)
    store_reason: str = ""  # why the state was written (canary.rollout.persistence), "" when not
    evaluated: bool = False  # an evaluation was due and evidence was asked for


@dataclass
class Prepared:
    """A reconcile read and ready for its evidence: what :meth:`Reconciler.finish` decides on."""

    policy: PromotionPolicy
    destinations: Sequence[Destination]
    bound: FilteringBoundLogger
    now: datetime
    observed: ObservedInferenceService
    stored: StoredState
    stored_ledger: StoredLedger
    state: RolloutState
    ledger: RollbackLedger
    stale: bool
    answer: CommandOutcome | None
    request: EvidenceRequest | None
    # The state as stored, bound to this object (before an unwritten decision or a command): what a
    # restart would read, so what a new state is compared with.
    baseline: RolloutState | None = None
    started: float = field(default_factory=time.monotonic)
    alarm: bool = False  # a critical signal moved: evaluated now, before its interval (core.decide)
    # The gate results the decision is made with, read once: the core runs its rules up to the
    # evaluation once (``preparation``), and the decision on the evidence runs only the rest.
    gate_results: tuple[GateResult, ...] = ()
    preparation: Preparation | None = None

    @property
    def key(self) -> str:
        return self.policy.key


@dataclass
class _Unstored:
    """The latest state of a rollout when it was not written: valid while the stored ConfigMap is
    still the one it was decided on (same resourceVersion)."""

    resource_version: str | None
    state: RolloutState


class Reconciler:
    def __init__(
        self,
        *,
        inference_services: InferenceServiceClient,
        store: ConfigMapStateStore,
        evidence: EvidenceSource,
        dispatcher: NotificationDispatcher,
        metrics: ControllerMetrics,
        clock: Callable[[], datetime],
        fence: Callable[[str], None] = lambda key: None,
        dry_run: bool = False,
        ledgers: ConfigMapLedgerStore | None = None,
        reads: Reads | None = None,
        explain_every_intervals: float = DEFAULT_EXPLAIN_EVERY_INTERVALS,
        gates: GateRunner | None = None,
        knative_deadline: Callable[[], KnativeDeadline] | None = None,
    ):
        self._isvcs = inference_services
        self._store = store
        self._ledgers = ledgers or ConfigMapLedgerStore(
            store.api_client, request_timeout=store.request_timeout
        )
        self._reads = reads or DirectReads(inference_services, store, self._ledgers)
        self._evidence = evidence
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._clock = clock
        self._fence = fence
        self._dry_run = dry_run
        self._explain_every = explain_every_intervals
        self._gates = gates  # calls the gates a decision waits for, beside the tick
        self._knative_deadline = knative_deadline  # the cluster's, for revisions not annotated
        # Dry-run keeps state in memory only; live runs read the ConfigMap (or its watch cache).
        self._memory: dict[str, StoredState] = {}
        self._memory_ledgers: dict[str, StoredLedger] = {}
        self._last_logged: dict[str, str] = {}  # what the last decision logged said, per rollout
        # The id of the last write this process told, per rollout: a write found in the spec that
        # is not this one was made (and perhaps never told) by another process, or by this one
        # before an error cut its reconcile short.
        self._told_write: dict[str, str] = {}
        self._announcements = Announcements()
        # Decisions not written (canary.rollout.persistence): the next reconcile decides on them as
        # long as the stored ConfigMap is the one they were decided on.
        self._unstored: dict[str, _Unstored] = {}
        self._explained_at: dict[str, datetime] = {}  # the last explain.json write, per rollout
        self._lock = threading.Lock()

    @property
    def reads(self) -> Reads:
        return self._reads

    # -- entry points --------------------------------------------------------------------------

    def reconcile(self, loaded: LoadedPolicy, destinations: Sequence[Destination] = ()) -> ReconcileOutcome:
        """Decide and act for one policy's InferenceService; ``destinations`` are the policy's own
        notification targets (the dispatcher adds its defaults, e.g. Kubernetes Events)."""
        prepared = self.prepare(loaded, destinations)
        if isinstance(prepared, ReconcileOutcome):
            return prepared
        evidence = (
            self.collect(prepared.policy, prepared.request, prepared.bound)
            if prepared.request is not None
            else None
        )
        return self.finish(prepared, evidence)

    def prepare(
        self,
        loaded: LoadedPolicy,
        destinations: Sequence[Destination] = (),
        *,
        now: datetime | None = None,
        alarm: bool = False,
    ) -> Prepared | ReconcileOutcome:
        """Read one rollout and ask the core what to measure (a finished outcome when there is
        nothing to decide: an unreadable state, an API error). ``alarm``: a critical signal of its
        canary moved, and an evaluation is due now (:func:`canary.rollout.core.decide`)."""
        policy = loaded.policy
        started = time.monotonic()
        bound = log.bind(
            namespace=policy.metadata.namespace, inferenceService=policy.spec.target.inference_service
        )
        try:
            return self._prepare(policy, destinations, bound, now or self._clock(), alarm)
        except NotLeader:
            raise
        except ApiException as error:
            return self._api_failed(policy.key, error, bound)
        except Exception as error:  # a strange object must never take the controller down
            bound.exception("reconcile failed", error=str(error))
            self._metrics.reconcile_errors.labels("internal").inc()
            return ReconcileOutcome(policy.key, error=str(error))
        finally:
            self._metrics.reconcile_duration.observe(time.monotonic() - started)

    def finish(self, prepared: Prepared, evidence: Evidence | None) -> ReconcileOutcome:
        """Decide on ``evidence`` (the answer to ``prepared.request``), remember, write, tell."""
        started = time.monotonic()
        try:
            return self._finish(prepared, evidence)
        except NotLeader:
            raise
        except ApiException as error:
            return self._api_failed(prepared.key, error, prepared.bound)
        except Exception as error:  # a strange object must never take the controller down
            prepared.bound.exception("reconcile failed", error=str(error))
            self._metrics.reconcile_errors.labels("internal").inc()
            return ReconcileOutcome(prepared.key, error=str(error))
        finally:
            self._metrics.reconcile_duration.observe(time.monotonic() - started)

    def _api_failed(self, key: str, error: ApiException, bound: FilteringBoundLogger) -> ReconcileOutcome:
        reason = f"apiserver answered {error.status} {error.reason}"
        bound.warning("reconcile failed: kubernetes API", status=error.status, reason=error.reason)
        self._metrics.reconcile_errors.labels("kubernetes").inc()
        return ReconcileOutcome(key, error=reason)

    def pause_removed(self, policy: PromotionPolicy, attempts: int = 5) -> None:
        """A policy was removed from the directory: pause its rollout (never roll it back).

        Called once, at the reload that removed it: a reconcile still in flight may write the state
        in between (409), so the pause is read and written again rather than lost."""
        for _ in range(attempts):
            try:
                self._pause_removed_once(policy)
                return
            except ConflictError:
                namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
                self._reads.refresh_state(namespace, name)
                continue
            except NotLeader:
                raise
            except Exception as error:
                log.error("policy removed: pausing the rollout failed", key=policy.key, error=str(error))
                return
        log.error("policy removed: the rollout could not be paused (its state kept changing)", key=policy.key)

    def forget(self, key: str) -> None:
        """Drop what is remembered of a rollout (its policy is gone, or another replica owns it)."""
        with self._lock:
            self._unstored.pop(key, None)
            self._explained_at.pop(key, None)
        namespace, _, name = key.partition("/")
        self._metrics.forget(namespace, name)
        if self._gates is not None:
            self._gates.forget(key)

    def _pause_removed_once(self, policy: PromotionPolicy) -> None:
        namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
        stored = self._load(policy.key, namespace, name)
        if stored.state_json is None:
            return
        try:
            state = stored.state()
        except StateFormatError:
            return
        if not state.phase.is_rollout_active:
            return
        result = apply_command(state, CommandKind.PAUSE, self._clock(), by="kserve-canary (policy removed)")
        if result.accepted:
            self._save(
                policy.key,
                stored,
                result.state,
                owner_uid=state.inference_service_uid or stored.owner_uid,
                explain=_readable(stored.explain_uncached),
                command_result=stored.readable_command_result(),
                rollouts=stored.rollouts_json,
            )
            self.forget(policy.key)
            log.warning(
                "policy removed: rollout paused",
                namespace=namespace,
                inferenceService=name,
                message=result.message,
            )
            # The policy's destinations are gone with it; the default ones (Events) still tell.
            self._dispatcher.submit(
                policy_removed_notification(
                    policy,
                    state.revision,
                    state.stable_revision,
                    result.message,
                    self._clock(),
                    state.inference_service_uid,
                )
            )

    # -- the reconcile -------------------------------------------------------------------------

    def _prepare(
        self,
        policy: PromotionPolicy,
        destinations: Sequence[Destination],
        bound: FilteringBoundLogger,
        now: datetime,
        alarm: bool = False,
    ) -> Prepared | ReconcileOutcome:
        key = policy.key
        namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
        observed = observe(self._reads.inference_service(namespace, name), namespace=namespace, name=name)
        if observed.knative_deadline is None and self._knative_deadline is not None and observed.exists:
            observed = replace(observed, knative_deadline=self._knative_deadline())

        stored = self._load(key, namespace, name)
        stored_ledger = self._load_ledger(key, namespace, name)
        try:
            state = stored.state()
            ledger = stored_ledger.ledger()  # a LedgerFormatError is a StateFormatError
        except StateFormatError as error:
            # Never overwrite what we cannot read: a person must look at it (or delete it).
            bound.error("rollout state unreadable: rollout paused until it is fixed", error=str(error))
            self._metrics.reconcile_errors.labels("state").inc()
            outcome = ReconcileOutcome(key, error=f"state unreadable: {error}")
            if self._announcements.tell_unreadable(key):
                notification = unreadable_state_notification(policy, str(error), now, observed.uid)
                self._dispatcher.submit(notification, destinations)
                outcome.notifications.append(notification)
            return outcome
        # The state (and the ledger) must describe this very object: a model deleted and re-created
        # under the same name gets a new uid, and Knative numbers its revisions from 00001 again.
        bound_state = baseline = state.bound_to(observed.uid, owner_uid=stored.owner_uid)
        stale = bound_state is None
        if bound_state is not None:
            bound_state = self._remembered(key, stored, bound_state, now)
        if bound_state is None:
            bound.warning(
                "rollout state of another InferenceService object (deleted and re-created?): not used, "
                "replaced by a fresh state",
                staleUid=state.inference_service_uid or stored.owner_uid,
                uid=observed.uid,
                staleRevision=state.revision,
                stalePhase=str(state.phase),
            )
            bound_state = RolloutState(inference_service_uid=observed.uid)
        state = bound_state
        ledger = ledger.for_inference_service(observed.uid)

        answer: CommandOutcome | None = None  # to the command waiting in the ConfigMap, if any
        if stored.command_json is not None and not stale:
            state, answer = self._apply_command(stored, state, now, bound, policy.spec.approval_steps)

        gate_results = self._gates.results(key) if self._gates is not None else ()
        preparation = prepare(policy, observed, state, now, ledger=ledger, gates=gate_results, alarm=alarm)
        return Prepared(
            policy, destinations, bound, now, observed, stored, stored_ledger, state, ledger, stale, answer,
            preparation.request, baseline, alarm=alarm, gate_results=gate_results, preparation=preparation,
        )  # fmt: skip

    def _remembered(self, key: str, stored: StoredState, state: RolloutState, now: datetime) -> RolloutState:
        """The latest decided state, while the ConfigMap is still the one it was decided on (or
        written as); else the stored state as read after a restart (:func:`restarted`: what was not
        stored since was not seen by this process, so onNoData counts again from now)."""
        with self._lock:
            unstored = self._unstored.get(key)
        if unstored is not None and unstored.resource_version == stored.resource_version:
            return unstored.state
        return restarted(state, now)

    def _finish(self, prepared: Prepared, evidence: Evidence | None) -> ReconcileOutcome:
        policy, key = prepared.policy, prepared.key
        decision = decide(
            policy,
            prepared.observed,
            prepared.state,
            evidence,
            prepared.now,
            ledger=prepared.ledger,
            gates=prepared.gate_results,
            alarm=prepared.alarm,
            prepared=prepared.preparation,
        )
        outcome = ReconcileOutcome(key, decision=decision, evaluated=prepared.request is not None)
        self._tell_landed(prepared, outcome)
        # Write-ahead, first of all: the rollback ledger, which losing the state cannot undo; then the
        # state; then the patch. A write that loses a race ends the reconcile: it is decided again.
        if not self._write_ledger(prepared, decision, outcome):
            return outcome
        if not self._write_state(prepared, decision, evidence, outcome):
            return outcome
        self._write_patch(prepared, decision, outcome)
        if self._gates is not None and decision.gate_calls and not self._dry_run:
            # After the state (with each gate's first-call time) is stored: a restart keeps the deadline.
            self._gates.submit(policy, decision.gate_calls)
        if decision.action.writes:
            self._told_write[key] = decision.id
        self._log(policy, decision, prepared.bound)
        self._export(policy, decision)
        self._announce(policy, decision, prepared.destinations, prepared.observed.uid, outcome, prepared.now)
        return outcome

    def _write_ledger(self, prepared: Prepared, decision: Decision, outcome: ReconcileOutcome) -> bool:
        """Save the rollback ledger this decision changes; False when it changed since it was read
        (``outcome.retry_soon``: decide again)."""
        recorded = ledger_after(decision, prepared.ledger, prepared.observed.uid)
        if recorded is None:
            return True
        namespace, name = prepared.policy.metadata.namespace, prepared.policy.spec.target.inference_service
        try:
            self._save_ledger(prepared.key, namespace, name, prepared.stored_ledger, recorded)
        except ConflictError:
            prepared.bound.info("rollback ledger changed while deciding; deciding again")
            self._reads.refresh_ledger(namespace, name)
            outcome.retry_soon = True
            return False
        return True

    def _write_state(
        self, prepared: Prepared, decision: Decision, evidence: Evidence | None, outcome: ReconcileOutcome
    ) -> bool:
        """Save the state when this decision changes what a restart needs; False when the state changed
        since it was read (``outcome.retry_soon``: decide again)."""
        # Only what a restart needs is written (canary.rollout.persistence); a stored command is
        # consumed by saving the state without it, even if nothing else changed. An
        # InferenceService that does not exist gets no state: a ConfigMap written for it would have
        # no owner, outlive it, and wait for the next object of that name.
        # explain_with_gates reads the stored evaluation only for a gated rollout's tick that judged
        # nothing: parsed whole (it is written back) only then.
        key, stored, stale, now = prepared.key, prepared.stored, prepared.stale, prepared.now
        kept = not stale and not decision.judgements and bool(decision.new_state.gates)
        previous = _readable(stored.explain_uncached) if kept else None
        explain = explain_with_gates(previous, decision, evidence, now)
        reason = self._store_reason(prepared, decision.new_state, explain)
        if not prepared.observed.exists:
            return True
        if not reason:
            self._metrics.state_writes_skipped.inc()
            with self._lock:
                self._unstored[key] = _Unstored(stored.resource_version, decision.new_state)
            return True
        try:
            written = self._save(
                key,
                stored,
                decision.new_state,
                # The object the state describes: the owner is never another object's uid.
                owner_uid=decision.new_state.inference_service_uid,
                explain=explain or (None if stale else _readable(stored.explain_uncached)),
                command_result=prepared.answer or stored.readable_command_result(),
                # In the same write: the record of past rollouts, with the one this decision ends.
                rollouts=_rollouts_text(prepared, decision, prepared.bound),
            )
            outcome.wrote_state = True
            outcome.store_reason = reason
            self._metrics.state_writes.labels(reason).inc()
            with self._lock:
                self._unstored[key] = _Unstored(written, decision.new_state)
                if explain is not None:
                    self._explained_at[key] = now
        except ConflictError:
            prepared.bound.info("state changed while deciding (an operator command?); deciding again")
            policy = prepared.policy
            self._reads.refresh_state(policy.metadata.namespace, policy.spec.target.inference_service)
            outcome.retry_soon = True
            return False
        return True

    def _write_patch(self, prepared: Prepared, decision: Decision, outcome: ReconcileOutcome) -> None:
        """Patch the InferenceService as decided; a conflict asks for the decision again soon."""
        if decision.patch is None:
            return
        namespace, name = prepared.policy.metadata.namespace, prepared.policy.spec.target.inference_service
        try:
            self._patch(prepared.key, namespace, name, decision.patch)
            outcome.patched = True
        except ConflictError:
            prepared.bound.info(
                "InferenceService changed since it was read; deciding again", action=str(decision.action)
            )
            self._reads.refresh_inference_service(namespace, name)
            outcome.retry_soon = True

    def _tell_landed(self, prepared: Prepared, outcome: ReconcileOutcome) -> None:
        """Tell a write of the stored intent that the spec already shows, unless this process told
        it: the process that patched it may have been killed before its log line and notification
        (or its patch's answer was lost). At least once: a process that did tell it and stopped
        before the next reconcile adopted the intent is told again, with the same decision id."""
        key = prepared.key
        landed = landed_write(prepared.policy, prepared.observed, prepared.state, prepared.now)
        if landed is None or self._told_write.get(key) == landed.id or self._dry_run:
            return
        self._told_write[key] = landed.id
        self._log(prepared.policy, landed, prepared.bound)
        self._announce(
            prepared.policy, landed, prepared.destinations, prepared.observed.uid, outcome, prepared.now
        )

    def _store_reason(
        self, prepared: Prepared, new_state: RolloutState, explain: ExplainDocument | None
    ) -> str:
        """Why this decision is written — "" when it only refreshes numbers."""
        stored = prepared.stored
        if stored.state_json is None:
            return "first"
        if prepared.stale:
            return "uid"
        if stored.command_json is not None:
            return "command"
        if prepared.baseline is None:
            return "uid"
        reason = store_reason(prepared.baseline, new_state)
        if reason:
            return reason.reason
        with self._lock:
            last = self._explained_at.get(prepared.key)
        due = explain_due(
            _readable(stored.explain_reading),
            explain,
            last_written=last,
            now=prepared.now,
            interval=timedelta(seconds=prepared.policy.spec.interval),
            every_intervals=self._explain_every,
        )
        return f"explain-{due}" if due else ""

    def _apply_command(
        self,
        stored: StoredState,
        state: RolloutState,
        now: datetime,
        bound: FilteringBoundLogger,
        approval_steps: frozenset[int],
    ) -> tuple[RolloutState, CommandOutcome | None]:
        """The state after the waiting command, and the answer to write beside it for the issuer."""
        try:
            command = stored.command()
        except CommandFormatError as error:
            bound.warning("ignoring a malformed operator command", error=str(error))
            return state, CommandOutcome("unknown", False, f"refused: {error}", now)
        if command is None:
            return state, None
        # The issuer is the command-issuer key, which the admission policy checks against the identity
        # that wrote it; "by" inside command.json is the writer's say-so.
        by = stored.command_issuer or None
        if by is None:
            result_accepted, message, after = False, f"{command.command} names no issuer: refused", state
        else:
            result = apply_command(state, command, now, by=by, approval_steps=approval_steps)
            result_accepted, message, after = result.accepted, result.message, result.state
        level = bound.info if result_accepted else bound.warning
        level(
            "operator command",
            command=str(command.command),
            by=by,
            revision=command.revision,
            accepted=result_accepted,
            message=message,
        )
        answer = CommandOutcome(
            str(command.command), result_accepted, message, now, id=command.id, by=by,
            revision=command.revision,
        )  # fmt: skip
        return after, answer

    def collect(
        self, policy: PromotionPolicy, request: EvidenceRequest, bound: FilteringBoundLogger | None = None
    ) -> Evidence | None:
        """One rollout's evidence (the tick asks for every rollout at once instead)."""
        started = time.monotonic()
        try:
            evidence = self._evidence.collect(policy, request)
        except Exception as error:  # the contract says it never raises; a bug must not stop the rollout loop
            (bound or log).exception("evidence collection failed", error=str(error))
            self._metrics.query_errors.labels("internal").inc()
            return None
        finally:
            self._metrics.query_duration.observe(time.monotonic() - started)
        self.count_query_errors(evidence)
        return evidence

    def count_query_errors(self, evidence: Evidence) -> None:
        for measurements in (evidence.canary, evidence.stable):
            for measurement in measurements.values():
                if measurement.status is EvidenceStatus.ERROR and measurement.error_class is not None:
                    self._metrics.query_errors.labels(str(measurement.error_class)).inc()

    # -- edges -----------------------------------------------------------------------------------

    # A dry run starts from what the cluster holds (what the live controller would read), then keeps
    # what it would have written in memory.
    def _load(self, key: str, namespace: str, name: str) -> StoredState:
        if self._dry_run and key in self._memory:
            return self._memory[key]
        return self._reads.state(namespace, name)

    def _load_ledger(self, key: str, namespace: str, name: str) -> StoredLedger:
        if self._dry_run and key in self._memory_ledgers:
            return self._memory_ledgers[key]
        return self._reads.ledger(namespace, name)

    def _save_ledger(
        self, key: str, namespace: str, name: str, stored: StoredLedger, ledger: RollbackLedger
    ) -> None:
        if self._dry_run:
            self._memory_ledgers[key] = StoredLedger(
                ledger.to_json(), "dry-run", ledger.inference_service_uid
            )
            return
        self._fence(key)
        self._ledgers.save(namespace, name, ledger, resource_version=stored.resource_version)

    def _save(
        self,
        key: str,
        stored: StoredState,
        state: RolloutState,
        *,
        owner_uid: str | None,
        explain: ExplainDocument | None,
        command_result: CommandOutcome | None = None,
        rollouts: str | None = None,
    ) -> str | None:
        """Write the state; the new resourceVersion."""
        if self._dry_run:
            self._memory[key] = StoredState(
                stored.namespace,
                stored.inference_service,
                state.to_json(),
                "dry-run",
                explain_json=explain.to_json() if explain else None,
                rollouts_json=rollouts,
            )
            return "dry-run"
        self._fence(key)
        return self._store.save(
            stored.namespace,
            stored.inference_service,
            state,
            resource_version=stored.resource_version,
            owner_uid=owner_uid,
            explain=explain,
            command_result=command_result,
            rollouts=rollouts,
        )

    def _patch(self, key: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        if self._dry_run:
            return
        self._fence(key)
        patched = self._isvcs.apply_patch(namespace, name, patch)
        self._reads.wrote_inference_service(patched)

    # -- telling: the log, the metrics, people ---------------------------------------------------

    def _log(self, policy: PromotionPolicy, decision: Decision, bound: FilteringBoundLogger) -> None:
        """Every change is logged at info with its numbers: an action, another verdict, a check's
        verdict, a new reason. A wait that repeats the previous one — the same reason and verdicts,
        only its numbers refreshed ("held 2m of 10m", a value) — only at debug: at 1,000 rollouts
        every 30 s it would be 33 lines a second, and a fifth of the controller's CPU, saying nothing
        new (the numbers are in ``explain``, ``status`` and the check gauges)."""
        state = decision.new_state
        reason = str(decision.event_reason)
        shape = _log_shape(decision)
        previous = self._last_logged.get(policy.key)
        self._last_logged[policy.key] = shape
        repeated = decision.action is Action.WAIT and previous == shape
        level = (
            bound.debug
            if repeated
            else bound.warning
            if decision.severity is Severity.WARNING
            else bound.info
        )
        checks = {
            judgement.name: {
                "verdict": str(judgement.verdict),
                "value": judgement.value,
                "stable": judgement.stable_value,
                "limit": judgement.limit,
                "samples": judgement.samples,
            }
            for judgement in decision.judgements
        }
        level(
            decision.summary,
            revision=decision.revision,
            stableRevision=decision.stable_revision,
            step=state.step.index if state.step else None,
            weight=decision.weight,
            action=str(decision.action),
            phase=str(state.phase),
            reason=reason,
            verdict=str(decision.verdict) if decision.verdict else None,
            requests=decision.requests,
            reasons=list(decision.reasons),
            checks=checks or None,
            dryRun=self._dry_run or None,
            decisionId=decision.id,
        )

    def _export(self, policy: PromotionPolicy, decision: Decision) -> None:
        """The decision's numbers as Prometheus metrics: phase, step, weight, each check's verdict,
        value and limits."""
        namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
        state = decision.new_state
        metrics = self._metrics
        metrics.decisions.labels(namespace, name, str(decision.action)).inc()
        metrics.set_phase(namespace, name, str(state.phase))
        if state.step is not None:
            metrics.set_step(namespace, name, state.step.index)
        weight = decision.weight if decision.action.writes else decision.previous_weight
        metrics.set_weight(namespace, name, -1 if weight is None else weight)
        limits = {check.name: check for check in policy.spec.checks}
        for judgement in decision.judgements:
            metrics.set_verdict(namespace, name, judgement.name, str(judgement.verdict))
            check = limits.get(judgement.name)
            if check is not None:
                metrics.set_limits(namespace, name, check, judgement.stable_value)
            if judgement.value is not None:
                metrics.set_check_value(namespace, name, judgement.name, "canary", judgement.value)
            if judgement.stable_value is not None:
                metrics.set_check_value(namespace, name, judgement.name, "stable", judgement.stable_value)

    def _announce(
        self,
        policy: PromotionPolicy,
        decision: Decision,
        destinations: Sequence[Destination],
        uid: str | None,
        outcome: ReconcileOutcome,
        now: datetime,
    ) -> None:
        """Tell people, when the decision is worth it (:class:`Announcements`); never in a dry run."""
        if not self._announcements.tell(policy.key, decision) or self._dry_run:
            return
        notification = to_notification(decision, policy, now, inference_service_uid=uid)
        self._dispatcher.submit(notification, destinations)
        outcome.notifications.append(notification)


def _log_shape(decision: Decision) -> str:
    """What a decision's log line says, without its numbers: two decisions of the same shape differ
    only in values a reader finds in ``explain`` (numbers and durations masked, as explain's own
    change test does)."""
    checks = ",".join(f"{judgement.name}={judgement.verdict}" for judgement in decision.judgements)
    reasons = "|".join(sorted(decision.reasons))
    return text_shape(f"{decision.action}/{decision.event_reason}/{decision.verdict}/{checks}/{reasons}")


def _readable(read: Callable[[], ExplainDocument | None]) -> ExplainDocument | None:
    """The stored latest evaluation, or None when it cannot be read. ``explain_uncached``: kept when
    a decision evaluated nothing (one unreadable is dropped, not written back); ``explain_reading``
    (without its PromQL): compared with a new one (one unreadable: the new one is a change)."""
    try:
        return read()
    except StateFormatError:
        return None


def _rollouts_text(prepared: Prepared, decision: Decision, bound: FilteringBoundLogger) -> str | None:
    """The record of past rollouts to store with ``decision``'s state: with the rollout the decision
    ends added (canary.rollout.past), else the stored text as it is — read and parsed only when a
    rollout ends. A record that cannot be read is kept as it is, never overwritten: the rollout it would
    have received is not recorded (logged)."""
    stored = prepared.stored
    if not ends_rollout(prepared.state, decision):
        return stored.rollouts_json
    try:
        record = stored.past_rollouts()
    except StateFormatError as error:
        bound.warning(
            "record of past rollouts unreadable: kept as it is, this rollout is not recorded in it",
            error=str(error),
        )
        return stored.rollouts_json
    latest = _readable(stored.explain_uncached)
    recorded = record_after(prepared.state, decision, record, prepared.now, latest_evaluation=latest)
    return recorded.to_json() if recorded is not None else stored.rollouts_json
