"""End to end behind a 30 s ingestion lag (issue 33, item 7): a window counts evidence, not the clock.

The fleet's samples reach Prometheus 30 s late, with their own timestamps (remote write, a Thanos
sidecar's upload, Mimir's ingesters: ``canary_sandbox.exporter.IngestionLag``), scraped every second,
and the policies hold each step for 9 s. A canary that serves 8 % errors from the 50 % step on must
be rolled back, never promoted on the few seconds of the step that are visible; a healthy one is
still promoted; and the controller says how old its evidence is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until
from kubernetes import client

NS = "lag"
RPS = 400.0  # enough that a pass test on the visible evidence can promote within seconds
LAG = 30.0
V1, V2 = "s3://models/v1", "s3://models/v2"
HEALTHY = RevisionBehaviour(median_ms=80, ready_after_s=1.0)
FAILS_AT_HALF = RevisionBehaviour(
    median_ms=80, ready_after_s=1.0, loaded_error_rate=0.08, loaded_from_share=0.5
)
MODELS = {"lagbad": FAILS_AT_HALF, "laggood": HEALTHY}


def policy(name: str) -> str:
    return f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: {NS}}}
spec:
  target: {{inferenceService: {name}}}
  steps: [10, 50, 100]
  window: 9s
  interval: 1s
  minRequests: 10
  progressDeadline: 60s
  checks:
    - {{name: errors, metric: error-rate, max: 2%}}
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    models = [ModelTraffic(NS, name, RPS, {V1: HEALTHY, V2: behaviour}) for name, behaviour in MODELS.items()]
    policies = {f"{name}.yaml": policy(name) for name in MODELS}
    with Stack(models, policies, ingestion_lag=LAG) as started:
        for name in MODELS:
            started.apply(inference_service(NS, name, V1))
        assert wait_until(
            lambda: all(started.predictor_status(NS, n).get("latestRolledoutRevision") for n in MODELS), 30
        )
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    started = stack.start_controller("lag")
    # The stable revisions' first samples reach Prometheus only after the lag.
    time.sleep(LAG + 3)
    for name in MODELS:
        stack.set_storage_uri(NS, name, V2)
    return started


def _phase(stack: Stack, name: str) -> str | None:
    state = stack.state(NS, name)
    return None if state is None else str(state.get("phase"))


def _outcome(stack: Stack, name: str) -> str:
    final = {"Succeeded", "RolledBack"}
    assert wait_until(lambda: _phase(stack, name) in final, 240), json.dumps(stack.state(NS, name))[-3000:]
    return str(_phase(stack, name))


def _history(stack: Stack, name: str) -> str:
    state = stack.state(NS, name) or {}
    return "\n".join(f"{entry['action']}: {entry['reason']}" for entry in state.get("history", []))


def test_a_canary_failing_from_the_50_percent_step_behind_a_30s_lag_is_rolled_back(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert _outcome(stack, "lagbad") == "RolledBack", _history(stack, "lagbad")
    assert stack.canary_percent(NS, "lagbad") == 0
    history = _history(stack, "lagbad")
    assert "promote" not in [entry["action"] for entry in (stack.state(NS, "lagbad") or {})["history"]]
    assert "errors" in history.split("rollback:")[-1], history


def test_a_healthy_canary_behind_the_same_lag_is_promoted_and_the_lag_is_said(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert _outcome(stack, "laggood") == "Succeeded", _history(stack, "laggood")
    # The promotion's evaluation (explain.json) says how far its evidence reached, and how old it was.
    stored = client.CoreV1Api(stack.api).read_namespaced_config_map("kserve-canary-laggood", NS)
    explain = json.loads((stored.data or {})["explain.json"])
    assert explain["evidenceUntil"] is not None, explain
    assert any("s behind" in reason for reason in explain["reasons"]), explain["reasons"]
