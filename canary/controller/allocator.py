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
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

__all__ = ["ARENA_MAX", "MMAP_THRESHOLD", "tune_allocator"]

ARENA_MAX = 2
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
