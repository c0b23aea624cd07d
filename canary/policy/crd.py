"""The PromotionPolicy CustomResourceDefinition, generated from the pydantic models so it cannot drift.

The policy file's models (:mod:`canary.policy.model`) give ``spec``, the status model
(:mod:`canary.policy.status`) gives ``status``; :func:`crd_manifest` turns their JSON Schemas into
the *structural* OpenAPI v3 schema Kubernetes requires
(https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/#specifying-a-structural-schema):
every node has a type, no ``$ref``, no type inside ``anyOf``/``oneOf``, no ``additionalProperties:
false``, no ``const``, OpenAPI 3.0's boolean ``exclusiveMinimum``.

Some forms the file accepts have no structural equivalent (a number *or* a string, a number *or* an
object). Each such field is listed in :data:`DIVERGENCES`, the one place that says how the CRD differs
from the file and why; the generator refuses a union it finds that is not listed there, so a new
field cannot diverge silently (``tests/policy/test_crd_schema.py`` walks both schemas too).

No object keeps unknown fields: the API server prunes a field the schema does not name, as it does
for built-in objects, so a namespace editor cannot store data of its own in a PromotionPolicy for the
controller to cache. ``kubectl apply`` refuses such a field (server-side field validation
``Strict``, kubectl's default) and other clients get a ``Warning: unknown field`` answer; the only
untyped nodes are the unions listed in :data:`DIVERGENCES`, which hold one value each and which the
controller validates. Objects stored while an older CRD kept unknown fields lose them when read
(the API server prunes on decoding from etcd too) and are stored without them at their next write.

``kserve-canary schema --crd`` prints the manifest; ``make schema`` writes it to
``deploy/crds/promotionpolicies.yaml`` and ``charts/kserve-canary/crds/promotionpolicies.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import yaml
from pydantic import TypeAdapter

from canary.policy.model import API_VERSION, KIND, Duration, PolicySpec
from canary.policy.status import PromotionPolicyStatus

__all__ = [
    "CATEGORIES",
    "CEL_RULES",
    "CRD_NAME",
    "DIVERGENCES",
    "GROUP",
    "PLURAL",
    "PRINTER_COLUMNS",
    "SERVER_SET_METADATA",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "Divergence",
    "DivergenceKind",
    "crd_manifest",
    "crd_yaml",
    "policy_document",
    "walk_properties",
]

GROUP, _, VERSION = API_VERSION.partition("/")
PLURAL = "promotionpolicies"
SINGULAR = "promotionpolicy"
# Not "pp": Karmada's PropagationPolicy (policy.karmada.io, which can share the cluster's API server)
# has it, and kubectl resolves a short name to one resource only.
SHORT_NAMES = ("ppol",)
CATEGORIES = ("kserve-canary",)  # `kubectl get kserve-canary`
CRD_NAME = f"{PLURAL}.{GROUP}"

# ObjectMeta fields the API server sets or that only make sense on a stored object; a manifest
# fetched with `kubectl get -o yaml` carries them and they say nothing about the policy.
SERVER_SET_METADATA = frozenset(
    {
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
        "finalizers",
        "ownerReferences",
        "generateName",
    }
)


class DivergenceKind(StrEnum):
    DURATION = "duration"  # number-or-string -> x-kubernetes-int-or-string (whole seconds as numbers)
    ANY_VALUE = (
        "any-value"  # number-or-string / number-or-object -> no type (kept, validated by the controller)
    )
    GLOBAL = "global"  # not one field: a rule about the whole object


@dataclass(frozen=True)
class Divergence:
    """Where the CRD accepts something else than the policy file, and why."""

    path: str  # "spec.checks[].max"; for GLOBAL a short name
    kind: DivergenceKind
    file: str  # what the policy file (pydantic) accepts
    crd: str  # what the API server accepts
    reason: str


_INT_OR_STRING_WHY = (
    "a structural schema has no number-or-string type; x-kubernetes-int-or-string is the nearest, so a "
    'fractional number of seconds must be written as a string ("1.5s", "1500ms")'
)
_ANY_VALUE_WHY = (
    "a structural schema has no number-or-string type and int-or-string would refuse fractions such as "
    "0.2; the node is left untyped (x-kubernetes-preserve-unknown-fields) and the controller validates it"
)


def _duration(path: str) -> Divergence:
    return Divergence(
        path,
        DivergenceKind.DURATION,
        'a duration string ("10m") or a number of seconds, fractions included',
        "a duration string or a whole number of seconds",
        _INT_OR_STRING_WHY,
    )


def _any_value(path: str, file: str) -> Divergence:
    return Divergence(path, DivergenceKind.ANY_VALUE, file, "any value", _ANY_VALUE_WHY)


_RATIO = 'a percentage ("20%") or a fraction (0.2)'
_LIMIT = 'a number or a string in the check\'s unit ("800ms", "1%", "70Gi")'

# The one list of differences between the policy file and the custom resource.
DIVERGENCES: tuple[Divergence, ...] = (
    _duration("spec.window"),
    _duration("spec.horizon"),
    _duration("spec.interval"),
    _duration("spec.progressDeadline"),
    _duration("spec.bake"),
    _duration("spec.onNoData.after"),
    _duration("spec.gates[].deadline"),
    _duration("spec.gates[].webhook.timeout"),
    Divergence(
        "spec.steps[]",
        DivergenceKind.ANY_VALUE,
        "a weight (10) or a step object ({weight: 50, window: 20m, horizon: 40m, minRequests: 2000, "
        "approval: manual})",
        "any value",
        "a structural schema cannot say number-or-object; so the step object's fields (window, horizon, "
        "minRequests, approval) and the increasing order are checked by the controller only",
    ),
    _any_value("spec.confidence", _RATIO),
    _any_value("spec.checks[].maxIncrease", _RATIO),
    _any_value("spec.checks[].maxFraction", _RATIO),
    _any_value("spec.checks[].tolerance", _RATIO),
    _any_value("spec.checks[].max", _LIMIT),
    _any_value("spec.checks[].min", _LIMIT),
    _any_value("spec.checks[].minStable", _LIMIT),
    Divergence(
        "unknown-fields",
        DivergenceKind.GLOBAL,
        "an unknown field is an error",
        "unknown fields under spec are kept",
        "so a typo reaches the controller, which reports it (PolicyValid=False, reason InvalidSpec) "
        "instead of the API server pruning it silently",
    ),
    Divergence(
        "defaults",
        DivergenceKind.GLOBAL,
        "omitted fields take their documented defaults",
        "no defaults in the schema",
        "the controller applies the defaults when it reads the object; API-server defaulting would "
        "store today's defaults in every object and freeze them there",
    ),
    Divergence(
        "cross-field-rules",
        DivergenceKind.GLOBAL,
        "every rule of the policy reference (steps increasing, window >= interval, unique check "
        "names, units of limits, ...)",
        "the few rules CEL says simply (CEL_RULES), and unique check names (a list keyed by name)",
        "the rest needs the parsed units or list indices that Kubernetes 1.25's CEL lacks; the "
        "controller checks all of them",
    ),
    Divergence(
        "metadata",
        DivergenceKind.GLOBAL,
        "name, namespace (or the directory), labels and annotations; nothing else",
        "any ObjectMeta (the API server validates it); namespace is always set",
        "metadata belongs to the API server; server-set fields (uid, resourceVersion, managedFields, "
        "...) are ignored by the controller and by `kserve-canary validate` (policy_document)",
    ),
    Divergence(
        "snake-case",
        DivergenceKind.GLOBAL,
        "snake_case spellings of fields (min_requests) as well as camelCase",
        "camelCase fields only in the schema; a snake_case one is kept as an unknown field",
        "the models accept Python names for programmatic use; the CEL rules look only at camelCase "
        "names, so write camelCase in a manifest",
    ),
)


@dataclass(frozen=True)
class CelRule:
    path: str  # the object node it is attached to
    rule: str
    message: str


# Cross-field rules of the models that CEL says in one line (presence only: constant cost, and
# valid on Kubernetes 1.25, where CEL rules are beta and on by default). Each mirrors a
# model_validator; tests/policy/test_crd_schema.py evaluates them against the models.
_ONE_SECRET = ("has(self.env) != has(self.file)", "give exactly one of 'env' or 'file'")
CEL_RULES: tuple[CelRule, ...] = (
    CelRule(
        "spec.checks[]",
        "has(self.metric) != has(self.promql)",
        "a check needs exactly one of 'metric' (a builtin metric) or 'promql' (a custom query)",
    ),
    CelRule(
        "spec.checks[]",
        "has(self.max) || has(self.min) || has(self.maxIncrease) || has(self.maxFraction)",
        "a check needs a limit: max, min, maxIncrease or maxFraction",
    ),
    CelRule(
        "spec.checks[]",
        "!has(self.minStable) || has(self.maxIncrease)",
        "'minStable' is the floor of 'maxIncrease'; set maxIncrease too",
    ),
    CelRule(
        "spec.notify[]",
        "(has(self.slack) ? 1 : 0) + (has(self.teams) ? 1 : 0) + (has(self.discord) ? 1 : 0)"
        " + (has(self.webhook) ? 1 : 0) == 1",
        "each notify entry needs exactly one of 'slack', 'teams', 'discord' or 'webhook'",
    ),
    CelRule("spec.notify[].slack.webhookUrlFrom", *_ONE_SECRET),
    CelRule("spec.notify[].teams.webhookUrlFrom", *_ONE_SECRET),
    CelRule("spec.notify[].discord.webhookUrlFrom", *_ONE_SECRET),
    CelRule("spec.notify[].webhook.urlFrom", *_ONE_SECRET),
    CelRule("spec.notify[].webhook.secretFrom", *_ONE_SECRET),
    CelRule("spec.gates[].webhook.urlFrom", *_ONE_SECRET),
    CelRule("spec.gates[].webhook.secretFrom", *_ONE_SECRET),
)

# Lists whose items are identified by a key: the API server refuses duplicate keys (the models'
# unique check names) and server-side apply merges them by key instead of replacing the list.
_LIST_MAP_KEYS = {
    "spec.checks": "name",
    "status.checks": "name",
    "status.conditions": "type",
}

PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Target", "type": "string", "jsonPath": ".spec.target.inferenceService"},
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Weight", "type": "integer", "jsonPath": ".status.weight"},
    {"name": "Step", "type": "string", "jsonPath": ".status.step"},
    {"name": "Verdict", "type": "string", "jsonPath": ".status.lastDecision.verdict"},
    {"name": "Canary", "type": "string", "jsonPath": ".status.canaryRevision", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)

# JSON Schema keywords a structural schema keeps as they are (value validations and docs).
_KEPT = (
    "description",
    "enum",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
)
_SCALARS = {"string", "number", "integer", "boolean"}
_NULL = {"type": "null"}


class _Converter:
    """JSON Schema (pydantic, draft 2020-12) -> structural OpenAPI v3 schema, one model at a time."""

    def __init__(self, schema: Mapping[str, Any], *, keep_unknown: bool) -> None:
        self.definitions: Mapping[str, Any] = schema.get("$defs", {})
        self.keep_unknown = keep_unknown
        self.duration = _without_description(TypeAdapter(Duration).json_schema())
        self.found: dict[str, DivergenceKind] = {}

    def resolve(self, node: Mapping[str, Any]) -> dict[str, Any]:
        """Inline a ``$ref``; the referring node's own keys (its description) win."""
        resolved = dict(node)
        while "$ref" in resolved:
            name = resolved.pop("$ref").rsplit("/", 1)[-1]
            resolved = {**self.definitions[name], **resolved}
        return resolved

    def convert(self, node: Mapping[str, Any], path: str) -> dict[str, Any]:
        node = self.resolve(node)
        if "anyOf" in node:
            branches = [branch for branch in node["anyOf"] if branch != _NULL]
            outer = {key: value for key, value in node.items() if key != "anyOf"}
            if len(branches) == 1:  # Optional[X]: an absent (or null, which is pruned) value
                return self.convert({**self.resolve(branches[0]), **outer}, path)
            return self.union(outer, branches, path)
        if "const" in node:
            node = {**node, "enum": [node["const"]]}
        kind = node.get("type")
        out: dict[str, Any] = {"type": kind}
        out.update({key: node[key] for key in _KEPT if key in node})
        for bound in ("Minimum", "Maximum"):  # draft 2020-12's number -> OpenAPI 3.0's flag
            exclusive = node.get(f"exclusive{bound}")
            if exclusive is not None:
                out[bound.lower()] = exclusive
                out[f"exclusive{bound}"] = True
        if kind == "object":
            properties = node.get("properties")
            extra = node.get("additionalProperties")
            if properties is not None:
                out["properties"] = {
                    name: self.convert(child, f"{path}.{name}") for name, child in properties.items()
                }
                if node.get("required"):
                    out["required"] = list(node["required"])
                if self.keep_unknown:
                    out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(extra, Mapping):  # a map (dict[str, str])
                out["additionalProperties"] = self.convert(extra, f"{path}.*")
        elif kind == "array":
            out["items"] = self.convert(node["items"], f"{path}[]")
            key = _LIST_MAP_KEYS.get(path)
            if key is not None:
                out["x-kubernetes-list-type"] = "map"
                out["x-kubernetes-list-map-keys"] = [key]
        elif kind not in _SCALARS:
            raise ValueError(f"{path}: no structural form for {dict(node)}")
        rules = [{"rule": rule.rule, "message": rule.message} for rule in CEL_RULES if rule.path == path]
        if rules:
            out["x-kubernetes-validations"] = rules
        return out

    def union(self, outer: Mapping[str, Any], branches: list[dict[str, Any]], path: str) -> dict[str, Any]:
        """A union the file accepts: int-or-string for durations, otherwise an untyped node."""
        description = outer.get("description", "")
        if [_without_description(self.resolve(b)) for b in branches] == self.duration["anyOf"]:
            self.found[path] = DivergenceKind.DURATION
            (text,) = [b for b in branches if b.get("type") == "string"]
            return {
                "description": f"{description} A duration (90s, 10m, 1h30m, 250ms) or whole seconds.".strip(),
                "anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": text["pattern"],  # applies to strings only, as for resource quantities
                "x-kubernetes-int-or-string": True,
            }
        self.found[path] = DivergenceKind.ANY_VALUE
        return {
            "description": (
                f"{description} Any value is stored; the controller validates it (PolicyValid)."
            ).strip(),
            "x-kubernetes-preserve-unknown-fields": True,
        }


