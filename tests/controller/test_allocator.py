"""The controller sets glibc's allocator before its threads start, unless the operator did.

Each case runs in a process of its own, as the controller starts: the settings are process-wide
and would otherwise change the allocator of the test worker for every test after it."""

from __future__ import annotations

import os
import subprocess
import sys

from canary.controller.allocator import ARENA_MAX, MMAP_THRESHOLD, YOUNG_COLLECTION_THRESHOLD


def _applied_in_a_fresh_process(**env: str) -> str:
    code = "from canary.controller.allocator import tune_allocator; print(sorted(tune_allocator().items()))"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    return subprocess.run(
        [sys.executable, "-c", code], env={**environment, **env}, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_both_settings_apply_on_glibc() -> None:
    assert _applied_in_a_fresh_process() == str(
        sorted({"arenaMax": ARENA_MAX, "mmapThreshold": MMAP_THRESHOLD}.items())
    )


def test_the_operators_environment_wins() -> None:
    assert _applied_in_a_fresh_process(MALLOC_ARENA_MAX="4") == f"[('mmapThreshold', {MMAP_THRESHOLD})]"
    assert _applied_in_a_fresh_process(MALLOC_ARENA_MAX="8", MALLOC_MMAP_THRESHOLD_="65536") == "[]"


def _collector_in_a_fresh_process(before: str = "pass") -> str:
    code = f"import gc; {before}; from canary.controller.allocator import tune_collector; print(tune_collector())"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_young_generation_is_collected_less_often_and_a_higher_setting_or_none_stays() -> None:
    default = subprocess.run(
        [sys.executable, "-c", "import gc; print(*gc.get_threshold())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    middle, old = int(default[1]), int(default[2])
    assert _collector_in_a_fresh_process() == str((YOUNG_COLLECTION_THRESHOLD, middle, old))
    assert _collector_in_a_fresh_process("gc.set_threshold(50_000, 5, 5)") == "(50000, 5, 5)"
    assert _collector_in_a_fresh_process("gc.set_threshold(0)") == f"(0, {middle}, {old})"
