"""One evaluation job per policy, on apscheduler 3.x, configured against its pitfalls.

* ``misfire_grace_time`` defaults to 1 s in apscheduler 3: a run that starts late is silently
  *dropped*. Here it is ``None`` (always run, however late) with ``coalesce`` (several missed runs
  become one) and ``max_instances=1`` (never two evaluations of one rollout at once).
* A bounded thread pool runs the jobs; every call a job makes has its own timeout, so one slow
  Prometheus query or apiserver call occupies one worker and cannot delay another model's rollback.
* ``trigger(key)`` runs a job as soon as possible (the watch saw a new revision: auto-start must
  happen in seconds, before a GPU revision is Ready). A trigger that arrives while the job is running
  is remembered and the job runs again right after, instead of being skipped by ``max_instances``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import structlog
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

__all__ = ["RolloutScheduler"]

log = structlog.get_logger(__name__)


class RolloutScheduler:
    def __init__(self, run: Callable[[str], None], *, max_workers: int = 8):
        self._run = run
        self._scheduler = BackgroundScheduler(
            executors={"default": ThreadPoolExecutor(max_workers=max_workers)},
            job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 1},
            timezone=UTC,
        )
        self._intervals: dict[str, float] = {}
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._pending: set[str] = set()

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self, *, wait: bool = True) -> None:
        """Stop scheduling; with ``wait`` the evaluations in flight finish (nothing half-done)."""
        self._scheduler.shutdown(wait=wait)

    @property
    def keys(self) -> set[str]:
        return set(self._intervals)

    def sync(self, intervals: dict[str, float]) -> None:
        """Make the jobs match ``{key: interval seconds}``: add, reschedule, remove."""
        for key in list(self._intervals):
            if key not in intervals:
                self._scheduler.remove_job(key)
                del self._intervals[key]
        for key, interval in intervals.items():
            if key not in self._intervals:
                self._scheduler.add_job(
                    self._guarded,
                    IntervalTrigger(seconds=interval, timezone=UTC),
                    args=(key,),
                    id=key,
                    name=f"evaluate {key}",
                    next_run_time=datetime.now(UTC),
                    replace_existing=True,
                )
            elif self._intervals[key] != interval:
                self._scheduler.reschedule_job(key, trigger=IntervalTrigger(seconds=interval, timezone=UTC))
            self._intervals[key] = interval

    def trigger(self, key: str) -> None:
        """Evaluate ``key`` as soon as a worker is free."""
        if key not in self._intervals:
            return
        with self._lock:
            if key in self._running:
                self._pending.add(key)
                return
        job = self._scheduler.get_job(key)
        if job is not None:
            job.modify(next_run_time=datetime.now(UTC) + timedelta(milliseconds=1))

    def _guarded(self, key: str) -> None:
        with self._lock:
            self._running.add(key)
        try:
            while True:
                try:
                    self._run(key)
                except Exception:  # one broken rollout must never stop the others
                    log.exception("evaluation failed", key=key)
                with self._lock:
                    if key not in self._pending:
                        return
                    self._pending.discard(key)
        finally:
            with self._lock:
                self._running.discard(key)
