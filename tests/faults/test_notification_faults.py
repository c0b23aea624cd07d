"""The webhook receiver failing: answering 500, closing the connection, answering slowly — "for
minutes", compressed by the outbox's retry horizon (``--notify-retry-for``). A rollout never waits
for its notifications; every decision that wrote a percentage reaches the receiver once it recovers,
or — past the horizon — is reported lost (a NotificationFailed Event and the lost counter).
"""

from __future__ import annotations

import time

import pytest
from canary_sandbox.stack import wait_until

from tests.faults.support import (
    TERMINAL,
    V2,
    World,
    check_all,
    check_told,
    events,
    isvc_writes,
    step_shown,
    wait_for_phase,
)

NAMESPACE = "notify"
MODELS = ["flaky", "lost"]

pytestmark = pytest.mark.usefixtures("stops_its_controllers")


def test_a_receiver_failing_500_closed_then_slow_delays_nothing_and_everything_arrives(world: World) -> None:
    stack = world.stack
    receiver = stack.receiver
    controller = stack.start_controller(
        "notify", extra_args=["-n", NAMESPACE, "--notify-retry-for", "60s", "--notify-info-retry-for", "60s"]
    )
    wait_until(lambda: False, 2.0)
    receiver.status = 500
    started = time.monotonic()
    stack.set_storage_uri(NAMESPACE, "flaky", V2)
    assert wait_until(lambda: step_shown(stack, NAMESPACE, "flaky", 10), 30)
    wait_until(lambda: False, 3.0)
    receiver.status, receiver.close = 200, True
    wait_until(lambda: False, 3.0)
    receiver.close, receiver.delay_seconds = False, 3.0
    assert wait_for_phase(stack, NAMESPACE, "flaky", TERMINAL, 60) == "Succeeded"
    took = time.monotonic() - started
    receiver.delay_seconds = 0.0
    assert took < 40, f"the rollout took {took:.0f}s: it waited for its notifications"
    failed = [r for r in receiver.requests if r.answered is None or r.answered >= 300]
    assert failed, "the receiver's faults were met"
    case = world.case("flaky")
    check_all(stack, world.recorder, case)
    check_told(stack, case, timeout=45)
    controller.terminate()


def test_a_receiver_down_past_the_retry_horizon_is_reported_lost(world: World) -> None:
    stack = world.stack
    receiver = stack.receiver
    receiver.status = 503
    controller = stack.start_controller(
        "notify-lost",
        extra_args=["-n", NAMESPACE, "--notify-retry-for", "4s", "--notify-info-retry-for", "4s"],
    )
    try:
        wait_until(lambda: False, 1.0)
        stack.set_storage_uri(NAMESPACE, "lost", V2)
        assert wait_for_phase(stack, NAMESPACE, "lost", TERMINAL, 60) == "Succeeded"
        case = world.case("lost")
        check_all(stack, world.recorder, case)
        # Every writing decision: a NotificationFailed Event naming it (nothing reached the receiver).
        check_told(stack, case, timeout=30)
        assert len(isvc_writes(stack, NAMESPACE, "lost")) >= 4
        assert any(e.reason == "NotificationFailed" for e in events(stack, NAMESPACE, "lost"))
        assert wait_until(lambda: "kserve_canary_notifications_lost_total{" in controller.metrics(), 10)
        assert any("lost" in line or "given up" in line for line in controller.log().splitlines())
    finally:
        receiver.status = 200
