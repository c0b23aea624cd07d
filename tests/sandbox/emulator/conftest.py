from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig, ManualClock
from kubernetes import client, config

from tests.sandbox.emulator.support import NAMESPACE, Isvcs

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z: a fixed start makes timestamps reproducible


@pytest.fixture
def emulator() -> Emulator:
    """Manual time: tests step it with ``emulator.advance`` and see exactly what falls due."""
    emulator = Emulator(
        KServeConfig(reconcile_delay=0.5, revision_ready_delay=1.0, scale_down_grace=30.0),
        ManualClock(START),
        seed=7,
    )
    emulator.create_namespace(NAMESPACE)
    return emulator


@pytest.fixture
def server(emulator: Emulator) -> Iterator[EmulatorServer]:
    with EmulatorServer(emulator, bookmark_interval=0.2) as running:
        yield running


@pytest.fixture
def kubeconfig(server: EmulatorServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig.yaml")


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    yield api
    api.close()


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def isvcs(custom: client.CustomObjectsApi) -> Isvcs:
    return Isvcs(custom)


# --- CustomResourceDefinitions: a small CRD of the tests' own (test_crd_*.py) ------------------------

WIDGET_GROUP, WIDGET_VERSION, WIDGET_PLURAL = "test.emulator.dev", "v1", "widgets"
WIDGET_CRD_NAME = f"{WIDGET_PLURAL}.{WIDGET_GROUP}"


def widget_schema() -> dict[str, Any]:
    """The Widget CRD's v1 schema: one of every kind of constraint the emulator enforces."""
    step = {
        "type": "object",
        "required": ["weight"],
        "properties": {
            "weight": {"type": "integer", "minimum": 0, "maximum": 100},
            "pause": {"type": "string"},
        },
    }
    condition = {
        "type": "object",
        "required": ["type", "status"],
        "properties": {
            "type": {"type": "string"},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string"},
            "message": {"type": "string"},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
        },
    }
    return {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["window"],
                "properties": {
                    "window": {"type": "string", "pattern": "^[0-9]+[smh]$"},
                    "replicas": {"type": "integer", "minimum": 0, "maximum": 10, "default": 1},
                    "mode": {"type": "string", "enum": ["Fast", "Slow"], "default": "Slow"},
                    "maxSurge": {"x-kubernetes-int-or-string": True},
                    "owner": {"type": "string", "minLength": 1, "maxLength": 8},
                    "note": {"type": "string", "nullable": True},
                    "ratio": {"type": "number"},
                    "enabled": {"type": "boolean"},
                    "startAt": {"type": "string", "format": "date-time"},
                    "steps": {"type": "array", "minItems": 1, "maxItems": 3, "items": step},
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                    "selector": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
            "status": {
                "type": "object",
                "properties": {
                    "observedGeneration": {"type": "integer"},
                    "phase": {"type": "string"},
                    "weight": {"type": "number"},
                    "promoted": {"type": "boolean"},
                    "conditions": {"type": "array", "items": condition},
                },
            },
        },
    }


def widget_crd(
    *, status_subresource: bool = True, schema: dict[str, Any] | None = None, name: str = WIDGET_CRD_NAME
) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": WIDGET_VERSION,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema or widget_schema()},
        "additionalPrinterColumns": [
            {"name": "Window", "type": "string", "jsonPath": ".spec.window"},
            {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
            {"name": "Ready", "type": "string", "jsonPath": '.status.conditions[?(@.type=="Ready")].status'},
            {"name": "Weight", "type": "number", "jsonPath": ".status.weight", "priority": 1},
            {"name": "Promoted", "type": "boolean", "jsonPath": ".status.promoted", "priority": 1},
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ],
    }
    if status_subresource:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": WIDGET_GROUP,
            "scope": "Namespaced",
            "names": {"plural": WIDGET_PLURAL, "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [version],
        },
    }


def widget(name: str = "alpha", namespace: str = NAMESPACE, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{WIDGET_GROUP}/{WIDGET_VERSION}",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"window": "5m", **spec},
    }


class Widgets:
    """Widget calls through the official client's CustomObjectsApi, over HTTP."""

    def __init__(self, api: client.CustomObjectsApi, namespace: str = NAMESPACE) -> None:
        self.api = api
        self.namespace = namespace

    def create(self, manifest: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.api.create_namespaced_custom_object(
            WIDGET_GROUP, WIDGET_VERSION, manifest["metadata"].get("namespace", self.namespace),
            WIDGET_PLURAL, manifest,
        )  # fmt: skip
        return result

    def get(self, name: str = "alpha") -> dict[str, Any]:
        result: dict[str, Any] = self.api.get_namespaced_custom_object(
            WIDGET_GROUP, WIDGET_VERSION, self.namespace, WIDGET_PLURAL, name
        )
        return result

    def patch(self, patch: Any, name: str = "alpha") -> dict[str, Any]:
        result: dict[str, Any] = self.api.patch_namespaced_custom_object(
            WIDGET_GROUP, WIDGET_VERSION, self.namespace, WIDGET_PLURAL, name, patch
        )
        return result

    def patch_status(self, patch: Any, name: str = "alpha") -> dict[str, Any]:
        result: dict[str, Any] = self.api.patch_namespaced_custom_object_status(
            WIDGET_GROUP, WIDGET_VERSION, self.namespace, WIDGET_PLURAL, name, patch
        )
        return result

    def replace(self, body: dict[str, Any], name: str = "alpha") -> dict[str, Any]:
        result: dict[str, Any] = self.api.replace_namespaced_custom_object(
            WIDGET_GROUP, WIDGET_VERSION, self.namespace, WIDGET_PLURAL, name, body
        )
        return result

    def replace_status(self, body: dict[str, Any], name: str = "alpha") -> dict[str, Any]:
        result: dict[str, Any] = self.api.replace_namespaced_custom_object_status(
            WIDGET_GROUP, WIDGET_VERSION, self.namespace, WIDGET_PLURAL, name, body
        )
        return result

    def delete(self, name: str = "alpha") -> dict[str, Any]:
        result: dict[str, Any] = self.api.delete_namespaced_custom_object(
            WIDGET_GROUP, WIDGET_VERSION, self.namespace, WIDGET_PLURAL, name
        )
        return result


@pytest.fixture
def apiextensions(api_client: client.ApiClient) -> client.ApiextensionsV1Api:
    return client.ApiextensionsV1Api(api_client)


@pytest.fixture
def widgets(apiextensions: client.ApiextensionsV1Api, custom: client.CustomObjectsApi) -> Widgets:
    """The Widget CRD, created through the API (with its status subresource)."""
    apiextensions.create_custom_resource_definition(widget_crd())
    return Widgets(custom)
