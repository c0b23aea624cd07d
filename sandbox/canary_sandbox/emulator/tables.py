"""Server-side printing: ``kubectl get`` asks for ``meta.k8s.io/v1`` Tables and prints their columns.

Columns follow the real apiserver's printers (and KServe's CRD ``additionalPrinterColumns`` for
InferenceServices: URL, READY, PREV, LATEST, PREVROLLEDOUTREVISION, LATESTREADYREVISION, AGE), so the
demo's ``kubectl get isvc`` looks like the real thing.

Objects of CRDs created through the API are printed from the version's ``additionalPrinterColumns`` as
apiextensions-apiserver's ``tableconvertor`` does: a Name column, then one column per definition (name,
type, format, description, priority; kubectl shows priority > 0 only with ``-o wide``), each cell the
first result of the column's JSONPath (``null`` when there is none); ``string`` cells print the value as
JSONPath prints it, ``integer``/``number``/``boolean`` cells carry the value when it has that type,
``date`` cells are the age (``5m``) of an RFC 3339 timestamp. Without columns: Name and Age. The JSONPath
subset: ``.a.b``, ``['a.b']``, ``[0]``, ``[*]`` and ``[?(@.type=="Ready")]`` filters.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from canary_sandbox.emulator import resources as r

__all__ = ["human_duration", "to_table"]

JsonObject = dict[str, Any]
Cell = str | int | float | bool | None


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def human_duration(seconds: float) -> str:
    """``k8s.io/apimachinery/pkg/util/duration.HumanDuration``."""
    whole = int(seconds)
    if whole < -1:
        return "<invalid>"
    if whole < 0:
        return "0s"
    if whole < 120:
        return f"{whole}s"
    minutes = whole // 60
    if minutes < 10:
        return f"{minutes}m" if whole % 60 == 0 else f"{minutes}m{whole % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = whole // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(obj: JsonObject, now: float) -> str:
    created = _parse_time(obj.get("metadata", {}).get("creationTimestamp"))
    return "<unknown>" if created is None else human_duration(now - created)


def _traffic(obj: JsonObject, match: Callable[[JsonObject], bool], key: str) -> Cell:
    traffic = (((obj.get("status") or {}).get("components") or {}).get("predictor") or {}).get(
        "traffic"
    ) or []
    for target in traffic:
        if match(target):
            value = target.get(key)
            return value if isinstance(value, str | int) else None
    return None


def _condition(obj: JsonObject, kind: str) -> Cell:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return str(condition.get("status"))
    return None


def _isvc_row(obj: JsonObject, now: float) -> list[Cell]:
    def is_prev(target: JsonObject) -> bool:
        return target.get("tag") == "prev"

    def is_latest(target: JsonObject) -> bool:
        return target.get("latestRevision") is True

    return [
        obj["metadata"]["name"],
        (obj.get("status") or {}).get("url"),
        _condition(obj, "Ready"),
        _traffic(obj, is_prev, "percent"),
        _traffic(obj, is_latest, "percent"),
        _traffic(obj, is_prev, "revisionName"),
        _traffic(obj, is_latest, "revisionName"),
        _age(obj, now),
    ]


def _pod_row(obj: JsonObject, now: float) -> list[Cell]:
    status = obj.get("status") or {}
    containers = status.get("containerStatuses") or []
    ready = sum(1 for c in containers if c.get("ready"))
    restarts = sum(int(c.get("restartCount", 0)) for c in containers)
    reason = status.get("phase", "Unknown")
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            reason = waiting.get("reason", reason)
    if status.get("phase") == "Pending" and status.get("initContainerStatuses"):
        reason = "Init:0/1"
    total = len((obj.get("spec") or {}).get("containers") or [])
    return [obj["metadata"]["name"], f"{ready}/{total}", reason, restarts, _age(obj, now)]


def _event_row(obj: JsonObject, now: float) -> list[Cell]:
    last = obj.get("lastTimestamp") or obj.get("eventTime") or obj["metadata"].get("creationTimestamp")
    seen = _parse_time(last)
    involved = obj.get("involvedObject") or {}
    target = f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"
    return [
        "<unknown>" if seen is None else human_duration(now - seen),
        obj.get("type"),
        obj.get("reason"),
        target,
        obj.get("message"),
    ]


def _name_column() -> JsonObject:
    return _column("Name", "string", "Name must be unique within a namespace.", "name")


def _column(name: str, kind: str, description: str, fmt: str = "", priority: int = 0) -> JsonObject:
    return {"name": name, "type": kind, "format": fmt, "description": description, "priority": priority}


_AGE = _column("Age", "date", "CreationTimestamp is a timestamp representing the server time of creation.")

_PRINTERS: dict[str, tuple[list[JsonObject], Callable[[JsonObject, float], list[Cell]]]] = {
    r.INFERENCESERVICES.store_key: (
        [
            _name_column(),
            _column("URL", "string", ""),
            _column("Ready", "string", ""),
            _column("Prev", "integer", ""),
            _column("Latest", "integer", ""),
            _column("PrevRolledoutRevision", "string", ""),
            _column("LatestReadyRevision", "string", ""),
            _AGE,
        ],
        _isvc_row,
    ),
    r.PODS.store_key: (
        [
            _name_column(),
            _column("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
            _column("Status", "string", "The aggregate status of the containers in this pod."),
            _column(
                "Restarts", "string", "The number of times the containers in this pod have been restarted."
            ),
            _AGE,
        ],
        _pod_row,
    ),
    r.CONFIGMAPS.store_key: (
        [_name_column(), _column("Data", "string", "Number of entries in data/binaryData."), _AGE],
        lambda obj, now: [
            obj["metadata"]["name"],
            len(obj.get("data") or {}) + len(obj.get("binaryData") or {}),
            _age(obj, now),
        ],
    ),
    r.EVENTS.store_key: (
        [
            _column("Last Seen", "string", "Time since the event was last seen."),
            _column("Type", "string", "Type of this event."),
            _column("Reason", "string", "Reason of this event."),
            _column("Object", "string", "The object this event is about."),
            _column("Message", "string", "Message of this event."),
        ],
        _event_row,
    ),
    r.LEASES.store_key: (
        [_name_column(), _column("Holder", "string", "The holder of the lease."), _AGE],
        lambda obj, now: [
            obj["metadata"]["name"],
            (obj.get("spec") or {}).get("holderIdentity"),
            _age(obj, now),
        ],
    ),
    r.NAMESPACES.store_key: (
        [_name_column(), _column("Status", "string", "The status of the namespace."), _AGE],
        lambda obj, now: [obj["metadata"]["name"], (obj.get("status") or {}).get("phase"), _age(obj, now)],
    ),
}


_TOKEN = re.compile(
    r"""\.(?P<field>[A-Za-z0-9_\-]+)"""
    r"""|\[(?P<index>-?\d+)\]"""
    r"""|\[\*\]|\.\*"""
    r"""|\[['"](?P<quoted>[^'"]+)['"]\]"""
    r"""|\[\?\(@\.(?P<key>[A-Za-z0-9_.\-]+)\s*(?P<op>==|!=)\s*['"]?(?P<value>[^'")]*)['"]?\)\]"""
)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """Results of a simple JSONPath (``.status.conditions[?(@.type=="Ready")].status``) on ``obj``."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    text = text.removeprefix("$")
    nodes: list[Any] = [obj]
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            return []
        position = match.end()
        following: list[Any] = []
        for node in nodes:
            if match.group("field") is not None or match.group("quoted") is not None:
                key = match.group("field") or match.group("quoted")
                if isinstance(node, Mapping) and key in node:
                    following.append(node[key])
            elif match.group("index") is not None:
                index = int(match.group("index"))
                if isinstance(node, list) and -len(node) <= index < len(node):
                    following.append(node[index])
            elif match.group("key") is not None:
                if isinstance(node, list):
                    for item in node:
                        found = jsonpath(item, "." + match.group("key"))
                        equal = bool(found) and _printed(found[0]) == match.group("value")
                        if equal == (match.group("op") == "=="):
                            following.append(item)
            elif isinstance(node, list):
                following.extend(node)
            elif isinstance(node, Mapping):
                following.extend(node.values())
        nodes = following
    return nodes


