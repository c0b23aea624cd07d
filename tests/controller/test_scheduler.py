"""The evaluation scheduler: no dropped runs, no overlap, no starvation by a slow rollout."""

from __future__ import annotations

import threading
import time
from collections import Counter

from canary.controller.scheduler import RolloutScheduler


def test_a_slow_rollout_does_not_delay_another_models_evaluation() -> None:
    release_slow = threading.Event()
    fast_ran = threading.Event()

    def run(key: str) -> None:
        if key == "ml/slow":
            release_slow.wait(10)
        else:
            fast_ran.set()

    scheduler = RolloutScheduler(run, max_workers=2)
    scheduler.start()
    try:
        scheduler.sync({"ml/slow": 60.0})
        time.sleep(0.1)  # the slow job is now holding a worker
        scheduler.sync({"ml/slow": 60.0, "ml/fast": 60.0})
        assert fast_ran.wait(5), "the fast rollout's evaluation must run while the slow one hangs"
    finally:
        release_slow.set()
        scheduler.shutdown()


def test_one_rollout_is_never_evaluated_twice_at_once() -> None:
    active = Counter[str]()
    overlaps: list[str] = []
    lock = threading.Lock()
    runs = threading.Semaphore(0)

    def run(key: str) -> None:
        with lock:
            active[key] += 1
            if active[key] > 1:
                overlaps.append(key)
        time.sleep(0.15)  # longer than the interval: runs would overlap without max_instances
        with lock:
            active[key] -= 1
        runs.release()

    scheduler = RolloutScheduler(run, max_workers=4)
    scheduler.start()
    try:
        scheduler.sync({"ml/a": 0.05})
        for _ in range(4):
            assert runs.acquire(timeout=5)
    finally:
        scheduler.shutdown()
    assert overlaps == []


def test_a_trigger_during_a_run_is_not_lost() -> None:
    started = threading.Event()
    proceed = threading.Event()
    calls: list[float] = []
    second = threading.Event()

    def run(key: str) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            started.set()
            proceed.wait(5)
        else:
            second.set()

    scheduler = RolloutScheduler(run, max_workers=2)
    scheduler.start()
    try:
        scheduler.sync({"ml/a": 3600.0})
        assert started.wait(5)
        scheduler.trigger("ml/a")  # e.g. the watch saw a new revision while we were evaluating
        proceed.set()
        assert second.wait(5), "the triggered evaluation must run after the one in flight"
    finally:
        scheduler.shutdown()


def test_trigger_runs_an_idle_job_right_away_and_removed_jobs_stop() -> None:
    ran = threading.Event()
    count = Counter[str]()

    def run(key: str) -> None:
        count[key] += 1
        if count[key] == 2:
            ran.set()

    scheduler = RolloutScheduler(run, max_workers=1)
    scheduler.start()
    try:
        scheduler.sync({"ml/a": 3600.0})
        time.sleep(0.2)
        scheduler.trigger("ml/a")
        assert ran.wait(5)
        scheduler.sync({})
        assert scheduler.keys == set()
        scheduler.trigger("ml/a")  # unknown now: ignored, no error
    finally:
        scheduler.shutdown()


def test_an_exception_in_one_evaluation_does_not_stop_the_schedule() -> None:
    runs = threading.Semaphore(0)

    def run(key: str) -> None:
        runs.release()
        raise RuntimeError("broken rollout")

    scheduler = RolloutScheduler(run, max_workers=1)
    scheduler.start()
    try:
        scheduler.sync({"ml/a": 0.05})
        for _ in range(3):
            assert runs.acquire(timeout=5)
    finally:
        scheduler.shutdown()
