"""Parsing a large answer without CPython's cyclic garbage collector running in the middle of it.

A thousand rollouts' counter sample is one JSON answer of about a hundred thousand series: half a
million dicts, lists and strings that live only until the sample is recorded. The collector counts
allocations, not bytes, so the parse sets off hundreds of young collections; each finds the half-built
answer alive and promotes it, until the old generation's growth rule (a quarter more than survived the
last full collection) sets off full collections, which walk the whole heap: every snapshot of every
rollout. Measured on the controller process in ``benchmarks.scale`` at 1,000 rollouts, the collector
took 28 % of its CPU time, full collections of about 0.4 s each.

None of those objects is part of a reference cycle: reference counting frees them the moment the
sample is recorded and the answer dropped. So the collector is paused while one is parsed and
recorded (:func:`collector_paused`), and resumes after; nothing it would have freed is kept longer
than the pause.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


class _Pause:
    """Who is inside :func:`collector_paused`, across threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.resume = False  # whether the collector was enabled when the first of them came in


_PAUSE = _Pause()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with the cyclic collector disabled; safe across threads and when nested: it
    is enabled again when the last caller leaves, and only if it was enabled when the first came."""
    pause = _PAUSE
    with pause.lock:
        if pause.holders == 0:
            pause.resume = gc.isenabled()
            gc.disable()
        pause.holders += 1
    try:
        yield
    finally:
        with pause.lock:
            pause.holders -= 1
            if pause.holders == 0 and pause.resume:
                gc.enable()
