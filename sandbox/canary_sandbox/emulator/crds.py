"""CustomResourceDefinitions (``apiextensions.k8s.io/v1``): validation, defaults, status, served resources.

What the real apiextensions-apiserver does, and the emulator with it:

- defaults (``SetDefaults_CustomResourceDefinition``): ``spec.names.singular`` is the lower-cased kind,
  ``spec.names.listKind`` is ``<kind>List``, ``spec.conversion`` is ``{strategy: None}``;
- validation (``pkg/apis/apiextensions/validation/validation.go``), 422 Invalid with the real texts:
  ``metadata.name`` must be ``<plural>.<group>``, the group a DNS subdomain with a dot, names DNS-1035
  labels (the kind in mixed case), ``kind != listKind``, scope ``Cluster`` or ``Namespaced``, unique
  version names, exactly one ``storage: true`` version, a schema for every version, structural schemas
  (see :func:`~canary_sandbox.emulator.schema.structural_errors`), printer columns with name, type and
  jsonPath, ``status.storedVersions`` consistent with ``spec.versions``; immutable group and plural, and,
  once established, scope and kind. (The real server does *not* require a served version: a CRD with
  none is accepted and serves nothing, and so it is here.)
- status, which the real server's controllers write a few milliseconds after each change and the
  emulator writes in the same request: ``acceptedNames``, conditions ``NamesAccepted`` and ``Established``
  (``False``/``NotAccepted`` when a name conflicts with another CRD of the group), ``storedVersions``
  (every version that has been the storage version), ``Terminating`` while it is being deleted;
- a finalizer, ``customresourcecleanup.apiextensions.k8s.io``: deleting a CRD deletes all its objects,
  then the CRD itself; meanwhile creating objects is refused with 405, as there.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from canary_sandbox.emulator import cel
from canary_sandbox.emulator import resources as r
from canary_sandbox.emulator.errors import FieldError
from canary_sandbox.emulator.schema import json_type, render_value, structural_errors

__all__ = [
    "CLEANUP_FINALIZER",
    "apply_crd_defaults",
    "compute_status",
    "condition",
    "served_resources",
    "unevaluated_rules",
    "validate_crd",
]

JsonObject = dict[str, Any]

CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex "
    "used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_DNS1123_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_COLUMN_TYPES = ("integer", "number", "string", "boolean", "date")
_COLUMN_FORMATS = ("int32", "int64", "float", "double", "byte", "date", "date-time", "password")


def _dns1035_errors(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _DNS1035.match(value):
        errors.append(_DNS1035_MESSAGE)
    return errors


def _invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(path, "FieldValueInvalid", f"Invalid value: {render_value(value)}: {detail}")


def _required(path: str, detail: str = "") -> FieldError:
    return FieldError(path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


# --- defaults --------------------------------------------------------------------------------------


def apply_crd_defaults(crd: JsonObject) -> JsonObject:
    """The CRD with the apiserver's defaults filled in (a copy)."""
    result = copy.deepcopy(crd)
    spec = result.get("spec")
    if not isinstance(spec, dict):
        return result
    names = spec.get("names")
    if isinstance(names, dict) and isinstance(names.get("kind"), str) and names["kind"]:
        if not names.get("singular"):
            names["singular"] = names["kind"].lower()
        if not names.get("listKind"):
            names["listKind"] = names["kind"] + "List"
    if not spec.get("conversion"):
        spec["conversion"] = {"strategy": "None"}
    return result


# --- validation ------------------------------------------------------------------------------------


