"""End to end: InferenceServices with long names are judged on their pods' metrics (issue #33, item 1).

The emulator names revisions and pods as Knative and the apiserver do (canary_sandbox/k8s_names.py):
a 31-character InferenceService's pods are ``<revision>-deploymentxxxxx``, a 37-character one's
Deployment name is md5-shortened, and at 53 characters (the longest whose ``<name>-predictor`` Knative
accepts) the revision name is hashed too. Before the fix every pod-joined check read no data there:
an OOM-killed canary was not rolled back for it and a healthy one could not show its GPU memory.
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

NS = "e2e-long"
RPS = 60.0
V1, V2 = "s3://models/v1", "s3://models/v2"
BASE = "llama-3-1-70b-instruct-awq-chatbot-prod-eu-west1-canary2"
OOM_31 = BASE[:31]  # "llama-3-1-70b-instruct-awq-chat", the example
OOM_53 = BASE[:53]
HEALTHY_37 = BASE[:37]
LEAKS_GPU_MEMORY = RevisionBehaviour(gpu_base_mib=30000, gpu_mib_per_request=400, oom_at_mib=40000)
HEALTHY = RevisionBehaviour(median_ms=80, gpu_base_mib=30000, ready_after_s=1.0)


def policy(name: str, window: str) -> str:
    return f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: {NS}}}
spec:
  target: {{inferenceService: {name}}}
  steps: [10, 50, 100]
  window: {window}
  interval: 1s
  minRequests: 10
  progressDeadline: 20s
  failureLimit: 2
  checks:
    - {{name: p90, metric: latency, quantile: 0.9, max: 2s}}
    - {{name: oom, metric: oom-kills, max: 0, critical: true}}
    - {{name: restarts, metric: restarts, max: 3}}
    - {{name: gpu, metric: gpu-memory-peak, maxFraction: 0.95}}
  notify:
    - webhook: {{urlFrom: {{env: HOOK_URL}}}}
"""


SCENARIOS: dict[str, tuple[RevisionBehaviour, str]] = {
    OOM_31: (LEAKS_GPU_MEMORY, "30s"),
    OOM_53: (LEAKS_GPU_MEMORY, "30s"),
    HEALTHY_37: (HEALTHY, "4s"),
}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    models = [
        ModelTraffic(NS, name, RPS, {V1: RevisionBehaviour(median_ms=80), V2: behaviour})
        for name, (behaviour, _) in SCENARIOS.items()
    ]
    policies = {
        f"p{index}.yaml": policy(name, window) for index, (name, (_, window)) in enumerate(SCENARIOS.items())
    }
    with Stack(models, policies) as started:
        started.env = {"HOOK_URL": f"{started.receiver.url}/hook"}
        for name in SCENARIOS:
            started.apply(inference_service(NS, name, V1))
        assert wait_until(
            lambda: all(started.predictor_status(NS, n).get("latestRolledoutRevision") for n in SCENARIOS), 30
        )
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    started = stack.start_controller("e2e-long")
    time.sleep(3)  # let Prometheus see the stable revisions before anything changes
    for name in SCENARIOS:
        stack.set_storage_uri(NS, name, V2)
    return started


def phase(stack: Stack, name: str) -> str | None:
    state = stack.state(NS, name)
    return None if state is None else str(state.get("phase"))


def notifications(stack: Stack, name: str) -> list[dict[str, Any]]:
    return [r.json() for r in stack.receiver.requests if r.json()["inferenceService"]["name"] == name]


def story(stack: Stack, name: str) -> str:
    return "\n".join(
        f"{n['action']}: {n['summary']} {[(c['name'], c['verdict'], c['value']) for c in n['checks']]}"
        for n in notifications(stack, name)
    )


def finished(stack: Stack, name: str, timeout: float = 120) -> str:
    assert wait_until(lambda: phase(stack, name) in {"Succeeded", "RolledBack"}, timeout), (
        f"{name} stayed in {phase(stack, name)}: {json.dumps(stack.state(NS, name), indent=1)[-2000:]}"
    )
    return str(phase(stack, name))


def decided(stack: Stack, name: str, action: str) -> dict[str, Any]:
    assert wait_until(lambda: any(n["action"] == action for n in notifications(stack, name)), 20), story(
        stack, name
    )
    return next(n for n in notifications(stack, name) if n["action"] == action)


@pytest.mark.parametrize("name", [OOM_31, OOM_53])
def test_an_oom_killed_canary_with_a_long_name_is_rolled_back_on_the_oom_check(
    stack: Stack, controller: ControllerProcess, name: str
) -> None:
    assert finished(stack, name) == "RolledBack", story(stack, name)
    rollback = decided(stack, name, "rolled-back")
    oom = next(check for check in rollback["checks"] if check["name"] == "oom")
    assert (oom["verdict"], oom["critical"]) == ("fail", True), story(stack, name)
    assert oom["measured"]["canary"] >= 1, oom


def test_a_healthy_canary_with_a_hashed_deployment_name_shows_its_gpu_memory_and_is_promoted(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert finished(stack, HEALTHY_37) == "Succeeded", story(stack, HEALTHY_37)
    promoted = decided(stack, HEALTHY_37, "promoted")
    gpu = next(check for check in promoted["checks"] if check["name"] == "gpu")
    assert gpu["verdict"] == "pass" and gpu["measured"]["canary"] > 0, gpu