def _without_description(node: Mapping[str, Any]) -> dict[str, Any]:
    if "anyOf" in node:
        return {"anyOf": [_without_description(branch) for branch in node["anyOf"]]}
    return {key: value for key, value in node.items() if key != "description"}


def _spec_schema() -> dict[str, Any]:
    converter = _Converter(PolicySpec.model_json_schema(by_alias=True, mode="validation"), keep_unknown=False)
    schema = converter.convert(PolicySpec.model_json_schema(by_alias=True, mode="validation"), "spec")
    documented = {d.path: d.kind for d in DIVERGENCES if d.kind is not DivergenceKind.GLOBAL}
    if converter.found != documented:
        missing = sorted(set(converter.found.items()) - set(documented.items()))
        stale = sorted(set(documented.items()) - set(converter.found.items()))
        raise ValueError(
            f"the CRD diverges from the policy file where DIVERGENCES does not say so: {missing}; "
            f"DIVERGENCES lists what no longer diverges: {stale}"
        )
    schema["description"] = (
        "The promotion policy (docs/policy-reference.md). Unknown fields are kept and reported by the "
        "controller in the PolicyValid condition."
    )
    return schema


def _status_schema() -> dict[str, Any]:
    model_schema = PromotionPolicyStatus.model_json_schema(by_alias=True, mode="serialization")
    converter = _Converter(model_schema, keep_unknown=False)
    schema = converter.convert(model_schema, "status")
    if converter.found:  # the status model is ours: it must not need any union
        raise ValueError(f"the status model has fields without a structural form: {converter.found}")
    return schema


