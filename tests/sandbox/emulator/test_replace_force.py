"""``kubectl replace --force`` in the emulator: delete and create again, as the apiserver and Knative do it.

The new object gets a new uid and Knative numbers its revisions from 00001 again; the garbage
collector removes the old object's dependents only after ``garbageCollectionDelaySeconds`` (a real
collector lags), so a dependent can outlive its owner's deletion for a while.
"""

from __future__ import annotations

from canary_sandbox.emulator import Emulator, EmulatorAdminClient, EmulatorServer
from kubernetes import client

from tests.sandbox.emulator.support import NAMESPACE, Isvcs, isvc_manifest


def dependent(owner_uid: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(
            name="kserve-canary-llama",
            owner_references=[
                client.V1OwnerReference(
                    api_version="serving.kserve.io/v1beta1",
                    kind="InferenceService",
                    name="llama",
                    uid=owner_uid,
                    block_owner_deletion=False,
                )
            ],
        ),
        data={"state.json": "{}"},
    )


def test_a_re_created_inference_service_has_a_new_uid_and_revisions_from_00001(
    emulator: Emulator, isvcs: Isvcs, custom: client.CustomObjectsApi
) -> None:
    old = isvcs.create(isvc_manifest())
    emulator.advance(2)
    isvcs.set_storage_uri("hf://meta/llama-3-8b-v2")
    emulator.advance(2)
    assert [r["name"] for r in emulator.revisions(NAMESPACE, "llama")] == [
        "llama-predictor-00001",
        "llama-predictor-00002",
    ]
    custom.delete_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", NAMESPACE, "inferenceservices", "llama"
    )
    new = isvcs.create(isvc_manifest())
    emulator.advance(2)
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    assert [r["name"] for r in emulator.revisions(NAMESPACE, "llama")] == ["llama-predictor-00001"]
    status = isvcs.get()["status"]["components"]["predictor"]
    assert status["latestCreatedRevision"] == status["latestRolledoutRevision"] == "llama-predictor-00001"


def test_the_garbage_collector_can_lag_behind_a_deletion(
    emulator: Emulator,
    server: EmulatorServer,
    isvcs: Isvcs,
    custom: client.CustomObjectsApi,
    core: client.CoreV1Api,
) -> None:
    admin = EmulatorAdminClient(server.url)
    assert admin.config()["garbageCollectionDelaySeconds"] == 0.0
    assert admin.patch_config(garbageCollectionDelaySeconds=20)["garbageCollectionDelaySeconds"] == 20.0
    owner = isvcs.create(isvc_manifest())
    core.create_namespaced_config_map(NAMESPACE, dependent(owner["metadata"]["uid"]))
    custom.delete_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", NAMESPACE, "inferenceservices", "llama"
    )
    emulator.advance(19)
    assert core.read_namespaced_config_map("kserve-canary-llama", NAMESPACE) is not None
    emulator.advance(2)
    names = [item.metadata.name for item in core.list_namespaced_config_map(NAMESPACE).items]
    assert "kserve-canary-llama" not in names
    # Without the lag (the default), dependents go at once.
    admin.patch_config(garbageCollectionDelaySeconds=0)
    owner = isvcs.create(isvc_manifest())
    core.create_namespaced_config_map(NAMESPACE, dependent(owner["metadata"]["uid"]))
    custom.delete_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", NAMESPACE, "inferenceservices", "llama"
    )
    emulator.advance(0)
    assert "kserve-canary-llama" not in [
        item.metadata.name for item in core.list_namespaced_config_map(NAMESPACE).items
    ]
