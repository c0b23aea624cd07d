"""Patch formats the apiserver accepts: JSON merge patch (RFC 7386) and JSON patch (RFC 6902).

Strategic merge patch is not implemented separately: for the built-in kinds the emulator serves
(ConfigMaps, Leases, Events, Namespaces) it is identical to a merge patch because they hold maps, not
keyed lists. For custom resources the real apiserver refuses it with 415, and so does the emulator.
"""

from __future__ import annotations

import copy
from typing import Any

from canary_sandbox.emulator.errors import ApiError

__all__ = ["apply_json_patch", "apply_merge_patch", "changed_paths"]


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces. Pure."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


def _unprocessable(message: str) -> ApiError:
    # The apiserver answers 422 when a well-formed JSON patch cannot be applied to the object.
    return ApiError(422, message, reason="Invalid")


def _parse_pointer(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ApiError.bad_request(f'JSON pointer "{pointer}" must start with "/"')
    return [token.replace("~1", "/").replace("~0", "~") for token in pointer[1:].split("/")]


def _array_index(segment: str, length: int, allow_end: bool, pointer: str) -> int:
    if allow_end and segment == "-":
        return length
    if not segment.isdigit() or (len(segment) > 1 and segment.startswith("0")):
        raise _unprocessable(f'invalid array index "{segment}" in "{pointer}"')
    index = int(segment)
    limit = length if allow_end else length - 1
    if index > limit:
        raise _unprocessable(f'array index {index} out of bounds in "{pointer}"')
    return index


def _container(document: Any, tokens: list[str], pointer: str) -> Any:
    node = document
    for token in tokens:
        if isinstance(node, dict):
            if token not in node:
                raise _unprocessable(f'path "{pointer}" does not exist: missing "{token}"')
            node = node[token]
        elif isinstance(node, list):
            node = node[_array_index(token, len(node), False, pointer)]
        else:
            raise _unprocessable(f'path "{pointer}" traverses a scalar')
    return node


def _get(document: Any, pointer: str) -> Any:
    tokens = _parse_pointer(pointer)
    if not tokens:
        return document
    parent = _container(document, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _unprocessable(f'path "{pointer}" does not exist')
        return parent[last]
    if isinstance(parent, list):
        return parent[_array_index(last, len(parent), False, pointer)]
    raise _unprocessable(f'path "{pointer}" traverses a scalar')


def _add(document: Any, pointer: str, value: Any) -> Any:
    tokens = _parse_pointer(pointer)
    if not tokens:
        return value
    parent = _container(document, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_array_index(last, len(parent), True, pointer), value)
    else:
        raise _unprocessable(f'path "{pointer}" traverses a scalar')
    return document


def _remove(document: Any, pointer: str) -> tuple[Any, Any]:
    tokens = _parse_pointer(pointer)
    if not tokens:
        raise _unprocessable("cannot remove the whole document")
    parent = _container(document, tokens[:-1], pointer)
    last = tokens[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _unprocessable(f'unable to remove nonexistent key "{last}": missing value')
        return document, parent.pop(last)
    if isinstance(parent, list):
        return document, parent.pop(_array_index(last, len(parent), False, pointer))
    raise _unprocessable(f'path "{pointer}" traverses a scalar')


def apply_json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 add/remove/replace/move/copy/test on a copy of ``target``."""
    if not isinstance(operations, list):
        # What the apiserver answers when a merge-style object is sent as application/json-patch+json
        # (the Python client's default Content-Type for core PATCH calls in v37).
        kind = "object" if isinstance(operations, dict) else type(operations).__name__
        raise ApiError.bad_request(f"json: cannot unmarshal {kind} into Go value of type jsonpatch.Patch")
    document = copy.deepcopy(target)
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise ApiError.bad_request(f"invalid JSON patch operation: {operation!r}")
        op, path = operation["op"], operation["path"]
        if not isinstance(path, str):
            raise ApiError.bad_request(f"invalid JSON patch path: {path!r}")
        if op in ("add", "replace", "test") and "value" not in operation:
            raise ApiError.bad_request(f'JSON patch operation "{op}" needs a value')
        if op == "add":
            document = _add(document, path, copy.deepcopy(operation["value"]))
        elif op == "remove":
            document, _ = _remove(document, path)
        elif op == "replace":
            document, _ = _remove(document, path)
            document = _add(document, path, copy.deepcopy(operation["value"]))
        elif op in ("move", "copy"):
            source = operation.get("from")
            if not isinstance(source, str):
                raise ApiError.bad_request(f'JSON patch operation "{op}" needs "from"')
            if op == "move":
                document, value = _remove(document, source)
            else:
                value = copy.deepcopy(_get(document, source))
            document = _add(document, path, value)
        elif op == "test":
            if _get(document, path) != operation["value"]:
                raise _unprocessable(f"testing value {path} failed: test failed")
        else:
            raise ApiError.bad_request(f'unexpected JSON patch operation "{op}"')
    return document


def changed_paths(before: Any, after: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves that differ between two JSON documents (added, removed or changed).

    The request log records them so a test can assert, for example, that the controller never changed
    anything under ``metadata.annotations`` of an InferenceService.
    """
    if isinstance(before, dict) or isinstance(after, dict):
        if not (isinstance(before, dict) or before is _MISSING) or not (
            isinstance(after, dict) or after is _MISSING
        ):
            return [prefix]
        old = before if isinstance(before, dict) else {}
        new = after if isinstance(after, dict) else {}
        paths: list[str] = []
        for key in sorted(set(old) | set(new)):
            child = f"{prefix}.{key}" if prefix else key
            paths.extend(changed_paths(old.get(key, _MISSING), new.get(key, _MISSING), child))
        if not paths and old != new:
            paths.append(prefix)
        return paths
    if before is _MISSING and after is _MISSING:
        return []
    if before != after or type(before) is not type(after):
        return [prefix]
    return []


_MISSING: Any = object()
