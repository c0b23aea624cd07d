"""The resources the emulator serves, and the discovery documents that describe them to clients.

``kubectl`` finds resources through discovery (``/api``, ``/apis``, ``/apis/<group>/<version>``); since
kubectl 1.30 it first asks for *aggregated* discovery (``apidiscovery.k8s.io/v2``) and falls back to the
per-group documents when the answer is plain JSON. Both are served here.

The registry is dynamic: the built-in kinds are always there, and every established
CustomResourceDefinition adds one :class:`ResourceType` per served version (and takes them away when it
is deleted). Each :class:`~canary_sandbox.emulator.store.ObjectStore` owns its registry, so CRDs created in
one emulator do not leak into another.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BUILTIN_RESOURCES",
    "CONFIGMAPS",
    "CUSTOMRESOURCEDEFINITIONS",
    "EVENTS",
    "EVENTS_V1",
    "INFERENCESERVICES",
    "LEASES",
    "NAMESPACES",
    "PODS",
    "REGISTRY",
    "SECRETS",
    "CustomResourceVersion",
    "ResourceRegistry",
    "ResourceType",
    "version_priority",
]

JsonObject = dict[str, Any]

_ALL_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")
_STATUS_VERBS = ("get", "patch", "update")


@dataclass(frozen=True)
class CustomResourceVersion:
    """What a CRD says about one of its versions: the schema and printer columns the emulator enforces.

    ``schema`` is the version's ``openAPIV3Schema`` as written in the CRD (a structural schema; the CRD's
    validation made sure of that).
    """

    crd_name: str
    schema: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    printer_columns: tuple[Mapping[str, Any], ...] = field(default=(), hash=False, compare=False)
    storage: bool = False


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
    # Set for resources served from a CustomResourceDefinition (None for the built-in kinds, including
    # InferenceServices, whose KServe CRD the emulator models by hand).
    crd: CustomResourceVersion | None = field(default=None, compare=False)

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
# Secrets: what a PromotionPolicy object's notification references read in its own namespace.
SECRETS = ResourceType("", "v1", "secrets", "secret", "Secret", namespaced=True)
LEASES = ResourceType("coordination.k8s.io", "v1", "leases", "lease", "Lease", namespaced=True)
INFERENCESERVICES = ResourceType(
    "serving.kserve.io", "v1beta1", "inferenceservices", "inferenceservice", "InferenceService",
    namespaced=True, short_names=("isvc",), has_status_subresource=True, is_custom=True,
)  # fmt: skip


_VERSION = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """A sort key putting versions in the apiserver's order: GA, then beta, then alpha, newest first;
    versions not shaped like Kubernetes versions last, alphabetically
    (``version.CompareKubeAwareVersionStrings``)."""
    match = _VERSION.match(version)
    if match is None:
        return (3, 0, 0, version)
    major, stage, minor = match.groups()
    rank = {None: 0, "beta": 1, "alpha": 2}[stage]
    return (rank, -int(major), -int(minor or 0), "")


@dataclass(frozen=True)
class _Index:
    resources: tuple[ResourceType, ...]
    by_path: Mapping[tuple[str, str, str], ResourceType]
    by_kind: Mapping[tuple[str, str], ResourceType]


class ResourceRegistry:
    """Lookup of served resources by URL segments or by apiVersion/kind, plus discovery documents.

    Writers (:meth:`set_custom`, :meth:`remove_custom`) run under the emulator's lock; readers may run
    without it (the HTTP handler resolves a URL before it takes the lock), so every change builds a
    new immutable index and swaps it in with one assignment: a reader sees the old or the new registry,
    never half of a change.
    """

    def __init__(self, resources: list[ResourceType]) -> None:
        self._builtin = tuple(resources)
        self._custom: dict[str, tuple[ResourceType, ...]] = {}
        self._index = self._build()

    def _build(self) -> _Index:
        resources = list(self._builtin)
        for name in sorted(self._custom):
            resources.extend(self._custom[name])
        by_kind: dict[tuple[str, str], ResourceType] = {}
        by_path: dict[tuple[str, str, str], ResourceType] = {}
        served: list[ResourceType] = []
        for resource in resources:
            # Built-ins come first and win: a CRD for a kind the emulator models by hand (KServe's
            # inferenceservices.serving.kserve.io, applied with KServe's manifests) is stored and
            # established, but the hand-made model keeps serving that resource.
            if (resource.group, resource.version, resource.plural) in by_path:
                continue
            by_path[(resource.group, resource.version, resource.plural)] = resource
            by_kind.setdefault((resource.api_version, resource.kind), resource)
            served.append(resource)
        return _Index(tuple(served), by_path, by_kind)

    def set_custom(self, crd_name: str, resources: list[ResourceType]) -> None:
        """Serve ``resources`` (a CRD's served versions) in place of what that CRD served before."""
        if resources:
            self._custom[crd_name] = tuple(resources)
        else:
            self._custom.pop(crd_name, None)
        self._index = self._build()

    def remove_custom(self, crd_name: str) -> None:
        self.set_custom(crd_name, [])

    def custom(self, crd_name: str) -> tuple[ResourceType, ...]:
        return self._custom.get(crd_name, ())

    def snapshot(self) -> ResourceRegistry:
        """A read-only view of the registry as it is now: one request's discovery documents and
        lookups agree with each other even while a CRD write changes the registry."""
        view = ResourceRegistry.__new__(ResourceRegistry)
        view._builtin = self._builtin
        view._custom = {}  # a view is never written to; its index is all it reads
        view._index = self._index
        return view

    @property
    def resources(self) -> tuple[ResourceType, ...]:
        return self._index.resources

    def by_path(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._index.by_path.get((group, version, plural))

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        return self._index.by_kind.get((api_version, kind))

    def group_versions(self) -> dict[str, list[str]]:
        """Named groups (not the legacy core group) and their versions, preferred version first."""
        groups: dict[str, list[str]] = {}
        for resource in self.resources:
            if resource.group and resource.version not in groups.setdefault(resource.group, []):
                groups[resource.group].append(resource.version)
        for group, versions in groups.items():
            if any(r.crd is not None for r in self.resources if r.group == group):
                # A CRD's group lists its versions in priority order, the first being preferred.
                versions.sort(key=version_priority)
        return groups

    def served_kinds(self) -> set[tuple[str, str]]:
        return set(self._index.by_kind)

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
        order = self.group_versions()
        for resource in self.resources:
            if (resource.group == "") != legacy:
                continue
            versions = groups.setdefault(resource.group, {})
            versions.setdefault(resource.version, []).append(resource.aggregated_resource())
        for group, versions in groups.items():
            if group in order:
                groups[group] = {v: versions[v] for v in order[group] if v in versions}
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


CUSTOMRESOURCEDEFINITIONS = ResourceType(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "customresourcedefinition",
    "CustomResourceDefinition", namespaced=False, short_names=("crd", "crds"),
    categories=("api-extensions",), has_status_subresource=True,
)  # fmt: skip

BUILTIN_RESOURCES = (
    NAMESPACES, PODS, CONFIGMAPS, SECRETS, EVENTS, EVENTS_V1, LEASES, INFERENCESERVICES,
    CUSTOMRESOURCEDEFINITIONS,
)  # fmt: skip
REGISTRY = ResourceRegistry(list(BUILTIN_RESOURCES))
"""The built-in kinds only; each store copies it (``ResourceRegistry(list(BUILTIN_RESOURCES))``) and adds
its CRDs' resources to its own copy."""
