"""x-kubernetes-validations: the CEL subset the emulator evaluates, and what it says about the rest."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from canary_sandbox.emulator import EmulatorServer
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.sandbox.emulator.conftest import (
    WIDGET_GROUP,
    WIDGET_PLURAL,
    WIDGET_VERSION,
    Widgets,
    widget,
    widget_crd,
)
from tests.sandbox.emulator.support import NAMESPACE, raw_request

UNSUPPORTED_RULE = "self.steps.all(s, s.weight > 0)"


def cel_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "x-kubernetes-validations": [
            {"rule": "self.metadata.name.startsWith('w')", "message": "names start with w"},
        ],
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [
                    {"rule": "self.minReplicas <= self.maxReplicas", "message": "min must not exceed max"},
                    {"rule": "!has(self.canary) || self.canary.size() > 0", "fieldPath": ".canary"},
                    {"rule": "self.window == oldSelf.window", "message": "window is immutable"},
                    {"rule": "self.mode in ['Fast', 'Slow'] && size(self.tags) <= 2 || self.mode == 'Any'"},
                    {"rule": "self.limit > 0"},
                    {
                        "rule": "!has(self.steps) || self.steps.filter(s, s.weight > 50).size() <= 1",
                        "message": "at most one step above 50",
                    },
                    {"rule": UNSUPPORTED_RULE},
                ],
                "properties": {
                    "window": {"type": "string"},
                    "minReplicas": {"type": "integer"},
                    "maxReplicas": {"type": "integer"},
                    "canary": {"type": "string"},
                    "mode": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "limit": {"type": "integer"},
                    "steps": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {"weight": {"type": "integer"}},
                            "x-kubernetes-validations": [
                                {"rule": "self.weight <= 100", "message": "at most 100"}
                            ],
                        },
                    },
                },
            },
        },
    }


def good(name: str = "wand", **changes: Any) -> dict[str, Any]:
    spec = {"minReplicas": 1, "maxReplicas": 3, "mode": "Fast", "tags": ["a"], "limit": 5, **changes}
    return widget(name, **spec)


def _request(
    url: str, method: str, body: Any, content_type: str = "application/json"
) -> tuple[int, Any, list[str]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method=method)
    request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), response.headers.get_all("Warning") or []
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers.get_all("Warning") or []


@pytest.fixture
def cel_widgets(apiextensions: client.ApiextensionsV1Api, custom: client.CustomObjectsApi) -> Widgets:
    apiextensions.create_custom_resource_definition(widget_crd(schema=cel_schema()))
    return Widgets(custom)


def _causes(call: Any) -> list[dict[str, str]]:
    with pytest.raises(ApiException) as error:
        call()
    assert error.value.status == 422
    causes: list[dict[str, str]] = json.loads(error.value.body)["details"]["causes"]
    return causes


def test_a_valid_object_passes_every_evaluated_rule(cel_widgets: Widgets) -> None:
    assert cel_widgets.create(good())["spec"]["minReplicas"] == 1


def test_a_failed_rule_reports_its_message_at_its_node(cel_widgets: Widgets) -> None:
    assert _causes(lambda: cel_widgets.create(good(minReplicas=5))) == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "object": min must not exceed max',
            "field": "spec",
        }
    ]


def test_a_rule_without_message_reports_the_rule_and_field_path_moves_the_error(cel_widgets: Widgets) -> None:
    assert _causes(lambda: cel_widgets.create(good(canary=""))) == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "object": failed rule: !has(self.canary) || self.canary.size() > 0',
            "field": "spec.canary",
        }
    ]


def test_root_rules_see_metadata(cel_widgets: Widgets) -> None:
    causes = _causes(lambda: cel_widgets.create(good("gadget")))
    assert causes == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "object": names start with w',
            "field": "<nil>",
        }
    ]


def test_in_list_size_and_boolean_operators(cel_widgets: Widgets) -> None:
    causes = _causes(lambda: cel_widgets.create(good(tags=["a", "b", "c"])))
    assert [c["field"] for c in causes] == ["spec"]
    assert "failed rule: self.mode in ['Fast', 'Slow']" in causes[0]["message"]
    assert cel_widgets.create(good("wide", mode="Any", tags=["a", "b", "c"]))["spec"]["mode"] == "Any"


def test_the_filter_macro_keeps_the_items_whose_predicate_holds(cel_widgets: Widgets) -> None:
    """``x.filter(v, p)`` as cel-go expands it (kubernetes/kubernetes
    vendor/github.com/google/cel-go/parser/macro.go, ``MakeFilter`` at 00e63227: a comprehension
    over the range whose step is ``p ? accu + [v] : accu``): the items for which ``p`` holds, in order."""
    causes = _causes(lambda: cel_widgets.create(good("wsteep", steps=[{"weight": 60}, {"weight": 70}])))
    assert [c["field"] for c in causes] == ["spec"]
    assert "at most one step above 50" in causes[0]["message"]
    kept = cel_widgets.create(good("wgentle", steps=[{"weight": 10}, {"weight": 60}]))
    assert kept["spec"]["steps"] == [{"weight": 10}, {"weight": 60}]


def test_a_missing_field_is_a_runtime_error_of_the_rule(cel_widgets: Widgets) -> None:
    manifest = good()
    del manifest["spec"]["limit"]
    assert _causes(lambda: cel_widgets.create(manifest)) == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "object": no such key: limit evaluating rule: self.limit > 0',
            "field": "spec",
        }
    ]


def test_rules_on_array_items_are_evaluated_per_item(cel_widgets: Widgets) -> None:
    causes = _causes(lambda: cel_widgets.create(good(steps=[{"weight": 10}, {"weight": 200}])))
    assert causes == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "object": at most 100',
            "field": "spec.steps[1]",
        }
    ]


def test_transition_rule_compares_with_the_stored_object_on_update_only(cel_widgets: Widgets) -> None:
    cel_widgets.create(good("wand"))  # no oldSelf on create: the transition rule does not run
    causes = _causes(lambda: cel_widgets.api.patch_namespaced_custom_object(
        WIDGET_GROUP, WIDGET_VERSION, NAMESPACE, WIDGET_PLURAL, "wand", {"spec": {"window": "9m"}}
    ))  # fmt: skip
    assert causes == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "object": window is immutable',
            "field": "spec",
        }
    ]
    patched = cel_widgets.api.patch_namespaced_custom_object(
        WIDGET_GROUP, WIDGET_VERSION, NAMESPACE, WIDGET_PLURAL, "wand", {"spec": {"limit": 7}}
    )
    assert patched["spec"]["limit"] == 7


def test_type_errors_keep_the_rules_from_running(cel_widgets: Widgets) -> None:
    causes = _causes(lambda: cel_widgets.create(good(minReplicas="many")))
    assert [c["field"] for c in causes] == ["spec.minReplicas", "<nil>"]
    assert causes[1]["message"].endswith(
        "some validation rules were not checked because the object was invalid; correct the existing errors "
        "to complete validation"
    )


def test_an_unsupported_rule_is_not_evaluated_and_the_client_is_told(
    apiextensions: client.ApiextensionsV1Api, server: EmulatorServer
) -> None:
    crd_url = f"{server.url}/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    status, _, warnings = _request(crd_url, "POST", widget_crd(schema=cel_schema()))
    assert status == 201
    assert any(UNSUPPORTED_RULE in warning and "does not evaluate" in warning for warning in warnings)
    objects = f"{server.url}/apis/{WIDGET_GROUP}/{WIDGET_VERSION}/namespaces/{NAMESPACE}/{WIDGET_PLURAL}"
    # the weight 0 breaks the unsupported rule; the emulator cannot know, accepts, and says so
    status, created, warnings = _request(objects, "POST", good(steps=[{"weight": 0}]))
    assert status == 201
    assert created["spec"]["steps"] == [{"weight": 0}]
    assert any(UNSUPPORTED_RULE in warning and "not checked" in warning for warning in warnings)


def test_a_runtime_error_names_the_rules_message_when_it_has_one(
    apiextensions: client.ApiextensionsV1Api, custom: client.CustomObjectsApi
) -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-validations": [
                    {"rule": "self.limit > 0", "message": "  limit must be positive "}
                ],
                "properties": {"window": {"type": "string"}, "limit": {"type": "integer"}},
            }
        },
    }
    apiextensions.create_custom_resource_definition(widget_crd(schema=schema))
    widgets = Widgets(custom)
    assert _causes(lambda: widgets.create(widget())) == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "object": no such key: limit evaluating rule: limit must be positive',
            "field": "spec",
        }
    ]
    assert _causes(lambda: widgets.create(widget(limit=0)))[0]["message"] == (
        'Invalid value: "object": limit must be positive'
    )


def test_a_rule_without_old_self_is_ratcheted_on_an_unchanged_value(
    apiextensions: client.ApiextensionsV1Api, custom: client.CustomObjectsApi, server: EmulatorServer
) -> None:
    loose = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {"window": {"type": "string"}, "limit": {"type": "integer"}},
            }
        },
    }
    apiextensions.create_custom_resource_definition(widget_crd(schema=loose))
    widgets = Widgets(custom)
    widgets.create(widget(limit=0))
    strict = json.loads(json.dumps(loose))
    strict["properties"]["spec"]["properties"]["limit"]["x-kubernetes-validations"] = [{"rule": "self > 0"}]
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{WIDGET_PLURAL}.{WIDGET_GROUP}"
    _, crd = raw_request(server.url, "GET", path)
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = strict
    assert raw_request(server.url, "PUT", path, crd)[0] == 200
    assert widgets.patch({"spec": {"window": "1m"}})["spec"]["window"] == "1m"  # limit unchanged
    assert _causes(lambda: widgets.patch({"spec": {"limit": -1}})) == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "integer": failed rule: self > 0',
            "field": "spec.limit",
        }
    ]
