"""End to end, issue 11 items 1 and 2: the controller as a process, the emulator, a real Prometheus.

* A rollback is never undone: after it, deleting the state ConfigMap must not make the controller
  take the rolled-back revision (at 0 %, Ready) for a dark launch and write its first step again.
* A write is never stale: an InferenceService deleted and re-created within a second (``kubectl
  replace --force``) must not be driven by the old object's state, which the garbage collector has
  not removed yet (Knative numbers the new object's revisions from 00001 again, so names match).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import Stack, inference_service, wait_until
from kubernetes import client

from tests.e2e.support import V1, V2
from tests.e2e.test_rollouts import policy

NS = "e2e"
STABLE = RevisionBehaviour(median_ms=80)
REGRESSES_UNDER_LOAD = RevisionBehaviour(median_ms=80, load_sensitivity=3.0)  # p99 grows with its share
HEALTHY = RevisionBehaviour(median_ms=80, ready_after_s=1.0)
GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    models = [
        ModelTraffic(NS, "undone", 60.0, {V1: STABLE, V2: REGRESSES_UNDER_LOAD}),
        ModelTraffic(NS, "replaced", 60.0, {V1: STABLE, V2: HEALTHY}),
        ModelTraffic(NS, "slow", 10.0, {V1: STABLE}),
    ]
    policies = {
        "undone.yaml": policy("undone", tail=90),
        "replaced.yaml": policy("replaced", window="3s", tail=90),
        "slow.yaml": policy("slow", window="10m").replace("interval: 1s", "interval: 10m"),
    }
    with Stack(models, policies) as started:
        started.env = {"HOOK_URL": f"{started.receiver.url}/hook"}
        for name in ("undone", "replaced", "slow"):
            started.apply(inference_service(NS, name, V1))
        assert wait_until(
            lambda: all(
                started.predictor_status(NS, n).get("latestRolledoutRevision") for n in ("undone", "replaced")
            ),
            30,
        )
        started.start_controller("state-loss")
        time.sleep(3)  # let Prometheus see the stable revisions before anything changes
        yield started


def phase(stack: Stack, name: str) -> str | None:
    state = stack.state(NS, name)
    return None if state is None else str(state.get("phase"))


def patches(stack: Stack, name: str, since: int = 0) -> list[Any]:
    """The controller's accepted writes to the InferenceService, in order."""
    return [
        entry
        for entry in stack.emulator.requests.entries(since=since)
        if entry.method == "PATCH"
        and entry.path.endswith(f"/inferenceservices/{name}")
        and entry.status < 300
        and entry.user_agent.startswith("kserve-canary/")
    ]


def last_sequence(stack: Stack) -> int:
    entries = stack.emulator.requests.entries()
    return entries[-1].sequence if entries else 0


def configmap(stack: Stack, name: str) -> client.V1ConfigMap | None:
    try:
        return client.CoreV1Api(stack.api).read_namespaced_config_map(name, NS)
    except client.ApiException:
        return None


def test_deleting_the_state_after_a_rollback_never_writes_the_rolled_back_revision_again(
    stack: Stack,
) -> None:
    stack.set_storage_uri(NS, "undone", V2)
    assert wait_until(lambda: phase(stack, "undone") == "RolledBack", 90), json.dumps(
        stack.state(NS, "undone"), indent=1
    )
    canary = (stack.state(NS, "undone") or {})["revision"]
    assert wait_until(lambda: stack.canary_percent(NS, "undone") == 0, 10)
    assert stack.predictor_status(NS, "undone").get("latestReadyRevision") == canary, "Ready, at 0 %"
    ledger = configmap(stack, "kserve-canary-undone.ledger")
    assert ledger is not None and canary in (ledger.data or {})["ledger.json"]

    since = last_sequence(stack)
    client.CoreV1Api(stack.api).delete_namespaced_config_map("kserve-canary-undone", NS)
    assert wait_until(lambda: stack.state(NS, "undone") is not None, 15), "the controller saw it again"
    time.sleep(10)  # the failure wrote the first step within a second and served ~10 s
    assert patches(stack, "undone", since) == [], "nothing is written to the rolled-back revision"
    assert stack.canary_percent(NS, "undone") == 0
    state = stack.state(NS, "undone") or {}
    assert state["phase"] == "RolledBack" and state["revision"] == canary
    assert [entry["revision"] for entry in state["rolledBack"]] == [canary]


