"""Helpers shared by the emulator tests."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from kubernetes import client

GROUP, VERSION, PLURAL = "serving.kserve.io", "v1beta1", "inferenceservices"
NAMESPACE = "ml"

JsonObject = dict[str, Any]


def isvc_manifest(
    name: str = "llama",
    storage_uri: str = "hf://meta/llama-3-8b",
    canary: int | None = None,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    namespace: str = NAMESPACE,
) -> JsonObject:
    predictor: JsonObject = {"model": {"modelFormat": {"name": "huggingface"}, "storageUri": storage_uri}}
    if canary is not None:
        predictor["canaryTrafficPercent"] = canary
    metadata: JsonObject = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": {"predictor": predictor},
    }


class Isvcs:
    """InferenceService calls through the official client's CustomObjectsApi, over HTTP."""

    def __init__(self, api: client.CustomObjectsApi, namespace: str = NAMESPACE) -> None:
        self.api = api
        self.namespace = namespace

    def create(self, manifest: JsonObject) -> JsonObject:
        result: JsonObject = self.api.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, manifest
        )
        return result

    def get(self, name: str = "llama") -> JsonObject:
        result: JsonObject = self.api.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )
        return result

    def patch(self, patch: Any, name: str = "llama", content_type: str | None = None) -> JsonObject:
        """A JSON merge patch unless told otherwise (the client's default for custom objects)."""
        result: JsonObject = self.api.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name, patch, _content_type=content_type
        )
        return result

    def set_canary(self, percent: int | None, name: str = "llama") -> JsonObject:
        return self.patch({"spec": {"predictor": {"canaryTrafficPercent": percent}}}, name)

    def set_storage_uri(self, uri: str, canary: int | None = None, name: str = "llama") -> JsonObject:
        predictor: JsonObject = {"model": {"storageUri": uri}}
        if canary is not None:
            predictor["canaryTrafficPercent"] = canary
        return self.patch({"spec": {"predictor": predictor}}, name)

    def predictor(self, name: str = "llama") -> JsonObject:
        component: JsonObject = self.get(name).get("status", {}).get("components", {}).get("predictor", {})
        return component

    def traffic(self, name: str = "llama") -> list[JsonObject]:
        entries: list[JsonObject] = self.predictor(name).get("traffic", [])
        return entries

    def condition(self, kind: str, name: str = "llama") -> JsonObject:
        for condition in self.get(name).get("status", {}).get("conditions", []):
            if condition["type"] == kind:
                found: JsonObject = condition
                return found
        raise AssertionError(f"no {kind} condition")


def latest_entry(traffic: list[JsonObject]) -> JsonObject:
    """The canary's traffic entry, found the way the design says: by ``latestRevision: true``."""
    (entry,) = [target for target in traffic if target.get("latestRevision") is True]
    return entry


def prev_entry(traffic: list[JsonObject]) -> JsonObject:
    (entry,) = [target for target in traffic if target.get("tag") == "prev"]
    return entry


def raw_request(
    base_url: str, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> tuple[int, Any]:
    """A request without the client's own validation and content-type choices: (status, parsed body)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base_url + path, data=data, method=method)
    request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
