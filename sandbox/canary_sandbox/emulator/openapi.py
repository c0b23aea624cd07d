"""OpenAPI v3 (``/openapi/v3``), only as much as ``kubectl apply``/``create``/``replace`` read.

kubectl's default ``--validate=strict`` asks the server to validate (``?fieldValidation=Strict``) when
the group-version's OpenAPI v3 document lists that query parameter on the resource's PATCH operation,
and otherwise validates on the client with OpenAPI v2, which the emulator does not serve (so kubectl
would stop with "failed to download openapi"). These documents therefore describe every served
resource's paths with their PATCH operation, its ``x-kubernetes-group-version-kind`` and the
``fieldValidation`` parameter, and for a CRD's resources the version's schema as a component.

PATCH operations do not offer ``application/strategic-merge-patch+json``: kubectl then computes a
strategic merge patch from its compiled-in types for the built-in kinds and a JSON merge patch for
custom resources, exactly as it does against a real server without OpenAPI components it can use.
``/openapi/v2`` stays 404 (kubectl copes).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from canary_sandbox.emulator import resources as r

__all__ = ["group_version_document", "index_document"]

JsonObject = dict[str, Any]

_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")


def _group_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _definition_name(resource: r.ResourceType) -> str:
    reversed_group = ".".join(reversed(resource.group.split("."))) if resource.group else "io.k8s.api.core"
    return f"{reversed_group}.{resource.version}.{resource.kind}"


def group_version_document(registry: r.ResourceRegistry, group: str, version: str) -> JsonObject | None:
    served = [x for x in registry.resources if x.group == group and x.version == version]
    if not served:
        return None
    paths: JsonObject = {}
    schemas: JsonObject = {}
    for resource in served:
        gvk = {"group": resource.group, "version": resource.version, "kind": resource.kind}
        prefix = f"/{_group_path(group, version)}"
        if resource.namespaced:
            prefix += "/namespaces/{namespace}"
        reference = {"$ref": f"#/components/schemas/{_definition_name(resource)}"}
        parameters = [
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
        ]
        item: JsonObject = {
            "get": {"x-kubernetes-action": "get", "x-kubernetes-group-version-kind": gvk},
            "put": {
                "x-kubernetes-action": "put",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": parameters,
            },
            "patch": {
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": parameters,
                "requestBody": {"content": {kind: {"schema": {"type": "object"}} for kind in _PATCH_TYPES}},
            },
            "delete": {"x-kubernetes-action": "delete", "x-kubernetes-group-version-kind": gvk},
        }
        paths[f"{prefix}/{resource.plural}/{{name}}"] = item
        paths[f"{prefix}/{resource.plural}"] = {
            "get": {"x-kubernetes-action": "list", "x-kubernetes-group-version-kind": gvk},
            "post": {
                "x-kubernetes-action": "post",
                "x-kubernetes-group-version-kind": gvk,
                "parameters": parameters,
                "requestBody": {"content": {"*/*": {"schema": reference}}},
            },
        }
        schema: JsonObject = (
            json.loads(json.dumps(resource.crd.schema))
            if resource.crd is not None
            else {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
        )
        schema["x-kubernetes-group-version-kind"] = [gvk]
        schemas[_definition_name(resource)] = schema
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def index_document(registry: r.ResourceRegistry) -> JsonObject:
    """``/openapi/v3``: where each group-version's document is, with a hash that changes with it (kubectl
    caches documents by URL)."""
    paths: JsonObject = {}
    seen: set[tuple[str, str]] = set()
    for resource in registry.resources:
        key = (resource.group, resource.version)
        if key in seen:
            continue
        seen.add(key)
        document = group_version_document(registry, *key)
        digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32].upper()
        path = _group_path(*key)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}
