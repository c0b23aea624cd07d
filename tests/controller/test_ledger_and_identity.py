"""The reconciler against the API emulator over HTTP: losing the state, and an object re-created.

Issue 11, items 1 and 2. A rollback is remembered in the rollback ledger, its own ConfigMap,
written before the rollback's patch, so deleting the state cannot make the controller roll the
rolled-back revision out again. A state read for an InferenceService that was deleted and re-created
under the same name (``kubectl replace --force``: a new uid, revisions numbered from 00001 again,
and the old state still there because the garbage collector lags) is never used, and never left
behind under the new object's ownership.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig, ManualClock, RevisionBehaviour
from canary_sandbox.emulator.kserve import RevisionState
from canary_sandbox.prometheus import free_port
from canary_sandbox.stack import inference_service
from kubernetes import client, config

from canary.controller.observability import ControllerMetrics
from canary.controller.reconciler import Reconciler
from canary.kserve.admitted import list_states
from canary.kserve.client import InferenceServiceClient
from canary.kserve.ledger_store import LEDGER_KEY, ConfigMapLedgerStore, ledger_configmap_name
from canary.kserve.store import STATE_KEY, ConfigMapStateStore, state_configmap_name
from canary.metrics.client import PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.notify import NotificationDispatcher
from canary.policy import LoadedPolicy, load_text
from canary.rollout import Action, Phase, RollbackLedger, RolloutState
from tests.policy.support import valid_policy

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"


@dataclass
class World:
    emulator: Emulator
    api: client.ApiClient
    reconciler: Reconciler
    clock: list[datetime]
    policy: LoadedPolicy

    def reconcile(self, after: timedelta = timedelta(seconds=10)) -> Any:
        self.clock[0] += after
        return self.reconciler.reconcile(self.policy)

    def create(self, storage_uri: str = "s3://m/v1") -> str:
        created = client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            GROUP, VERSION, "ml", PLURAL, inference_service("ml", "llama", storage_uri)
        )
        return str(created["metadata"]["uid"])

    def set_storage_uri(self, storage_uri: str) -> None:
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "ml",
            PLURAL,
            "llama",
            {"spec": {"predictor": {"model": {"storageUri": storage_uri}}}},
        )

    def isvc(self) -> dict[str, Any]:
        found: dict[str, Any] = client.CustomObjectsApi(self.api).get_namespaced_custom_object(
            GROUP, VERSION, "ml", PLURAL, "llama"
        )
        return found

    def configmap(self, name: str) -> client.V1ConfigMap | None:
        try:
            return client.CoreV1Api(self.api).read_namespaced_config_map(name, "ml")
        except client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def state(self) -> RolloutState:
        return ConfigMapStateStore(self.api).load("ml", "llama").state()

    def isvc_patches(self, since: int = 0) -> list[Any]:
        return [
            entry
            for entry in self.emulator.requests.entries(since=since)
            if entry.method == "PATCH" and entry.path.endswith("/inferenceservices/llama")
        ]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0), ManualClock())
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace("ml")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        dispatcher = NotificationDispatcher()
        source = PrometheusEvidenceSource(PrometheusConfig(url=f"http://127.0.0.1:{free_port()}", timeout=1))
        clock = [T0]
        reconciler = Reconciler(
            inference_services=InferenceServiceClient(api),
            store=ConfigMapStateStore(api),
            evidence=source,
            dispatcher=dispatcher,
            metrics=ControllerMetrics(),
            clock=lambda: clock[0],
        )
        world = World(emulator, api, reconciler, clock, load_text(valid_policy("llama")).policies[0])
        world.create()
        emulator.advance(2)  # llama-predictor-00001 is Ready and rolled out
        try:
            yield world
        finally:
            dispatcher.close(1)


def roll_back_a_canary_that_never_becomes_ready(world: World) -> None:
    assert world.reconcile().decision.new_state.phase is Phase.IDLE
    world.emulator.set_default_behaviour("ml", "llama", RevisionBehaviour(ready_after_seconds=None))
    world.set_storage_uri("s3://m/v2")
    world.emulator.advance(0.1)
    started = world.reconcile()
    assert (started.decision.action, started.decision.weight) == (Action.START, 10)
    world.emulator.advance(0.1)  # KServe takes the step in
    rolled = world.reconcile(timedelta(minutes=20))  # past progressDeadline (15m)
    assert (rolled.decision.action, rolled.decision.weight, rolled.patched) == (Action.ROLLBACK, 0, True)
    # It became Ready after all, at 0 %: exactly what a dark launch looks like.
    world.emulator.set_revision_state("ml", "llama-predictor-00002", RevisionState.READY)
    world.emulator.advance(1)
    assert world.isvc()["spec"]["predictor"]["canaryTrafficPercent"] == 0


def test_deleting_the_state_after_a_rollback_never_writes_the_rolled_back_revision_again(
    world: World,
) -> None:
    roll_back_a_canary_that_never_becomes_ready(world)
    uid = world.isvc()["metadata"]["uid"]
    ledger_map = world.configmap(ledger_configmap_name("llama"))
    assert ledger_map is not None and ledger_map.metadata is not None
    assert ledger_map.metadata.name == "kserve-canary-llama.ledger"
    assert ledger_map.metadata.labels == {
        "app.kubernetes.io/managed-by": "kserve-canary",
        "kserve-canary.dev/inference-service": "llama.ledger",
        "kserve-canary.dev/record": "rollback-ledger",
    }
    [owner] = ledger_map.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.block_owner_deletion) == (
        "InferenceService",
        "llama",
        uid,
        False,
    )
    listed = list_states(world.api, "ml", ignored=lambda *_: None)
    assert [(item.inference_service, item.owner_uid) for item in listed] == [("llama", uid)], "not a state"
    ledger = RollbackLedger.from_json((ledger_map.data or {})[LEDGER_KEY])
    assert ledger.inference_service_uid == uid and ledger.has("llama-predictor-00002")
    assert ledger.entries[0].fingerprint == world.state().fingerprint

    client.CoreV1Api(world.api).delete_namespaced_config_map(state_configmap_name("llama"), "ml")
    since = world.emulator.requests.entries()[-1].sequence
    for _ in range(5):
        outcome = world.reconcile()
        assert not outcome.patched, outcome.decision.reasons
    assert world.isvc_patches(since) == []
    state = world.state()
    assert state.phase is Phase.ROLLED_BACK and state.was_rolled_back("llama-predictor-00002")
    assert world.isvc()["spec"]["predictor"]["canaryTrafficPercent"] == 0


def test_the_ledger_is_written_before_the_rollback_patch(world: World) -> None:
    roll_back_a_canary_that_never_becomes_ready(world)
    entries = [e for e in world.emulator.requests.entries() if e.status < 300]

    def is_ledger_write(entry: Any) -> bool:
        body = entry.body if isinstance(entry.body, dict) else {}
        return entry.method in {"POST", "PUT"} and (body.get("metadata") or {}).get("name") == (
            "kserve-canary-llama.ledger"
        )

    def is_rollback(entry: Any) -> bool:
        body = entry.body if isinstance(entry.body, dict) else {}
        return (
            entry.method == "PATCH"
            and body.get("spec", {}).get("predictor", {}).get("canaryTrafficPercent", None) == 0
        )

    ledger_write = next(e.sequence for e in entries if is_ledger_write(e))
    rollback = next(e.sequence for e in entries if is_rollback(e))
    assert ledger_write < rollback


def test_a_ready_revision_at_zero_without_state_or_ledger_pauses(world: World) -> None:
    roll_back_a_canary_that_never_becomes_ready(world)
    core = client.CoreV1Api(world.api)
    core.delete_namespaced_config_map(state_configmap_name("llama"), "ml")
    core.delete_namespaced_config_map(ledger_configmap_name("llama"), "ml")
    outcome = world.reconcile()
    assert outcome.decision.action is Action.PAUSE and not outcome.patched
    assert "is not the rolled-out revision" in outcome.decision.reasons[0]
    assert world.state().phase is Phase.PAUSED
    assert not world.reconcile().patched


def test_state_of_a_deleted_and_recreated_inference_service_is_never_used(world: World) -> None:
    world.emulator.store.garbage_collection_delay = 30.0  # a real collector takes its time
    assert world.reconcile().decision.new_state.phase is Phase.IDLE
    world.set_storage_uri("s3://m/v2")
    world.emulator.advance(0.1)
    started = world.reconcile()
    assert (started.decision.action, started.decision.weight) == (Action.START, 10)
    old_uid = world.isvc()["metadata"]["uid"]

    # kubectl replace --force: delete, then create the same manifest again at once.
    client.CustomObjectsApi(world.api).delete_namespaced_custom_object(GROUP, VERSION, "ml", PLURAL, "llama")
    world.emulator.advance(0.1)
    new_uid = world.create("s3://m/v1")
    world.emulator.advance(2)
    assert new_uid != old_uid
    assert [revision["name"] for revision in world.emulator.revisions("ml", "llama")] == [
        "llama-predictor-00001"
    ], "Knative numbers the new object's revisions from 00001 again"
    left = world.configmap(state_configmap_name("llama"))
    assert left is not None and left.metadata is not None
    assert [ref.uid for ref in left.metadata.owner_references] == [old_uid], "the collector lags"

    since = world.emulator.requests.entries()[-1].sequence
    outcome = world.reconcile(timedelta(seconds=1))
    assert not outcome.patched and world.isvc_patches(since) == []
    state = world.state()
    assert state.inference_service_uid == new_uid
    assert (state.phase, state.revision) == (Phase.IDLE, "llama-predictor-00001")
    assert all(entry.phase is not Phase.PENDING for entry in state.history), "nothing of the old rollout"
    kept = world.configmap(state_configmap_name("llama"))
    assert kept is not None and kept.metadata is not None
    assert [ref.uid for ref in kept.metadata.owner_references] == [new_uid]
    assert json.loads((kept.data or {})[STATE_KEY])["inferenceServiceUid"] == new_uid
    for _ in range(3):
        assert not world.reconcile().patched
    world.emulator.advance(31)  # the collector comes by for the old object's dependents
    assert world.configmap(state_configmap_name("llama")) is not None
    assert ConfigMapLedgerStore(world.api).load("ml", "llama").ledger_json is None


def test_a_version_1_state_is_adopted_only_when_its_owner_is_this_object(world: World) -> None:
    uid = world.isvc()["metadata"]["uid"]
    store = ConfigMapStateStore(world.api)
    old = json.dumps(
        {"schemaVersion": 1, "phase": "Idle", "revision": "llama-predictor-00001", "fingerprint": "x"}
    )
    store.save_files("ml", "llama", {STATE_KEY: old}, resource_version=None, owner_uid=uid)
    world.reconcile()
    adopted = world.state()
    assert adopted.inference_service_uid == uid and adopted.fingerprint == "x"
    stored = store.load("ml", "llama")
    # The collector lags, as a real one does: a state owned by no existing object is still there when
    # the controller reads it (with no delay the emulator's collector raced the reconcile, and the
    # write that replaces the state could find it deleted).
    world.emulator.store.garbage_collection_delay = 30.0
    store.save_files(
        "ml", "llama", {STATE_KEY: old}, resource_version=stored.resource_version, owner_uid="someone-else"
    )
    world.reconcile()
    fresh = world.state()
    assert fresh.inference_service_uid == uid and fresh.fingerprint != "x"
