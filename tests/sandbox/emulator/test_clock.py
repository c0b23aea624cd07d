"""Simulated time: the demo runs KServe's delays at speed; a manual clock never moves by itself."""

from __future__ import annotations

import time

import pytest
from canary_sandbox.emulator import INFERENCESERVICES, Emulator, KServeConfig, ManualClock, ScaledClock

from tests.sandbox.emulator.support import NAMESPACE, isvc_manifest


def ready(emulator: Emulator) -> bool:
    status = emulator.get(INFERENCESERVICES, NAMESPACE, "llama").get("status", {})
    return status.get("components", {}).get("predictor", {}).get("latestRolledoutRevision") is not None


def test_a_scaled_clock_runs_kserve_delays_faster_than_real_time() -> None:
    # 5 s of reconcile delay and 10 s of model loading take a fraction of a second at 100x.
    emulator = Emulator(KServeConfig(reconcile_delay=5, revision_ready_delay=10), ScaledClock(100)).start()
    try:
        emulator.create_namespace(NAMESPACE)
        emulator.create(isvc_manifest())
        began = time.monotonic()
        while not ready(emulator) and time.monotonic() - began < 5:
            time.sleep(0.02)
        assert ready(emulator)
        assert 0.1 < time.monotonic() - began < 2
    finally:
        emulator.stop()


def test_a_manual_clock_moves_only_when_advanced() -> None:
    emulator = Emulator(KServeConfig(reconcile_delay=0.5), ManualClock()).start()
    try:
        emulator.create_namespace(NAMESPACE)
        emulator.create(isvc_manifest())
        time.sleep(0.6)  # real time passes; simulated time does not
        assert emulator.revision_count(NAMESPACE, "llama") == 0
        emulator.advance(0.5)
        assert emulator.revision_count(NAMESPACE, "llama") == 1
        with pytest.raises(ValueError, match="backwards"):
            emulator.advance(-1)
    finally:
        emulator.stop()


def test_advance_refuses_a_clock_it_does_not_control() -> None:
    with pytest.raises(TypeError):
        Emulator(KServeConfig(), ScaledClock(2)).advance(1)
