"""The generic apiserver behaviour, through the official kubernetes client over HTTP."""

from __future__ import annotations

import json
from typing import Any

import pytest
from canary_sandbox.emulator import CONFIGMAPS, INFERENCESERVICES, Emulator, EmulatorServer
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.sandbox.emulator.support import (
    GROUP,
    NAMESPACE,
    PLURAL,
    VERSION,
    Isvcs,
    isvc_manifest,
    raw_request,
)

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def status_of(error: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


def configmap(name: str = "state", data: dict[str, str] | None = None, **metadata: Any) -> client.V1ConfigMap:
    return client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name, **metadata), data=data or {"phase": "Idle"}
    )


def test_configmap_crud_assigns_uid_timestamp_and_increasing_resource_versions(
    core: client.CoreV1Api,
) -> None:
    created = core.create_namespaced_config_map(NAMESPACE, configmap())
    assert created.metadata.uid
    assert created.metadata.creation_timestamp is not None
    assert created.metadata.namespace == NAMESPACE
    created.data["phase"] = "Progressing"
    updated = core.replace_namespaced_config_map("state", NAMESPACE, created)
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    listed = core.list_namespaced_config_map(NAMESPACE)
    assert [item.metadata.name for item in listed.items] == ["state"]
    assert int(listed.metadata.resource_version) >= int(updated.metadata.resource_version)
    core.delete_namespaced_config_map("state", NAMESPACE)
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("state", NAMESPACE)
    assert missing.value.status == 404


