"""The resources the emulator serves, and the discovery documents that describe them to clients.

``kubectl`` finds resources through discovery (``/api``, ``/apis``, ``/apis/<group>/<version>``); since
kubectl 1.30 it first asks for *aggregated* discovery (``apidiscovery.k8s.io/v2``) and falls back to the
per-group documents when the answer is plain JSON. Both are served here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "CONFIGMAPS",
    "EVENTS",
    "EVENTS_V1",
    "INFERENCESERVICES",
    "LEASES",
    "NAMESPACES",
    "PODS",
    "REGISTRY",
    "ResourceRegistry",
    "ResourceType",
]

JsonObject = dict[str, Any]

_ALL_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")
_STATUS_VERBS = ("get", "patch", "update")


@dataclass(frozen=True)
class ResourceType:
    """One served resource (a group/version/plural)."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    has_status_subresource: bool = False
    # Custom resources differ from built-in ones in ways clients notice: no strategic merge patch
    # (415), metadata.generation bumped on every change outside metadata and status.
    is_custom: bool = False
    # Resources sharing a storage key are two views of the same objects (core/v1 and
    # events.k8s.io/v1 Events).
    storage_key: str = ""
    # Field selectors the real apiserver supports for this resource besides metadata.name/namespace.
    extra_field_selectors: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified_resource(self) -> str:
        """How error messages name the resource: ``configmaps``, ``inferenceservices.serving.kserve.io``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def store_key(self) -> str:
        return self.storage_key or f"{self.group}/{self.plural}"

    def api_resource(self) -> list[JsonObject]:
        """Entries of an ``APIResourceList`` (the resource and its status subresource)."""
        entry: JsonObject = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(_ALL_VERBS),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        entries = [entry]
        if self.has_status_subresource:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": list(_STATUS_VERBS),
                }
            )
        return entries

    def aggregated_resource(self) -> JsonObject:
        """An ``APIResourceDiscovery`` entry of aggregated discovery (apidiscovery.k8s.io/v2)."""
        kind = {"group": self.group, "version": self.version, "kind": self.kind}
        entry: JsonObject = {
            "resource": self.plural,
            "responseKind": kind,
            "scope": "Namespaced" if self.namespaced else "Cluster",
            "singularResource": self.singular,
            "verbs": list(_ALL_VERBS),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        if self.categories:
            entry["categories"] = list(self.categories)
        if self.has_status_subresource:
            entry["subresources"] = [
                {"subresource": "status", "responseKind": kind, "verbs": list(_STATUS_VERBS)}
            ]
        return entry


NAMESPACES = ResourceType(
    "", "v1", "namespaces", "namespace", "Namespace", namespaced=False, short_names=("ns",),
    has_status_subresource=True, extra_field_selectors=("status.phase",),
)  # fmt: skip
PODS = ResourceType(
    "", "v1", "pods", "pod", "Pod", namespaced=True, short_names=("po",), categories=("all",),
    has_status_subresource=True, extra_field_selectors=("spec.nodeName", "status.phase", "status.podIP"),
)  # fmt: skip
CONFIGMAPS = ResourceType(
    "", "v1", "configmaps", "configmap", "ConfigMap", namespaced=True, short_names=("cm",)
)
_EVENT_FIELDS = (
    "involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
    "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
    "reason", "reportingComponent", "source", "type",
)  # fmt: skip
EVENTS = ResourceType(
    "", "v1", "events", "event", "Event", namespaced=True, short_names=("ev",),
    storage_key="events", extra_field_selectors=_EVENT_FIELDS,
)  # fmt: skip
EVENTS_V1 = ResourceType(
    "events.k8s.io", "v1", "events", "event", "Event", namespaced=True, short_names=("ev",),
    storage_key="events", extra_field_selectors=_EVENT_FIELDS,
)  # fmt: skip
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "lease", "Lease", namespaced=True)
INFERENCESERVICES = ResourceType(
    "serving.kserve.io", "v1beta1", "inferenceservices", "inferenceservice", "InferenceService",
    namespaced=True, short_names=("isvc",), has_status_subresource=True, is_custom=True,
)  # fmt: skip


class ResourceRegistry:
    """Lookup of served resources by URL segments or by apiVersion/kind, plus discovery documents."""

    def __init__(self, resources: list[ResourceType]) -> None:
        self.resources = list(resources)
        self._by_path = {(r.group, r.version, r.plural): r for r in resources}
        self._by_kind: dict[tuple[str, str], ResourceType] = {}
        for resource in resources:
            self._by_kind.setdefault((resource.api_version, resource.kind), resource)

    def by_path(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_path.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self._by_kind.get((api_version, kind))

    def group_versions(self) -> dict[str, list[str]]:
        """Named groups (not the legacy core group) and their versions, in registration order."""
        groups: dict[str, list[str]] = {}
        for resource in self.resources:
            if resource.group and resource.version not in groups.setdefault(resource.group, []):
                groups[resource.group].append(resource.version)
        return groups

    def served_kinds(self) -> set[tuple[str, str]]:
        return set(self._by_kind)

    # --- legacy discovery ---------------------------------------------------------------------------

    def api_versions(self, server_address: str) -> JsonObject:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }

    def api_group(self, group: str) -> JsonObject | None:
        versions = self.group_versions().get(group)
        if versions is None:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def api_group_list(self) -> JsonObject:
        groups = []
        for group in self.group_versions():
            document = self.api_group(group)
            assert document is not None
            groups.append({key: document[key] for key in ("name", "versions", "preferredVersion")})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def api_resource_list(self, group: str, version: str) -> JsonObject | None:
        matching = [r for r in self.resources if r.group == group and r.version == version]
        if not matching:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for resource in matching for entry in resource.api_resource()],
        }

    # --- aggregated discovery (apidiscovery.k8s.io/v2) ----------------------------------------------

    def aggregated(self, legacy: bool) -> JsonObject:
        """The ``APIGroupDiscoveryList`` for ``/api`` (legacy=True) or ``/apis``."""
        groups: dict[str, dict[str, list[JsonObject]]] = {}
        for resource in self.resources:
            if (resource.group == "") != legacy:
                continue
            versions = groups.setdefault(resource.group, {})
            versions.setdefault(resource.version, []).append(resource.aggregated_resource())
        items = [
            {
                "metadata": {"name": group, "creationTimestamp": None},
                "versions": [
                    {"version": version, "resources": resources, "freshness": "Current"}
                    for version, resources in versions.items()
                ],
            }
            for group, versions in groups.items()
        ]
        return {
            "kind": "APIGroupDiscoveryList",
            "apiVersion": "apidiscovery.k8s.io/v2",
            "metadata": {},
            "items": items,
        }


REGISTRY = ResourceRegistry([NAMESPACES, PODS, CONFIGMAPS, EVENTS, EVENTS_V1, LEASES, INFERENCESERVICES])
