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

from collections.abc import Iterator
from typing import Any

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.stack import ControllerProcess, Stack, wait_until
from typer.testing import CliRunner

from canary.cli import app
from tests.e2e.support import notifications as notifications_about
from tests.e2e.support import policy, roll_out, serving
from tests.e2e.support import writes as writes_to

NS = "e2e-knative"
NAME = "llama-70b"
KNATIVE_DEADLINE = "6s"
LOADS_15_S = RevisionBehaviour(median_ms=80, ready_after_s=15.0)
CHECKS = (
    "{name: p90, metric: latency, quantile: 0.9, max: 2s}",
    "{name: oom, metric: oom-kills, max: 0, critical: true}",
)


def knative_config(stack: Stack) -> None:
    """The cluster's Knative: a 6 s progress deadline in knative-serving/config-deployment."""
    stack.emulator.create_namespace("knative-serving")
    stack.emulator.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "config-deployment", "namespace": "knative-serving"},
            "data": {"progress-deadline": KNATIVE_DEADLINE},
        }
    )


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    policies = {f"{NAME}.yaml": policy(NS, NAME, CHECKS, deadline="60s")}
    with serving(NS, {NAME: LOADS_15_S}, policies, rps=40.0, prepare=knative_config) as started:
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    return roll_out(stack, "e2e-knative", NS, [NAME], settle=2)


def notifications(stack: Stack) -> list[dict[str, Any]]:
    return notifications_about(stack, NAME)


def writes(stack: Stack) -> list[tuple[float, Any]]:
    """(time, canaryTrafficPercent) of every write the controller made to the InferenceService."""
    return writes_to(stack, NAME)


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
