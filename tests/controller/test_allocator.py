"""The controller sets glibc's allocator before its threads start, unless the operator did."""

from __future__ import annotations

import subprocess
import sys

from canary.controller.allocator import ARENA_MAX, MMAP_THRESHOLD, tune_allocator


def _applied_in_a_fresh_process(env: dict[str, str]) -> str:
    code = "from canary.controller.allocator import tune_allocator; print(sorted(tune_allocator().items()))"
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_both_settings_apply_on_glibc() -> None:
    assert tune_allocator({}) == {"arenaMax": ARENA_MAX, "mmapThreshold": MMAP_THRESHOLD}


def test_the_operators_environment_wins() -> None:
    assert tune_allocator({"MALLOC_ARENA_MAX": "8"}) == {"mmapThreshold": MMAP_THRESHOLD}
    assert tune_allocator({"MALLOC_ARENA_MAX": "8", "MALLOC_MMAP_THRESHOLD_": "65536"}) == {}
    # And in a process of its own, as the controller starts.
    assert _applied_in_a_fresh_process({"MALLOC_ARENA_MAX": "4"}) == "[('mmapThreshold', 131072)]"
