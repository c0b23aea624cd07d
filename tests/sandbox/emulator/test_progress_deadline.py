"""Knative's progress deadline in the emulator (issue #33, items 3 and 9).

Upstream, as read (knative/serving; kserve/kserve):

* pkg/reconciler/revision/resources/deploy.go ``MakeDeployment``: the Deployment's
  ``progressDeadlineSeconds`` is ``cfg.Deployment.ProgressDeadline``, overridden by the revision's
  ``serving.knative.dev/progress-deadline`` annotation.
* pkg/deployment/config.go (007ed564) lines 41-46: ``ProgressDeadlineDefault = 600 * time.Second``,
  ``ProgressDeadlineKey = "progress-deadline"``; ``NewConfigFromMap`` also reads the legacy
  ``progressDeadline``. config/core/configmaps/deployment.yaml (04597a16) line 53 ships the 600 s in
  its ``_example`` block: a cluster without the key has the built-in default.
* pkg/apis/serving/v1/revision_lifecycle.go (05b7ca7b) lines 172-241, ``PropagateAutoscalerStatus``:
  a PodAutoscaler that timed out before the scale target was initialised marks the revision
  ResourcesAvailable False, reason ``ProgressDeadlineExceeded`` (line 51), message "Initial scale was
  never achieved" (lines 234-235); the revision is scaled to zero.
* pkg/apis/serving/v1/configuration_lifecycle.go (109c92c6) lines 77-81, ``MarkLatestCreatedFailed``:
  the Configuration says ``RevisionFailed``, ``Revision "<name>" failed with message: <message>.``
  (the revision's Ready message, pkg/reconciler/configuration/configuration.go).
* kserve pkg/apis/serving/v1beta1/inference_service_status.go (0217bdab), ``PropagateStatus`` lines
  563-573 and 579-583: the Knative Service's Ready and ConfigurationsReady conditions become
  PredictorReady and PredictorConfigurationReady, reason and message kept (``SetCondition``, 589-599);
  ``PropagateCrossComponentStatus`` makes LatestDeploymentReady "PredictorConfigurationReady not ready".
"""

from __future__ import annotations

import pytest
from canary_sandbox.emulator import Emulator, RevisionBehaviour, RevisionState
from canary_sandbox.emulator import resources as r
from canary_sandbox.emulator.errors import ApiError

from tests.sandbox.emulator.support import NAMESPACE, Isvcs, isvc_manifest, latest_entry

REV1, REV2 = "llama-predictor-00001", "llama-predictor-00002"
NEVER = 'Revision "llama-predictor-00002" failed with message: Initial scale was never achieved.'
LOADS_12_MINUTES = RevisionBehaviour(ready_after_seconds=720)


def deploy_and_load_slowly(emulator: Emulator, isvcs: Isvcs, **manifest: object) -> None:
    """The first revision serves; the next one, a 70B model, needs 12 minutes to load."""
    isvcs.create(isvc_manifest(**manifest))  # type: ignore[arg-type]
    emulator.advance(1.5)
    emulator.set_revision_behaviour(NAMESPACE, REV2, LOADS_12_MINUTES)
    isvcs.set_storage_uri("hf://meta/llama-3.1-70b", canary=10)
    emulator.advance(0.5)  # KServe's reconcile: REV2 is created now


def knative_config(emulator: Emulator, data: dict[str, str]) -> None:
    emulator.create_namespace("knative-serving")
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "config-deployment", "namespace": "knative-serving"},
            "data": data,
        }
    )


def test_a_revision_not_ready_within_600_s_is_failed_as_knative_fails_it(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_and_load_slowly(emulator, isvcs)
    emulator.advance(599)
    assert isvcs.condition("PredictorReady")["status"] == "Unknown"
    emulator.advance(1.5)
    for kind in ("PredictorConfigurationReady", "PredictorReady"):
        condition = isvcs.condition(kind)
        assert (condition["status"], condition["reason"], condition["message"]) == (
            "False",
            "RevisionFailed",
            NEVER,
        ), kind
    assert isvcs.condition("LatestDeploymentReady")["reason"] == "PredictorConfigurationReady not ready"
    assert isvcs.condition("Ready")["status"] == "False"
    # Scaled to zero for good: loading would have finished at 720 s, it never becomes Ready.
    emulator.advance(600)
    (revision,) = [rev for rev in emulator.revisions(NAMESPACE, "llama") if rev["name"] == REV2]
    assert revision["state"] == "Failed"
    assert revision["pods"] == []
    assert not emulator.list_objects(r.PODS, NAMESPACE, f"serving.knative.dev/revision={REV2}")
    predictor = isvcs.predictor()
    assert (predictor["latestCreatedRevision"], predictor["latestReadyRevision"]) == (REV2, REV1)
    assert latest_entry(predictor["traffic"])["revisionName"] == REV1  # the stable revision serves
    assert isvcs.condition("PredictorReady")["message"] == NEVER


@pytest.mark.parametrize("where", ["metadata", "predictor"])
def test_the_progress_deadline_annotation_lets_a_slow_model_load(
    emulator: Emulator, isvcs: Isvcs, where: str
) -> None:
    annotation = {"serving.knative.dev/progress-deadline": "20m"}
    if where == "metadata":
        deploy_and_load_slowly(emulator, isvcs, annotations=annotation)
    else:
        deploy_and_load_slowly(emulator, isvcs)
        isvcs.patch({"spec": {"predictor": {"annotations": annotation}}})  # a new template: REV3
        emulator.set_revision_behaviour(NAMESPACE, "llama-predictor-00003", LOADS_12_MINUTES)
        emulator.advance(0.5)
    emulator.advance(721)
    predictor = isvcs.predictor()
    assert predictor["latestReadyRevision"] == predictor["latestCreatedRevision"]
    assert isvcs.condition("PredictorReady")["status"] == "True"


def test_the_cluster_default_comes_from_config_deployment(emulator: Emulator, isvcs: Isvcs) -> None:
    knative_config(emulator, {"progress-deadline": "15m"})
    deploy_and_load_slowly(emulator, isvcs)
    emulator.advance(721)
    assert isvcs.predictor()["latestReadyRevision"] == REV2


def test_the_legacy_config_deployment_key_is_read_and_the_new_one_wins(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    knative_config(emulator, {"progressDeadline": "15m", "progress-deadline": "300s"})
    deploy_and_load_slowly(emulator, isvcs)
    emulator.advance(301)
    assert isvcs.condition("PredictorReady")["message"] == NEVER


def test_a_revision_that_missed_its_deadline_cannot_be_forced_ready(emulator: Emulator, isvcs: Isvcs) -> None:
    deploy_and_load_slowly(emulator, isvcs)
    emulator.advance(601)
    with pytest.raises(ApiError) as refused:
        emulator.set_revision_state(NAMESPACE, REV2, RevisionState.READY)
    assert refused.value.code == 409


def test_a_revision_that_fails_before_its_deadline_keeps_its_own_message(
    emulator: Emulator, isvcs: Isvcs
) -> None:
    deploy_and_load_slowly(emulator, isvcs)
    crash = "Container failed with: CUDA error: out of memory"
    emulator.set_revision_behaviour(
        NAMESPACE,
        REV2,
        RevisionBehaviour(ready_after_seconds=None, fail_after_seconds=30, failure_message=crash),
    )
    emulator.advance(700)
    assert isvcs.condition("PredictorReady")["message"] == f'Revision "{REV2}" failed with message: {crash}.'