def _tidy(node: Any) -> Any:
    """No titles (pydantic's repeat the field names; the API server would store and serve them for
    nothing) and descriptions without the docstrings' reStructuredText quotes (``x`` -> x), as
    `kubectl explain` shows them as plain text."""
    if isinstance(node, dict):
        return {
            key: value.replace("``", "") if key == "description" and isinstance(value, str) else _tidy(value)
            for key, value in node.items()
            if key != "title"
        }
    if isinstance(node, list):
        return [_tidy(item) for item in node]
    return node


def crd_manifest() -> dict[str, Any]:
    """The CustomResourceDefinition, as a JSON-ready dict."""
    root = {
        "type": "object",
        "description": f"{KIND}: how one InferenceService's new revisions are rolled out.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _spec_schema(),
            "status": _status_schema(),
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {
                "app.kubernetes.io/name": "kserve-canary",
                "app.kubernetes.io/part-of": "kserve-canary",
            },
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(column) for column in PRINTER_COLUMNS],
                    "schema": {"openAPIV3Schema": _tidy(root)},
                }
            ],
        },
    }


_HEADER = (
    "# Generated by `kserve-canary schema --crd` (make schema) from canary/policy/model.py and\n"
    "# canary/policy/status.py: do not edit. How it differs from the policy file: docs/gitops.md.\n"
)


