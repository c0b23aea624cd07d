"""Say a repeated failure once per change, with how often it repeated.

A failure that lasts (Prometheus unreachable, a query Prometheus refuses) would otherwise log the same
line for every query of every tick: 28 two-kilobyte lines in 14 s for one rollout. A failure is said
when it first appears and when what it says changes (with the count of the repeats in between), and
its end is said once, with that count.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

__all__ = ["Repeats"]


class Repeats:
    """Per key, the last failure said and how often it came again since."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self._said: dict[Hashable, tuple[str, int]] = {}
        self._max_keys = max_keys  # a key per rollout and check: bounded, the oldest forgotten first
        self._lock = threading.Lock()

    def failed(self, key: Hashable, text: str) -> int | None:
        """None when ``text`` is what ``key`` last said (a repeat, counted); else the number of
        repeats of the previous failure (0 for a first one): say it."""
        with self._lock:
            said = self._said.get(key)
            if said is not None and said[0] == text:
                self._said[key] = (text, said[1] + 1)
                return None
            if said is None and len(self._said) >= self._max_keys:
                self._said.pop(next(iter(self._said)))
            self._said[key] = (text, 0)
            return said[1] if said is not None else 0

    def ended(self, key: Hashable) -> int | None:
        """The repeats of the failure of ``key`` that just ended (say so), None if none was said."""
        with self._lock:
            said = self._said.pop(key, None)
            return said[1] if said is not None else None