def _printed(value: Any) -> str:
    """A value as client-go's JSONPath printer writes it (strings bare, the rest as JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else str(value)


def _custom_cell(kind: str, value: Any, now: float) -> Cell:
    if value is None:
        return None
    if kind == "string":
        return _printed(value)
    if kind == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "date" and isinstance(value, str):
        try:
            instant = _parse_time(value)
        except ValueError:
            return "<invalid>"
        return "<unknown>" if instant is None else human_duration(now - instant)
    return None


def _custom_printer(
    crd: r.CustomResourceVersion,
) -> tuple[list[JsonObject], Callable[[JsonObject, float], list[Cell]]]:
    definitions = list(crd.printer_columns) or [
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp",
         "description": _AGE["description"]}
    ]  # fmt: skip
    columns = [_name_column()]
    for definition in definitions:
        description = definition.get("description") or (
            f"Custom resource definition column (in JSONPath format): {definition.get('jsonPath')}"
        )
        columns.append(
            _column(
                str(definition.get("name")),
                str(definition.get("type")),
                str(description),
                str(definition.get("format") or ""),
                int(definition.get("priority") or 0),
            )
        )

    def row(obj: JsonObject, now: float) -> list[Cell]:
        cells: list[Cell] = [obj["metadata"]["name"]]
        for definition in definitions:
            found = jsonpath(obj, str(definition.get("jsonPath") or ""))
            cells.append(_custom_cell(str(definition.get("type")), found[0] if found else None, now))
        return cells

    return columns, row


def _crd_row(obj: JsonObject, now: float) -> list[Cell]:
    return [obj["metadata"]["name"], obj["metadata"].get("creationTimestamp")]


_PRINTERS[r.CUSTOMRESOURCEDEFINITIONS.store_key] = (
    [_name_column(), _column("Created At", "date", _AGE["description"])],
    _crd_row,
)


def to_table(
    resource: r.ResourceType, objects: list[JsonObject], resource_version: str, now: float
) -> JsonObject:
    """A ``meta.k8s.io/v1`` Table of ``objects`` (stored/core forms) as the apiserver prints them.

    Rows carry only cells; the caller attaches each row's object as the request's includeObject asks.
    """
    if resource.crd is not None:
        columns, custom_row = _custom_printer(resource.crd)
        return {
            "kind": "Table",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns,
            "rows": [{"cells": custom_row(obj, now)} for obj in objects],
        }
    columns, row_of = _PRINTERS.get(resource.store_key, ([_name_column(), _AGE], None))
    rows = [
        {"cells": row_of(obj, now) if row_of else [obj["metadata"]["name"], _age(obj, now)]}
        for obj in objects
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    }