def test_errors_are_status_objects_with_reason_and_code(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("nope", NAMESPACE)
    assert status_of(missing.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'configmaps "nope" not found',
        "reason": "NotFound",
        "details": {"name": "nope", "kind": "configmaps"},
        "code": 404,
    }


def test_create_twice_is_409_already_exists(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NAMESPACE, configmap())
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_config_map(NAMESPACE, configmap())
    assert exists.value.status == 409
    assert status_of(exists.value)["reason"] == "AlreadyExists"


def test_create_in_a_namespace_that_does_not_exist_is_404(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as missing:
        core.create_namespaced_config_map("nowhere", configmap())
    assert missing.value.status == 404
    assert status_of(missing.value)["message"] == 'namespaces "nowhere" not found'


def test_replace_with_stale_resource_version_is_409_conflict(core: client.CoreV1Api) -> None:
    first = core.create_namespaced_config_map(NAMESPACE, configmap())
    stale_version = first.metadata.resource_version
    first.data = {"phase": "Pending"}
    core.replace_namespaced_config_map("state", NAMESPACE, first)
    first.metadata.resource_version = stale_version
    first.data = {"phase": "Paused"}
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_config_map("state", NAMESPACE, first)
    assert conflict.value.status == 409
    status = status_of(conflict.value)
    assert status["reason"] == "Conflict"
    assert "the object has been modified" in status["message"]
    assert core.read_namespaced_config_map("state", NAMESPACE).data == {"phase": "Pending"}


def test_replacing_an_inferenceservice_needs_a_resource_version_unlike_built_in_kinds(
    core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    manifest = isvcs.create(isvc_manifest())
    del manifest["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as invalid:
        isvcs.api.replace_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "llama", manifest)
    assert invalid.value.status == 422
    assert "metadata.resourceVersion" in status_of(invalid.value)["message"]
    created = core.create_namespaced_config_map(NAMESPACE, configmap())
    created.metadata.resource_version = None
    created.data = {"phase": "Paused"}
    assert core.replace_namespaced_config_map("state", NAMESPACE, created).data == {"phase": "Paused"}


def test_merge_patch_carrying_resource_version_is_a_precondition(
    core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    created = isvcs.create(isvc_manifest())
    version = created["metadata"]["resourceVersion"]
    isvcs.set_canary(10)
    with pytest.raises(ApiException) as conflict:
        isvcs.patch(
            {"metadata": {"resourceVersion": version}, "spec": {"predictor": {"canaryTrafficPercent": 30}}}
        )
    assert conflict.value.status == 409
    current = isvcs.get()
    assert current["spec"]["predictor"]["canaryTrafficPercent"] == 10
    patched = isvcs.patch(
        {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
         "spec": {"predictor": {"canaryTrafficPercent": 30}}}
    )  # fmt: skip
    assert patched["spec"]["predictor"]["canaryTrafficPercent"] == 30


def test_merge_patch_null_deletes_the_field(core: client.CoreV1Api, isvcs: Isvcs) -> None:
    isvcs.create(isvc_manifest(canary=10))
    promoted = isvcs.set_canary(None)
    assert "canaryTrafficPercent" not in promoted["spec"]["predictor"]
    assert promoted["spec"]["predictor"]["model"]["storageUri"] == "hf://meta/llama-3-8b"
    core.create_namespaced_config_map(NAMESPACE, configmap(data={"a": "1", "b": "2"}))
    patched = core.patch_namespaced_config_map("state", NAMESPACE, {"data": {"a": None}}, _content_type=MERGE)
    assert patched.data == {"b": "2"}


def test_strategic_merge_patch_on_an_inferenceservice_is_415(isvcs: Isvcs) -> None:
    isvcs.create(isvc_manifest())
    with pytest.raises(ApiException) as unsupported:
        isvcs.patch({"spec": {"predictor": {"canaryTrafficPercent": 10}}}, content_type=STRATEGIC)
    assert unsupported.value.status == 415
    assert status_of(unsupported.value)["reason"] == "UnsupportedMediaType"


def test_strategic_merge_patch_on_a_configmap_merges(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NAMESPACE, configmap(data={"a": "1"}))
    patched = core.patch_namespaced_config_map(
        "state", NAMESPACE, {"data": {"b": "2"}}, _content_type=STRATEGIC
    )
    assert patched.data == {"a": "1", "b": "2"}


def test_json_patch_add_replace_remove_and_test(isvcs: Isvcs) -> None:
    isvcs.create(isvc_manifest(canary=10))
    patched = isvcs.patch(
        [
            {"op": "test", "path": "/spec/predictor/canaryTrafficPercent", "value": 10},
            {"op": "replace", "path": "/spec/predictor/canaryTrafficPercent", "value": 30},
            {"op": "add", "path": "/spec/predictor/minReplicas", "value": 2},
            {"op": "remove", "path": "/spec/predictor/minReplicas"},
        ],
        content_type=JSON_PATCH,
    )
    assert patched["spec"]["predictor"]["canaryTrafficPercent"] == 30
    assert "minReplicas" not in patched["spec"]["predictor"]
    with pytest.raises(ApiException) as failed_test:
        isvcs.patch(
            [{"op": "test", "path": "/spec/predictor/canaryTrafficPercent", "value": 10},
             {"op": "replace", "path": "/spec/predictor/canaryTrafficPercent", "value": 50}],
            content_type=JSON_PATCH,
        )  # fmt: skip
    assert failed_test.value.status == 422
    assert isvcs.get()["spec"]["predictor"]["canaryTrafficPercent"] == 30


def test_an_update_that_changes_nothing_keeps_the_resource_version(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map(NAMESPACE, configmap())
    again = core.replace_namespaced_config_map("state", NAMESPACE, created)
    assert again.metadata.resource_version == created.metadata.resource_version


@pytest.mark.parametrize("name", ["Upper", "under_score", "-leading", "x" * 254])
def test_invalid_metadata_name_is_422(core: client.CoreV1Api, name: str) -> None:
    with pytest.raises(ApiException) as invalid:
        core.create_namespaced_config_map(NAMESPACE, configmap(name=name))
    assert invalid.value.status == 422
    status = status_of(invalid.value)
    assert status["reason"] == "Invalid"
    assert status["details"]["causes"][0]["field"] == "metadata.name"


def test_configmap_data_larger_than_one_mebibyte_is_422(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NAMESPACE, configmap(data={"history": "x" * (1024 * 1024)}))
    with pytest.raises(ApiException) as too_big:
        core.create_namespaced_config_map(
            NAMESPACE, configmap(name="big", data={"history": "x" * (1024 * 1024 + 1)})
        )
    assert too_big.value.status == 422
    assert status_of(too_big.value)["message"] == (
        'ConfigMap "big" is invalid: []: Too long: must have at most 1048576 bytes'
    )


@pytest.mark.parametrize("percent", ["10", 10.5, True])
def test_canary_traffic_percent_that_is_not_an_integer_is_422(isvcs: Isvcs, percent: Any) -> None:
    with pytest.raises(ApiException) as invalid:
        isvcs.create(isvc_manifest(canary=percent))
    assert invalid.value.status == 422
    status = status_of(invalid.value)
    assert status["message"].startswith('InferenceService.serving.kserve.io "llama" is invalid: ')
    assert "spec.predictor.canaryTrafficPercent in body must be of type integer" in status["message"]
    isvcs.create(isvc_manifest(canary=10))
    with pytest.raises(ApiException) as invalid_patch:
        isvcs.set_canary(percent)
    assert invalid_patch.value.status == 422


def test_inferenceservice_without_a_predictor_is_422(isvcs: Isvcs) -> None:
    manifest = isvc_manifest()
    manifest["spec"] = {}
    with pytest.raises(ApiException) as invalid:
        isvcs.create(manifest)
    assert invalid.value.status == 422
    assert status_of(invalid.value)["details"]["causes"][0]["field"] == "spec.predictor"


def test_inferenceservice_name_that_is_not_a_dns1035_label_is_refused_by_kserves_webhook(
    isvcs: Isvcs,
) -> None:
    with pytest.raises(ApiException) as denied:
        isvcs.create(isvc_manifest(name="1llama"))
    assert denied.value.status == 403
    assert "admission webhook" in status_of(denied.value)["message"]


def test_generation_bumps_on_spec_changes_only(isvcs: Isvcs) -> None:
    assert isvcs.create(isvc_manifest())["metadata"]["generation"] == 1
    assert isvcs.patch({"metadata": {"labels": {"team": "ml"}}})["metadata"]["generation"] == 1
    assert isvcs.patch({"metadata": {"annotations": {"note": "x"}}})["metadata"]["generation"] == 1
    assert isvcs.set_canary(10)["metadata"]["generation"] == 2
    status_write = isvcs.api.patch_namespaced_custom_object_status(
        GROUP, VERSION, NAMESPACE, PLURAL, "llama", {"status": {"observedGeneration": 99}}
    )
    assert status_write["metadata"]["generation"] == 2


def test_main_resource_writes_ignore_status_and_status_writes_ignore_spec(isvcs: Isvcs) -> None:
    manifest = isvc_manifest()
    manifest["status"] = {"url": "http://forged"}
    assert "status" not in isvcs.create(manifest)
    assert "status" not in isvcs.patch(
        {"status": {"url": "http://forged"}, "metadata": {"labels": {"a": "b"}}}
    )
    written = isvcs.api.patch_namespaced_custom_object_status(
        GROUP, VERSION, NAMESPACE, PLURAL, "llama",
        {"status": {"url": "http://real"}, "spec": {"predictor": {"canaryTrafficPercent": 50}}},
    )  # fmt: skip
    assert written["status"]["url"] == "http://real"
    assert "canaryTrafficPercent" not in written["spec"]["predictor"]


def test_deleting_an_inferenceservice_garbage_collects_configmaps_it_owns(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    owner = isvcs.create(isvc_manifest())
    reference = client.V1OwnerReference(
        api_version=f"{GROUP}/{VERSION}", kind="InferenceService", name="llama", uid=owner["metadata"]["uid"]
    )
    core.create_namespaced_config_map(NAMESPACE, configmap(name="owned", owner_references=[reference]))
    core.create_namespaced_config_map(NAMESPACE, configmap(name="unowned"))
    isvcs.api.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, "llama")
    emulator.settle()
    names = [item.metadata.name for item in core.list_namespaced_config_map(NAMESPACE).items]
    assert names == ["unowned"]


def test_orphan_propagation_keeps_dependents_and_drops_the_reference(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    owner = isvcs.create(isvc_manifest())
    reference = client.V1OwnerReference(
        api_version=f"{GROUP}/{VERSION}", kind="InferenceService", name="llama", uid=owner["metadata"]["uid"]
    )
    core.create_namespaced_config_map(NAMESPACE, configmap(name="owned", owner_references=[reference]))
    isvcs.api.delete_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, "llama", body=client.V1DeleteOptions(propagation_policy="Orphan")
    )
    emulator.settle()
    assert core.read_namespaced_config_map("owned", NAMESPACE).metadata.owner_references is None


def test_an_owner_deleted_with_orphan_before_its_dependents_owner_check_ran_orphans_them(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    # A dependent's owner check is scheduled when it is created; here the owner goes (Orphan) before
    # the emulator's ticker gets to it — what a loaded machine does between two quick API calls.
    owner = isvcs.create(isvc_manifest())
    reference = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "name": "llama",
        "uid": owner["metadata"]["uid"],
    }
    with emulator.lock:  # the ticker waits: nothing runs between the two writes
        emulator.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "owned", "namespace": NAMESPACE, "ownerReferences": [reference]},
            }
        )
        emulator.store.delete(INFERENCESERVICES, NAMESPACE, "llama", options={"propagationPolicy": "Orphan"})
    emulator.settle()
    assert core.read_namespaced_config_map("owned", NAMESPACE).metadata.owner_references is None


def test_a_dependent_whose_owner_uid_does_not_exist_is_garbage_collected(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    isvcs.create(isvc_manifest())
    wrong = client.V1OwnerReference(
        api_version=f"{GROUP}/{VERSION}", kind="InferenceService", name="llama", uid="not-the-uid"
    )
    core.create_namespaced_config_map(NAMESPACE, configmap(name="dangling", owner_references=[wrong]))
    emulator.settle()
    assert core.list_namespaced_config_map(NAMESPACE).items == []


def test_finalizers_hold_deletion_until_removed(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NAMESPACE, configmap(finalizers=["example.com/hold"]))
    terminating = core.delete_namespaced_config_map("state", NAMESPACE)
    assert terminating.metadata.deletion_timestamp is not None if hasattr(terminating, "metadata") else True
    held = core.read_namespaced_config_map("state", NAMESPACE)
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map(
        "state", NAMESPACE, {"metadata": {"finalizers": None}}, _content_type=MERGE
    )
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_config_map("state", NAMESPACE)
    assert gone.value.status == 404


def test_label_selectors_equality_inequality_and_set_based(core: client.CoreV1Api) -> None:
    for name, labels in (
        ("a", {"app": "x", "tier": "web"}),
        ("b", {"app": "y"}),
        ("c", {"app": "z", "tier": "db"}),
    ):
        core.create_namespaced_config_map(NAMESPACE, configmap(name=name, labels=labels))

    def names(selector: str) -> list[str]:
        return [
            i.metadata.name for i in core.list_namespaced_config_map(NAMESPACE, label_selector=selector).items
        ]

    assert names("app=x") == ["a"]
    assert names("app==y") == ["b"]
    assert names("app!=x") == ["b", "c"]
    assert names("app in (x, z)") == ["a", "c"]
    assert names("app notin (x)") == ["b", "c"]
    assert names("tier") == ["a", "c"]
    assert names("!tier") == ["b"]
    assert names("app in (x,y),tier") == ["a"]


def test_field_selector_by_name_and_unsupported_fields_are_400(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NAMESPACE, configmap(name="a"))
    core.create_namespaced_config_map(NAMESPACE, configmap(name="b"))
    selected = core.list_namespaced_config_map(NAMESPACE, field_selector="metadata.name=b")
    assert [item.metadata.name for item in selected.items] == ["b"]
    with pytest.raises(ApiException) as unsupported:
        core.list_namespaced_config_map(NAMESPACE, field_selector="data.phase=Idle")
    assert unsupported.value.status == 400


def test_cluster_wide_lists_span_namespaces(emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs) -> None:
    emulator.create_namespace("other")
    core.create_namespaced_config_map(NAMESPACE, configmap(name="a"))
    core.create_namespaced_config_map("other", configmap(name="b"))
    everywhere = core.list_config_map_for_all_namespaces()
    assert sorted((i.metadata.namespace, i.metadata.name) for i in everywhere.items) == [
        (NAMESPACE, "a"),
        ("other", "b"),
    ]
    isvcs.create(isvc_manifest())
    listed = isvcs.api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert [item["metadata"]["name"] for item in listed["items"]] == ["llama"]
    assert listed["kind"] == "InferenceServiceList"


def test_leases_replace_with_conflict_detection(api_client: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api_client)
    spec = client.V1LeaseSpec(holder_identity="replica-a", lease_duration_seconds=15)
    created = leases.create_namespaced_lease(
        NAMESPACE, client.V1Lease(metadata={"name": "kserve-canary"}, spec=spec)
    )
    created.spec.holder_identity = "replica-b"
    leases.replace_namespaced_lease("kserve-canary", NAMESPACE, created)
    created.spec.holder_identity = "replica-c"
    with pytest.raises(ApiException) as conflict:
        leases.replace_namespaced_lease("kserve-canary", NAMESPACE, created)
    assert conflict.value.status == 409
    assert leases.read_namespaced_lease("kserve-canary", NAMESPACE).spec.holder_identity == "replica-b"


def test_lease_micro_time_needs_six_fractional_digits_as_the_go_decoder_does(
    api_client: client.ApiClient,
) -> None:
    # The client re-serialises datetimes with isoformat(), which drops the fraction when the
    # microseconds are 0: a real apiserver refuses that MicroTime with 400, and so does the emulator.
    leases = client.CoordinationV1Api(api_client)
    body: dict[str, Any] = {"metadata": {"name": "l"}, "spec": {"renewTime": "2026-01-01T00:00:00.000000Z"}}
    with pytest.raises(ApiException) as undecodable:
        leases.create_namespaced_lease(NAMESPACE, body)
    assert undecodable.value.status == 400
    assert "cannot be handled as a Lease" in status_of(undecodable.value)["message"]
    body["spec"] = {"renewTime": "2026-01-01T00:00:00.123456Z", "leaseDurationSeconds": 0}
    with pytest.raises(ApiException) as invalid:
        leases.create_namespaced_lease(NAMESPACE, body)
    assert invalid.value.status == 422
    body["spec"] = {"renewTime": "2026-01-01T00:00:00.123456Z", "leaseDurationSeconds": 15}
    assert leases.create_namespaced_lease(NAMESPACE, body).spec.lease_duration_seconds == 15


def test_core_and_events_v1_events_are_two_views_of_one_store(api_client: client.ApiClient) -> None:
    core = client.CoreV1Api(api_client)
    events = client.EventsV1Api(api_client)
    events.create_namespaced_event(
        NAMESPACE,
        {
            "metadata": {"name": "llama.rollback"},
            "eventTime": "2026-01-01T00:00:00.250000Z",
            "reportingController": "kserve-canary.dev/controller",
            "reportingInstance": "replica-a",
            "action": "Rollback",
            "reason": "RolledBack",
            "type": "Warning",
            "note": "p99 1200ms > 800ms",
            "regarding": {"kind": "InferenceService", "name": "llama", "namespace": NAMESPACE},
        },
    )
    (legacy,) = core.list_namespaced_event(NAMESPACE).items
    assert legacy.message == "p99 1200ms > 800ms"
    assert legacy.involved_object.name == "llama"
    assert legacy.reporting_component == "kserve-canary.dev/controller"
    selected = core.list_namespaced_event(
        NAMESPACE, field_selector="involvedObject.name=llama,reason=RolledBack"
    )
    assert len(selected.items) == 1


def test_events_v1_without_event_time_or_reporting_controller_is_422(server: EmulatorServer) -> None:
    status, body = raw_request(
        server.url,
        "POST",
        f"/apis/events.k8s.io/v1/namespaces/{NAMESPACE}/events",
        {"metadata": {"name": "e"}, "reason": "X", "type": "Normal", "action": "A"},
    )
    assert status == 422
    fields = {cause["field"] for cause in body["details"]["causes"]}
    assert {"eventTime", "reportingController", "reportingInstance"} <= fields


def test_dry_run_validates_without_persisting(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NAMESPACE, configmap(), dry_run="All")
    assert core.list_namespaced_config_map(NAMESPACE).items == []


def test_unknown_paths_are_404_and_unsupported_methods_405(server: EmulatorServer) -> None:
    status, body = raw_request(server.url, "GET", "/apis/apps/v1/deployments")
    assert (status, body["reason"]) == (404, "NotFound")
    status, body = raw_request(server.url, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/configmaps")
    assert (status, body["reason"]) == (405, "MethodNotAllowed")
    status, _ = raw_request(server.url, "GET", "/openapi/v2")
    assert status == 404


def test_python_api_reads_what_clients_wrote(emulator: Emulator, isvcs: Isvcs) -> None:
    isvcs.create(isvc_manifest())
    assert emulator.get(INFERENCESERVICES, NAMESPACE, "llama")["metadata"]["name"] == "llama"
    emulator.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": NAMESPACE}}
    )
    assert [item["metadata"]["name"] for item in emulator.list_objects(CONFIGMAPS, NAMESPACE)] == ["c"]
