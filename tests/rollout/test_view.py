"""Reading InferenceService JSON (v1beta1, as KServe writes it) into the core's view."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canary.kserve.view import observe, predictor_fingerprint
from canary.rollout.observed import DeploymentMode, ObservedInferenceService, TrafficTarget

# Shaped after KServe's own canary example (tag routing on), trimmed to what matters.
CANARY_IN_PROGRESS: dict[str, Any] = {
    "apiVersion": "serving.kserve.io/v1beta1",
    "kind": "InferenceService",
    "metadata": {
        "name": "sklearn-iris",
        "namespace": "ml",
        "generation": 4,
        "resourceVersion": "91234",
        "annotations": {"serving.kserve.io/enable-tag-routing": "true"},
    },
    "spec": {
        "predictor": {
            "canaryTrafficPercent": 10,
            "model": {
                "modelFormat": {"name": "sklearn"},
                "storageUri": "gs://kfserving-examples/models/sklearn/2",
            },
        }
    },
    "status": {
        "deploymentMode": "Serverless",
        "observedGeneration": 3,
        "conditions": [
            {"type": "IngressReady", "status": "True"},
            {"type": "PredictorReady", "status": "True"},
            {"type": "Ready", "status": "True"},
            {"type": "Stopped", "status": "False"},
        ],
        "components": {
            "predictor": {
                "latestCreatedRevision": "sklearn-iris-predictor-00003",
                "latestReadyRevision": "sklearn-iris-predictor-00003",
                "latestRolledoutRevision": "sklearn-iris-predictor-00001",
                "previousRolledoutRevision": "",
                "traffic": [
                    {
                        "latestRevision": False,
                        "percent": 90,
                        "revisionName": "sklearn-iris-predictor-00001",
                        "tag": "prev",
                        "url": "http://prev-sklearn-iris-predictor.ml.example.com",
                    },
                    {
                        "latestRevision": True,
                        "percent": 10,
                        "revisionName": "sklearn-iris-predictor-00003",
                        "tag": "latest",
                        "url": "http://latest-sklearn-iris-predictor.ml.example.com",
                    },
                ],
            }
        },
    },
}


def test_a_canary_in_progress_is_read_as_kserve_reports_it() -> None:
    view = observe(CANARY_IN_PROGRESS)
    assert view.exists
    assert (view.namespace, view.name) == ("ml", "sklearn-iris")
    assert view.deployment_mode is DeploymentMode.KNATIVE
    assert view.deployment_mode_reported == "Serverless"
    assert view.generation == 4
    assert view.resource_version == "91234"
    assert view.canary_traffic_percent == 10
    assert view.latest_created_revision == "sklearn-iris-predictor-00003"
    assert view.latest_ready_revision == "sklearn-iris-predictor-00003"
    assert view.latest_rolledout_revision == "sklearn-iris-predictor-00001"
    assert view.previous_rolledout_revision is None  # empty strings are absent
    assert view.predictor_ready is True
    assert view.canary_ready
    assert view.revision_failure is None
    assert view.problems == ()
    assert view.weight_of("sklearn-iris-predictor-00003") == 10
    assert view.weight_of("sklearn-iris-predictor-00001") == 90
    assert view.weight_of(None) == 0
    assert view.stable_for("sklearn-iris-predictor-00003") == "sklearn-iris-predictor-00001"


def test_fingerprint_ignores_only_the_percentage() -> None:
    base = observe(CANARY_IN_PROGRESS).predictor_fingerprint
    other_percentage = copy.deepcopy(CANARY_IN_PROGRESS)
    other_percentage["spec"]["predictor"]["canaryTrafficPercent"] = 50
    assert observe(other_percentage).predictor_fingerprint == base
    removed = copy.deepcopy(CANARY_IN_PROGRESS)
    del removed["spec"]["predictor"]["canaryTrafficPercent"]
    assert observe(removed).predictor_fingerprint == base
    new_model = copy.deepcopy(CANARY_IN_PROGRESS)
    new_model["spec"]["predictor"]["model"]["storageUri"] = "gs://kfserving-examples/models/sklearn/3"
    assert observe(new_model).predictor_fingerprint != base
    assert base is not None
    assert base.startswith("sha256:")


def test_fingerprint_does_not_depend_on_key_order() -> None:
    one = {"model": {"storageUri": "s3://a", "modelFormat": {"name": "x"}}, "minReplicas": 1}
    other = {"minReplicas": 1, "model": {"modelFormat": {"name": "x"}, "storageUri": "s3://a"}}
    assert predictor_fingerprint(one) == predictor_fingerprint(other)


def test_latest_revision_entry_without_a_name_resolves_to_the_latest_ready_revision() -> None:
    isvc = copy.deepcopy(CANARY_IN_PROGRESS)
    isvc["status"]["components"]["predictor"]["traffic"] = [
        {"latestRevision": True, "percent": 10},
        {
            "latestRevision": False,
            "percent": 90,
            "revisionName": "sklearn-iris-predictor-00001",
            "tag": "prev",
        },
    ]
    view = observe(isvc)
    assert view.weight_of("sklearn-iris-predictor-00003") == 10
    assert view.traffic[0] == TrafficTarget(percent=10, revision_name=None, latest_revision=True, tag=None)


def test_a_canary_that_is_not_ready_gets_no_traffic_of_its_own() -> None:
    # latestRevision resolves to the latest *Ready* revision: the stable one under both entries.
    isvc = copy.deepcopy(CANARY_IN_PROGRESS)
    predictor = isvc["status"]["components"]["predictor"]
    predictor["latestReadyRevision"] = "sklearn-iris-predictor-00001"
    predictor["traffic"] = [
        {"latestRevision": True, "percent": 10, "revisionName": "sklearn-iris-predictor-00001"},
        {
            "latestRevision": False,
            "percent": 90,
            "revisionName": "sklearn-iris-predictor-00001",
            "tag": "prev",
        },
    ]
    isvc["status"]["conditions"][1] = {
        "type": "PredictorReady",
        "status": "Unknown",
        "reason": "RevisionMissing",
    }
    view = observe(isvc)
    assert not view.canary_ready
    assert view.predictor_ready is None
    assert view.weight_of("sklearn-iris-predictor-00003") == 0
    assert view.stable_for("sklearn-iris-predictor-00003") == "sklearn-iris-predictor-00001"


def test_revision_failed_condition_gives_the_failure_message() -> None:
    isvc = copy.deepcopy(CANARY_IN_PROGRESS)
    isvc["status"]["components"]["predictor"]["latestReadyRevision"] = "sklearn-iris-predictor-00001"
    message = 'Revision "sklearn-iris-predictor-00003" failed with message: OOMKilled.'
    isvc["status"]["conditions"] = [
        {"type": "PredictorReady", "status": "False", "reason": "RevisionFailed", "message": message},
        {"type": "Ready", "status": "False", "reason": "RevisionFailed", "message": message},
    ]
    view = observe(isvc)
    assert view.predictor_ready is False
    assert view.revision_failure == message
    assert not view.canary_ready


def test_a_ready_revision_turning_unready_is_not_ready() -> None:
    isvc = copy.deepcopy(CANARY_IN_PROGRESS)
    isvc["status"]["conditions"] = [
        {"type": "Ready", "status": "False", "reason": "RevisionMissing", "message": "CrashLoopBackOff"}
    ]
    view = observe(isvc)
    assert view.latest_created_revision == view.latest_ready_revision
    assert not view.canary_ready
    assert view.revision_failure == "CrashLoopBackOff"


@pytest.mark.parametrize(
    ("status_mode", "annotation", "expected"),
    [
        ("Serverless", None, DeploymentMode.KNATIVE),
        ("Knative", None, DeploymentMode.KNATIVE),
        ("RawDeployment", None, DeploymentMode.STANDARD),
        ("Standard", None, DeploymentMode.STANDARD),
        ("ModelMesh", None, DeploymentMode.MODEL_MESH),
        ("SomethingNew", None, DeploymentMode.UNKNOWN),
        (None, "RawDeployment", DeploymentMode.STANDARD),
        (None, "Serverless", DeploymentMode.KNATIVE),
        ("Serverless", "RawDeployment", DeploymentMode.KNATIVE),  # status wins over the annotation
    ],
)
def test_deployment_mode_from_status_then_annotation(
    status_mode: str | None, annotation: str | None, expected: DeploymentMode
) -> None:
    isvc = copy.deepcopy(CANARY_IN_PROGRESS)
    isvc["status"].pop("deploymentMode")
    isvc["status"]["components"] = {}
    if status_mode is not None:
        isvc["status"]["deploymentMode"] = status_mode
    if annotation is not None:
        isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] = annotation
    assert observe(isvc).deployment_mode is expected


def test_mode_is_knative_when_unreported_but_a_traffic_split_exists() -> None:
    isvc = copy.deepcopy(CANARY_IN_PROGRESS)
    isvc["status"].pop("deploymentMode")
    view = observe(isvc)
    assert view.deployment_mode is DeploymentMode.KNATIVE
    assert view.deployment_mode_reported is None


def test_a_fresh_inference_service_without_status() -> None:
    view = observe({"metadata": {"name": "new", "namespace": "ml"}, "spec": {"predictor": {"model": {}}}})
    assert view.exists
    assert view.deployment_mode is DeploymentMode.UNKNOWN
    assert view.latest_created_revision is None
    assert view.traffic == ()
    assert view.predictor_ready is None


def test_a_missing_inference_service() -> None:
    view = observe(None, namespace="ml", name="gone")
    assert view == ObservedInferenceService.missing("ml", "gone")
    assert not view.exists


def test_malformed_fields_are_reported_not_raised() -> None:
    isvc = copy.deepcopy(CANARY_IN_PROGRESS)
    isvc["metadata"]["generation"] = "four"
    isvc["spec"]["predictor"]["canaryTrafficPercent"] = True
    isvc["status"]["conditions"] = "broken"
    isvc["status"]["components"]["predictor"]["traffic"] = [{"percent": 12.5}, "junk"]
    view = observe(isvc)
    assert view.generation is None
    assert view.canary_traffic_percent is None
    assert view.predictor_ready is None
    assert view.traffic == (TrafficTarget(percent=0),)
    assert len(view.problems) == 5
    assert any("canaryTrafficPercent is a boolean" in problem for problem in view.problems)


def test_integral_floats_are_integers() -> None:
    isvc = copy.deepcopy(CANARY_IN_PROGRESS)
    isvc["spec"]["predictor"]["canaryTrafficPercent"] = 30.0
    assert observe(isvc).canary_traffic_percent == 30


def test_wrongly_typed_sections_are_reported() -> None:
    view = observe(
        {"metadata": [], "spec": "x", "status": {"components": {"predictor": 3}, "conditions": None}}
    )
    assert view.exists
    assert {problem.split(" ")[0] for problem in view.problems} == {
        "metadata",
        "spec",
        "status.components.predictor",
    }
    assert observe({"status": {"components": {"predictor": {"traffic": {}}}}}).problems == (
        "status.components.predictor.traffic is not a list",
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(
    metadata=JSON,
    predictor=JSON,
    status=st.fixed_dictionaries(
        {},
        optional={
            "deploymentMode": JSON,
            "conditions": JSON,
            "components": st.fixed_dictionaries({}, optional={"predictor": JSON}),
        },
    ),
)
def test_observe_never_raises_on_strange_inference_services(
    metadata: Any, predictor: Any, status: Any
) -> None:
    view = observe({"metadata": metadata, "spec": {"predictor": predictor}, "status": status})
    assert view.exists
    assert isinstance(view.problems, tuple)