def validate_crd(crd: JsonObject, old: JsonObject | None) -> list[FieldError]:
    """The 422 causes the real apiserver reports for a (defaulted) CRD."""
    errors: list[FieldError] = []
    metadata = _mapping(crd.get("metadata"))
    spec = crd.get("spec")
    if not isinstance(spec, Mapping):
        return [_required("spec")]
    names = _mapping(spec.get("names"))
    group = spec.get("group") or ""
    plural = names.get("plural") or ""
    name = metadata.get("name")
    if isinstance(name, str) and name and name != f"{plural}.{group}":
        errors.append(_invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))

    if not group:
        errors.append(_required("spec.group"))
    elif not isinstance(group, str) or not _DNS1123_SUBDOMAIN.match(group) or len(group) > 253:
        errors.append(_invalid("spec.group", group, _DNS1123_SUBDOMAIN_MESSAGE))
    elif len(group.split(".")) < 2:
        errors.append(_invalid("spec.group", group, "should be a domain with at least one dot"))

    scope = spec.get("scope") or ""
    if not scope:
        errors.append(_required("spec.scope"))
    elif scope not in ("Cluster", "Namespaced"):
        errors.append(
            FieldError(
                "spec.scope",
                "FieldValueNotSupported",
                f'Unsupported value: {render_value(scope)}: supported values: "Cluster", "Namespaced"',
            )
        )

    versions = spec.get("versions")
    if not isinstance(versions, list):
        versions = []
    storage_count = 0
    seen: set[str] = set()
    unique = True
    for index, version in enumerate(versions):
        path = f"spec.versions[{index}]"
        if not isinstance(version, Mapping):
            errors.append(_invalid(path, version, "must be an object"))
            continue
        version_name = str(version.get("name") or "")
        if version.get("storage") is True:
            storage_count += 1
        if version_name in seen:
            unique = False
        seen.add(version_name)
        for message in _dns1035_errors(version_name):
            errors.append(_invalid(f"{path}.name", version_name, message))
        schema = _mapping(version.get("schema")).get("openAPIV3Schema")
        if schema is None:
            errors.append(_required(f"{path}.schema.openAPIV3Schema", "schemas are required"))
        else:
            errors.extend(structural_errors(schema, f"{path}.schema.openAPIV3Schema"))
            errors.extend(_check_defaults(schema, f"{path}.schema.openAPIV3Schema"))
        subresources = version.get("subresources")
        if subresources is not None and not isinstance(subresources, Mapping):
            errors.append(_invalid(f"{path}.subresources", subresources, "must be an object"))
        for column_index, column in enumerate(version.get("additionalPrinterColumns") or []):
            errors.extend(_check_column(column, f"{path}.additionalPrinterColumns[{column_index}]"))
    rendered_versions = json.dumps(versions, separators=(",", ":"))
    if not unique:
        errors.append(
            FieldError(
                "spec.versions",
                "FieldValueInvalid",
                f"Invalid value: {rendered_versions}: must contain unique version names",
            )
        )
    if storage_count != 1:
        errors.append(
            FieldError(
                "spec.versions",
                "FieldValueInvalid",
                f"Invalid value: {rendered_versions}: "
                "must have exactly one version marked as storage version",
            )
        )

    for key in ("plural", "singular", "kind", "listKind"):
        if not names.get(key):
            errors.append(_required(f"spec.names.{key}"))
    errors.extend(_check_names(names, "spec.names"))

    conversion = _mapping(spec.get("conversion"))
    if conversion.get("strategy") not in ("None", "Webhook"):
        errors.append(
            FieldError(
                "spec.conversion.strategy",
                "FieldValueNotSupported",
                f"Unsupported value: {render_value(conversion.get('strategy'))}: supported values: "
                '"None", "Webhook"',
            )
        )

    if old is not None:
        old_spec = _mapping(old.get("spec"))
        old_names = _mapping(old_spec.get("names"))
        immutable = [
            ("spec.group", group, old_spec.get("group")),
            ("spec.names.plural", plural, old_names.get("plural")),
        ]
        if condition(old, "Established") == "True":
            immutable += [
                ("spec.scope", scope, old_spec.get("scope")),
                ("spec.names.kind", names.get("kind"), old_names.get("kind")),
            ]
        for path, new_value, old_value in immutable:
            if new_value != old_value:
                errors.append(_invalid(path, new_value, "field is immutable"))
    return errors


