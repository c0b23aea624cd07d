"""Kubernetes RBAC, small and literal: what a request asks for, and whether rendered manifests allow it.

* :func:`attributes` turns an HTTP request into the attributes the apiserver authorises
  (namespace, API group, resource[/subresource], verb, name) — the apiserver's RequestInfo rules:
  GET on a collection is ``list`` (``watch`` with ``?watch=true``), GET on an object ``get``, POST
  ``create``, PUT ``update``, PATCH ``patch``, DELETE ``delete``/``deletecollection``.
* :func:`implied_by_body` adds what the apiserver's OwnerReferencesPermissionEnforcement admission
  plugin checks: an ownerReference with ``blockOwnerDeletion: true`` needs ``update`` on the owner's
  ``finalizers`` subresource.
* :class:`Authorizer` evaluates ClusterRoleBindings and RoleBindings for one service account the way
  the RBAC authorizer does (union of rules; ``resourceNames`` never match a request without a name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

# Owners whose finalizers subresource matters here: (apiVersion, kind) -> (group, plural).
KNOWN_OWNERS = {("serving.kserve.io/v1beta1", "InferenceService"): ("serving.kserve.io", "inferenceservices")}


@dataclass(frozen=True, order=True)
class Attributes:
    group: str
    resource: str
    verb: str
    namespace: str | None = None  # None: a cluster-scoped request (or a list across namespaces)
    name: str | None = None

    @property
    def triple(self) -> tuple[str, str, str]:
        return (self.group, self.resource, self.verb)

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else " cluster-wide"
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.resource}{'.' + self.group if self.group else ''}{named}{where}"


def attributes(method: str, path: str, query: str = "") -> Attributes | None:
    """The RBAC attributes of one resource request; None for non-resource URLs (discovery, /version)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None
    if not rest:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, name, subresource = (
        rest[0],
        rest[1] if len(rest) > 1 else None,
        rest[2] if len(rest) > 2 else None,
    )
    if resource == "namespaces" and name and namespace is None:
        namespace = name  # a namespace object is authorised within itself
    watch = parse_qs(query).get("watch", [""])[0].lower() in {"true", "1"}
    verb = {
        "GET": ("watch" if watch else "list") if name is None else "get",
        "HEAD": "get" if name else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if name else "deletecollection",
    }[method.upper()]
    return Attributes(group, f"{resource}/{subresource}" if subresource else resource, verb, namespace, name)


def implied_by_body(request: Attributes, body: Any) -> list[Attributes]:
    """Extra permissions a create/update body needs: blockOwnerDeletion -> update owner finalizers."""
    if request.verb not in {"create", "update", "patch"} or not isinstance(body, Mapping):
        return []
    implied = []
    for owner in (body.get("metadata") or {}).get("ownerReferences") or []:
        if not owner.get("blockOwnerDeletion"):
            continue
        key = (owner.get("apiVersion"), owner.get("kind"))
        if key not in KNOWN_OWNERS:
            raise AssertionError(f"an ownerReference to an unknown kind blocks deletion: {key}")
        group, plural = KNOWN_OWNERS[key]
        implied.append(
            Attributes(group, f"{plural}/finalizers", "update", request.namespace, owner.get("name"))
        )
    return implied


@dataclass(frozen=True)
class Rule:
    api_groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    resource_names: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, rule: Mapping[str, Any]) -> Rule:
        return cls(
            frozenset(rule.get("apiGroups") or []),
            frozenset(rule.get("resources") or []),
            frozenset(rule.get("verbs") or []),
            frozenset(rule.get("resourceNames") or []),
        )

    def allows(self, request: Attributes) -> bool:
        def has(values: frozenset[str], value: str) -> bool:
            return value in values or "*" in values

        return (
            has(self.api_groups, request.group)
            and has(self.resources, request.resource)
            and has(self.verbs, request.verb)
            and (
                not self.resource_names or (request.name is not None and request.name in self.resource_names)
            )
        )

    def grants(self) -> set[tuple[str, str, str]]:
        return {(g, r, v) for g in self.api_groups for r in self.resources for v in self.verbs}


@dataclass(frozen=True)
class Grant:
    """One rule as bound to the subject: where it applies (None: every namespace)."""

    role: str  # "ClusterRole/x" or "Role/ns/x"
    index: int
    rule: Rule
    namespace: str | None

    def allows(self, request: Attributes) -> bool:
        if self.namespace is not None and request.namespace != self.namespace:
            return False
        return self.rule.allows(request)

    def __str__(self) -> str:
        where = "every namespace" if self.namespace is None else f"namespace {self.namespace}"
        names = f" names {sorted(self.rule.resource_names)}" if self.rule.resource_names else ""
        return (
            f"{self.role} rule {self.index}: {sorted(self.rule.verbs)} on {sorted(self.rule.resources)}"
            f" in groups {sorted(self.rule.api_groups)}{names} ({where})"
        )


@dataclass
class Authorizer:
    """The grants of one service account in a set of rendered manifests."""

    grants: list[Grant] = field(default_factory=list)

    @classmethod
    def for_service_account(
        cls, manifests: Iterable[Mapping[str, Any]], namespace: str, name: str
    ) -> Authorizer:
        manifests = list(manifests)
        roles: dict[tuple[str, str | None, str], list[Rule]] = {}
        for manifest in manifests:
            if manifest["kind"] in {"Role", "ClusterRole"}:
                scope = manifest["metadata"].get("namespace") if manifest["kind"] == "Role" else None
                key = (manifest["kind"], scope, manifest["metadata"]["name"])
                roles[key] = [Rule.parse(rule) for rule in manifest.get("rules") or []]

        def bound(binding: Mapping[str, Any]) -> bool:
            return any(
                s.get("kind") == "ServiceAccount"
                and s.get("name") == name
                and s.get("namespace") == namespace
                for s in binding.get("subjects") or []
            )

        authorizer = cls()
        for binding in manifests:
            if binding["kind"] not in {"RoleBinding", "ClusterRoleBinding"} or not bound(binding):
                continue
            ref = binding["roleRef"]
            binding_namespace = (
                binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
            )
            role_scope = binding_namespace if ref["kind"] == "Role" else None
            key = (ref["kind"], role_scope, ref["name"])
            if key not in roles:
                raise AssertionError(
                    f"{binding['kind']} {binding['metadata']['name']} refers to missing {key}"
                )
            label = f"{ref['kind']}/{role_scope + '/' if role_scope else ''}{ref['name']}"
            for index, rule in enumerate(roles[key]):
                authorizer.grants.append(Grant(label, index, rule, binding_namespace))
        return authorizer

    def allowing(self, request: Attributes) -> list[Grant]:
        return [grant for grant in self.grants if grant.allows(request)]

    def allows(self, request: Attributes) -> bool:
        return bool(self.allowing(request))


def rules_of(manifests: Iterable[Mapping[str, Any]]) -> list[tuple[str, Rule]]:
    """Every rule of every Role and ClusterRole, with the role's name."""
    return [
        (f"{m['kind']}/{m['metadata']['name']}", Rule.parse(rule))
        for m in manifests
        if m["kind"] in {"Role", "ClusterRole"}
        for rule in m.get("rules") or []
    ]
