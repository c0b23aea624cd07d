"""OpenAPI v3 structural schemas of CustomResourceDefinitions: what apiextensions-apiserver does with them.

For every custom object written (create, update, patch, both the main resource and ``/status``), in the
real server's order:

1. pruning: fields the schema does not specify are dropped silently, except under
   ``x-kubernetes-preserve-unknown-fields: true`` (kept as they are) and ``additionalProperties`` (a map:
   its values are pruned by that schema). At the root ``apiVersion``, ``kind`` and ``metadata`` are
   always kept; ``metadata`` keeps only ObjectMeta's fields, as the real decoder does.
2. defaulting: ``null`` in a non-nullable field without a default is dropped, ``default`` fills an
   absent (or non-nullable ``null``) field. Pruning and defaults are also applied when an object is
   read, as the real server does when it decodes an object from etcd, so a default added to a CRD later
   shows on old objects and a field removed from the schema disappears from them.
3. validation (422 Invalid): ``type`` (object, array, string, integer, number, boolean;
   ``x-kubernetes-int-or-string``), ``nullable``, ``required``, ``enum``, ``minimum``/``maximum`` (and
   ``exclusive*``), ``multipleOf``, ``minLength``/``maxLength``/``pattern``, ``minItems``/``maxItems``,
   ``uniqueItems``, ``minProperties``/``maxProperties``, ``allOf``/``anyOf``/``oneOf``/``not`` and the string
   ``format`` values apiextensions checks (others are ignored, as there).

Messages and causes are built the way ``kubeOpenAPIResultToFieldErrors`` in
``apiextensions-apiserver/pkg/apiserver/validation/validation.go`` builds them from kube-openapi's
``pkg/validation/errors/schema.go`` texts, e.g. ``spec.window: Invalid value: "integer": spec.window in body
must be of type string: "integer"`` (cause ``FieldValueTypeInvalid``, field ``spec.window``).

:func:`structural_errors` reports why a CRD's schema is not structural, with the wording of
``apiextensions-apiserver/pkg/apiserver/schema/validation.go`` (a subset of its checks; see there).

Validation ratcheting (Kubernetes >= 1.30): on updates, an error on a value unchanged from the stored
object is dropped (see :func:`validate`; lists are atomic, so items of a changed list are not
correlated).

Not done: ``x-kubernetes-list-type``/``-map-keys`` uniqueness and correlation;
``x-kubernetes-embedded-resource`` metadata checks.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime as dt
import ipaddress
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from canary_sandbox.emulator.errors import FieldError

__all__ = [
    "apply_defaults",
    "normalise",
    "prune",
    "render_value",
    "structural_errors",
    "validate",
]

JsonObject = dict[str, Any]
Schema = Mapping[str, Any]

# metav1.ObjectMeta's JSON fields: everything else under metadata is dropped by the decoder.
OBJECT_META_FIELDS = frozenset(
    {
        "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
        "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations",
        "ownerReferences", "finalizers", "managedFields",
    }
)  # fmt: skip
_ROOT_KEPT = ("apiVersion", "kind", "metadata")


def render_value(value: Any) -> str:
    """A bad value as ``field.Error`` prints it: strings quoted, numbers and booleans bare, others JSON."""
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return _number(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _number(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    return str(value)


def json_type(value: Any) -> str:
    """The JSON type name kube-openapi reports for a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        # The apiserver decodes JSON numbers without a fraction as int64.
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _preserves(schema: Schema) -> bool:
    return schema.get("x-kubernetes-preserve-unknown-fields") is True


# --- pruning ---------------------------------------------------------------------------------------


