"""End to end: a model that loads for longer than Knative's progress deadline (issue #33, item 3).

The cluster's Knative fails a revision not Ready within ``progress-deadline`` of
knative-serving/config-deployment ("Initial scale was never achieved"), scales it to zero and never
retries it; the emulator does the same (tests/sandbox/emulator/test_progress_deadline.py). Here the
cluster's deadline is 6 s, the new model needs 15 s to load and the policy waits 60 s: the rollout
must be rolled back as soon as Knative fails the revision, quoting Knative, and the controller must
have warned at the start that the policy waits longer than Knative will. Before the fix the emulator
made the revision Ready at 15 s and the model was promoted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until
from typer.testing import CliRunner

from canary.cli import app

NS = "e2e-knative"
NAME = "llama-70b"
V1, V2 = "s3://models/v1", "s3://models/v2"
KNATIVE_DEADLINE = "6s"
LOADS_15_S = RevisionBehaviour(median_ms=80, ready_after_s=15.0)

POLICY = f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {NAME}, namespace: {NS}}}
spec:
  target: {{inferenceService: {NAME}}}
  steps: [10, 50, 100]
  window: 4s
  interval: 1s
  minRequests: 10
  progressDeadline: 60s
  checks:
    - {{name: p90, metric: latency, quantile: 0.9, max: 2s}}
    - {{name: oom, metric: oom-kills, max: 0, critical: true}}
  notify:
    - webhook: {{urlFrom: {{env: HOOK_URL}}}}
"""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    models = [ModelTraffic(NS, NAME, 40.0, {V1: RevisionBehaviour(median_ms=80), V2: LOADS_15_S})]
    with Stack(models, {f"{NAME}.yaml": POLICY}) as started:
        started.env = {"HOOK_URL": f"{started.receiver.url}/hook"}
        started.emulator.create_namespace("knative-serving")
        started.emulator.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "config-deployment", "namespace": "knative-serving"},
                "data": {"progress-deadline": KNATIVE_DEADLINE},
            }
        )
        started.apply(inference_service(NS, NAME, V1))
        assert wait_until(lambda: started.predictor_status(NS, NAME).get("latestRolledoutRevision"), 30)
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    started = stack.start_controller("e2e-knative")
    time.sleep(2)  # let Prometheus see the stable revision before anything changes
    stack.set_storage_uri(NS, NAME, V2)
    return started


def notifications(stack: Stack) -> list[dict[str, Any]]:
    return [r.json() for r in stack.receiver.requests if r.json()["inferenceService"]["name"] == NAME]


def writes(stack: Stack) -> list[tuple[float, Any]]:
    """(time, canaryTrafficPercent) of every write the controller made to the InferenceService."""
    found = []
    for entry in stack.emulator.requests.entries(method="PATCH", path_contains=f"/inferenceservices/{NAME}"):
        if (
            entry.status == 200
            and entry.user_agent.startswith("kserve-canary/")
            and isinstance(entry.body, dict)
        ):
            predictor = (entry.body.get("spec") or {}).get("predictor") or {}
            found.append((entry.time, predictor.get("canaryTrafficPercent", "<absent>")))
    return found


def test_a_model_loading_longer_than_knatives_deadline_is_rolled_back_with_knatives_reason(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert wait_until(lambda: any(n["action"] == "rolled-back" for n in notifications(stack)), 45), [
        (n["action"], n["summary"]) for n in notifications(stack)
    ]
    rollback = next(n for n in notifications(stack) if n["action"] == "rolled-back")
    revision = f"{NAME}-predictor-00002"
    assert (
        f'RevisionFailed: Revision "{revision}" failed with message: Initial scale was never achieved.'
        in rollback["summary"]
    ), rollback["summary"]
    assert "rolled back at once rather than at progressDeadline 1m" in rollback["summary"]
    assert "missed Knative's progress deadline, 6s (knative-serving/config-deployment" in rollback["summary"]
    (started_at, first), (rolled_back_at, zero) = writes(stack)
    assert (first, zero) == (10, 0)
    # Knative's 6 s (and a reconcile or two), not the policy's 60 s.
    assert rolled_back_at - started_at < 20, rolled_back_at - started_at
    assert (stack.state(NS, NAME) or {}).get("phase") == "RolledBack"


def test_the_start_warned_that_the_policy_waits_longer_than_knative(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert wait_until(lambda: any(n["action"] == "started" for n in notifications(stack)), 30)
    started = next(n for n in notifications(stack) if n["action"] == "started")
    warning = next((r for r in started["reasons"] if "Knative's progress deadline" in r), None)
    assert warning is not None, started["reasons"]
    assert f'knative-serving/config-deployment progress-deadline: "{KNATIVE_DEADLINE}"' in warning
    assert 'serving.knative.dev/progress-deadline: "60s"' in warning
    events = [e for e in stack.events(NS) if e.reason == "CanaryStarted"]
    assert events and events[0].type == "Warning"
    assert "Knative" in (events[0].message or ""), events[0].message


def test_explain_shows_that_the_policy_waits_longer_than_knative(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert wait_until(lambda: (stack.state(NS, NAME) or {}).get("phase") == "RolledBack", 45)
    result = CliRunner().invoke(app, ["explain", f"{NS}/{NAME}", "--kubeconfig", str(stack.kubeconfig)])
    assert result.exit_code == 0, result.output
    assert (
        f"progressDeadline 1m is longer than Knative's progress deadline for {NAME}-predictor-00002, 6s "
        f'(knative-serving/config-deployment progress-deadline: "{KNATIVE_DEADLINE}")' in result.output
    ), result.output
