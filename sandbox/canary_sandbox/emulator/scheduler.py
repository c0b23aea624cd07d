"""Simulated-time task queue: everything the emulated controllers do later is a task on this queue."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from canary_sandbox.emulator.clock import Clock

__all__ = ["Scheduler"]

log = logging.getLogger(__name__)


@dataclass(order=True)
class _Task:
    due: float
    sequence: int
    key: str | None = field(compare=False)
    action: Callable[[], None] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)


class Scheduler:
    """Tasks due at simulated instants, run in order by :meth:`run_due`.

    A keyed task is de-duplicated the way a controller's work queue is: scheduling a key that is
    already pending keeps whichever is due first, so a burst of changes causes one reconcile.
    Callers hold the emulator's lock; :attr:`wake` tells the ticker thread that work arrived.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.wake = threading.Event()
        self._heap: list[_Task] = []
        self._pending: dict[str, _Task] = {}
        self._sequence = itertools.count()

    def schedule(self, delay: float, action: Callable[[], None], key: str | None = None) -> None:
        due = self.clock.now() + max(0.0, delay)
        if key is not None:
            pending = self._pending.get(key)
            if pending is not None:
                if pending.due <= due:
                    return
                pending.cancelled = True
        task = _Task(due, next(self._sequence), key, action)
        if key is not None:
            self._pending[key] = task
        heapq.heappush(self._heap, task)
        self.wake.set()

    def cancel(self, key_prefix: str) -> None:
        for key in [k for k in self._pending if k.startswith(key_prefix)]:
            self._pending.pop(key).cancelled = True

    def next_due(self) -> float | None:
        while self._heap and self._heap[0].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0].due if self._heap else None

    def run_due(self, now: float, limit: int = 10_000) -> int:
        """Run every task due at or before ``now`` (including ones they schedule); return how many."""
        ran = 0
        while ran < limit:
            due = self.next_due()
            if due is None or due > now:
                break
            task = heapq.heappop(self._heap)
            if task.key is not None and self._pending.get(task.key) is task:
                del self._pending[task.key]
            ran += 1
            try:
                task.action()
            except Exception:  # one broken task must not stop the simulation
                log.exception("emulator task %s failed", task.key or task.action)
        if ran >= limit:
            log.error("emulator scheduler stopped after %d tasks at one instant: a reconcile loop?", limit)
        return ran
