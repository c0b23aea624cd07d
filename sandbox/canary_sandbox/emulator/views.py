"""What the apiserver converts on the way in and out of storage.

* core/v1 Events and events.k8s.io/v1 Events share storage: the apiserver stores one Event and
  converts; a Warning written through events.k8s.io/v1 is listed by ``kubectl get events`` (core/v1),
  and the reverse.
* a Secret's ``stringData`` is write-only: folded into ``data`` (base64, overriding a key there) and
  never stored or shown; ``type`` defaults to ``Opaque``.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

from canary_sandbox.emulator import resources as r
from canary_sandbox.emulator.schema import normalise

__all__ = ["from_storage", "to_storage"]

JsonObject = dict[str, Any]

# events.k8s.io/v1 field -> core/v1 field (fields with the same name in both are copied as they are).
_V1_TO_CORE = {
    "regarding": "involvedObject",
    "note": "message",
    "deprecatedSource": "source",
    "deprecatedFirstTimestamp": "firstTimestamp",
    "deprecatedLastTimestamp": "lastTimestamp",
    "deprecatedCount": "count",
    "reportingController": "reportingComponent",
}
_CORE_TO_V1 = {core: v1 for v1, core in _V1_TO_CORE.items()}


def to_storage(resource: r.ResourceType, obj: JsonObject) -> JsonObject:
    """The stored form of an object written through ``resource``'s endpoint (a copy)."""
    stored = copy.deepcopy(obj)
    if resource is r.SECRETS:
        string_data = stored.pop("stringData", None) or {}
        if string_data:
            data = stored.setdefault("data", None) or {}
            for key, value in string_data.items():
                data[key] = base64.b64encode(str(value).encode()).decode()
            stored["data"] = data
        stored.setdefault("type", "Opaque")
    if resource is r.EVENTS_V1:
        stored = {_V1_TO_CORE.get(key, key): value for key, value in stored.items()}
        resource = r.EVENTS
    stored["apiVersion"] = resource.api_version
    stored["kind"] = resource.kind
    return stored


def from_storage(resource: r.ResourceType, stored: JsonObject) -> JsonObject:
    """The object as ``resource``'s endpoint shows it (a copy)."""
    shown = copy.deepcopy(stored)
    if resource.store_key == r.EVENTS.store_key:
        # Go serialises a zero MicroTime as null even with omitempty, and these strings have no
        # omitempty: a legacy Event (no eventTime) reads back with "eventTime": null in both views.
        # Clients that require eventTime (the Python client's EventsV1Event) trip on that, as they
        # would against a real cluster.
        shown.setdefault("eventTime", None)
        if resource is r.EVENTS:
            shown.setdefault("reportingComponent", "")
            shown.setdefault("reportingInstance", "")
            shown.setdefault("firstTimestamp", None)
            shown.setdefault("lastTimestamp", None)
    if resource is r.EVENTS_V1:
        shown = {_CORE_TO_V1.get(key, key): value for key, value in shown.items()}
        shown = {key: value for key, value in shown.items() if value != "" or key == "note"}
    if resource.crd is not None:
        # The real server prunes and defaults objects as it reads them from etcd (its storage codec
        # applies the schema coercer), with the read version's schema: a field a CRD update removed
        # disappears, a default it added appears.
        shown = normalise(shown, resource.crd.schema)
    shown["apiVersion"] = resource.api_version
    shown["kind"] = resource.kind
    return shown
