"""The admin API (``/emulator/v1``), through the EmulatorAdminClient, and the request log and faults."""

from __future__ import annotations

import time

import pytest
from canary_sandbox.emulator import (
    AdminApiError,
    Emulator,
    EmulatorAdminClient,
    EmulatorServer,
    KServeConfig,
    RevisionBehaviour,
    RevisionState,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.sandbox.emulator.support import NAMESPACE, Isvcs, isvc_manifest, raw_request

REV1, REV2 = "llama-predictor-00001", "llama-predictor-00002"


@pytest.fixture
def admin(server: EmulatorServer) -> EmulatorAdminClient:
    return EmulatorAdminClient(server.url)


def test_request_log_shows_what_a_client_changed_so_tests_can_prove_annotations_were_never_written(
    admin: EmulatorAdminClient, isvcs: Isvcs
) -> None:
    isvcs.create(isvc_manifest())
    admin.clear_requests()
    isvcs.set_canary(10)
    isvcs.set_canary(None)
    patches = admin.requests(method="PATCH", path="/inferenceservices/llama")
    assert [entry["body"] for entry in patches] == [
        {"spec": {"predictor": {"canaryTrafficPercent": 10}}},
        {"spec": {"predictor": {"canaryTrafficPercent": None}}},
    ]
    assert {entry["contentType"] for entry in patches} == {"application/merge-patch+json"}
    assert all(entry["changedPaths"] == ["spec.predictor.canaryTrafficPercent"] for entry in patches)
    isvcs.patch({"metadata": {"annotations": {"kserve-canary.dev/step": "1"}}})
    touched = [entry for entry in admin.requests(method="PATCH") if any(
        path.startswith("metadata.annotations") for path in entry["changedPaths"])]  # fmt: skip
    assert len(touched) == 1
    assert admin.requests(since=patches[-1]["sequence"], method="PATCH") == touched


def test_python_request_log_entries_can_be_asked_what_they_touched(emulator: Emulator, isvcs: Isvcs) -> None:
    isvcs.create(isvc_manifest())
    isvcs.patch({"metadata": {"labels": {"a": "b"}}})
    (labelled,) = emulator.requests.entries(method="PATCH")
    assert labelled.touched("metadata.labels")
    assert not labelled.touched("metadata.annotations")


def test_an_injected_409_answers_the_next_matching_request_then_the_api_behaves_again(
    admin: EmulatorAdminClient, isvcs: Isvcs
) -> None:
    isvcs.create(isvc_manifest())
    fault = admin.add_fault(r"/inferenceservices/llama$", method="PATCH", status=409, count=1)
    with pytest.raises(ApiException) as conflict:
        isvcs.set_canary(10)
    assert conflict.value.status == 409
    assert isvcs.set_canary(10)["spec"]["predictor"]["canaryTrafficPercent"] == 10
    assert [entry["fault"] for entry in admin.requests(method="PATCH")] == [fault, None]
    assert admin.faults() == []


def test_an_injected_500_and_a_delay_on_reads(admin: EmulatorAdminClient, core: client.CoreV1Api) -> None:
    admin.add_fault("/configmaps", method="GET", status=500, count=2)
    for _ in range(2):
        with pytest.raises(ApiException) as failing:
            core.list_namespaced_config_map(NAMESPACE)
        assert failing.value.status == 500
    core.list_namespaced_config_map(NAMESPACE)
    admin.add_fault("/configmaps", method="GET", delay_seconds=0.3)
    began = time.monotonic()
    core.list_namespaced_config_map(NAMESPACE)
    assert time.monotonic() - began >= 0.3
    admin.add_fault("/configmaps", status=503, count=None)
    assert len(admin.faults()) == 1
    admin.clear_faults()
    core.list_namespaced_config_map(NAMESPACE)


def test_revision_behaviour_set_before_the_revision_exists_applies_when_it_is_created(
    emulator: Emulator, admin: EmulatorAdminClient, isvcs: Isvcs
) -> None:
    isvcs.create(isvc_manifest())
    admin.advance(1.5)
    applied = admin.set_revision_behaviour(NAMESPACE, REV2, readyAfterSeconds=None, failAfterSeconds=5,
                                           failureMessage="OOMKilled")  # fmt: skip
    assert applied["applied"] == "on-creation"
    isvcs.set_storage_uri("hf://meta/llama-3.1-8b", canary=10)
    admin.advance(0.5)
    revisions = admin.revisions(NAMESPACE, "llama")
    assert revisions["revisionCount"] == 2
    assert [(r["name"], r["state"]) for r in revisions["items"]] == [(REV1, "Ready"), (REV2, "Pending")]
    admin.advance(5)
    assert admin.revisions(NAMESPACE, "llama")["items"][1]["state"] == "Failed"
    assert isvcs.condition("PredictorConfigurationReady")["reason"] == "RevisionFailed"


def test_revision_state_can_be_forced_now(
    emulator: Emulator, admin: EmulatorAdminClient, isvcs: Isvcs
) -> None:
    admin.set_default_behaviour(NAMESPACE, "llama", readyAfterSeconds=None)
    isvcs.create(isvc_manifest())
    admin.advance(10)
    assert isvcs.condition("Ready")["status"] == "Unknown"
    admin.set_revision_state(NAMESPACE, REV1, "Ready")
    emulator.settle()
    assert isvcs.condition("Ready")["status"] == "True"
    emulator.set_revision_state(NAMESPACE, REV1, RevisionState.FAILED, "evicted")
    emulator.settle()
    assert "evicted" in isvcs.condition("PredictorReady")["message"]
    with pytest.raises(AdminApiError) as unknown:
        admin.set_revision_state(NAMESPACE, "nope-predictor-00001", "Ready")
    assert unknown.value.status == 404


def test_default_behaviour_per_inferenceservice_sets_replicas_and_readiness(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    emulator.set_default_behaviour(NAMESPACE, "llama", RevisionBehaviour(ready_after_seconds=120, replicas=3))
    isvcs.create(isvc_manifest())
    emulator.advance(60)
    assert len(core.list_namespaced_pod(NAMESPACE).items) == 3
    assert isvcs.condition("Ready")["status"] == "Unknown"
    emulator.advance(61)
    assert isvcs.condition("Ready")["status"] == "True"


def test_knative_service_view_shows_spec_traffic_and_generation(
    admin: EmulatorAdminClient, isvcs: Isvcs
) -> None:
    isvcs.create(isvc_manifest())
    admin.advance(1.5)
    isvcs.set_storage_uri("hf://meta/llama-3.1-8b", canary=10)
    admin.advance(0.5)
    ksvc = admin.knative_service(NAMESPACE, "llama")
    assert ksvc["spec"]["traffic"] == [
        {"latestRevision": True, "percent": 10},
        {"tag": "prev", "revisionName": REV1, "latestRevision": False, "percent": 90},
    ]
    assert ksvc["status"]["observedGeneration"] == ksvc["generation"]


def test_config_can_be_read_and_changed(admin: EmulatorAdminClient, emulator: Emulator) -> None:
    assert admin.config()["reconcileDelaySeconds"] == 0.5
    changed = admin.patch_config(reconcileDelaySeconds=2, scaleDownGraceSeconds=5)
    assert (changed["reconcileDelaySeconds"], changed["scaleDownGraceSeconds"]) == (2.0, 5.0)
    assert emulator.config.reconcile_delay == 2.0
    with pytest.raises(AdminApiError) as unknown:
        admin.patch_config(nonsense=1)
    assert unknown.value.status == 400


def test_clock_advance_needs_a_manual_clock() -> None:
    with EmulatorServer(Emulator(KServeConfig())) as server:
        admin = EmulatorAdminClient(server.url)
        assert admin.clock()["kind"] == "system"
        with pytest.raises(AdminApiError) as conflict:
            admin.advance(1)
        assert conflict.value.status == 409


def test_unknown_admin_paths_are_404_and_wrong_methods_405(server: EmulatorServer) -> None:
    assert raw_request(server.url, "GET", "/emulator/v1/nothing")[0] == 404
    assert raw_request(server.url, "POST", "/emulator/v1/requests")[0] == 405
    assert raw_request(server.url, "POST", "/emulator/v1/faults", {"path": "("})[0] == 400


def test_admin_requests_are_not_in_the_request_log(admin: EmulatorAdminClient) -> None:
    admin.clock()
    admin.faults()
    assert admin.requests() == []