def crd_yaml() -> str:
    """The manifest as the checked-in files hold it (a header, then block YAML in a stable order)."""
    body = yaml.safe_dump(crd_manifest(), sort_keys=False, width=100, allow_unicode=True)
    return _HEADER + body


def policy_document(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A PromotionPolicy object as read from the API server (or ``kubectl get -o yaml``), reduced to
    what the policy models validate: no ``status``, no server-set metadata.

    Anything else stays, so an unknown field is still an error. The ``kubectl.kubernetes.io/
    last-applied-configuration`` annotation is an annotation like any other and stays too.

    A new top level and ``metadata``; everything below them is shared with ``manifest``, not copied
    (validation reads it; copying 10,000 policies' specs at startup cost more than parsing them).
    """
    document = {key: value for key, value in manifest.items() if key != "status"}
    metadata = document.get("metadata")
    if isinstance(metadata, dict):
        document["metadata"] = {
            key: value for key, value in metadata.items() if key not in SERVER_SET_METADATA
        }
    return document


def walk_properties(schema: Mapping[str, Any], path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every (path, node) of a converted schema, paths like ``spec.checks[].max``."""
    yield path, schema
    for name, child in (schema.get("properties") or {}).items():
        yield from walk_properties(child, f"{path}.{name}" if path else name)
    items = schema.get("items")
    if isinstance(items, Mapping):
        yield from walk_properties(items, f"{path}[]")