def test_a_deleted_state_is_written_again_at_once_not_an_interval_later(stack: Stack) -> None:
    assert wait_until(lambda: phase(stack, "slow") == "Idle", 30)
    deleted = configmap(stack, "kserve-canary-slow")
    assert deleted is not None and deleted.metadata is not None
    client.CoreV1Api(stack.api).delete_namespaced_config_map("kserve-canary-slow", NS)
    # The deletion is answered once it is done; the state written again is a new object (a new uid).
    # (Polling for the moment it is absent races with a rewrite that comes "at once": sooner than a poll.)

    def written_again() -> bool:
        found = configmap(stack, "kserve-canary-slow")
        return (
            found is not None
            and found.metadata is not None
            and found.metadata.uid != deleted.metadata.uid
            and phase(stack, "slow") == "Idle"
        )

    assert wait_until(written_again, 20), "within seconds of a 10m interval"


def test_state_of_a_deleted_and_recreated_inference_service_is_never_used(stack: Stack) -> None:
    stack.emulator.store.garbage_collection_delay = 20.0  # a real collector takes its time
    try:
        stack.set_storage_uri(NS, "replaced", V2)
        assert wait_until(
            lambda: (stack.state(NS, "replaced") or {}).get("phase") in {"Pending", "Progressing"}, 30
        )
        old_uid = stack.get(NS, "replaced")["metadata"]["uid"]

        # kubectl replace --force: delete, and create the manifest again at once.
        stack.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "replaced")
        since = last_sequence(stack)
        created = stack.apply(inference_service(NS, "replaced", V1))
        new_uid = created["metadata"]["uid"]
        assert new_uid != old_uid
        assert wait_until(lambda: stack.predictor_status(NS, "replaced").get("latestRolledoutRevision"), 30)
        assert stack.predictor_status(NS, "replaced")["latestCreatedRevision"] == "replaced-predictor-00001"

        def bound_to_the_new_object() -> bool:
            return (stack.state(NS, "replaced") or {}).get("inferenceServiceUid") == new_uid

        assert wait_until(bound_to_the_new_object, 20), json.dumps(stack.state(NS, "replaced"), indent=1)
        time.sleep(5)
        assert patches(stack, "replaced", since) == [], "no write to the new object from the old state"
        assert stack.canary_percent(NS, "replaced") is None
        state = stack.state(NS, "replaced") or {}
        assert (state["phase"], state["revision"]) == ("Idle", "replaced-predictor-00001")
        assert not any(entry["phase"] in {"Pending", "Progressing"} for entry in state["history"])
        kept = configmap(stack, "kserve-canary-replaced")
        assert kept is not None and kept.metadata is not None
        assert [ref.uid for ref in kept.metadata.owner_references] == [new_uid], (
            "the old state does not linger under the new owner: the ConfigMap is the new object's state"
        )
    finally:
        stack.emulator.store.garbage_collection_delay = 0.0

    # The new object's rollout starts fresh, from the first step, and completes.
    since = last_sequence(stack)
    stack.set_storage_uri(NS, "replaced", V2)
    assert wait_until(lambda: phase(stack, "replaced") in {"Succeeded", "RolledBack"}, 90)
    assert phase(stack, "replaced") == "Succeeded"
    written = [
        ((entry.body or {}).get("spec") or {}).get("predictor", {}).get("canaryTrafficPercent")
        for entry in patches(stack, "replaced", since)
    ]
    assert written[0] == 10 and written[-1] is None, written  # the first step ... the promotion
    assert (stack.state(NS, "replaced") or {})["revision"] == "replaced-predictor-00002"
