"""The tick timer (apscheduler 3.x): no dropped ticks, no overlap, a wake during a tick is not lost."""

from __future__ import annotations

import threading
import time

from canary.controller.scheduler import TickScheduler


def test_ticks_never_overlap_even_when_one_runs_longer_than_the_period() -> None:
    active = 0
    overlaps = 0
    lock = threading.Lock()
    runs = threading.Semaphore(0)

    def run() -> None:
        nonlocal active, overlaps
        with lock:
            active += 1
            overlaps += active > 1
        time.sleep(0.15)  # longer than the period: ticks would overlap without max_instances
        with lock:
            active -= 1
        runs.release()

    scheduler = TickScheduler(run, period=0.05)
    scheduler.start()
    try:
        for _ in range(4):
            assert runs.acquire(timeout=5)
    finally:
        scheduler.shutdown()
    assert overlaps == 0


def test_a_wake_during_a_tick_runs_another_tick_right_after() -> None:
    started = threading.Event()
    proceed = threading.Event()
    second = threading.Event()
    calls: list[float] = []

    def run() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            started.set()
            proceed.wait(5)
        else:
            second.set()

    scheduler = TickScheduler(run, period=3600.0)
    scheduler.start()
    try:
        assert started.wait(5)
        scheduler.wake()  # e.g. the watch saw a new revision while the tick ran
        proceed.set()
        assert second.wait(5), "the wake must run a tick after the one in flight"
    finally:
        scheduler.shutdown()


def test_a_wake_runs_an_idle_timer_at_once() -> None:
    ticks = threading.Semaphore(0)
    scheduler = TickScheduler(ticks.release, period=3600.0)
    scheduler.start()
    try:
        assert ticks.acquire(timeout=5)  # the first tick runs at start
        time.sleep(0.1)
        scheduler.wake()
        assert ticks.acquire(timeout=5)
    finally:
        scheduler.shutdown()


def test_an_exception_in_one_tick_does_not_stop_the_timer_and_the_period_can_change() -> None:
    runs = threading.Semaphore(0)

    def run() -> None:
        runs.release()
        raise RuntimeError("broken tick")

    scheduler = TickScheduler(run, period=3600.0)
    scheduler.start()
    try:
        assert runs.acquire(timeout=5)
        scheduler.set_period(0.05)
        for _ in range(3):
            assert runs.acquire(timeout=5)
        assert scheduler.period == 0.05
    finally:
        scheduler.shutdown()


def test_the_timer_is_configured_against_apschedulers_pitfalls() -> None:
    scheduler = TickScheduler(lambda: None, period=1.0)
    scheduler.start()
    try:
        job = scheduler._scheduler.get_job("tick")
        assert job is not None
        assert job.misfire_grace_time is None
        assert job.coalesce is True
        assert job.max_instances == 1
    finally:
        scheduler.shutdown()