def prune(obj: JsonObject, schema: Schema, dropped: list[str] | None = None) -> JsonObject:
    """A copy of ``obj`` without the fields ``schema`` does not specify (``structuralpruning.Prune``);
    the paths of what was dropped are appended to ``dropped`` (what ``fieldValidation`` reports)."""
    dropped = [] if dropped is None else dropped
    pruned = copy.deepcopy(obj)
    root = {key: pruned[key] for key in _ROOT_KEPT if key in pruned}
    body = {key: value for key, value in pruned.items() if key not in _ROOT_KEPT}
    body = _prune(body, schema, "", dropped, root=True)
    if isinstance(root.get("metadata"), dict):
        dropped.extend(f"metadata.{k}" for k in root["metadata"] if k not in OBJECT_META_FIELDS)
        root["metadata"] = {k: v for k, v in root["metadata"].items() if k in OBJECT_META_FIELDS}
    result: JsonObject = {**root, **body}
    return result


def _prune(value: Any, schema: Schema, path: str, dropped: list[str], root: bool = False) -> Any:
    if isinstance(value, dict):
        properties: Mapping[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        kept: JsonObject = {}
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if root and key in _ROOT_KEPT:
                continue
            if key in properties:
                kept[key] = _prune(item, properties[key], child, dropped)
            elif isinstance(additional, Mapping):
                kept[key] = _prune(item, additional, child, dropped)
            elif (
                additional is True
                or _preserves(schema)
                or (schema.get("x-kubernetes-embedded-resource") and key in _ROOT_KEPT)
            ):
                kept[key] = item
            else:
                # dropped without an error, as the real server does (a warning at most)
                dropped.append(child)
        return kept
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [_prune(item, items, f"{path}[{index}]", dropped) for index, item in enumerate(value)]
        return value
    return value


# --- defaulting ------------------------------------------------------------------------------------


def apply_defaults(obj: JsonObject, schema: Schema) -> JsonObject:
    """A copy of ``obj`` with ``schema``'s defaults applied (``structuraldefaulting.Default``), after
    dropping non-nullable nulls that have no default (``PruneNonNullableNullsWithoutDefaults``)."""
    result = copy.deepcopy(obj)
    _default(result, schema, root=True)
    return result


def _default(value: Any, schema: Schema, root: bool = False) -> None:
    if isinstance(value, dict):
        properties: Mapping[str, Schema] = schema.get("properties") or {}
        for key, prop in properties.items():
            if root and key in _ROOT_KEPT:
                continue
            has_default = "default" in prop
            if key in value and value[key] is None and not prop.get("nullable"):
                if has_default:
                    value[key] = copy.deepcopy(prop["default"])
                else:
                    del value[key]
            elif key not in value and has_default:
                value[key] = copy.deepcopy(prop["default"])
            if key in value:
                _default(value[key], prop)
        additional = schema.get("additionalProperties")
        if isinstance(additional, Mapping):
            for key in [k for k in value if k not in properties]:
                _default(value[key], additional)
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                if item is None and "default" in items and not items.get("nullable"):
                    value[index] = copy.deepcopy(items["default"])
                _default(value[index], items)


def normalise(obj: JsonObject, schema: Schema, dropped: list[str] | None = None) -> JsonObject:
    """What the server stores for a written object: pruned, then defaulted."""
    return apply_defaults(prune(obj, schema, dropped), schema)


# --- validation ------------------------------------------------------------------------------------


def _is_datetime(text: str) -> bool:
    # strfmt.DateTime accepts RFC 3339 with or without fraction, "T" or " " separator is not allowed
    if not re.match(r"^\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)$", text):
        return False
    try:
        dt.datetime.fromisoformat(text.upper().replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _is_date(text: str) -> bool:
    try:
        dt.date.fromisoformat(text)
    except ValueError:
        return False
    return bool(re.match(r"^\d{4}-\d\d-\d\d$", text))


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return bool(re.match(r"^[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}$", text))


def _is_byte(text: str) -> bool:
    try:
        base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _is_duration(text: str) -> bool:
    # strfmt.Duration: Go durations ("1h30m", "300ms") and "<n> <unit>" spellings such as "3 days".
    go = r"^[-+]?(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$"
    spelled = r"^\d+\s*(ns|us|µs|ms|s|m|h|d|w|second|minute|hour|day|week)s?$"
    return bool(re.match(go, text) or re.match(spelled, text))


# The formats apiextensions checks that the emulator checks too; any other format is accepted unchecked
# (apiextensions ignores unknown formats as well).
_FORMAT_CHECKS: dict[str, Callable[[str], bool]] = {
    "date-time": _is_datetime,
    "datetime": _is_datetime,
    "date": _is_date,
    "uuid": _is_uuid,
    "byte": _is_byte,
    "ipv4": _is_ipv4,
    "ipv6": _is_ipv6,
    "duration": _is_duration,
}


class _Validator:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []
        # For each error, the schema node it belongs to (keys and list indices from the body's root):
        # what validation ratcheting compares with the old object.
        self.nodes: list[tuple[str | int, ...]] = []
        self._node: tuple[str | int, ...] = ()

    def _add(self, error: FieldError) -> None:
        self.errors.append(error)
        self.nodes.append(self._node)

    def _invalid(self, path: str, value: Any, message: str, reason: str = "FieldValueInvalid") -> None:
        self._add(FieldError(path, reason, f"Invalid value: {render_value(value)}: {message}"))

    def check(self, value: Any, schema: Schema, path: str, node: tuple[str | int, ...] = ()) -> None:
        saved, self._node = self._node, node
        try:
            self._check(value, schema, path)
        finally:
            self._node = saved

    def _check(self, value: Any, schema: Schema, path: str) -> None:
        name = path or "."
        if value is None:
            if schema.get("nullable"):
                return
            if schema.get("type") or schema.get("x-kubernetes-int-or-string"):
                # nulls that reached validation (list items; defaulting dropped the rest) are a type error
                self._type_error(name, path, schema, value)
            return
        if not self._check_type(value, schema, name, path):
            return
        self._check_enum(value, schema, name, path)
        if isinstance(value, bool):
            pass
        elif isinstance(value, int | float):
            self._check_number(value, schema, name, path)
        elif isinstance(value, str):
            self._check_string(value, schema, name, path)
        elif isinstance(value, list):
            self._check_array(value, schema, name, path)
        elif isinstance(value, dict):
            self._check_object(value, schema, name, path)
        self._check_combinators(value, schema, name, path)

    def _type_error(self, name: str, path: str, schema: Schema, value: Any) -> None:
        expected = "integer,string" if schema.get("x-kubernetes-int-or-string") else str(schema.get("type"))
        actual = json_type(value)
        self._invalid(
            path or ".",
            actual,
            f'{name} in body must be of type {expected}: "{actual}"',
            reason="FieldValueTypeInvalid",
        )

    def _check_type(self, value: Any, schema: Schema, name: str, path: str) -> bool:
        actual = json_type(value)
        if schema.get("x-kubernetes-int-or-string"):
            if actual in ("integer", "string"):
                return True
            self._type_error(name, path, schema, value)
            return False
        expected = schema.get("type")
        if not expected:
            return True
        if actual == expected or (expected == "number" and actual == "integer"):
            return True
        self._type_error(name, path, schema, value)
        return False

    def _check_enum(self, value: Any, schema: Schema, name: str, path: str) -> None:
        allowed = schema.get("enum")
        if allowed is None or any(_equal(value, option) for option in allowed):
            return
        rendered = ", ".join(
            json.dumps(option if isinstance(option, str) else json.dumps(option)) for option in allowed
        )
        self._add(
            FieldError(
                path or ".",
                "FieldValueNotSupported",
                f"Unsupported value: {render_value(value)}: supported values: {rendered}",
            )
        )

    def _check_number(self, value: float, schema: Schema, name: str, path: str) -> None:
        maximum, minimum = schema.get("maximum"), schema.get("minimum")
        if maximum is not None:
            exclusive = bool(schema.get("exclusiveMaximum"))
            if value > maximum or (exclusive and value == maximum):
                word = "less than" if exclusive else "less than or equal to"
                self._invalid(path, value, f"{name} in body should be {word} {_number(maximum)}")
        if minimum is not None:
            exclusive = bool(schema.get("exclusiveMinimum"))
            if value < minimum or (exclusive and value == minimum):
                word = "greater than" if exclusive else "greater than or equal to"
                self._invalid(path, value, f"{name} in body should be {word} {_number(minimum)}")
        factor = schema.get("multipleOf")
        if factor and not math.isclose(value / factor, round(value / factor)):
            self._invalid(path, value, f"{name} in body should be a multiple of {_number(factor)}")

    def _check_string(self, value: str, schema: Schema, name: str, path: str) -> None:
        length = len(value)  # kube-openapi counts characters (utf8.RuneCountInString)
        max_length, min_length = schema.get("maxLength"), schema.get("minLength")
        if max_length is not None and length > max_length:
            # kubeOpenAPIResultToFieldErrors reads the limit from the kube-openapi error's Valid, which
            # kube-openapi's TooLong does not set: the limit is -1 and field.TooLong says only this.
            self._add(FieldError(path, "FieldValueTooLong", "Too long: value is too long"))
        if min_length is not None and length < min_length:
            self._invalid(path, value, f"{name} in body should be at least {min_length} chars long")
        pattern = schema.get("pattern")
        if pattern is not None and re.search(pattern, value) is None:
            self._invalid(path, value, f"{name} in body should match '{pattern}'")
        fmt = schema.get("format")
        check = _FORMAT_CHECKS.get(str(fmt)) if fmt else None
        if check is not None and not check(value):
            self._invalid(
                path,
                value,
                f"{name} in body must be of type {fmt}: {json.dumps(value)}",
                "FieldValueTypeInvalid",
            )

    def _check_array(self, value: list[Any], schema: Schema, name: str, path: str) -> None:
        max_items, min_items = schema.get("maxItems"), schema.get("minItems")
        if max_items is not None and len(value) > max_items:
            # As for maxLength, the limit does not reach field.TooMany (-1): the count does.
            self._add(FieldError(path, "FieldValueTooMany", f"Too many: {len(value)}: has too many items"))
        if min_items is not None and len(value) < min_items:
            self._invalid(path, len(value), f"{name} in body should have at least {min_items} items")
        if schema.get("uniqueItems"):
            seen: list[Any] = []
            for item in value:
                if any(_equal(item, other) for other in seen):
                    self._invalid(path, value, f"{name} in body shouldn't contain duplicates")
                    break
                seen.append(item)
        items = schema.get("items")
        if isinstance(items, Mapping):
            for index, item in enumerate(value):
                self.check(item, items, f"{path}[{index}]", (*self._node, index))

    def _check_object(self, value: JsonObject, schema: Schema, name: str, path: str) -> None:
        for required in schema.get("required") or []:
            if required not in value:
                child = f"{path}.{required}" if path else required
                self._add(FieldError(child, "FieldValueRequired", "Required value"))
        max_properties, min_properties = schema.get("maxProperties"), schema.get("minProperties")
        if max_properties is not None and len(value) > max_properties:
            # kube-openapi's TooManyProperties carries the limit as the value: that is what is shown.
            self._add(
                FieldError(path, "FieldValueTooMany", f"Too many: {max_properties}: has too many items")
            )
        if min_properties is not None and len(value) < min_properties:
            self._invalid(
                path, len(value), f"{name} in body should have at least {min_properties} properties"
            )
        properties: Mapping[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if not path and key in _ROOT_KEPT:
                continue  # metadata is validated as ObjectMeta, apiVersion/kind by the decoder
            child = f"{path}.{key}" if path else key
            if key in properties:
                self.check(item, properties[key], child, (*self._node, key))
            elif isinstance(additional, Mapping):
                self.check(item, additional, child, (*self._node, key))

    def _check_combinators(self, value: Any, schema: Schema, name: str, path: str) -> None:
        def passes(sub: Schema) -> bool:
            probe = _Validator()
            probe.check(value, sub, path)
            return not probe.errors

        for sub in schema.get("allOf") or []:
            self.check(value, sub, path, self._node)
        any_of = schema.get("anyOf")
        if any_of and not (schema.get("x-kubernetes-int-or-string")) and not any(passes(s) for s in any_of):
            self._invalid(path, value, f"{name} in body must validate at least one schema (anyOf)")
        one_of = schema.get("oneOf")
        if one_of and sum(1 for s in one_of if passes(s)) != 1:
            self._invalid(path, value, f"{name} in body must validate one and only one schema (oneOf)")
        negated = schema.get("not")
        if isinstance(negated, Mapping) and passes(negated):
            self._invalid(path, value, f"{name} in body should not validate the schema (not)")


def _equal(left: Any, right: Any) -> bool:
    if isinstance(left, bool) != isinstance(right, bool):
        return False
    return bool(left == right)


def validate(obj: JsonObject, schema: Schema, old: JsonObject | None = None) -> list[FieldError]:
    """The schema errors of ``obj`` (the pruned and defaulted object), as 422 causes.

    On updates (``old``: the stored object), errors are ratcheted as Kubernetes does since 1.30
    (``CRDValidationRatcheting``): an error is dropped when its node is unchanged from the old object,
    or sits under an unchanged node. Nodes correlate through object keys only: an item of a changed list
    is never correlated (lists are atomic here), so its errors stand.
    """
    validator = _Validator()
    body = {key: value for key, value in obj.items() if key not in _ROOT_KEPT}
    validator.check(body, schema, "")
    if old is None:
        return validator.errors
    old_body = {key: value for key, value in old.items() if key not in _ROOT_KEPT}
    return [
        error
        for error, node in zip(validator.errors, validator.nodes, strict=True)
        if not _unchanged(body, old_body, node)
    ]


def _unchanged(new: Any, old: Any, node: tuple[str | int, ...]) -> bool:
    """Whether ``node`` (or a node above it) holds the same value in ``new`` and ``old``."""
    for segment in node:
        if _same(new, old):
            return True
        if isinstance(segment, int) or not (isinstance(new, Mapping) and isinstance(old, Mapping)):
            return False
        if segment not in new or segment not in old:
            return False
        new, old = new[segment], old[segment]
    return _same(new, old)


def _same(left: Any, right: Any) -> bool:
    return type(left) is type(right) and bool(left == right)


# --- structural schema checks (of a CRD's schema) --------------------------------------------------

_TYPES = ("object", "array", "string", "integer", "number", "boolean")
_FORBIDDEN_IN_JUNCTORS = (
    ("type", "must be empty to be structural"),
    ("additionalProperties", "must be undefined to be structural"),
    ("default", "must be undefined to be structural"),
    ("title", "must be empty to be structural"),
    ("description", "must be empty to be structural"),
    ("nullable", "must be false to be structural"),
    ("x-kubernetes-preserve-unknown-fields", "must be false to be structural"),
    ("x-kubernetes-embedded-resource", "must be false to be structural"),
    ("x-kubernetes-int-or-string", "must be false to be structural"),
    ("x-kubernetes-validations", "must be empty to be structural"),
)


def structural_errors(schema: Any, path: str) -> list[FieldError]:
    """Why ``schema`` (an ``openAPIV3Schema`` at ``path``) is not structural; empty when it is."""
    if not isinstance(schema, Mapping):
        return [FieldError(path, "FieldValueRequired", "Required value: schemas are required")]
    errors: list[FieldError] = []
    _structural(schema, path, "root", errors)
    return sorted(errors, key=lambda e: e.message())


def _structural(schema: Mapping[str, Any], path: str, level: str, errors: list[FieldError]) -> None:
    kind = schema.get("type")
    if kind is not None and kind not in _TYPES:
        errors.append(
            FieldError(
                f"{path}.type",
                "FieldValueNotSupported",
                f"Unsupported value: {render_value(kind)}: supported values: "
                + ", ".join(f'"{t}"' for t in ("array", "boolean", "integer", "number", "object", "string")),
            )
        )
    if kind == "array" and not isinstance(schema.get("items"), Mapping):
        errors.append(FieldError(f"{path}.items", "FieldValueRequired", "Required value: must be specified"))
    if isinstance(schema.get("items"), Mapping):
        _structural(schema["items"], f"{path}.items", "item", errors)
    for key, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, Mapping):
            _structural(prop, f"{path}.properties[{key}]", "field", errors)
    additional = schema.get("additionalProperties")
    if additional is not None:
        if level == "root":
            errors.append(
                FieldError(
                    f"{path}.additionalProperties",
                    "FieldValueForbidden",
                    "Forbidden: must not be used at the root",
                )
            )
        if isinstance(additional, Mapping):
            _structural(additional, f"{path}.additionalProperties", "field", errors)
        if schema.get("properties") and additional is not False:
            errors.append(
                FieldError(
                    f"{path}.additionalProperties",
                    "FieldValueForbidden",
                    "Forbidden: additionalProperties and properties are mutual exclusive",
                )
            )
    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    if int_or_string and _preserves(schema):
        errors.append(
            FieldError(
                f"{path}.x-kubernetes-preserve-unknown-fields",
                "FieldValueInvalid",
                "Invalid value: true: must be false if x-kubernetes-int-or-string is true",
            )
        )
    if not kind and not int_or_string and not _preserves(schema):
        where = {
            "root": "must not be empty at the root",
            "item": "must not be empty for specified array items",
            "field": "must not be empty for specified object fields",
        }[level]
        errors.append(FieldError(f"{path}.type", "FieldValueRequired", f"Required value: {where}"))
    if level == "root" and kind and kind != "object":
        errors.append(
            FieldError(
                f"{path}.type",
                "FieldValueInvalid",
                f"Invalid value: {render_value(kind)}: must be object at the root",
            )
        )
    if level == "root" and "metadata" in (schema.get("properties") or {}):
        metadata = schema["properties"]["metadata"]
        extra = set(metadata.get("properties") or {}) - {"name", "generateName"}
        others = set(metadata) - {"type", "properties", "description"}
        if extra or others:
            errors.append(
                FieldError(
                    f"{path}.properties[metadata]",
                    "FieldValueForbidden",
                    "Forbidden: must not specify anything other than name and generateName, but metadata is "
                    "implicitly specified",
                )
            )
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        try:
            re.compile(pattern)
        except re.error as error:
            errors.append(
                FieldError(
                    f"{path}.pattern",
                    "FieldValueInvalid",
                    f"Invalid value: {render_value(pattern)}: "
                    f"must be a valid regular expression, but isn't: {error}",
                )
            )
    int_or_string_any_of = [{"type": "integer"}, {"type": "string"}]
    for junctor in ("allOf", "anyOf", "oneOf"):
        for index, sub in enumerate(schema.get(junctor) or []):
            if (
                junctor == "anyOf"
                and int_or_string
                and list(schema.get("anyOf") or []) == int_or_string_any_of
            ):
                continue
            if isinstance(sub, Mapping):
                _nested(sub, f"{path}.{junctor}[{index}]", errors)
    if isinstance(schema.get("not"), Mapping):
        _nested(schema["not"], f"{path}.not", errors)


def _nested(schema: Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    """Value validations under allOf/anyOf/oneOf/not may not carry structure of their own."""
    for key, message in _FORBIDDEN_IN_JUNCTORS:
        if schema.get(key) not in (None, False, "", []):
            errors.append(FieldError(f"{path}.{key}", "FieldValueForbidden", f"Forbidden: {message}"))
    if "metadata" in (schema.get("properties") or {}):
        errors.append(
            FieldError(
                f"{path}.properties[metadata]",
                "FieldValueForbidden",
                "Forbidden: must not be specified in a nested context",
            )
        )
    for key, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, Mapping):
            _nested(prop, f"{path}.properties[{key}]", errors)
    if isinstance(schema.get("items"), Mapping):
        _nested(schema["items"], f"{path}.items", errors)
