"""Clocks for the emulator's simulated time.

Every delay the emulator simulates (KServe's reconcile lag, a revision becoming Ready, Knative scaling
an unrouted revision down) is measured on a :class:`Clock`, never on ``time.time()`` directly, so the
demo can run at speed and tests can step time exactly.

Network-facing timeouts (a watch's ``timeoutSeconds``, an injected hang) stay in real seconds: they
are about sockets, not about the cluster being simulated.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "ManualClock", "ScaledClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Simulated wall-clock time in seconds since the Unix epoch."""

    def now(self) -> float: ...


class SystemClock:
    """Real time."""

    def now(self) -> float:
        return time.time()

    def __repr__(self) -> str:
        return "SystemClock()"


class ScaledClock:
    """Real time running ``speed`` times faster, starting from the real time at construction."""

    def __init__(self, speed: float, start: float | None = None) -> None:
        if speed <= 0:
            raise ValueError(f"clock speed must be positive, got {speed}")
        self.speed = speed
        self._start_wall = time.time() if start is None else start
        self._start_monotonic = time.monotonic()

    def now(self) -> float:
        return self._start_wall + (time.monotonic() - self._start_monotonic) * self.speed

    def real_seconds(self, simulated_seconds: float) -> float:
        """How long ``simulated_seconds`` of this clock take in real time."""
        return simulated_seconds / self.speed

    def __repr__(self) -> str:
        return f"ScaledClock(speed={self.speed})"


class ManualClock:
    """Time that moves only when told to; tests step it with :meth:`Emulator.advance`.

    It starts at the real current time (rounded to the second) so ages printed by ``kubectl`` look
    sensible, unless a start is given.
    """

    def __init__(self, start: float | None = None) -> None:
        self._now = float(int(time.time())) if start is None else start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def set(self, instant: float) -> None:
        """Move to ``instant``; time never runs backwards."""
        with self._lock:
            if instant < self._now:
                raise ValueError(f"a ManualClock cannot go back in time ({instant} < {self._now})")
            self._now = instant

    def __repr__(self) -> str:
        return f"ManualClock(now={self._now})"
