"""End to end on Knative >= 1.19's metrics: an overloaded canary is caught (issue #33, 4).

The fleet's queue-proxies export both OpenTelemetry request histograms, as Knative's do
(tests/sandbox/test_queue_proxy_histograms.py cites the sources): their own, inside the breaker, and
otelhttp's around it. A canary whose breaker sheds load answers 503s the model never sees; one whose
requests wait for a slot is slow only for its clients. Both are rolled back; read from the inner
histogram both served 0 % errors at the model's speed and were promoted. A healthy canary on the same
metrics is promoted. The controller detects the profile itself (``requests: auto``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until

NS = "otel"
RPS = 60.0
V1, V2 = "s3://models/v1", "s3://models/v2"
STABLE = RevisionBehaviour(median_ms=80)
BEHAVIOURS = {
    "steady": RevisionBehaviour(median_ms=80, ready_after_s=1.0),
    "shedding": RevisionBehaviour(median_ms=80, ready_after_s=1.0, shed_ratio=0.2),  # queue full: 503
    "queueing": RevisionBehaviour(median_ms=80, ready_after_s=1.0, queue_ms=3000.0),  # waits for a slot
}


def _policy(name: str) -> str:
    return f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: {NS}}}
spec:
  target: {{inferenceService: {name}}}
  steps: [10, 30, 50, 100]
  window: 4s
  interval: 1s
  minRequests: 10
  progressDeadline: 12s
  checks:
    - {{name: p90, metric: latency, quantile: 0.9, max: 2s, maxIncrease: 50%}}
    - {{name: errors, metric: error-rate, max: 5%}}
  notify:
    - webhook: {{urlFrom: {{env: HOOK_URL}}}}
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    models = [
        ModelTraffic(NS, name, RPS, {V1: STABLE, V2: behaviour}) for name, behaviour in BEHAVIOURS.items()
    ]
    policies = {f"{name}.yaml": _policy(name) for name in BEHAVIOURS}
    with Stack(models, policies, requests_profile="knative-otel-invocation") as started:
        started.env = {"HOOK_URL": f"{started.receiver.url}/hook"}
        for name in BEHAVIOURS:
            started.apply(inference_service(NS, name, V1))
        assert wait_until(
            lambda: all(started.predictor_status(NS, n).get("latestRolledoutRevision") for n in BEHAVIOURS),
            30,
        )
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    started = stack.start_controller("otel")
    time.sleep(3)  # let Prometheus see the stable revisions before anything changes
    for name in BEHAVIOURS:
        stack.set_storage_uri(NS, name, V2)
    return started


def _notifications(stack: Stack, name: str) -> list[dict[str, Any]]:
    return [r.json() for r in stack.receiver.requests if r.json()["inferenceService"]["name"] == name]


def _outcome(stack: Stack, name: str) -> str:
    def phase() -> str | None:
        state = stack.state(NS, name)
        return None if state is None else str(state.get("phase"))

    assert wait_until(lambda: phase() in {"Succeeded", "RolledBack"}, 90), json.dumps(stack.state(NS, name))[
        -3000:
    ]
    return str(phase())


def _why(stack: Stack, name: str) -> str:
    """What the controller said when it decided: the last notification's summary and check statements."""
    last = (_notifications(stack, name) or [{}])[-1]
    return "\n".join([str(last.get("summary"))] + [str(c.get("statement")) for c in last.get("checks", [])])


def _check(stack: Stack, name: str, action: str, check: str) -> dict[str, Any]:
    assert wait_until(lambda: any(n["action"] == action for n in _notifications(stack, name)), 20)
    notification = next(n for n in _notifications(stack, name) if n["action"] == action)
    return next(c for c in notification["checks"] if c["name"] == check)


def test_a_healthy_canary_on_knative_otel_metrics_is_promoted(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert _outcome(stack, "steady") == "Succeeded", _why(stack, "steady")
    assert stack.canary_percent(NS, "steady") is None


def test_a_canary_shedding_503s_at_the_breaker_is_rolled_back(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert _outcome(stack, "shedding") == "RolledBack", _notifications(stack, "shedding")
    errors = _check(stack, "shedding", "rolled-back", "errors")
    assert errors["verdict"] == "fail"
    assert errors["measured"]["canary"] > 0.05


def test_a_canary_whose_requests_queue_at_the_breaker_is_rolled_back(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert _outcome(stack, "queueing") == "RolledBack", _notifications(stack, "queueing")
    p90 = _check(stack, "queueing", "rolled-back", "p90")
    assert p90["verdict"] == "fail"
    assert p90["measured"]["canary"] > 2.0
