"""Server-side apply (``PATCH`` with ``application/apply-patch+yaml``), a documented subset.

What is done as the real apiserver does: the applied configuration creates the object when it does
not exist (201) and is merged into it when it does; ``fieldManager`` is required; every applier's fields
are recorded in ``metadata.managedFields`` (``operation: Apply``, ``fieldsType: FieldsV1``); a field this
applier applied before and no longer applies is removed unless another applier also owns it; applying a
different value to a field another applier owns is a 409 Conflict (``Apply failed with 1 conflict:
conflict with "other": .spec.window``, causes ``FieldManagerConflict``) unless ``force=true``, which moves
the field to the new owner.

Simplifications (say so when it matters): lists are atomic (a list is one field, replaced whole; the real
server merges lists marked ``x-kubernetes-list-type: map``/``set`` and the built-in keyed lists item by
item); only appliers own fields: writes that are not applies (create, update, merge/JSON patch) record
no ``Update`` entries, so they never conflict with an apply; applying to ``/status`` is not supported
(415).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "IDENTITY",
    "Path",
    "conflict_message",
    "fields_v1",
    "leaf_paths",
    "merge",
    "owned_paths",
    "remove_path",
    "render_path",
    "value_at",
]

JsonObject = dict[str, Any]
Path = tuple[str, ...]

# Fields that identify the object rather than belong to anyone.
IDENTITY: frozenset[Path] = frozenset(
    {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace"), ("metadata", "uid")}
)
_SERVER_OWNED_METADATA = {"resourceVersion", "generation", "creationTimestamp", "managedFields", "uid"}


def leaf_paths(config: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    """The fields an applied configuration sets: map entries recursively, lists and scalars as wholes."""
    paths: set[Path] = set()
    for key, value in config.items():
        path = (*prefix, str(key))
        if not prefix and key == "status":
            continue  # the main resource's apply does not own status (it is a subresource there)
        if prefix == ("metadata",) and key in _SERVER_OWNED_METADATA:
            continue
        if isinstance(value, Mapping) and value:
            paths |= leaf_paths(value, path)
        elif path not in IDENTITY:
            paths.add(path)
    return paths


def render_path(path: Path) -> str:
    return "".join(f".{part}" for part in path)


def fields_v1(paths: Iterable[Path]) -> JsonObject:
    """``managedFields[].fieldsV1``: ``{"f:spec": {"f:window": {}}}``."""
    tree: JsonObject = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return tree


def owned_paths(fields: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    """The leaf paths of a ``fieldsV1`` tree."""
    paths: set[Path] = set()
    for key, value in fields.items():
        if not key.startswith("f:"):
            continue
        path = (*prefix, key[2:])
        if isinstance(value, Mapping) and any(k.startswith("f:") for k in value):
            paths |= owned_paths(value, path)
        else:
            paths.add(path)
    return paths


def value_at(obj: Any, path: Path) -> tuple[bool, Any]:
    node = obj
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def merge(live: JsonObject, config: Mapping[str, Any]) -> JsonObject:
    """``live`` with every field of ``config`` set (maps merged, lists and scalars replaced); a copy."""
    result = copy.deepcopy(live)
    for key, value in config.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merge(dict(result[key]), value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def remove_path(obj: JsonObject, path: Path) -> None:
    """Remove the field at ``path`` and the maps it leaves empty."""
    parents: list[tuple[JsonObject, str]] = []
    node: Any = obj
    for part in path[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return
        parents.append((node, part))
        node = node[part]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, part in reversed(parents):
        if parent[part] == {} and part not in ("metadata",):
            del parent[part]
        else:
            break


def conflict_message(conflicts: Mapping[str, list[Path]]) -> str:
    count = sum(len(paths) for paths in conflicts.values())
    if count == 1:
        ((manager, (path,)),) = conflicts.items()
        return f'Apply failed with 1 conflict: conflict with "{manager}": {render_path(path)}'
    parts = []
    for manager, paths in conflicts.items():
        listed = "\n".join(f"- {render_path(path)}" for path in sorted(paths))
        parts.append(f'conflicts with "{manager}":\n{listed}')
    return f"Apply failed with {count} conflicts: " + "\n".join(parts)
