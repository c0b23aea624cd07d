"""ValidatingAdmissionPolicy, small and literal: does a rendered policy admit one request?

The apiserver's algorithm for one policy and its Deny binding, with the CEL evaluated by cel-python
(a pure-Python CEL implementation): the request must match ``matchConstraints.resourceRules``
(group, version, resource, operation), then every ``matchCondition`` must be true, then
``variables`` are evaluated in order (each sees the earlier ones as ``variables.NAME``), and every
``validation`` that is false denies the request with its message.

cel-python lacks cel-go's heterogeneous equality (``map != null`` is an error there, not ``true``), so
the shipped expressions test ``request.operation`` instead of comparing ``object`` with null —
valid CEL for both. Kubernetes' extension libraries (``authorizer``, ``quantity``, ``url`` ...) are
not available in cel-python; the shipped policies use none of them (checked below by
:func:`kubernetes_extensions_used`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import celpy

# Functions only Kubernetes' CEL environment has (k8s.io/apiserver/pkg/cel/library).
KUBERNETES_EXTENSIONS = (
    "authorizer",
    "quantity",
    "isQuantity",
    "url",
    "isURL",
    "ip",
    "isIP",
    "cidr",
    "isCIDR",
    "format",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "join",
    "indexOf",
    "lastIndexOf",
    "isSorted",
    "sum",
    "min",
    "max",
)

_ENVIRONMENT = celpy.Environment()


@dataclass(frozen=True)
class Request:
    operation: str  # CREATE, UPDATE, DELETE
    username: str
    group: str
    version: str
    resource: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    namespace: str = "models"

    def as_cel(self) -> dict[str, Any]:
        return {
            "request": celpy.json_to_cel(
                {
                    "operation": self.operation,
                    "userInfo": {"username": self.username, "groups": ["system:serviceaccounts"]},
                    "namespace": self.namespace,
                    "resource": {"group": self.group, "version": self.version, "resource": self.resource},
                }
            ),
            "object": celpy.json_to_cel(dict(self.object)) if self.object is not None else None,
            "oldObject": celpy.json_to_cel(dict(self.old_object)) if self.old_object is not None else None,
        }


@dataclass(frozen=True)
class Verdict:
    applies: bool  # matched the rules and every matchCondition
    denials: tuple[str, ...] = ()

    @property
    def admitted(self) -> bool:
        return not self.denials


def evaluate(expression: str, activation: Mapping[str, Any]) -> Any:
    program = _ENVIRONMENT.program(_ENVIRONMENT.compile(expression))
    return program.evaluate(dict(activation))


def _rule_matches(rule: Mapping[str, Any], request: Request) -> bool:
    def has(values: list[str], value: str) -> bool:
        return value in values or "*" in values

    return (
        has(rule.get("apiGroups") or [], request.group)
        and has(rule.get("apiVersions") or [], request.version)
        and has(rule.get("resources") or [], request.resource)
        and has(rule.get("operations") or [], request.operation)
    )


def admit(policy: Mapping[str, Any], request: Request) -> Verdict:
    spec = policy["spec"]
    if not any(_rule_matches(rule, request) for rule in spec["matchConstraints"]["resourceRules"]):
        return Verdict(applies=False)
    activation = request.as_cel()
    for condition in spec.get("matchConditions") or []:
        if not bool(evaluate(condition["expression"], activation)):
            return Verdict(applies=False)
    variables: dict[str, Any] = {}
    for variable in spec.get("variables") or []:
        variables[variable["name"]] = evaluate(
            variable["expression"], {**activation, "variables": celpy.celtypes.MapType(variables)}
        )
    activation["variables"] = celpy.celtypes.MapType(
        {celpy.celtypes.StringType(k): v for k, v in variables.items()}
    )
    denials = []
    for validation in spec["validations"]:
        result = evaluate(validation["expression"], activation)
        if not isinstance(result, celpy.celtypes.BoolType):
            raise AssertionError(f"{validation['expression']!r} evaluated to {result!r}, not a bool")
        if not result:
            denials.append(" ".join(validation["message"].split()))
    return Verdict(applies=True, denials=tuple(denials))


def expressions(policy: Mapping[str, Any]) -> list[str]:
    spec = policy["spec"]
    return [
        *(c["expression"] for c in spec.get("matchConditions") or []),
        *(v["expression"] for v in spec.get("variables") or []),
        *(v["expression"] for v in spec["validations"]),
    ]


def kubernetes_extensions_used(policy: Mapping[str, Any]) -> set[str]:
    used = set()
    for expression in expressions(policy):
        code = re.sub(r'"(\\.|[^"\\])*"', '""', expression)  # not inside string literals
        for name in KUBERNETES_EXTENSIONS:
            if re.search(rf"\b{name}\s*\(", code):
                used.add(name)
    return used
