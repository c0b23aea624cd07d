"""What the real apiserver (and KServe's admission webhook) refuses, for the kinds the emulator serves.

Three layers, in the apiserver's order:

1. decoding (400 BadRequest): a value of the wrong JSON type for a built-in kind, a timestamp the Go
   decoder cannot parse (``MicroTime`` needs exactly six fractional digits);
2. validation (422 Invalid): names, label syntax, sizes (a ConfigMap holds 1 MiB), required fields, the
   CRD's OpenAPI types (``canaryTrafficPercent`` is an integer); CustomResourceDefinitions themselves
   (:mod:`~canary_sandbox.emulator.crds`) and the objects of the CRDs created through the API, against
   their structural schema (:mod:`~canary_sandbox.emulator.schema`) and their ``x-kubernetes-validations``
   CEL rules (:mod:`~canary_sandbox.emulator.cel`, a subset);
3. admission (403 Forbidden): KServe's validating webhook (DNS-1035 names, immutable deployment mode).
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Mapping
from typing import Any

from canary_sandbox.emulator import cel, crds
from canary_sandbox.emulator import resources as r
from canary_sandbox.emulator import schema as crd_schema
from canary_sandbox.emulator.errors import ApiError, FieldError

__all__ = ["MAX_ANNOTATIONS_BYTES", "MAX_CONFIGMAP_BYTES", "validate_object"]

JsonObject = dict[str, Any]
log = logging.getLogger(__name__)

MAX_CONFIGMAP_BYTES = 1024 * 1024  # core.MaxSecretSize, which also bounds ConfigMaps
MAX_ANNOTATIONS_BYTES = 256 * 1024  # TotalAnnotationSizeLimitB
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
# metav1.MicroTime is parsed with Go layout "2006-01-02T15:04:05.000000Z07:00": exactly 6 digits.
_MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
# metav1.Time uses RFC 3339, where Go's parser accepts an optional fraction.
_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")

DNS1123_SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and "
    "must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1123_LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start "
    "and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _cannot_handle(kind: str, version: str, detail: str) -> ApiError:
    return ApiError.bad_request(f'{kind} in version "{version}" cannot be handled as a {kind}: {detail}')


class _Checker:
    """Collects field errors for one object, then raises them together as the apiserver does."""

    def __init__(self, resource: r.ResourceType, obj: JsonObject) -> None:
        self.resource = resource
        self.obj = obj
        self.errors: list[FieldError] = []

    def fail(self, field: str, reason: str, detail: str) -> None:
        self.errors.append(FieldError(field, reason, detail))

    def invalid(self, field: str, value: Any, detail: str) -> None:
        rendered = f'"{value}"' if isinstance(value, str) else str(value)
        self.fail(field, "FieldValueInvalid", f"Invalid value: {rendered}: {detail}")

    def required(self, field: str, detail: str = "") -> None:
        self.fail(field, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))

    def too_long(self, field: str, limit: int, unit: str = "bytes") -> None:
        self.fail(field, "FieldValueTooLong", f"Too long: must have at most {limit} {unit}")

    def raise_if_any(self) -> None:
        if self.errors:
            name = str(self.obj.get("metadata", {}).get("name") or "")
            raise ApiError.invalid(self.resource.kind, self.resource.group, name, self.errors)

    # --- decoding-level checks (400) ----------------------------------------------------------------

    def decode_error(self, detail: str) -> ApiError:
        return _cannot_handle(self.resource.kind, self.resource.version, detail)

    def string_map(self, value: Any, where: str) -> None:
        if value is None:
            return
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            raise self.decode_error(f"json: cannot unmarshal {where}: expected map[string]string")

    def timestamp(self, value: Any, where: str, micro: bool) -> None:
        if value is None:
            return
        pattern = _MICRO_TIME if micro else _TIME
        if not isinstance(value, str) or not pattern.match(value):
            layout = "2006-01-02T15:04:05.000000Z07:00" if micro else "2006-01-02T15:04:05Z07:00"
            raise self.decode_error(f'{where}: parsing time "{value}" as "{layout}": cannot parse')


def _check_metadata(check: _Checker, creating: bool) -> None:
    metadata = check.obj.get("metadata")
    if not isinstance(metadata, Mapping):
        raise check.decode_error("metadata must be an object")
    check.string_map(metadata.get("labels"), "metadata.labels")
    check.string_map(metadata.get("annotations"), "metadata.annotations")
    name = metadata.get("name")
    if not name:
        if not (creating and metadata.get("generateName")):
            check.required("metadata.name", "name or generateName is required")
    else:
        if not isinstance(name, str):
            raise check.decode_error("metadata.name must be a string")
        if check.resource is r.NAMESPACES:
            if len(name) > 63 or not _DNS1123_LABEL.match(name):
                check.invalid("metadata.name", name, DNS1123_LABEL_MESSAGE)
        elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
            check.invalid("metadata.name", name, DNS1123_SUBDOMAIN_MESSAGE)
    for key, value in (metadata.get("labels") or {}).items():
        _check_qualified_key(check, "metadata.labels", key)
        if len(value) > 63 or not _LABEL_VALUE.match(value):
            check.invalid(
                "metadata.labels",
                value,
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
                "'.', and must start and end with an alphanumeric character",
            )
    annotations = metadata.get("annotations") or {}
    for key in annotations:
        _check_qualified_key(check, "metadata.annotations", key)
    if sum(len(k) + len(v) for k, v in annotations.items()) > MAX_ANNOTATIONS_BYTES:
        check.too_long("metadata.annotations", MAX_ANNOTATIONS_BYTES)


def _check_qualified_key(check: _Checker, field: str, key: str) -> None:
    prefix, _, name = key.rpartition("/")
    ok = bool(_QUALIFIED_NAME.match(name)) and len(name) <= 63
    if prefix:
        ok = ok and len(prefix) <= 253 and bool(_DNS1123_SUBDOMAIN.match(prefix))
    if not ok:
        check.invalid(
            field,
            key,
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character",
        )


def _check_configmap(check: _Checker) -> None:
    data, binary = check.obj.get("data"), check.obj.get("binaryData")
    check.string_map(data, "data")
    check.string_map(binary, "binaryData")
    total = 0
    for key, value in (data or {}).items():
        if len(key) > 253 or not _CONFIG_KEY.match(key):
            check.invalid(f"data[{key}]", key, "a valid config key must consist of alphanumeric characters")
        total += len(value.encode())
    for key, value in (binary or {}).items():
        if len(key) > 253 or not _CONFIG_KEY.match(key):
            check.invalid(
                f"binaryData[{key}]", key, "a valid config key must consist of alphanumeric characters"
            )
        if key in (data or {}):
            check.invalid(f"binaryData[{key}]", key, "duplicate of key present in data")
        try:
            total += len(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            raise check.decode_error(f"binaryData[{key}]: illegal base64 data") from None
    if total > MAX_CONFIGMAP_BYTES:
        # The apiserver reports the whole object (an empty field path, rendered "[]").
        check.too_long("[]", MAX_CONFIGMAP_BYTES)


def _check_secret(check: _Checker, old: JsonObject | None) -> None:
    """core/v1 ValidateSecret: config keys, base64 ``data`` (checked when decoding), 1 MiB in all,
    ``type`` immutable; ``stringData`` is plain text and folded into ``data`` (views.to_storage)."""
    data, string_data = check.obj.get("data"), check.obj.get("stringData")
    check.string_map(data, "data")
    check.string_map(string_data, "stringData")
    total = 0
    for key, value in (data or {}).items():
        try:
            total += len(base64.b64decode(value, validate=True))
        except (binascii.Error, ValueError):
            raise check.decode_error(f"data[{key}]: illegal base64 data") from None
    for value in (string_data or {}).values():
        total += len(value.encode())
    for key in {**(data or {}), **(string_data or {})}:
        if len(key) > 253 or not _CONFIG_KEY.match(key):
            check.invalid(f"data[{key}]", key, "a valid config key must consist of alphanumeric characters")
    if total > MAX_CONFIGMAP_BYTES:
        check.too_long("data", MAX_CONFIGMAP_BYTES)
    if old is not None and check.obj.get("type", "Opaque") != old.get("type", "Opaque"):
        check.invalid("type", check.obj.get("type"), "field is immutable")


def _integer_field(check: _Checker, where: str, value: Any, minimum: int | None = None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise check.decode_error(
            f"json: cannot unmarshal {_type_name(value)} into Go value {where} of type int32"
        )
    if minimum is not None and value < minimum:
        relation = "greater than 0" if minimum == 1 else f"greater than or equal to {minimum}"
        check.invalid(where, value, f"must be {relation}")


def _check_lease(check: _Checker) -> None:
    spec = check.obj.get("spec") or {}
    if not isinstance(spec, Mapping):
        raise check.decode_error("spec must be an object")
    _integer_field(check, "spec.leaseDurationSeconds", spec.get("leaseDurationSeconds"), minimum=1)
    _integer_field(check, "spec.leaseTransitions", spec.get("leaseTransitions"), minimum=0)
    holder = spec.get("holderIdentity")
    if holder is not None and not isinstance(holder, str):
        raise check.decode_error("spec.holderIdentity must be a string")
    for key in ("acquireTime", "renewTime"):
        check.timestamp(spec.get(key), f"spec.{key}", micro=True)


def _check_event_core(check: _Checker) -> None:
    event = check.obj
    for key in ("firstTimestamp", "lastTimestamp"):
        check.timestamp(event.get(key), key, micro=False)
    check.timestamp(event.get("eventTime"), "eventTime", micro=True)
    series = event.get("series") or {}
    check.timestamp(series.get("lastObservedTime"), "series.lastObservedTime", micro=True)
    _integer_field(check, "count", event.get("count"))
    involved = event.get("involvedObject")
    if not isinstance(involved, Mapping):
        check.required("involvedObject")
        return
    namespace = event.get("metadata", {}).get("namespace")
    involved_namespace = involved.get("namespace") or ""
    if involved_namespace and namespace and involved_namespace != namespace:
        check.invalid("involvedObject.namespace", involved_namespace, "does not match event.namespace")
    if event.get("eventTime"):
        # A "new style" event (it has an eventTime) must say who reported it, as in events.k8s.io/v1.
        for key in ("reportingComponent", "reportingInstance", "action", "reason"):
            if not event.get(key):
                check.required(key)
    event_type = event.get("type")
    if event.get("eventTime") and event_type not in ("Normal", "Warning"):
        check.fail("type", "FieldValueNotSupported", f'Unsupported value: "{event_type}"')


def _check_event_v1(check: _Checker) -> None:
    event = check.obj
    check.timestamp(event.get("eventTime"), "eventTime", micro=True)
    for key in ("deprecatedFirstTimestamp", "deprecatedLastTimestamp"):
        check.timestamp(event.get(key), key, micro=False)
    series = event.get("series")
    if series is not None:
        check.timestamp(series.get("lastObservedTime"), "series.lastObservedTime", micro=True)
        if not isinstance(series.get("count"), int) or series.get("count", 0) < 2:
            check.invalid("series.count", series.get("count"), "should be at least 2")
    if not event.get("eventTime"):
        check.required("eventTime")
    for key in ("reportingController", "reportingInstance", "action", "reason"):
        if not event.get(key):
            check.required(key)
    for key, limit in (("action", 128), ("reason", 128), ("reportingInstance", 128), ("note", 1024)):
        value = event.get(key)
        if isinstance(value, str) and len(value.encode()) > limit:
            check.too_long(key, limit)
    if event.get("type") not in ("Normal", "Warning"):
        check.fail("type", "FieldValueNotSupported", f'Unsupported value: "{event.get("type")}"')
    regarding = event.get("regarding") or {}
    namespace = event.get("metadata", {}).get("namespace")
    if regarding.get("namespace") and namespace and regarding["namespace"] != namespace:
        check.invalid("regarding.namespace", regarding["namespace"], "does not match event.namespace")


def _check_pod(check: _Checker) -> None:
    spec = check.obj.get("spec")
    if not isinstance(spec, Mapping) or not spec.get("containers"):
        check.required("spec.containers")


_ISVC_INTEGER_FIELDS = (
    "canaryTrafficPercent", "minReplicas", "maxReplicas", "scaleTarget", "containerConcurrency",
    "timeoutSeconds",
)  # fmt: skip


def _check_inferenceservice(check: _Checker) -> None:
    # The CRD's structural schema: type errors are 422 "must be of type integer", not 400.
    spec = check.obj.get("spec")
    if not isinstance(spec, Mapping):
        check.required("spec")
        return
    predictor = spec.get("predictor")
    if not isinstance(predictor, Mapping):
        check.required("spec.predictor")
        return
    for key in _ISVC_INTEGER_FIELDS:
        if key not in predictor:
            continue
        value = predictor[key]
        if isinstance(value, bool) or not isinstance(value, int):
            path = f"spec.predictor.{key}"
            type_name = _type_name(value)
            check.invalid(path, type_name, f'{path} in body must be of type integer: "{type_name}"')


def _admit_inferenceservice(obj: JsonObject, old: JsonObject | None) -> None:
    """KServe's validating webhook: it answers 403 via controller-runtime's ``admission.Denied``."""
    webhook = 'admission webhook "inferenceservice.kserve-webhook-server.validator" denied the request'
    name = str(obj.get("metadata", {}).get("name") or "")
    if name and not _DNS1035_LABEL.match(name):
        raise ApiError(
            403,
            f'{webhook}: The InferenceService "{name}" is invalid: a InferenceService name must consist '
            "of lower case alphanumeric characters or '-', and must start with alphabetical character. "
            '(e.g. "my-name" or "abc-123", regex used for validation is \'[a-z]([-a-z0-9]*[a-z0-9])?\')',
            reason="Forbidden",
        )
    if old is not None:
        key = "serving.kserve.io/deploymentMode"
        before = (old.get("status") or {}).get("deploymentMode")
        after = (obj.get("metadata", {}).get("annotations") or {}).get(key)
        if before and after and _normalise_mode(after) != _normalise_mode(before):
            raise ApiError(
                403,
                f"{webhook}: update rejected: deploymentMode cannot be changed from {before} to {after}",
                reason="Forbidden",
            )


def _normalise_mode(mode: str) -> str:
    return "RawDeployment" if mode in ("RawDeployment", "Standard") else mode


def validate_object(resource: r.ResourceType, obj: JsonObject, old: JsonObject | None) -> list[str]:
    """Raise the ApiError the real API would answer for ``obj`` (``old`` is the stored one on updates).

    Returns warnings for the client: the ``x-kubernetes-validations`` rules the emulator did not evaluate.
    """
    check = _Checker(resource, obj)
    warnings: list[str] = []
    _check_metadata(check, creating=old is None)
    if resource is r.CONFIGMAPS:
        _check_configmap(check)
    elif resource is r.SECRETS:
        _check_secret(check, old)
    elif resource is r.LEASES:
        _check_lease(check)
    elif resource is r.EVENTS:
        _check_event_core(check)
    elif resource is r.EVENTS_V1:
        _check_event_v1(check)
    elif resource is r.PODS:
        _check_pod(check)
    elif resource is r.INFERENCESERVICES:
        _check_inferenceservice(check)
    elif resource is r.CUSTOMRESOURCEDEFINITIONS:
        check.errors.extend(crds.validate_crd(obj, old))
        warnings.extend(crds.unevaluated_rules(obj))
    elif resource.crd is not None:
        schema_errors = crd_schema.validate(obj, resource.crd.schema, old)
        check.errors.extend(schema_errors)
        if not cel.rules_in(resource.crd.schema):
            pass  # no CEL validator at all (apiextensions builds none for a schema without rules)
        elif any(error.reason == "FieldValueTypeInvalid" for error in schema_errors):
            # As in apiextensions (hasBlockingErr): type errors keep the CEL rules from running.
            check.fail(
                "<nil>",
                "FieldValueInvalid",
                'Invalid value: "null": some validation rules were not checked because the object was '
                "invalid; correct the existing errors to complete validation",
            )
        else:
            rule_errors, skipped = cel.evaluate_rules(obj, old, resource.crd.schema)
            check.errors.extend(rule_errors)
            for rule in skipped:
                log.warning(
                    "%s: x-kubernetes-validations rule not evaluated: %s", resource.qualified_resource, rule
                )
                warnings.append(
                    "the kserve-canary emulator does not evaluate the x-kubernetes-validations rule "
                    f"{rule!r}; the object was not checked against it"
                )
    check.raise_if_any()
    if resource is r.INFERENCESERVICES:
        _admit_inferenceservice(obj, old)
    return warnings
