"""Custom objects against their CRD's structural schema: pruning, defaults, 422 Invalid causes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from canary_sandbox.emulator import EmulatorServer
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
    widget_schema,
)
from tests.sandbox.emulator.support import NAMESPACE, raw_request


def _invalid(call: Any) -> tuple[str, list[dict[str, str]]]:
    """(message, causes) of the 422 ``call`` must fail with."""
    with pytest.raises(ApiException) as error:
        call()
    assert error.value.status == 422
    body = json.loads(error.value.body)
    assert body["reason"] == "Invalid"
    assert body["details"]["kind"] == "Widget"
    assert body["details"]["group"] == WIDGET_GROUP
    return body["message"], body["details"]["causes"]


def test_unknown_field_outside_preserved_subtree_is_pruned(widgets: Widgets) -> None:
    created = widgets.create({**widget(typo=1), "topLevelJunk": {"a": 1}})
    assert "typo" not in created["spec"]
    assert "topLevelJunk" not in created
    assert "typo" not in widgets.get()["spec"]
    patched = widgets.patch({"spec": {"steps": [{"weight": 5, "unknown": True}]}})
    assert patched["spec"]["steps"] == [{"weight": 5}]


def test_unknown_field_inside_preserved_subtree_is_kept(widgets: Widgets) -> None:
    extra = {"anything": {"nested": [1, "two", {"three": 3}]}, "flag": True}
    created = widgets.create(widget(extra=extra))
    assert created["spec"]["extra"] == extra
    assert widgets.get()["spec"]["extra"] == extra


def test_additional_properties_map_keeps_its_keys_and_checks_its_values(widgets: Widgets) -> None:
    created = widgets.create(widget(selector={"app": "llama", "tier": "gpu"}))
    assert created["spec"]["selector"] == {"app": "llama", "tier": "gpu"}
    _, causes = _invalid(lambda: widgets.patch({"spec": {"selector": {"app": 3}}}))
    assert [c["field"] for c in causes] == ["spec.selector.app"]


def test_unknown_metadata_fields_are_dropped_and_labels_kept(widgets: Widgets) -> None:
    manifest = widget()
    manifest["metadata"].update(labels={"team": "ml"}, annotations={"a": "b"}, bogus="x")
    created = widgets.create(manifest)
    assert created["metadata"]["labels"] == {"team": "ml"}
    assert created["metadata"]["annotations"] == {"a": "b"}
    assert "bogus" not in created["metadata"]


def test_wrong_type_is_422_with_the_real_message(widgets: Widgets) -> None:
    message, causes = _invalid(lambda: widgets.create(widget(window=5)))
    assert causes == [
        {
            "reason": "FieldValueTypeInvalid",
            "message": 'Invalid value: "integer": spec.window in body must be of type string: "integer"',
            "field": "spec.window",
        }
    ]
    assert message == (
        f'Widget.{WIDGET_GROUP} "alpha" is invalid: spec.window: Invalid value: "integer": '
        'spec.window in body must be of type string: "integer"'
    )


def test_each_json_type_is_checked(widgets: Widgets) -> None:
    _, causes = _invalid(
        lambda: widgets.create(widget(replicas=1.5, ratio="high", enabled="yes", steps={"weight": 1}))
    )
    assert {c["field"]: c["message"] for c in causes} == {
        "spec.replicas": 'Invalid value: "number": spec.replicas in body must be of type integer: "number"',
        "spec.ratio": 'Invalid value: "string": spec.ratio in body must be of type number: "string"',
        "spec.enabled": 'Invalid value: "string": spec.enabled in body must be of type boolean: "string"',
        "spec.steps": 'Invalid value: "object": spec.steps in body must be of type array: "object"',
    }
    # an integer is a number
    assert widgets.create(widget(ratio=2))["spec"]["ratio"] == 2


def test_required_field_missing(widgets: Widgets) -> None:
    manifest = widget()
    del manifest["spec"]["window"]
    message, causes = _invalid(lambda: widgets.create(manifest))
    assert causes == [{"reason": "FieldValueRequired", "message": "Required value", "field": "spec.window"}]
    assert message.endswith("is invalid: spec.window: Required value")


def test_enum_violation(widgets: Widgets) -> None:
    _, causes = _invalid(lambda: widgets.create(widget(mode="Medium")))
    assert causes == [
        {
            "reason": "FieldValueNotSupported",
            "message": 'Unsupported value: "Medium": supported values: "Fast", "Slow"',
            "field": "spec.mode",
        }
    ]


def test_minimum_and_maximum(widgets: Widgets) -> None:
    _, causes = _invalid(lambda: widgets.create(widget(replicas=11)))
    assert (
        causes[0]["message"] == "Invalid value: 11: spec.replicas in body should be less than or equal to 10"
    )
    _, causes = _invalid(lambda: widgets.create(widget(replicas=-1)))
    assert (
        causes[0]["message"]
        == "Invalid value: -1: spec.replicas in body should be greater than or equal to 0"
    )


def test_string_length_and_pattern(widgets: Widgets) -> None:
    _, causes = _invalid(lambda: widgets.create(widget(owner="")))
    assert causes == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "": spec.owner in body should be at least 1 chars long',
            "field": "spec.owner",
        }
    ]
    _, causes = _invalid(lambda: widgets.create(widget(owner="much-too-long")))
    assert causes == [
        {
            "reason": "FieldValueTooLong",
            "message": "Too long: value is too long",
            "field": "spec.owner",
        }
    ]
    _, causes = _invalid(lambda: widgets.create(widget(window="five minutes")))
    assert causes[0]["message"] == (
        "Invalid value: \"five minutes\": spec.window in body should match '^[0-9]+[smh]$'"
    )


def test_array_items_are_checked_with_indexed_field_paths(widgets: Widgets) -> None:
    steps = [{"weight": 10}, {"weight": 101}, {"pause": "1m"}]
    _, causes = _invalid(lambda: widgets.create(widget(steps=steps)))
    assert [(c["field"], c["reason"]) for c in causes] == [
        ("spec.steps[1].weight", "FieldValueInvalid"),
        ("spec.steps[2].weight", "FieldValueRequired"),
    ]
    assert causes[0]["message"] == (
        "Invalid value: 101: spec.steps[1].weight in body should be less than or equal to 100"
    )


def test_min_and_max_items(widgets: Widgets) -> None:
    _, causes = _invalid(lambda: widgets.create(widget(steps=[])))
    assert causes == [
        {
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0: spec.steps in body should have at least 1 items",
            "field": "spec.steps",
        }
    ]
    _, causes = _invalid(lambda: widgets.create(widget(steps=[{"weight": 1}] * 4)))
    assert causes == [
        {
            "reason": "FieldValueTooMany",
            "message": "Too many: 4: has too many items",
            "field": "spec.steps",
        }
    ]


def test_int_or_string_accepts_both_and_refuses_others(widgets: Widgets) -> None:
    assert widgets.create(widget("a", maxSurge=2))["spec"]["maxSurge"] == 2
    assert widgets.create(widget("b", maxSurge="25%"))["spec"]["maxSurge"] == "25%"
    _, causes = _invalid(lambda: widgets.create(widget("c", maxSurge=True)))
    assert causes[0]["message"] == (
        'Invalid value: "boolean": spec.maxSurge in body must be of type integer,string: "boolean"'
    )


def test_null_is_kept_where_nullable_and_dropped_elsewhere(widgets: Widgets) -> None:
    created = widgets.create(widget(note=None, owner=None))
    assert "note" in created["spec"] and created["spec"]["note"] is None
    assert "owner" not in created["spec"]


def test_default_applied_on_create(widgets: Widgets) -> None:
    created = widgets.create(widget())
    assert created["spec"]["replicas"] == 1
    assert created["spec"]["mode"] == "Slow"
    # a null in a non-nullable field with a default is defaulted too
    assert widgets.create(widget("beta", replicas=None))["spec"]["replicas"] == 1


def test_default_applied_on_read_after_the_crd_gains_one(widgets: Widgets, server: EmulatorServer) -> None:
    widgets.create(widget())
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_CRD_NAME}"
    _, crd = raw_request(server.url, "GET", path)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"]["properties"]["owner"]["default"] = "nobody"
    status, _ = raw_request(server.url, "PUT", path, crd)
    assert status == 200
    assert widgets.get()["spec"]["owner"] == "nobody"
    listed = widgets.api.list_namespaced_custom_object(WIDGET_GROUP, WIDGET_VERSION, NAMESPACE, WIDGET_PLURAL)
    assert listed["items"][0]["spec"]["owner"] == "nobody"


def test_date_time_format_is_checked(widgets: Widgets) -> None:
    assert widgets.create(widget("a", startAt="2026-01-01T00:00:00Z"))["spec"]["startAt"]
    _, causes = _invalid(lambda: widgets.create(widget("b", startAt="tomorrow")))
    assert causes == [
        {
            "reason": "FieldValueTypeInvalid",
            "message": 'Invalid value: "tomorrow": spec.startAt in body must be of type date-time: "tomorrow"',
            "field": "spec.startAt",
        }
    ]


def test_patch_and_status_writes_are_validated(widgets: Widgets) -> None:
    widgets.create(widget())
    _, causes = _invalid(lambda: widgets.patch({"spec": {"replicas": "three"}}))
    assert causes[0]["field"] == "spec.replicas"
    _, causes = _invalid(lambda: widgets.patch_status({"status": {"observedGeneration": "one"}}))
    assert causes[0]["field"] == "status.observedGeneration"
    _, causes = _invalid(
        lambda: widgets.patch_status({"status": {"conditions": [{"type": "Ready", "status": "Maybe"}]}})
    )
    assert causes[0]["field"] == "status.conditions[0].status"
    assert widgets.get()["spec"]["replicas"] == 1  # nothing was written


def test_several_errors_are_reported_together(widgets: Widgets) -> None:
    message, causes = _invalid(lambda: widgets.create(widget(window=1, replicas=99)))
    assert len(causes) == 2
    assert message.startswith(f'Widget.{WIDGET_GROUP} "alpha" is invalid: [spec.window: ')


def test_crd_schema_with_a_default_of_the_wrong_type_is_refused(
    apiextensions: client.ApiextensionsV1Api,
) -> None:
    from tests.sandbox.emulator.conftest import widget_crd, widget_schema

    schema = widget_schema()
    schema["properties"]["spec"]["properties"]["replicas"]["default"] = "one"
    with pytest.raises(ApiException) as error:
        apiextensions.create_custom_resource_definition(widget_crd(schema=schema))
    assert error.value.status == 422
    (cause,) = json.loads(error.value.body)["details"]["causes"]
    assert (
        cause["field"]
        == "spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[replicas].default"
    )


def test_a_field_removed_from_the_schema_disappears_from_stored_objects(
    widgets: Widgets, server: EmulatorServer
) -> None:
    widgets.create(widget(owner="ml"))
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_CRD_NAME}"
    _, crd = raw_request(server.url, "GET", path)
    del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["owner"]
    assert raw_request(server.url, "PUT", path, crd)[0] == 200
    assert "owner" not in widgets.get()["spec"]


def _tighten_replicas_maximum(server: EmulatorServer, maximum: int) -> None:
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_CRD_NAME}"
    _, crd = raw_request(server.url, "GET", path)
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["replicas"][
        "maximum"
    ] = maximum
    assert raw_request(server.url, "PUT", path, crd)[0] == 200


def test_an_unchanged_invalid_value_is_ratcheted_on_update(widgets: Widgets, server: EmulatorServer) -> None:
    widgets.create(widget(replicas=8, steps=[{"weight": 1}]))
    _tighten_replicas_maximum(server, 5)  # the stored object is now invalid
    # status writes and spec changes elsewhere pass: spec.replicas did not change
    assert widgets.patch_status({"status": {"phase": "Running"}})["status"]["phase"] == "Running"
    assert widgets.patch({"spec": {"window": "9m"}})["spec"]["window"] == "9m"
    # changing the invalid value itself is validated
    _, causes = _invalid(lambda: widgets.patch({"spec": {"replicas": 9}}))
    assert [c["field"] for c in causes] == ["spec.replicas"]
    # creating one is validated too
    _, causes = _invalid(lambda: widgets.create(widget("beta", replicas=8)))
    assert [c["field"] for c in causes] == ["spec.replicas"]


def test_items_of_a_changed_list_are_not_ratcheted(widgets: Widgets, server: EmulatorServer) -> None:
    widgets.create(widget(steps=[{"weight": 90}]))
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_CRD_NAME}"
    _, crd = raw_request(server.url, "GET", path)
    step = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "steps"
    ]
    step["items"]["properties"]["weight"]["maximum"] = 50
    assert raw_request(server.url, "PUT", path, crd)[0] == 200
    assert widgets.patch({"spec": {"owner": "ml"}})["spec"]["owner"] == "ml"  # the list is unchanged
    _, causes = _invalid(lambda: widgets.patch({"spec": {"steps": [{"weight": 90}, {"weight": 10}]}}))
    assert [c["field"] for c in causes] == ["spec.steps[0].weight"]


def test_fields_an_older_crd_kept_are_pruned_on_read_once_a_new_one_is_applied(
    widgets: Widgets, apiextensions: client.ApiextensionsV1Api, custom: client.CustomObjectsApi
) -> None:
    """The apiserver prunes custom objects with the schema in force on every read from etcd, not only
    on writes: apiextensions-apiserver ``pkg/apiserver/customresource_handler.go``,
    ``crdConversionRESTOptionsGetter.GetRESTOptions`` wraps the storage codec in
    ``schemaCoercingDecoder{... validator: unstructuredSchemaCoercer{... structuralSchemas: ...,
    preserveUnknownFields: ...}}``, whose ``apply`` calls ``structuralpruning.Prune`` when unknown
    fields are not preserved. The object in etcd keeps them until its next write."""
    widgets.create(widget(extra={"kept": "under preserve-unknown-fields", "blob": "x" * 1000}))
    assert widgets.get()["spec"]["extra"]["blob"] == "x" * 1000
    crd = apiextensions.read_custom_resource_definition(WIDGET_CRD_NAME).to_dict()
    schema = widget_schema()
    schema["properties"]["spec"]["properties"]["extra"] = {
        "type": "object",
        "properties": {"kept": {"type": "string"}},
    }
    replaced = widget_crd(schema=schema)
    replaced["metadata"]["resourceVersion"] = crd["metadata"]["resource_version"]
    apiextensions.replace_custom_resource_definition(WIDGET_CRD_NAME, replaced)
    assert widgets.get()["spec"]["extra"] == {"kept": "under preserve-unknown-fields"}
    listed = custom.list_namespaced_custom_object(WIDGET_GROUP, WIDGET_VERSION, NAMESPACE, WIDGET_PLURAL)
    assert [item["spec"]["extra"] for item in listed["items"]] == [{"kept": "under preserve-unknown-fields"}]
