"""The controller's timer: one tick for all rollouts, on apscheduler 3.x, configured against its pitfalls.

* One interval job, the tick (``--tick``, never more than the smallest policy interval). Each run
  evaluates every rollout that is due (:mod:`canary.controller.tick`); a job per policy would ask
  Prometheus once per rollout instead of once per tick.
* ``misfire_grace_time`` defaults to 1 s in apscheduler 3: a run that starts late is silently
  *dropped*, and with it a rollback. Here it is ``None`` (always run, however late) with ``coalesce``
  (several missed runs become one) and ``max_instances=1`` (never two ticks at once: a tick that runs
  long delays the next one, which then carries what is due).
* ``wake()`` runs a tick as soon as possible (the watch saw a new revision: auto-start must happen in
  seconds, before a GPU revision is Ready; a conflict retries soon). A wake that arrives while a
  tick runs is remembered and another tick runs right after, instead of being skipped by
  ``max_instances``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import structlog
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.base import JobLookupError
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

__all__ = ["TICK_JOB", "TickScheduler"]

log = structlog.get_logger(__name__)

TICK_JOB = "tick"


class TickScheduler:
    def __init__(self, run: Callable[[], None], *, period: float):
        if period <= 0:
            raise ValueError("the tick period must be positive")
        self._run = run
        self._period = period
        # One worker: ticks never overlap; the tick has its own pool for the rollouts' writes.
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=1)},
            job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 1},
            timezone=UTC,
        )
        self._lock = threading.Lock()
        self._running = False
        self._pending = False
        self._woken = False  # a wake is already scheduled: a burst of watch events moves the job once
        self._started = False

    @property
    def period(self) -> float:
        return self._period

    def start(self) -> None:
        self._scheduler.add_job(
            self._guarded,
            IntervalTrigger(seconds=self._period, timezone=UTC),
            id=TICK_JOB,
            name="tick",
            next_run_time=datetime.now(UTC),
            replace_existing=True,
        )
        self._scheduler.start()
        self._started = True

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop ticking; with ``wait`` the tick in flight finishes (nothing half-done)."""
        if self._started:
            self._scheduler.shutdown(wait=wait)
            self._started = False

    def set_period(self, period: float) -> None:
        """A new tick period (the smallest policy interval changed); the next tick keeps its time."""
        if period <= 0 or period == self._period:
            return
        self._period = period
        if self._started:
            try:
                self._scheduler.reschedule_job(
                    TICK_JOB, trigger=IntervalTrigger(seconds=period, timezone=UTC)
                )
            except JobLookupError:
                return
            log.info("tick period changed", seconds=period)

    def wake(self) -> None:
        """Run a tick as soon as the one in flight (if any) is done."""
        with self._lock:
            if self._running:
                self._pending = True
                return
            if self._woken or not self._started:
                return
            self._woken = True
        job = self._scheduler.get_job(TICK_JOB)
        if job is not None:
            job.modify(next_run_time=datetime.now(UTC) + timedelta(milliseconds=1))

    def _guarded(self) -> None:
        with self._lock:
            self._running = True
            self._woken = False
        try:
            while True:
                try:
                    self._run()
                except Exception:  # a broken tick must never stop the timer
                    log.exception("tick failed")
                with self._lock:
                    if not self._pending:
                        return
                    self._pending = False
        finally:
            with self._lock:
                self._running = False
