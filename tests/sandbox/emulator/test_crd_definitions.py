"""CustomResourceDefinitions through the API: validation, status, discovery, deletion."""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.sandbox.emulator.conftest import (
    WIDGET_CRD_NAME,
    WIDGET_GROUP,
    WIDGET_PLURAL,
    WIDGET_VERSION,
    Widgets,
    widget,
    widget_crd,
)
from tests.sandbox.emulator.support import NAMESPACE, Isvcs, isvc_manifest, raw_request

AGGREGATED = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"


def _get(url: str, accept: str = "application/json") -> Any:
    request = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _causes(error: ApiException) -> list[dict[str, str]]:
    causes: list[dict[str, str]] = json.loads(error.body)["details"]["causes"]
    return causes


def _create_invalid(apiextensions: client.ApiextensionsV1Api, crd: dict[str, Any]) -> ApiException:
    with pytest.raises(ApiException) as error:
        apiextensions.create_custom_resource_definition(crd)
    assert error.value.status == 422
    assert json.loads(error.value.body)["reason"] == "Invalid"
    return error.value


def test_crd_create_reports_names_accepted_and_established(
    apiextensions: client.ApiextensionsV1Api, server: EmulatorServer
) -> None:
    apiextensions.create_custom_resource_definition(widget_crd())
    _, crd = raw_request(
        server.url, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_CRD_NAME}"
    )
    conditions = {c["type"]: (c["status"], c["reason"]) for c in crd["status"]["conditions"]}
    assert conditions == {
        "NamesAccepted": ("True", "NoConflicts"),
        "Established": ("True", "InitialNamesAccepted"),
    }
    assert crd["status"]["acceptedNames"] == {
        "plural": "widgets",
        "singular": "widget",
        "shortNames": ["wd"],
        "kind": "Widget",
        "listKind": "WidgetList",
    }
    assert crd["status"]["storedVersions"] == ["v1"]
    assert crd["metadata"]["generation"] == 1
    assert "customresourcecleanup.apiextensions.k8s.io" in crd["metadata"]["finalizers"]
    assert crd["spec"]["conversion"] == {"strategy": "None"}


def test_crd_name_must_be_plural_dot_group(apiextensions: client.ApiextensionsV1Api) -> None:
    error = _create_invalid(apiextensions, widget_crd(name="widget.test.emulator.dev"))
    assert _causes(error) == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "widget.test.emulator.dev": must be spec.names.plural+"."+spec.group',
            "field": "metadata.name",
        }
    ]
    assert (
        'CustomResourceDefinition.apiextensions.k8s.io "widget.test.emulator.dev" is invalid: metadata.name'
        in json.loads(error.body)["message"]
    )


def test_crd_needs_exactly_one_storage_version(apiextensions: client.ApiextensionsV1Api) -> None:
    crd = widget_crd()
    second = copy.deepcopy(crd["spec"]["versions"][0])
    second["name"] = "v2"
    crd["spec"]["versions"].append(second)  # both storage: true
    (cause,) = _causes(_create_invalid(apiextensions, crd))
    assert cause["field"] == "spec.versions"
    assert cause["message"].endswith("must have exactly one version marked as storage version")


def test_crd_version_needs_a_schema(apiextensions: client.ApiextensionsV1Api) -> None:
    crd = widget_crd()
    del crd["spec"]["versions"][0]["schema"]
    assert _causes(_create_invalid(apiextensions, crd)) == [
        {
            "reason": "FieldValueRequired",
            "message": "Required value: schemas are required",
            "field": "spec.versions[0].schema.openAPIV3Schema",
        }
    ]


def test_crd_names_are_validated(apiextensions: client.ApiextensionsV1Api) -> None:
    crd = widget_crd(name="Widgets.test.emulator.dev")
    crd["spec"]["names"].update(plural="Widgets", kind="Wid get", shortNames=["w_d"])
    crd["spec"]["scope"] = "Global"
    fields = {cause["field"] for cause in _causes(_create_invalid(apiextensions, crd))}
    assert {"spec.names.plural", "spec.names.kind", "spec.names.shortNames[0]", "spec.scope"} <= fields


def test_non_structural_schema_is_rejected_with_the_field_that_lacks_a_type(
    apiextensions: client.ApiextensionsV1Api,
) -> None:
    schema = {"type": "object", "properties": {"spec": {"properties": {"window": {"type": "string"}}}}}
    assert _causes(_create_invalid(apiextensions, widget_crd(schema=schema))) == [
        {
            "reason": "FieldValueRequired",
            "message": "Required value: must not be empty for specified object fields",
            "field": "spec.versions[0].schema.openAPIV3Schema.properties[spec].type",
        }
    ]


def test_array_schema_without_items_is_not_structural(apiextensions: client.ApiextensionsV1Api) -> None:
    schema = {"type": "object", "properties": {"steps": {"type": "array"}}}
    (cause,) = _causes(_create_invalid(apiextensions, widget_crd(schema=schema)))
    assert cause["field"] == "spec.versions[0].schema.openAPIV3Schema.properties[steps].items"
    assert cause["message"] == "Required value: must be specified"


