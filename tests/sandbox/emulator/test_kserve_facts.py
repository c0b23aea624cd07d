"""The KServe behaviour layer against the KServe facts of docs/design.md §2.1–§2.3.

Each test is named after the fact it checks. Time is manual: ``emulator.advance`` runs what KServe and
Knative would do as the seconds pass (reconcile delay 0.5 s, revisions Ready after 1 s, unrouted
revisions scaled down after 30 s).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from canary_sandbox.emulator import (
    DEPLOYMENT_MODE_ANNOTATION,
    TAG_ROUTING_ANNOTATION,
    Emulator,
    RevisionBehaviour,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.sandbox.emulator.support import NAMESPACE, Isvcs, isvc_manifest, latest_entry, prev_entry

REV1, REV2, REV3 = "llama-predictor-00001", "llama-predictor-00002", "llama-predictor-00003"
FAILURE = "Container failed with: CUDA error: out of memory"


def deploy_stable(emulator: Emulator, isvcs: Isvcs, **manifest: Any) -> None:
    """The first revision, Ready and rolled out with 100%."""
    isvcs.create(isvc_manifest(**manifest))
    emulator.advance(1.5)
    assert isvcs.predictor()["latestRolledoutRevision"] == REV1


def start_canary(emulator: Emulator, isvcs: Isvcs, percent: int = 10) -> None:
    """A new model version with the first step, as GitOps would apply it; the canary becomes Ready."""
    isvcs.set_storage_uri("hf://meta/llama-3.1-8b", canary=percent)
    emulator.advance(1.5)
    assert isvcs.predictor()["latestReadyRevision"] == REV2


def pods(core: client.CoreV1Api, revision: str) -> list[client.V1Pod]:
    selector = f"serving.knative.dev/revision={revision}"
    items: list[client.V1Pod] = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return items


def test_first_deployment_gets_100_percent_regardless_of_canary_traffic_percent(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    emulator.config.knative_delay = 0.25  # to see the state before KServe reacts to the recorded rollout
    isvcs.create(isvc_manifest(canary=10))
    emulator.advance(1.75)  # created at 0.5 + 0.25, Ready 1 s later
    assert isvcs.traffic() == [{"revisionName": REV1, "latestRevision": True, "percent": 100}]
    predictor = isvcs.predictor()
    assert predictor["latestRolledoutRevision"] == REV1
    assert "previousRolledoutRevision" not in predictor
    # Once the rollout is recorded the field splits traffic as usual — between REV1 and itself.
    emulator.advance(0.5)
    traffic = isvcs.traffic()
    assert (latest_entry(traffic)["revisionName"], latest_entry(traffic)["percent"]) == (REV1, 10)
    assert (prev_entry(traffic)["revisionName"], prev_entry(traffic)["percent"]) == (REV1, 90)


def test_predictor_spec_change_creates_the_next_revision_as_latest_created_revision(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    isvcs.set_storage_uri("hf://meta/llama-3.1-8b", canary=10)
    emulator.advance(0.5)
    predictor = isvcs.predictor()
    assert predictor["latestCreatedRevision"] == REV2
    assert predictor["latestReadyRevision"] == REV1  # not Ready yet: compare before evaluating
    assert emulator.revision_count(NAMESPACE, "llama") == 2


def test_canary_entry_is_found_by_latest_revision_and_has_no_latest_tag_without_tag_routing(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    start_canary(emulator, isvcs, 10)
    traffic = isvcs.traffic()
    assert latest_entry(traffic) == {"revisionName": REV2, "latestRevision": True, "percent": 10}
    assert prev_entry(traffic) == {
        "tag": "prev",
        "revisionName": REV1,
        "latestRevision": False,
        "percent": 90,
        "url": "http://prev-llama-predictor.ml.example.com",
    }


def test_latest_tag_exists_only_with_the_enable_tag_routing_annotation(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs, annotations={TAG_ROUTING_ANNOTATION: "true"})
    start_canary(emulator, isvcs, 10)
    latest = latest_entry(isvcs.traffic())
    assert latest["tag"] == "latest"
    assert latest["url"] == "http://latest-llama-predictor.ml.example.com"


def test_never_ready_canary_gets_zero_traffic_and_the_stable_revision_appears_under_both_entries(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    emulator.set_revision_behaviour(NAMESPACE, REV2, RevisionBehaviour(ready_after_seconds=None))
    isvcs.set_storage_uri("hf://meta/llama-3.1-8b", canary=10)
    emulator.advance(60)
    traffic = isvcs.traffic()
    assert latest_entry(traffic) == {"revisionName": REV1, "latestRevision": True, "percent": 10}
    assert prev_entry(traffic)["revisionName"] == REV1
    assert prev_entry(traffic)["percent"] == 90
    predictor = isvcs.predictor()
    assert (predictor["latestCreatedRevision"], predictor["latestReadyRevision"]) == (REV2, REV1)


def test_conditions_are_unknown_while_the_canary_is_pending_and_false_with_revision_failed_once_it_fails(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    emulator.set_revision_behaviour(
        NAMESPACE,
        REV2,
        RevisionBehaviour(ready_after_seconds=None, fail_after_seconds=10, failure_message=FAILURE),
    )
    isvcs.set_storage_uri("hf://meta/llama-3.1-8b", canary=10)
    emulator.advance(0.5)
    for pending in ("PredictorConfigurationReady", "PredictorReady", "LatestDeploymentReady", "Ready"):
        assert isvcs.condition(pending)["status"] == "Unknown", pending
    assert isvcs.condition("LatestDeploymentReady")["reason"] == "PredictorConfigurationReady not ready"
    assert isvcs.condition("PredictorRouteReady")["status"] == "True"  # the stable revision serves
    emulator.advance(10)
    failed = isvcs.condition("PredictorConfigurationReady")
    assert (failed["status"], failed["reason"]) == ("False", "RevisionFailed")
    assert failed["message"] == f'Revision "{REV2}" failed with message: {FAILURE}.'
    assert isvcs.condition("PredictorReady")["status"] == "False"
    assert isvcs.condition("LatestDeploymentReady")["reason"] == "PredictorConfigurationReady not ready"
    assert isvcs.condition("Ready")["status"] == "False"
    assert isvcs.condition("Stopped")["status"] == "False"
    assert latest_entry(isvcs.traffic())["revisionName"] == REV1


def test_stepping_the_percentage_changes_only_traffic_and_creates_no_revision(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    start_canary(emulator, isvcs, 10)
    for step in (30, 50):
        isvcs.set_canary(step)
        emulator.advance(0.5)
        assert latest_entry(isvcs.traffic())["percent"] == step
        assert prev_entry(isvcs.traffic())["percent"] == 100 - step
    assert emulator.revision_count(NAMESPACE, "llama") == 2


def test_promotion_is_recorded_when_the_field_is_removed(emulator: Emulator, isvcs: Isvcs) -> None:
    deploy_stable(emulator, isvcs)
    start_canary(emulator, isvcs, 50)
    isvcs.set_canary(None)
    emulator.advance(0.5)
    predictor = isvcs.predictor()
    assert predictor["previousRolledoutRevision"] == REV1
    assert predictor["latestRolledoutRevision"] == REV2
    assert predictor["traffic"] == [{"revisionName": REV2, "latestRevision": True, "percent": 100}]


def test_leaving_100_promotes_and_makes_the_next_spec_change_go_straight_to_100_percent(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    start_canary(emulator, isvcs, 50)
    isvcs.set_canary(100)
    emulator.advance(0.5)
    assert isvcs.predictor()["latestRolledoutRevision"] == REV2
    isvcs.set_storage_uri("hf://meta/llama-3.2-8b")
    emulator.advance(1.5)
    assert isvcs.traffic() == [{"revisionName": REV3, "latestRevision": True, "percent": 100}]


def test_pin_back_with_zero_after_promotion_leaves_previous_rolled_out_revision_unchanged(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    start_canary(emulator, isvcs, 50)
    isvcs.set_canary(None)
    emulator.advance(0.5)
    isvcs.set_canary(0)
    emulator.advance(0.5)
    traffic = isvcs.traffic()
    assert latest_entry(traffic) == {"revisionName": REV2, "latestRevision": True, "percent": 0}
    assert prev_entry(traffic)["revisionName"] == REV1
    assert prev_entry(traffic)["percent"] == 100
    predictor = isvcs.predictor()
    assert predictor["latestRolledoutRevision"] == REV1
    assert predictor["previousRolledoutRevision"] == REV1


def test_rollback_to_zero_during_a_canary_sends_everything_to_the_last_rolled_out_revision(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    start_canary(emulator, isvcs, 10)
    isvcs.set_canary(0)
    emulator.advance(0.5)
    traffic = isvcs.traffic()
    assert latest_entry(traffic)["percent"] == 0
    assert (prev_entry(traffic)["revisionName"], prev_entry(traffic)["percent"]) == (REV1, 100)
    assert isvcs.predictor()["latestRolledoutRevision"] == REV1
    assert "previousRolledoutRevision" not in isvcs.predictor()


def test_status_trails_the_spec_by_a_reconcile(emulator: Emulator, isvcs: Isvcs) -> None:
    deploy_stable(emulator, isvcs)
    before = isvcs.get()["status"]
    isvcs.set_storage_uri("hf://meta/llama-3.1-8b", canary=10)
    assert isvcs.get()["status"] == before  # nothing has reconciled yet
    emulator.advance(0.4)
    assert isvcs.predictor()["latestCreatedRevision"] == REV1
    emulator.advance(0.1)
    assert isvcs.predictor()["latestCreatedRevision"] == REV2


def test_status_write_right_after_a_spec_change_can_carry_the_pre_update_knative_status(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    # KServe propagates the Knative status it read before updating the Knative Service; with Knative
    # slower than KServe, the status written by that reconcile still describes the old spec.
    deploy_stable(emulator, isvcs)
    emulator.config.knative_delay = 2.0
    generation_before = isvcs.get()["status"]["observedGeneration"]
    isvcs.set_storage_uri("hf://meta/llama-3.1-8b", canary=10)
    emulator.advance(0.5)
    status = isvcs.get()["status"]
    assert status["observedGeneration"] == generation_before
    assert status["components"]["predictor"]["latestCreatedRevision"] == REV1
    emulator.advance(2.0)
    assert isvcs.predictor()["latestCreatedRevision"] == REV2


def test_observed_generation_is_the_knative_service_generation_not_the_inferenceservices(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    isvcs.patch({"metadata": {"labels": {"team": "llm"}}})
    emulator.advance(0.5)
    isvc = isvcs.get()
    assert isvc["metadata"]["generation"] == 1  # labels are metadata: no InferenceService generation bump
    assert isvc["status"]["observedGeneration"] == 2  # but the Knative Service template changed


def test_any_annotation_change_creates_a_new_revision_and_restarts_pods(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    old_pods = {pod.metadata.name for pod in pods(core, REV1)}
    isvcs.patch({"metadata": {"annotations": {"kserve-canary.dev/state": "Progressing"}}})
    emulator.advance(1.5)
    assert emulator.revision_count(NAMESPACE, "llama") == 2
    assert isvcs.predictor()["latestRolledoutRevision"] == REV2  # field absent: a full switch
    assert {pod.metadata.name for pod in pods(core, REV2)}.isdisjoint(old_pods)
    isvcs.patch({"metadata": {"labels": {"owner": "someone"}}})
    emulator.advance(0.5)
    assert emulator.revision_count(NAMESPACE, "llama") == 3


def test_kubectl_last_applied_annotation_is_not_copied_into_the_revision(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    isvcs.patch({"metadata": {"annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}}})
    emulator.advance(1.0)
    assert emulator.revision_count(NAMESPACE, "llama") == 1


def test_raw_deployment_mode_silently_ignores_canary_traffic_percent(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    isvcs.create(isvc_manifest(annotations={DEPLOYMENT_MODE_ANNOTATION: "RawDeployment"}))
    emulator.advance(1.5)
    first_pods = {pod.metadata.name for pod in core.list_namespaced_pod(NAMESPACE).items}
    isvcs.set_storage_uri("hf://meta/llama-3.1-8b", canary=10)
    emulator.advance(1.5)
    status = isvcs.get()["status"]
    assert status["deploymentMode"] == "RawDeployment"
    assert status["components"]["predictor"].keys() <= {"url"}  # no revisions, no traffic split
    assert isvcs.condition("Ready")["status"] == "True"
    # A rolling update replaced every pod: nothing kept 90% on the old version.
    assert {pod.metadata.name for pod in core.list_namespaced_pod(NAMESPACE).items}.isdisjoint(first_pods)
    isvcs.set_canary(30)
    emulator.advance(1.5)
    assert emulator.revision_count(NAMESPACE, "llama") == 2


def test_the_deployment_mode_cannot_be_changed(emulator: Emulator, isvcs: Isvcs) -> None:
    deploy_stable(emulator, isvcs)
    with pytest.raises(ApiException) as denied:
        isvcs.patch({"metadata": {"annotations": {DEPLOYMENT_MODE_ANNOTATION: "RawDeployment"}}})
    assert denied.value.status == 403


def test_unrouted_revision_scales_down_after_promotion_so_a_later_rollback_meets_a_cold_start(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    start_canary(emulator, isvcs, 50)
    isvcs.set_canary(None)
    emulator.advance(0.5)
    assert len(pods(core, REV1)) == 1  # still inside the grace period
    emulator.advance(30)
    assert pods(core, REV1) == []
    isvcs.set_canary(0)  # pin back to the previous revision
    emulator.advance(0.5)
    (cold,) = pods(core, REV1)
    assert cold.status.phase == "Pending"
    emulator.advance(1.0)
    (warm,) = pods(core, REV1)
    assert warm.status.phase == "Running"


def test_pods_carry_knative_and_kserve_labels_and_follow_revision_readiness(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    isvcs.create(isvc_manifest())
    emulator.advance(0.5)
    (pod,) = pods(core, REV1)
    # <revision>-deployment-<pod-template-hash>-<5 random> while it fits (tests/sandbox/test_k8s_names.py)
    assert re.fullmatch(rf"{REV1}-deployment-[4-9bcdf]{{1,10}}-[a-z0-9]{{5}}", pod.metadata.name)
    assert (
        pod.metadata.labels.items()
        >= {
            "serving.kserve.io/inferenceservice": "llama",
            "component": "predictor",
            "serving.knative.dev/revision": REV1,
            "app": REV1,
            "serving.knative.dev/configuration": "llama-predictor",
            "serving.knative.dev/service": "llama-predictor",
        }.items()
    )
    assert [c.name for c in pod.spec.containers] == ["kserve-container", "queue-proxy"]
    assert [c.name for c in pod.spec.init_containers] == ["storage-initializer"]
    assert pod.status.phase == "Pending"
    emulator.advance(1.0)
    (ready,) = pods(core, REV1)
    assert ready.status.phase == "Running"
    assert {c.type: c.status for c in ready.status.conditions}["Ready"] == "True"


def test_a_canary_that_becomes_unready_mid_rollout_keeps_its_traffic_and_fails_its_conditions(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    emulator.set_revision_behaviour(
        NAMESPACE,
        REV2,
        RevisionBehaviour(ready_after_seconds=1, fail_after_seconds=20, failure_message=FAILURE),
    )
    start_canary(emulator, isvcs, 10)
    emulator.advance(20)
    predictor = isvcs.predictor()
    assert predictor["latestReadyRevision"] == REV2  # Knative does not take it back
    assert latest_entry(predictor["traffic"]) == {"revisionName": REV2, "latestRevision": True, "percent": 10}
    assert isvcs.condition("PredictorConfigurationReady")["reason"] == "RevisionFailed"
    (pod,) = pods(core, REV2)
    kserve_container = next(c for c in pod.status.container_statuses if c.name == "kserve-container")
    assert kserve_container.ready is False
    assert kserve_container.restart_count >= 1
    assert kserve_container.last_state.terminated.message == FAILURE


def test_a_new_spec_during_a_canary_replaces_the_canary_revision(emulator: Emulator, isvcs: Isvcs) -> None:
    deploy_stable(emulator, isvcs)
    start_canary(emulator, isvcs, 10)
    isvcs.set_storage_uri("hf://meta/llama-3.2-8b")
    emulator.advance(0.5)
    predictor = isvcs.predictor()
    assert predictor["latestCreatedRevision"] == REV3
    # Until the new revision is Ready, latestRevision still resolves to the previous canary.
    assert latest_entry(predictor["traffic"])["revisionName"] == REV2
    assert prev_entry(predictor["traffic"])["revisionName"] == REV1
    emulator.advance(1.0)
    assert latest_entry(isvcs.traffic())["revisionName"] == REV3


def test_empty_status_strings_are_omitted(emulator: Emulator, isvcs: Isvcs) -> None:
    isvcs.create(isvc_manifest())
    emulator.advance(0.5)

    def empty_values(node: Any, path: str = "status") -> list[str]:
        if isinstance(node, dict):
            return [p for key, value in node.items() for p in empty_values(value, f"{path}.{key}")]
        if isinstance(node, list):
            return [p for index, value in enumerate(node) for p in empty_values(value, f"{path}[{index}]")]
        return [path] if node in ("", None) else []

    status = isvcs.get()["status"]
    assert empty_values(status) == []
    assert "latestReadyRevision" not in status["components"]["predictor"]


def test_a_percentage_outside_0_to_100_is_accepted_by_the_api_but_refused_by_knative(
    emulator: Emulator, core: client.CoreV1Api, isvcs: Isvcs
) -> None:
    deploy_stable(emulator, isvcs)
    start_canary(emulator, isvcs, 10)
    isvcs.set_canary(150)  # int64 with no minimum or maximum in the CRD
    emulator.advance(0.5)
    assert latest_entry(isvcs.traffic())["percent"] == 10
    (event,) = core.list_namespaced_event(NAMESPACE, field_selector="reason=InternalError").items
    assert event.type == "Warning"
    assert "expected 0 <= 150 <= 100" in event.message
