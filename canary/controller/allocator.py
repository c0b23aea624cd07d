"""glibc's allocator, set for a long-running process with many threads and large per-tick buffers.

Two of glibc's defaults keep memory resident that the controller no longer uses:

* each thread that allocates gets an arena of its own (up to eight per core), and what an arena frees
  stays in it for that arena's next allocations; the controller has dozens of threads (the tick's
  workers, Prometheus queries, watches, notification lanes), each holding its own free memory;
* after a large block mapped on its own is freed, glibc raises the size from which blocks are mapped
  (up to 32 MiB), so the next answer of that size — the per-tick counter sample is tens of MiB at
  1,000 rollouts — is carved from an arena, and what it leaves when freed stays resident.

So the controller caps the arenas at two and keeps the mapping threshold at its default 128 KiB
(``mallopt(3)``: ``M_ARENA_MAX``, ``M_MMAP_THRESHOLD``; the same as ``MALLOC_ARENA_MAX=2
MALLOC_MMAP_THRESHOLD_=131072``), before its threads start. An operator's own setting of either in
the environment wins; on another C library (musl, macOS) nothing is done.

CPython's cyclic collector is tuned too (:func:`tune_collector`): its young generation is collected
every :data:`YOUNG_COLLECTION_THRESHOLD` net new container objects instead of 700, so the tallies an
evaluation builds and drops are freed by reference counting before a collection can promote them
towards the full collections that walk the whole heap.
"""

from __future__ import annotations

import ctypes
import gc
import os
from collections.abc import Mapping

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "YOUNG_COLLECTION_THRESHOLD", "tune_allocator", "tune_collector"]

ARENA_MAX = 2
# CPython's cyclic collector collects its young generation every 700 net new container objects.
# An evaluation builds its step's tallies (two revisions, up to a tally per tick each: a thousand
# objects or so) and drops them when it is judged; at 700 a young collection falls inside most
# evaluations, finds them alive, and promotes them, and promoted objects count towards the full
# collections that walk the whole heap (hundreds of thousands of objects at 1,000 rollouts). Above
# what one evaluation holds at once, the young collections find them freed by reference counting.
YOUNG_COLLECTION_THRESHOLD = 20_000
MMAP_THRESHOLD = 128 * 1024
_M_ARENA_MAX = -8  # <malloc.h>
_M_MMAP_THRESHOLD = -3


def tune_allocator(environ: Mapping[str, str] | None = None) -> dict[str, int]:
    """Set what the environment does not; the settings applied (empty when not glibc)."""
    environ = os.environ if environ is None else environ
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process' own C library
    except (OSError, AttributeError):
        return {}
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    applied: dict[str, int] = {}
    for variable, name, parameter, value in (
        ("MALLOC_ARENA_MAX", "arenaMax", _M_ARENA_MAX, ARENA_MAX),
        ("MALLOC_MMAP_THRESHOLD_", "mmapThreshold", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ):
        if variable in environ:
            continue
        if mallopt(parameter, value) == 1:  # mallopt answers 1 on success
            applied[name] = value
    return applied


def tune_collector() -> tuple[int, int, int]:
    """Raise the cyclic collector's young-generation threshold (``gc.set_threshold``) to
    :data:`YOUNG_COLLECTION_THRESHOLD` when it is lower; the thresholds in effect after."""
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_COLLECTION_THRESHOLD:  # 0: the collector is off, and stays off
        gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, old)
    return gc.get_threshold()