def _check_names(names: Mapping[str, Any], path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    for key in ("plural", "singular"):
        value = names.get(key)
        if isinstance(value, str) and value:
            messages = _dns1035_errors(value)
            if messages:
                errors.append(_invalid(f"{path}.{key}", value, ",".join(messages)))
    for key in ("kind", "listKind"):
        value = names.get(key)
        if isinstance(value, str) and value:
            messages = _dns1035_errors(value.lower())
            if messages:
                errors.append(
                    _invalid(
                        f"{path}.{key}",
                        value,
                        "may have mixed case, but should otherwise match: " + ",".join(messages),
                    )
                )
    for index, short in enumerate(names.get("shortNames") or []):
        messages = _dns1035_errors(str(short))
        if messages:
            errors.append(_invalid(f"{path}.shortNames[{index}]", short, ",".join(messages)))
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        errors.append(
            _invalid(f"{path}.listKind", names.get("listKind"), "kind and listKind may not be the same")
        )
    return errors


def _check_column(column: Any, path: str) -> list[FieldError]:
    if not isinstance(column, Mapping):
        return [_invalid(path, column, "must be an object")]
    errors: list[FieldError] = []
    if not column.get("name"):
        errors.append(_required(f"{path}.name"))
    kind = column.get("type")
    if not kind:
        errors.append(_required(f"{path}.type"))
    elif kind not in _COLUMN_TYPES:
        supported = ", ".join(f'"{t}"' for t in _COLUMN_TYPES)
        errors.append(
            FieldError(
                f"{path}.type",
                "FieldValueNotSupported",
                f"Unsupported value: {render_value(kind)}: supported values: {supported}",
            )
        )
    fmt = column.get("format")
    if fmt and fmt not in _COLUMN_FORMATS:
        supported = ", ".join(f'"{f}"' for f in _COLUMN_FORMATS)
        errors.append(
            FieldError(
                f"{path}.format",
                "FieldValueNotSupported",
                f"Unsupported value: {render_value(fmt)}: supported values: {supported}",
            )
        )
    priority = column.get("priority", 0)
    if not isinstance(priority, int) or priority < 0:
        errors.append(_invalid(f"{path}.priority", priority, "must be greater than or equal to 0"))
    if not column.get("jsonPath"):
        errors.append(_required(f"{path}.jsonPath"))
    return errors


def _check_defaults(schema: Any, path: str) -> list[FieldError]:
    """Defaults are validated against their own schema when the CRD is written. A subset: the type of
    each default, with a message of the emulator's own wording (the real server runs the whole schema
    validator on the default and reports its message)."""
    errors: list[FieldError] = []
    if not isinstance(schema, Mapping):
        return errors
    if "default" in schema and path.endswith("openAPIV3Schema"):
        errors.append(
            FieldError(f"{path}.default", "FieldValueForbidden", "Forbidden: must not be set at the root")
        )
    elif "default" in schema and schema.get("type"):
        actual = json_type(schema["default"])
        expected = schema["type"]
        if (
            schema["default"] is not None
            and actual != expected
            and not (expected == "number" and actual == "integer")
        ):
            errors.append(
                FieldError(
                    f"{path}.default",
                    "FieldValueInvalid",
                    f"Invalid value: {render_value(schema['default'])}: "
                    f'must be of type {expected}: "{actual}"',
                )
            )
    for key, prop in (schema.get("properties") or {}).items():
        errors.extend(_check_defaults(prop, f"{path}.properties[{key}]"))
    if isinstance(schema.get("items"), Mapping):
        errors.extend(_check_defaults(schema["items"], f"{path}.items"))
    if isinstance(schema.get("additionalProperties"), Mapping):
        errors.extend(_check_defaults(schema["additionalProperties"], f"{path}.additionalProperties"))
    return errors


def unevaluated_rules(crd: Mapping[str, Any]) -> list[str]:
    """Warnings naming the CEL rules of ``crd`` outside the subset :mod:`~canary_sandbox.emulator.cel`
    evaluates: objects will be accepted without them, and the client is told so."""
    warnings = []
    for index, version in enumerate(_mapping(crd.get("spec")).get("versions") or []):
        schema = _mapping(_mapping(_mapping(version).get("schema")).get("openAPIV3Schema"))
        for path, entry in cel.rules_in(schema, f"spec.versions[{index}].schema.openAPIV3Schema"):
            try:
                cel.compile_rule(entry)
            except cel.Unsupported as why:
                warnings.append(
                    f"{path}.x-kubernetes-validations: the kserve-canary emulator does not evaluate the rule "
                    f"{entry.get('rule')!r} ({why}); objects are accepted without it"
                )
    return warnings


# --- status ----------------------------------------------------------------------------------------


def condition(crd: Mapping[str, Any], kind: str) -> str | None:
    for entry in _mapping(crd.get("status")).get("conditions") or []:
        if isinstance(entry, Mapping) and entry.get("type") == kind:
            return str(entry.get("status"))
    return None


def _set_condition(
    conditions: list[JsonObject], kind: str, status: str, reason: str, message: str, now: str
) -> None:
    for entry in conditions:
        if entry.get("type") == kind:
            if entry.get("status") != status:
                entry["lastTransitionTime"] = now
            entry.update(status=status, reason=reason, message=message)
            return
    conditions.append(
        {"type": kind, "status": status, "lastTransitionTime": now, "reason": reason, "message": message}
    )


def _name_conflict(names: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) of the first name another CRD of the group already uses, as the names
    controller reports it; None when every name is free."""
    resource_names: set[str] = set()
    kinds: set[str] = set()
    for other in others:
        accepted = _mapping(_mapping(other.get("status")).get("acceptedNames"))
        resource_names.update(str(accepted.get(k)) for k in ("plural", "singular") if accepted.get(k))
        resource_names.update(str(s) for s in accepted.get("shortNames") or [])
        kinds.update(str(accepted.get(k)) for k in ("kind", "listKind") if accepted.get(k))
    checks = [
        ("PluralConflict", names.get("plural"), resource_names),
        ("SingularConflict", names.get("singular"), resource_names),
        ("KindConflict", names.get("kind"), kinds),
        ("ListKindConflict", names.get("listKind"), kinds),
    ]
    for reason, value, used in checks:
        if value and value in used:
            return reason, f'"{value}" is already in use'
    shorts = [s for s in names.get("shortNames") or [] if s in resource_names]
    if shorts:
        return "ShortNamesConflict", f'"{shorts}" is already in use'
    return None


def compute_status(
    crd: JsonObject, old: JsonObject | None, others: Sequence[Mapping[str, Any]], now: str
) -> JsonObject:
    """The status the naming and establishing controllers would settle on for ``crd``."""
    spec = _mapping(crd.get("spec"))
    names = _mapping(spec.get("names"))
    previous = copy.deepcopy(_mapping((old or {}).get("status")))
    conditions: list[JsonObject] = [
        dict(c) for c in previous.get("conditions") or [] if isinstance(c, Mapping)
    ]
    conflict = _name_conflict(names, others)
    accepted: JsonObject
    if conflict is None:
        accepted = {
            key: copy.deepcopy(names[key])
            for key in ("plural", "singular", "shortNames", "kind", "listKind", "categories")
            if names.get(key)
        }
        _set_condition(conditions, "NamesAccepted", "True", "NoConflicts", "no conflicts found", now)
    else:
        accepted = copy.deepcopy(dict(_mapping(previous.get("acceptedNames")))) or {"plural": "", "kind": ""}
        _set_condition(conditions, "NamesAccepted", "False", conflict[0], conflict[1], now)
    if conflict is None:
        _set_condition(
            conditions,
            "Established",
            "True",
            "InitialNamesAccepted",
            "the initial names have been accepted",
            now,
        )
    elif condition({"status": {"conditions": conditions}}, "Established") != "True":
        _set_condition(conditions, "Established", "False", "NotAccepted", "not all names are accepted", now)
    if _mapping(crd.get("metadata")).get("deletionTimestamp"):
        _set_condition(
            conditions,
            "Terminating",
            "True",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
            now,
        )
    stored = [str(v) for v in previous.get("storedVersions") or []]
    for version in spec.get("versions") or []:
        if (
            isinstance(version, Mapping)
            and version.get("storage") is True
            and version.get("name") not in stored
        ):
            stored.append(str(version.get("name")))
    return {"conditions": conditions, "acceptedNames": accepted, "storedVersions": stored}


def served_resources(crd: Mapping[str, Any], *, every_version: bool = False) -> list[r.ResourceType]:
    """The resources an established CRD serves: one per served version (``every_version``: one per
    version, served or not, established or not: how the emulator reaches a CRD's stored objects)."""
    if condition(crd, "Established") != "True" and not every_version:
        return []
    spec = _mapping(crd.get("spec"))
    names = _mapping(_mapping(crd.get("status")).get("acceptedNames")) or _mapping(spec.get("names"))
    crd_name = str(_mapping(crd.get("metadata")).get("name"))
    resources = []
    for version in spec.get("versions") or []:
        if not isinstance(version, Mapping) or (version.get("served") is not True and not every_version):
            continue
        subresources = _mapping(version.get("subresources"))
        resources.append(
            r.ResourceType(
                group=str(spec.get("group")),
                version=str(version.get("name")),
                plural=str(names.get("plural")),
                singular=str(names.get("singular") or ""),
                kind=str(names.get("kind")),
                namespaced=spec.get("scope") == "Namespaced",
                short_names=tuple(str(s) for s in names.get("shortNames") or []),
                categories=tuple(str(c) for c in names.get("categories") or []),
                has_status_subresource="status" in subresources,
                is_custom=True,
                crd=r.CustomResourceVersion(
                    crd_name=crd_name,
                    schema=copy.deepcopy(
                        dict(_mapping(_mapping(version.get("schema")).get("openAPIV3Schema")))
                    ),
                    printer_columns=tuple(
                        copy.deepcopy(dict(c)) for c in version.get("additionalPrinterColumns") or []
                    ),
                    storage=version.get("storage") is True,
                ),
            )
        )
    return resources