def test_crd_served_versions_appear_in_legacy_discovery(widgets: Widgets, server: EmulatorServer) -> None:
    groups = _get(f"{server.url}/apis")["groups"]
    (group,) = [g for g in groups if g["name"] == WIDGET_GROUP]
    assert group["preferredVersion"] == {"groupVersion": f"{WIDGET_GROUP}/v1", "version": "v1"}
    resources = _get(f"{server.url}/apis/{WIDGET_GROUP}/{WIDGET_VERSION}")["resources"]
    assert [(r["name"], r["kind"], r["namespaced"]) for r in resources] == [
        ("widgets", "Widget", True),
        ("widgets/status", "Widget", True),
    ]
    assert resources[0]["shortNames"] == ["wd"]
    crd_resources = _get(f"{server.url}/apis/apiextensions.k8s.io/v1")["resources"]
    assert "customresourcedefinitions" in [r["name"] for r in crd_resources]


def test_crd_served_versions_appear_in_aggregated_discovery(widgets: Widgets, server: EmulatorServer) -> None:
    document = _get(f"{server.url}/apis", AGGREGATED)
    (group,) = [g for g in document["items"] if g["metadata"]["name"] == WIDGET_GROUP]
    (version,) = group["versions"]
    (resource,) = version["resources"]
    assert version["version"] == "v1"
    assert resource["resource"] == "widgets"
    assert resource["scope"] == "Namespaced"
    assert resource["responseKind"] == {"group": WIDGET_GROUP, "version": "v1", "kind": "Widget"}
    assert [s["subresource"] for s in resource["subresources"]] == ["status"]


def test_versions_are_served_in_priority_order_and_unserved_ones_are_not(
    apiextensions: client.ApiextensionsV1Api, custom: client.CustomObjectsApi, server: EmulatorServer
) -> None:
    crd = widget_crd()
    v1 = crd["spec"]["versions"][0]
    beta = {**copy.deepcopy(v1), "name": "v1beta1", "storage": False}
    alpha = {**copy.deepcopy(v1), "name": "v1alpha1", "storage": False, "served": False}
    crd["spec"]["versions"] = [beta, alpha, v1]
    apiextensions.create_custom_resource_definition(crd)
    (group,) = [g for g in _get(f"{server.url}/apis")["groups"] if g["name"] == WIDGET_GROUP]
    assert [v["version"] for v in group["versions"]] == ["v1", "v1beta1"]
    # one storage, two views: an object written as v1beta1 reads back as v1
    written = {**widget(), "apiVersion": f"{WIDGET_GROUP}/v1beta1"}
    custom.create_namespaced_custom_object(WIDGET_GROUP, "v1beta1", NAMESPACE, WIDGET_PLURAL, written)
    read = custom.get_namespaced_custom_object(WIDGET_GROUP, "v1", NAMESPACE, WIDGET_PLURAL, "alpha")
    assert read["apiVersion"] == f"{WIDGET_GROUP}/v1"
    status, _ = raw_request(
        server.url, "GET", f"/apis/{WIDGET_GROUP}/v1alpha1/namespaces/{NAMESPACE}/widgets"
    )
    assert status == 404


def test_objects_of_an_unknown_crd_are_404(server: EmulatorServer) -> None:
    status, body = raw_request(server.url, "GET", f"/apis/{WIDGET_GROUP}/v1/namespaces/{NAMESPACE}/widgets")
    assert status == 404
    assert body["reason"] == "NotFound"


def test_crd_spec_change_bumps_generation_and_serves_the_new_columns(
    widgets: Widgets, apiextensions: client.ApiextensionsV1Api, server: EmulatorServer
) -> None:
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_CRD_NAME}"
    patch = {"spec": {"names": {"shortNames": ["wd", "wdg"]}}}
    status, patched = raw_request(server.url, "PATCH", path, patch, "application/merge-patch+json")
    assert status == 200
    assert patched["metadata"]["generation"] == 2
    assert patched["status"]["acceptedNames"]["shortNames"] == ["wd", "wdg"]
    resources = _get(f"{server.url}/apis/{WIDGET_GROUP}/{WIDGET_VERSION}")["resources"]
    assert resources[0]["shortNames"] == ["wd", "wdg"]


def test_crd_group_is_immutable(widgets: Widgets, server: EmulatorServer) -> None:
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_CRD_NAME}"
    status, body = raw_request(
        server.url, "PATCH", path, {"spec": {"scope": "Cluster"}}, "application/merge-patch+json"
    )
    assert status == 422
    assert {c["field"] for c in body["details"]["causes"]} == {"spec.scope"}
    assert body["details"]["causes"][0]["message"] == 'Invalid value: "Cluster": field is immutable'


