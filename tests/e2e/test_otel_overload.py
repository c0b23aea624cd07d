"""End to end on Knative >= 1.19's metrics: an overloaded canary is caught (issue #33, 4).

The fleet's queue-proxies export both OpenTelemetry request histograms, as Knative's do
(tests/sandbox/test_queue_proxy_histograms.py cites the sources): their own, inside the breaker, and
otelhttp's around it. A canary whose breaker sheds load answers 503s the model never sees; one whose
requests wait for a slot is slow only for its clients. Both are rolled back; read from the inner
histogram both served 0 % errors at the model's speed and were promoted. A healthy canary on the same
metrics is promoted. The controller detects the profile itself (``requests: auto``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.stack import ControllerProcess, Stack

from tests.e2e.support import check, decided, finished, policy, roll_out, serving, story

NS = "otel"
BEHAVIOURS = {
    "steady": RevisionBehaviour(median_ms=80, ready_after_s=1.0),
    "shedding": RevisionBehaviour(median_ms=80, ready_after_s=1.0, shed_ratio=0.2),  # queue full: 503
    "queueing": RevisionBehaviour(median_ms=80, ready_after_s=1.0, queue_ms=3000.0),  # waits for a slot
}
CHECKS = (
    "{name: p90, metric: latency, quantile: 0.9, max: 2s, maxIncrease: 50%}",
    "{name: errors, metric: error-rate, max: 5%}",
)


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    policies = {
        f"{name}.yaml": policy(NS, name, CHECKS, steps="[10, 30, 50, 100]", deadline="12s")
        for name in BEHAVIOURS
    }
    with serving(NS, BEHAVIOURS, policies, requests_profile="knative-otel-invocation") as started:
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    return roll_out(stack, "otel", NS, BEHAVIOURS)


def test_a_healthy_canary_on_knative_otel_metrics_is_promoted(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert finished(stack, NS, "steady") == "Succeeded", story(stack, "steady")
    assert stack.canary_percent(NS, "steady") is None


def test_a_canary_shedding_503s_at_the_breaker_is_rolled_back(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert finished(stack, NS, "shedding") == "RolledBack", story(stack, "shedding")
    errors = check(decided(stack, "shedding", "rolled-back"), "errors")
    assert errors["verdict"] == "fail"
    assert errors["measured"]["canary"] > 0.05


def test_a_canary_whose_requests_queue_at_the_breaker_is_rolled_back(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert finished(stack, NS, "queueing") == "RolledBack", story(stack, "queueing")
    p90 = check(decided(stack, "queueing", "rolled-back"), "p90")
    assert p90["verdict"] == "fail"
    assert p90["measured"]["canary"] > 2.0
