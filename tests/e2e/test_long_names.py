"""End to end: InferenceServices with long names are judged on their pods' metrics (issue #33, item 1).

The emulator names revisions and pods as Knative and the apiserver do (canary_sandbox/k8s_names.py):
a 31-character InferenceService's pods are ``<revision>-deploymentxxxxx``, a 37-character one's
Deployment name is md5-shortened, and at 53 characters (the longest whose ``<name>-predictor`` Knative
accepts) the revision name is hashed too. Before the fix every pod-joined check read no data there:
an OOM-killed canary was not rolled back for it and a healthy one could not show its GPU memory.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.stack import ControllerProcess, Stack

from tests.e2e.support import check, decided, finished, policy, roll_out, serving, story

NS = "e2e-long"
BASE = "llama-3-1-70b-instruct-awq-chatbot-prod-eu-west1-canary2"
OOM_31 = BASE[:31]  # "llama-3-1-70b-instruct-awq-chat", the example
OOM_53 = BASE[:53]
HEALTHY_37 = BASE[:37]
LEAKS_GPU_MEMORY = RevisionBehaviour(gpu_base_mib=30000, gpu_mib_per_request=400, oom_at_mib=40000)
HEALTHY = RevisionBehaviour(median_ms=80, gpu_base_mib=30000, ready_after_s=1.0)
CHECKS = (
    "{name: p90, metric: latency, quantile: 0.9, max: 2s}",
    "{name: oom, metric: oom-kills, max: 0, critical: true}",
    "{name: restarts, metric: restarts, max: 3}",
    "{name: gpu, metric: gpu-memory-peak, maxFraction: 0.95}",
)
SCENARIOS: dict[str, tuple[RevisionBehaviour, str]] = {
    OOM_31: (LEAKS_GPU_MEMORY, "30s"),
    OOM_53: (LEAKS_GPU_MEMORY, "30s"),
    HEALTHY_37: (HEALTHY, "4s"),
}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    policies = {
        f"p{index}.yaml": policy(NS, name, CHECKS, window=window, extra="  failureLimit: 2\n")
        for index, (name, (_, window)) in enumerate(SCENARIOS.items())
    }
    canaries = {name: behaviour for name, (behaviour, _) in SCENARIOS.items()}
    with serving(NS, canaries, policies) as started:
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    return roll_out(stack, "e2e-long", NS, SCENARIOS)


@pytest.mark.parametrize("name", [OOM_31, OOM_53])
def test_an_oom_killed_canary_with_a_long_name_is_rolled_back_on_the_oom_check(
    stack: Stack, controller: ControllerProcess, name: str
) -> None:
    assert finished(stack, NS, name, 120) == "RolledBack", story(stack, name)
    rollback = decided(stack, name, "rolled-back")
    oom = check(rollback, "oom")
    assert (oom["verdict"], oom["critical"]) == ("fail", True), story(stack, name)
    assert oom["measured"]["canary"] >= 1, oom


def test_a_healthy_canary_with_a_hashed_deployment_name_shows_its_gpu_memory_and_is_promoted(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert finished(stack, NS, HEALTHY_37, 120) == "Succeeded", story(stack, HEALTHY_37)
    promoted = decided(stack, HEALTHY_37, "promoted")
    gpu = check(promoted, "gpu")
    assert gpu["verdict"] == "pass" and gpu["measured"]["canary"] > 0, gpu