def test_kind_already_used_in_the_group_is_not_accepted(
    widgets: Widgets, apiextensions: client.ApiextensionsV1Api, server: EmulatorServer
) -> None:
    other = widget_crd(name=f"gadgets.{WIDGET_GROUP}")
    other["spec"]["names"] = {"plural": "gadgets", "singular": "gadget", "kind": "Widget"}
    apiextensions.create_custom_resource_definition(other)
    _, crd = raw_request(
        server.url, "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gadgets.{WIDGET_GROUP}"
    )
    conditions = {c["type"]: (c["status"], c["reason"]) for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": ("False", "KindConflict"), "Established": ("False", "NotAccepted")}
    status, _ = raw_request(server.url, "GET", f"/apis/{WIDGET_GROUP}/v1/namespaces/{NAMESPACE}/gadgets")
    assert status == 404


def _wait_until_gone(server: EmulatorServer, path: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if raw_request(server.url, "GET", path)[0] == 404:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} still exists")


def test_deleting_the_crd_removes_its_objects_and_discovery(
    widgets: Widgets, apiextensions: client.ApiextensionsV1Api, server: EmulatorServer
) -> None:
    widgets.create(widget("alpha"))
    widgets.create(widget("beta"))
    apiextensions.delete_custom_resource_definition(WIDGET_CRD_NAME)
    _wait_until_gone(server, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_CRD_NAME}")
    assert WIDGET_GROUP not in [g["name"] for g in _get(f"{server.url}/apis")["groups"]]
    aggregated = _get(f"{server.url}/apis", AGGREGATED)
    assert WIDGET_GROUP not in [g["metadata"]["name"] for g in aggregated["items"]]
    assert raw_request(server.url, "GET", f"/apis/{WIDGET_GROUP}/{WIDGET_VERSION}")[0] == 404
    # re-created, the CRD starts empty: its old objects were deleted, not hidden
    apiextensions.create_custom_resource_definition(widget_crd())
    assert (
        widgets.api.list_namespaced_custom_object(WIDGET_GROUP, WIDGET_VERSION, NAMESPACE, WIDGET_PLURAL)[
            "items"
        ]
        == []
    )


def test_objects_with_finalizers_hold_a_deleted_crd_and_block_new_objects(
    widgets: Widgets, apiextensions: client.ApiextensionsV1Api, server: EmulatorServer
) -> None:
    widgets.create({**widget(), "metadata": {"name": "alpha", "namespace": NAMESPACE, "finalizers": ["x/y"]}})
    apiextensions.delete_custom_resource_definition(WIDGET_CRD_NAME)
    time.sleep(0.5)
    crd = apiextensions.read_custom_resource_definition(WIDGET_CRD_NAME)
    assert crd.metadata.deletion_timestamp is not None
    assert {c.type: c.status for c in crd.status.conditions}["Terminating"] == "True"
    with pytest.raises(ApiException) as refused:
        widgets.create(widget("beta"))
    assert refused.value.status == 405
    widgets.patch({"metadata": {"finalizers": None}})
    _wait_until_gone(server, f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_CRD_NAME}")


def test_discovery_stays_consistent_while_crds_come_and_go(
    apiextensions: client.ApiextensionsV1Api, server: EmulatorServer
) -> None:
    stop = threading.Event()
    failures: list[str] = []

    def churn() -> None:
        for round_ in range(15):
            crd = widget_crd(name=f"r{round_}s.{WIDGET_GROUP}")
            crd["spec"]["names"] = {"plural": f"r{round_}s", "singular": f"r{round_}", "kind": f"R{round_}"}
            apiextensions.create_custom_resource_definition(crd)
            apiextensions.delete_custom_resource_definition(f"r{round_}s.{WIDGET_GROUP}")
        stop.set()

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    while not stop.is_set():
        for accept in ("application/json", AGGREGATED):
            try:
                document = _get(f"{server.url}/apis", accept)
            except urllib.error.HTTPError as error:
                failures.append(f"{accept}: {error.code}")
                continue
            groups = document.get("groups") or document.get("items") or []
            for group in groups:
                name = group.get("name") or group["metadata"]["name"]
                if name == WIDGET_GROUP and not group["versions"]:
                    failures.append(f"{accept}: a group without versions")
    thread.join(30)
    assert failures == []


def test_a_crd_for_inferenceservices_leaves_the_kserve_model_serving_them(
    apiextensions: client.ApiextensionsV1Api, emulator: Emulator, isvcs: Isvcs
) -> None:
    crd = widget_crd(name="inferenceservices.serving.kserve.io")
    crd["spec"]["group"] = "serving.kserve.io"
    crd["spec"]["names"] = {
        "plural": "inferenceservices",
        "singular": "inferenceservice",
        "kind": "InferenceService",
    }
    crd["spec"]["versions"][0]["name"] = "v1beta1"
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    apiextensions.create_custom_resource_definition(crd)
    isvcs.create(isvc_manifest())
    emulator.advance(2.0)
    assert emulator.revision_count(NAMESPACE, "llama") == 1
    assert isvcs.condition("Ready")["status"] == "True"
