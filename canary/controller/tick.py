"""One tick for all rollouts: find what is due, read it, collect its evidence at once, decide, write.

Every tick (:class:`~canary.controller.scheduler.TickScheduler`):

1. **Due.** A rollout is due when its next evaluation time has come (its policy interval after its
   last evaluation; at once when it has never been reconciled), when a watch event or a conflict
   triggered it, or when the previous tick carried it over. Carried rollouts come first, then the
   triggered ones, then the others by how long they have waited: none is starved. A rollout this
   replica does not own (``owns(key)``), or whose namespace's caches have not listed yet, is skipped
   and stays due.
2. **Read.** Each due rollout is read from the watch caches and the pure core is asked for its
   evidence request (:meth:`Reconciler.prepare`), all with the same evaluation time ``at``.
3. **Evidence, beside the tick.** ``collect_many([(policy, request), ...])`` for the rollouts that
   need evidence, in up to three calls at once on the evidence workers: those looked at for an
   alarm, those whose policies have only builtin checks, and those with custom queries (whose
   namespace's PromQL, slow or not, then never delays the others' error rates; the counter sample is
   taken once and shared). The source is a :class:`~canary.controller.evidence.TickEvidenceSource`;
   one that can only ``collect`` comes wrapped in :class:`~canary.controller.evidence.CollectEach`,
   which asks it per rollout. Rollouts that need none — an auto-start, a first step, an idle model,
   a readiness deadline that passed, a person's command — are handed to the workers as soon as they
   are read, without waiting for the other reads or for Prometheus. Evidence that is not in by the
   tick's budget is decided on when it arrives, and the tick ends on time: a slow or hanging
   Prometheus holds only the rollouts whose evidence it owes. Each later tick reads those rollouts
   again (a **peek**): one that needs no evidence any more (its deadline passed, a command came) is
   decided at once, and the late evidence is then dropped.
4. **Alarms.** An evidence source that samples every tracked revision each tick (``take_alarms``:
   :class:`~canary.metrics.prometheus.PrometheusEvidenceSource`) reports the canaries OOM-killed
   since its last sample; their rollouts are due at once, with ``alarm`` (an extra look before the
   interval: :func:`canary.rollout.core.decide`), so a critical signal is judged within a tick or
   two of becoming queryable, not up to an interval later. A canary warming up (Pending, or in its
   first step before its first evaluation) is handed to the source to watch (``watch_warm_up``), and
   sampled even in a tick where nothing needs evidence (``sample_warm_up``), so a kill while its
   model loads is an alarm too; an alarm its rollout cannot act on yet (the first
   step's clock has not started, or started this very tick) is kept, an interval at most, until an
   evaluation is due with it.
5. **Decide and write** on a bounded worker pool (:meth:`Reconciler.finish`, which keeps its order:
   ledger → state → patch, each fenced with ``fence(key)`` and conditional on the resourceVersion
   read in 2).

A tick has a budget (``budget`` × the tick period). Rollouts not started when it is spent are carried
to the next tick, first; a write in flight is never cut (it finishes on its worker, and its
rollout is not read again until it has). Nothing here raises for one rollout: its outcome carries
the error and the others go on.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

import structlog

from canary.controller.evidence import TickEvidenceSource
from canary.controller.leader import LeaderElector, NotLeader
from canary.controller.observability import ControllerMetrics
from canary.controller.reconciler import Prepared, ReconcileOutcome, Reconciler
from canary.evidence import Evidence, EvidenceRequest
from canary.notify import Destination
from canary.policy import LoadedPolicy, PromotionPolicy
from canary.rollout.bookkeeping import TIMER_SLACK
from canary.rollout.state import Phase

__all__ = ["Ownership", "SingleLeaseOwnership", "TickOutcome", "TickRunner"]

log = structlog.get_logger("kserve_canary.tick")

_ACTIVE = frozenset({Phase.PENDING, Phase.PROGRESSING, Phase.PROMOTING, Phase.BAKING})


class Ownership(Protocol):
    """Which rollouts this replica drives, and the fence before each of its writes."""

    def owns(self, key: str) -> bool: ...

    def fence(self, key: str) -> None:
        """Raises :class:`canary.controller.leader.NotLeader` unless this replica may write ``key``."""
        ...


class SingleLeaseOwnership:
    """The single-Lease elector as an :class:`Ownership`: the leader owns every key (no elector:
    this replica acts alone)."""

    def __init__(self, elector: LeaderElector | None):
        self._elector = elector

    def owns(self, key: str) -> bool:
        return self._elector is None or self._elector.is_leader

    def fence(self, key: str) -> None:
        if self._elector is not None:
            self._elector.fence()


@dataclass
class TickOutcome:
    at: datetime
    due: list[str] = field(default_factory=list)
    decided: list[str] = field(default_factory=list)  # finished within the tick's budget
    carried: list[str] = field(default_factory=list)  # out of budget: first in the next tick
    in_flight: list[str] = field(default_factory=list)  # still writing when the budget ran out
    skipped: list[str] = field(default_factory=list)  # not owned, or caches not synced
    failed: list[str] = field(default_factory=list)
    collect_calls: int = 0  # collect_many calls to the evidence source
    evidence_requests: int = 0  # rollouts that asked for evidence
    duration: float = 0.0
    outcomes: dict[str, ReconcileOutcome] = field(default_factory=dict)


class TickRunner:
    def __init__(
        self,
        *,
        reconciler: Reconciler,
        evidence: TickEvidenceSource,
        policy: Callable[[str], LoadedPolicy | None],
        destinations: Callable[[PromotionPolicy], Sequence[Destination]] = lambda policy: (),
        ownership: Ownership,
        metrics: ControllerMetrics,
        clock: Callable[[], datetime],
        period: float = 5.0,
        budget: float = 0.8,
        max_workers: int = 8,
        synced: Callable[[str], bool] = lambda namespace: True,
        before_reconcile: Callable[[LoadedPolicy], None] = lambda loaded: None,
        wake: Callable[[], None] = lambda: None,
        monotonic: Callable[[], float] = time.monotonic,
        on_reconciled: Callable[[str, str | None], None] = lambda key, error: None,
    ):
        self._reconciler = reconciler
        self._evidence = evidence
        self._policy = policy
        self._destinations = destinations
        self._ownership = ownership
        self._metrics = metrics
        self._clock = clock
        self.period = period
        self.budget = budget
        self._synced = synced
        self._before = before_reconcile
        self._wake = wake
        self._monotonic = monotonic
        self._on_reconciled = on_reconciled  # each error (None: none): canary.controller.failures
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="reconcile")
        # Evidence is collected here, so that the tick never waits for Prometheus past its budget.
        self._evidence_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="evidence")
        # Rollouts whose evidence is being collected, each with the token its collect will decide by
        # (a peek that decided without it takes the token away).
        self._awaiting: dict[str, object] = {}
        self._warm_up_sample: Future[None] | None = None
        self._lock = threading.Lock()
        self._intervals: dict[str, float] = {}
        self._next_due: dict[str, datetime] = {}
        self._waiting_since: dict[str, datetime] = {}
        self._triggered: set[str] = set()
        self._carried: list[str] = []
        self._in_flight: set[str] = set()
        self._not_owned: set[str] = set()  # keys another replica drives (or drove) meanwhile
        self._canaries: dict[tuple[str, str], str] = {}  # (namespace, canary revision): the rollout's key
        self._alarmed: set[str] = set()  # keys to look at now, with alarm (see step 4)
        # An alarm its rollout could not act on yet (the first step's clock not started): kept, for
        # an interval at most, until an evaluation is due with it.
        self._alarm_since: dict[str, datetime] = {}
        self._watched_now = False  # a canary warming up was watched in this tick (run_tick's thread)
        self.last: TickOutcome | None = None

    # -- what there is -------------------------------------------------------------------------

    def sync(self, intervals: Mapping[str, float]) -> None:
        """The policies now loaded: ``{key: interval seconds}``."""
        with self._lock:
            for key in set(self._intervals) - set(intervals):
                self._next_due.pop(key, None)
                self._waiting_since.pop(key, None)
                self._triggered.discard(key)
                self._alarmed.discard(key)
                self._alarm_since.pop(key, None)
                self._reconciler.forget(key)
            self._canaries = {canary: key for canary, key in self._canaries.items() if key in intervals}
            self._carried = [key for key in self._carried if key in intervals]
            self._intervals = dict(intervals)

    @property
    def keys(self) -> set[str]:
        with self._lock:
            return set(self._intervals)

    def smallest_interval(self) -> float | None:
        with self._lock:
            return min(self._intervals.values(), default=None)

    def trigger(self, key: str) -> None:
        """Reconcile ``key`` in the next tick (and wake the timer)."""
        with self._lock:
            if key not in self._intervals:
                return
            self._triggered.add(key)
        self._wake()

    def close(self, *, wait: bool = True) -> None:
        self._evidence_pool.shutdown(wait=False, cancel_futures=True)
        self._pool.shutdown(wait=wait, cancel_futures=False)

    # -- the tick ------------------------------------------------------------------------------

    def due(self, now: datetime) -> list[str]:
        """The rollouts due at ``now``, in the order they are served."""
        with self._lock:
            waiting = [
                key
                for key in self._intervals
                if key not in self._in_flight
                and (key in self._triggered or self._next_due.get(key, now) <= now)
            ]
            first = [key for key in self._carried if key in self._intervals and key not in self._in_flight]
            firsts = set(first)
            triggered = sorted(key for key in waiting if key in self._triggered and key not in firsts)
            others = sorted(
                (key for key in waiting if key not in self._triggered and key not in firsts),
                key=lambda key: (self._waiting_since.get(key, self._next_due.get(key, now)), key),
            )
        return first + triggered + others

    def run_tick(self) -> TickOutcome:
        started = self._monotonic()
        deadline = started + self.budget * self.period
        now = self._clock()
        outcome = TickOutcome(at=now)
        api_before = _api_counts(self._metrics)
        self._watched_now = False
        self._take_alarms(set())  # raised since the last tick's collect (or by another caller)
        due = self.due(now)
        outcome.due = list(due)
        with self._lock:
            self._carried = []
            for key in due:
                self._waiting_since.setdefault(key, now)
        futures = self._peek(now, outcome)
        more, needing = self._read(due, now, deadline, outcome)
        futures.update(more)
        if needing:
            self._collect_and_submit(needing, futures, outcome, deadline)
        if self._watched_now:
            self._sample_warm_up_beside(now, deadline)
        self._wait(futures, deadline, outcome)
        with self._lock:
            self._carried = [key for key in outcome.carried if key in self._intervals]
        outcome.duration = self._monotonic() - started
        self._record(outcome, api_before)
        self.last = outcome
        return outcome

    def _read(
        self, due: list[str], now: datetime, deadline: float, outcome: TickOutcome
    ) -> tuple[dict[str, Future[ReconcileOutcome]], list[Prepared]]:
        """Step 2: read, ask the core what to measure; 4a. what needs no evidence is decided at once,
        while the others are still read (after a restart with 10,000 idle models, the first is
        decided as soon as it is read, not after the last one). Returns those decisions and the
        rollouts that need evidence."""
        futures: dict[str, Future[ReconcileOutcome]] = {}
        needing: list[Prepared] = []
        for index, key in enumerate(due):
            if self._monotonic() >= deadline:
                outcome.carried.extend(due[index:])
                break
            item = self._prepare_one(key, now, outcome)
            if item is None:
                continue
            if item.request is None:
                futures[item.key] = self._submit(item, None)
            else:
                needing.append(item)
        return futures, needing

    def _collect_and_submit(
        self,
        needing: list[Prepared],
        futures: dict[str, Future[ReconcileOutcome]],
        outcome: TickOutcome,
        deadline: float,
    ) -> None:
        """Step 3: the evidence, collected beside the tick in batches — a rollout looked at for an
        alarm on its own (its rollback must not wait for the evidence of a tick of holds), the
        rollouts with builtin checks only, then those with custom queries. What is not in by
        ``deadline`` is decided on when it arrives (``in_flight`` in this tick's outcome)."""
        outcome.evidence_requests = len(needing)
        keys = {item.key for item in needing}
        urgent = [item for item in needing if item.alarm]
        builtin = [item for item in needing if not item.alarm and not item.policy.spec.custom_queries]
        custom = [item for item in needing if not item.alarm and item.policy.spec.custom_queries]
        batches: list[tuple[list[Prepared], dict[str, object], Future[list[Evidence | None]]]] = []
        for batch in (urgent, builtin, custom):
            if not batch:
                continue
            tokens = {item.key: object() for item in batch}
            with self._lock:
                self._awaiting.update(tokens)
            batches.append((batch, tokens, self._evidence_pool.submit(self._collect, batch)))
            outcome.collect_calls += 1
        for batch, tokens, collected in batches:
            try:
                evidences = collected.result(timeout=max(0.0, deadline - self._monotonic()))
            except TimeoutError:
                log.warning(
                    "evidence not in within the tick's budget: decided when it arrives",
                    rollouts=len(batch),
                    budget=round(self.budget * self.period, 3),
                )
                collected.add_done_callback(functools.partial(self._arrived, batch, tokens, judged_now=keys))
                continue
            futures.update(self._decide_on(batch, tokens, evidences, keys))

    def _decide_on(
        self,
        batch: list[Prepared],
        tokens: dict[str, object],
        evidences: Sequence[Evidence | None],
        judged_now: set[str],
    ) -> dict[str, Future[ReconcileOutcome]]:
        """Hand ``batch`` with its evidence to the workers: the canaries this sample saw OOM-killed
        first (behind no hold); a rollout a peek decided meanwhile is left alone. Alarmed rollouts
        not judged now are looked at next (step 4)."""
        alarmed = self._take_alarms(judged_now)
        futures: dict[str, Future[ReconcileOutcome]] = {}
        for index in sorted(range(len(batch)), key=lambda index: batch[index].key not in alarmed):
            item = batch[index]
            with self._lock:
                if self._awaiting.get(item.key) is not tokens[item.key]:
                    continue  # decided without this evidence, by a peek
                del self._awaiting[item.key]
            futures[item.key] = self._submit(item, evidences[index])
        return futures

    def _arrived(
        self,
        batch: list[Prepared],
        tokens: dict[str, object],
        collected: Future[list[Evidence | None]],
        *,
        judged_now: set[str],
    ) -> None:
        """Evidence that came after its tick's budget: decided on now (on the evidence worker)."""
        if collected.cancelled():
            evidences: list[Evidence | None] = [None] * len(batch)
        else:
            evidences = collected.result()
        try:
            self._decide_on(batch, tokens, evidences, judged_now)
        except RuntimeError:  # closed meanwhile: nothing more is decided
            for item in batch:
                self._done(item.key)

    def _peek(self, now: datetime, outcome: TickOutcome) -> dict[str, Future[ReconcileOutcome]]:
        """The rollouts still waiting for evidence, read again: one that needs none now (its
        readiness deadline passed, a command came) is decided at once, without that evidence."""
        with self._lock:
            waiting = list(self._awaiting)
        futures: dict[str, Future[ReconcileOutcome]] = {}
        for key in waiting:
            loaded = self._policy(key)
            if loaded is None or not self._may_read(key, loaded.policy.metadata.namespace):
                continue
            try:
                prepared = self._reconciler.prepare(loaded, self._destinations(loaded.policy), now=now)
            except Exception as error:  # the late evidence still comes
                log.warning("peek failed", key=key, error=str(error))
                continue
            if not isinstance(prepared, Prepared) or prepared.request is not None:
                continue  # still waiting for that evidence
            with self._lock:
                if self._awaiting.pop(key, None) is None:
                    continue  # it arrived meanwhile
            log.info("decided without waiting for Prometheus: the decision needs no evidence", key=key)
            outcome.due.append(key)
            futures[key] = self._submit(prepared, None)
        return futures

    def _wait(
        self, futures: dict[str, Future[ReconcileOutcome]], deadline: float, outcome: TickOutcome
    ) -> None:
        """Step 4b: wait for the decisions within the budget. Their evidence is in hand: none is
        dropped; what is not done by then finishes on the pool, and its rollout is not read again
        until then."""
        for key, future in futures.items():
            remaining = deadline - self._monotonic()
            if remaining > 0:
                with contextlib.suppress(Exception):  # a timeout is handled below
                    future.result(timeout=remaining)
            if future.done() and not future.cancelled():
                result = future.result() if future.exception() is None else None
                if result is None:
                    outcome.failed.append(key)
                else:
                    outcome.outcomes[key] = result
                    (outcome.failed if result.error else outcome.decided).append(key)
                continue
            outcome.in_flight.append(key)

    # -- the steps -----------------------------------------------------------------------------

    def _prepare_one(self, key: str, now: datetime, outcome: TickOutcome) -> Prepared | None:
        loaded = self._policy(key)
        if loaded is None:
            return None
        if not self._may_read(key, loaded.policy.metadata.namespace):
            outcome.skipped.append(key)
            return None
        with self._lock:
            self._triggered.discard(key)
            alarm = key in self._alarmed
            self._alarmed.discard(key)
            self._in_flight.add(key)  # from the read to the write (in_flight(): a draining elector waits)
        try:
            self._before(loaded)
            prepared = self._reconciler.prepare(
                loaded, self._destinations(loaded.policy), now=now, alarm=alarm
            )
        except NotLeader as error:
            log.warning("write refused: not the owner", key=key, error=str(error))
            outcome.skipped.append(key)
            self._done(key)
            return None
        except Exception as error:  # prepare never raises; this is the last line
            log.exception("reconcile failed", key=key, error=str(error))
            outcome.failed.append(key)
            self._metrics.tick_rollouts.labels("failed").inc()
            self._done(key)
            self._schedule(key, now, None)
            self._on_reconciled(key, f"internal error: {error}")
            return None
        if isinstance(prepared, ReconcileOutcome):
            outcome.outcomes[key] = prepared
            outcome.failed.append(key)
            self._metrics.tick_rollouts.labels("failed").inc()
            self._done(key)
            self._schedule(key, now, prepared)
            self._on_reconciled(key, prepared.error)
            return None
        self._track_canary(key, prepared, now, alarm)
        return prepared

    def _may_read(self, key: str, namespace: str) -> bool:
        """Whether ``key`` is read now: its namespace's caches have listed, and this replica owns it."""
        if not self._synced(namespace):
            return False
        if not self._ownership.owns(key):
            with self._lock:
                self._not_owned.add(key)
            return False
        with self._lock:
            regained = key in self._not_owned
            self._not_owned.discard(key)
        if regained:
            # Another replica may have decided (and not stored) in between: what this one remembers
            # of the rollout is no longer the latest; read it as after a restart.
            self._reconciler.forget(key)
        return True

    def _track_canary(self, key: str, prepared: Prepared, now: datetime, alarm: bool) -> None:
        """The canary whose alarms are ``key``'s: one evaluated now, or one warming up (watched)."""
        if prepared.request is not None:
            with self._lock:
                self._canaries[(prepared.request.namespace, prepared.request.canary_revision)] = key
                self._alarm_since.pop(key, None)
        elif prepared.state.warm_up_counted:
            self._watch_warm_up(key, prepared, now, alarm)
        else:
            with self._lock:
                self._alarm_since.pop(key, None)

    def _watch_warm_up(self, key: str, prepared: Prepared, now: datetime, alarm: bool) -> None:
        """A canary warming up with no evaluation due: its restart counters join the per-tick
        sample (an OOM kill while it loads is an alarm within a tick or two, not an interval after
        its first step started), and an alarm it could not act on yet is kept for the next tick."""
        state = prepared.state
        revision, born = state.revision, state.started_at
        if revision is None or born is None:
            return
        namespace = prepared.policy.metadata.namespace
        with self._lock:
            self._canaries[(namespace, revision)] = key
            if alarm:
                since = self._alarm_since.setdefault(key, now)
                if (now - since).total_seconds() <= self._intervals.get(key, 0.0):
                    self._alarmed.add(key)
                    self._triggered.add(key)
                else:
                    self._alarm_since.pop(key, None)  # its regular evaluation has come meanwhile
        try:
            self._evidence.watch_warm_up(prepared.policy, revision, born, now)
        except Exception as error:  # a watch is a shortcut; the first evaluation still comes
            log.warning("warm-up watch failed", key=key, error=str(error))
            return
        self._watched_now = True

    def _sample_warm_up_beside(self, now: datetime, deadline: float) -> None:
        """:meth:`_sample_warm_up` on an evidence worker (one at a time), waited for until the tick's
        ``deadline`` at most: a hanging Prometheus never holds the tick past its budget."""
        with self._lock:
            if self._warm_up_sample is not None and not self._warm_up_sample.done():
                return
            sample = self._warm_up_sample = self._evidence_pool.submit(self._sample_warm_up, now)
        with contextlib.suppress(TimeoutError):
            sample.result(timeout=max(0.0, deadline - self._monotonic()))

    def _sample_warm_up(self, now: datetime) -> None:
        """The tick's sample of the canaries warming up, if no collect took it (nothing else needed
        evidence): a kill while a model loads must not wait for another rollout's evaluation. Its
        alarms are looked at at once (the next tick now)."""
        try:
            self._evidence.sample_warm_up(now)
        except Exception as error:  # a shortcut, as the watch
            log.warning("warm-up sample failed", error=str(error))
            return
        if self._take_alarms(set()):
            self._wake()

    def _take_alarms(self, judged_now: set[str]) -> set[str]:
        """Step 4: the rollouts whose canary the evidence source saw OOM-killed (returned); those
        not judged in this very tick (whose evidence already holds the kill) are looked at now."""
        try:
            alarms = set(self._evidence.take_alarms())
        except Exception as error:  # an alarm is a shortcut; the interval still comes
            log.warning("evidence alarms unreadable", error=str(error))
            return set()
        with self._lock:
            alarmed = {self._canaries[alarm] for alarm in alarms if alarm in self._canaries}
            alarmed = {key for key in alarmed if key in self._intervals}
            later = alarmed - judged_now
            self._alarmed |= later
            self._triggered |= later
        for key in sorted(alarmed):
            log.info(
                "critical signal: the canary was OOM-killed; deciding it first"
                if key in judged_now
                else "critical signal: the canary was OOM-killed; evaluating it now",
                key=key,
            )
            self._metrics.tick_rollouts.labels("alarmed").inc()
        if later and judged_now:
            self._wake()  # raised by this tick's sample: the next tick now, not a period later
        return alarmed

    def _done(self, key: str) -> None:
        with self._lock:
            self._in_flight.discard(key)

    def in_flight(self) -> set[str]:
        """The keys read and not yet written (for an elector that drains a shard: it waits for them)."""
        with self._lock:
            return set(self._in_flight)

    def _collect(self, items: list[Prepared]) -> list[Evidence | None]:
        """One ``collect_many`` for ``items``: their evidence, in order (None: none)."""
        asks: list[tuple[PromotionPolicy, EvidenceRequest]] = []
        for item in items:
            assert item.request is not None  # only the rollouts that need evidence are collected
            asks.append((item.policy, item.request))
        started = self._monotonic()
        try:
            answers = list(self._evidence.collect_many(asks))
            if len(answers) != len(asks):
                raise ValueError(f"collect_many answered {len(answers)} of {len(asks)} requests")
        except Exception as error:  # the contract says it never raises: no evidence this tick
            log.exception("evidence collection failed", rollouts=len(asks), error=str(error))
            self._metrics.query_errors.labels("internal").inc()
            return [None] * len(asks)
        finally:
            self._metrics.query_duration.observe(self._monotonic() - started)
        for answer in answers:
            if answer is None:  # that rollout's evidence could not be collected (CollectEach logged it)
                self._metrics.query_errors.labels("internal").inc()
            else:
                self._reconciler.count_query_errors(answer)
        return answers

    def _submit(self, item: Prepared, evidence: Evidence | None) -> Future[ReconcileOutcome]:
        return self._pool.submit(self._finish, item, evidence)

    def _finish(self, item: Prepared, evidence: Evidence | None) -> ReconcileOutcome:
        key = item.key
        result: ReconcileOutcome | None = None
        try:
            result = self._reconciler.finish(item, evidence)
            self._on_reconciled(key, result.error)
        except NotLeader as error:  # not a failure of the rollout: another replica drives it
            log.warning("write refused: not the owner", key=key, error=str(error))
            result = ReconcileOutcome(key, error=f"not the owner: {error}")
        finally:
            self._metrics.tick_rollouts.labels(
                "failed" if result is None or result.error else "decided"
            ).inc()
            with self._lock:
                self._in_flight.discard(key)
            self._schedule(key, item.now, result)
        return result

    def _schedule(self, key: str, now: datetime, result: ReconcileOutcome | None) -> None:
        """When ``key`` is due next, after a reconcile at ``now``."""
        with self._lock:
            interval = self._intervals.get(key)
            if interval is None:
                return
            self._waiting_since.pop(key, None)
            every = timedelta(seconds=interval)
            if result is not None and result.retry_soon:
                self._triggered.add(key)
                self._next_due[key] = now
            elif result is not None and result.decision is not None and not result.evaluated:
                phase = result.decision.new_state.phase
                # An active rollout whose evaluation was not due yet (its window started after the
                # last one): looked at again next tick, from the caches, until it is.
                soon = timedelta(seconds=min(interval, self.period))
                self._next_due[key] = now + (soon if phase in _ACTIVE else every) - TIMER_SLACK
            else:
                self._next_due[key] = now + every - TIMER_SLACK  # as the core's is_due
        if result is not None and result.retry_soon:
            self._wake()

    def _record(self, outcome: TickOutcome, api_before: tuple[float, float]) -> None:
        metrics = self._metrics
        metrics.ticks.inc()
        metrics.tick_duration.observe(outcome.duration)
        # "decided" and the failures of a decision are counted as each finishes (_finish).
        for name, keys in (
            ("due", outcome.due),
            ("carried", outcome.carried),
            ("skipped", outcome.skipped),
            ("in-flight", outcome.in_flight),
        ):
            metrics.tick_rollouts.labels(name).inc(len(keys))
        reads, writes = _api_counts(metrics)
        for name, value in (
            ("due", len(outcome.due)),
            ("decided", len(outcome.decided)),
            ("carried", len(outcome.carried)),
            ("in-flight", len(outcome.in_flight)),
            ("collect-calls", outcome.collect_calls),
            ("evidence-requests", outcome.evidence_requests),
            ("api-reads", reads - api_before[0]),
            ("api-writes", writes - api_before[1]),
            ("duration-seconds", outcome.duration),
        ):
            metrics.tick_last.labels(name).set(value)
        if outcome.carried or outcome.in_flight:
            log.warning(
                "tick out of budget: rollouts carried to the next tick",
                due=len(outcome.due),
                decided=len(outcome.decided),
                carried=len(outcome.carried),
                inFlight=len(outcome.in_flight),
                seconds=round(outcome.duration, 3),
                budget=round(self.budget * self.period, 3),
            )
        elif outcome.due:
            log.debug(
                "tick",
                due=len(outcome.due),
                decided=len(outcome.decided),
                evidence=outcome.evidence_requests,
                seconds=round(outcome.duration, 3),
            )


def _api_counts(metrics: ControllerMetrics) -> tuple[float, float]:
    return metrics.api_totals()
