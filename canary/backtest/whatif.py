"""``--what-if key=value``: a policy changed for one backtest, validated exactly as the file is.

A key is a path into the policy's ``spec`` in the file's own spelling (camelCase), with ``spec.``
optional: ``window``, ``interval``, ``minRequests``, ``steps``, ``onNoData.after``,
``metrics.requests``; ``checks.<name>.<field>`` addresses a check by its name (``checks.p99.max``).
The value is read as YAML, like the file (``5m``, ``0.99``, ``[10, 50, 100]``, ``true``).

The overrides are applied to the document as it was read, and the result is loaded by the same
loader and models as the file (:func:`canary.policy.loader.load_text`), so a bad value is refused
with the same message ``validate`` prints, named after the override that caused it.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from canary.policy.loader import LoadedPolicy, PolicyError, load_text
from canary.policy.model import PromotionPolicy

__all__ = ["Override", "WhatIfError", "apply_what_if", "parse_override"]


class WhatIfError(ValueError):
    """An override that cannot be applied or does not validate; ``str()`` says which and why."""


@dataclass(frozen=True, slots=True)
class Override:
    text: str  # as given: "window=5m"
    path: tuple[str, ...]  # below spec: ("window",), ("checks", "p99", "max")
    value: Any


def parse_override(text: str) -> Override:
    key, separator, raw = text.partition("=")
    key = key.strip()
    if not separator or not key:
        raise WhatIfError(f"--what-if {text!r}: expected KEY=VALUE, e.g. window=5m or checks.p99.max=600ms")
    parts = tuple(key.split("."))
    if parts[0] == "spec":
        parts = parts[1:]
    if not parts or any(not part for part in parts):
        raise WhatIfError(f"--what-if {text!r}: {key!r} is not a field path (e.g. window, checks.p99.max)")
    if parts[0] in ("target", "notify"):
        raise WhatIfError(f"--what-if {text!r}: spec.{parts[0]} cannot be changed in a backtest")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as error:
        raise WhatIfError(f"--what-if {text!r}: the value is not YAML: {error}") from None
    return Override(text, parts, value)


def apply_what_if(
    loaded: LoadedPolicy, document: dict[str, Any], overrides: Sequence[Override]
) -> PromotionPolicy:
    """``document`` (the policy as read from its file) with ``overrides`` applied, loaded and validated."""
    if not overrides:
        return loaded.policy
    changed = copy.deepcopy(document)
    spec = changed.get("spec")
    if not isinstance(spec, dict):
        raise WhatIfError(f"{loaded.path}: the policy has no spec mapping to change")
    fields = [(override, _set(spec, override)) for override in overrides]
    shown = f"{loaded.path} with --what-if {' '.join(override.text for override in overrides)}"
    result = load_text(
        yaml.safe_dump(changed, sort_keys=False), shown, namespace=loaded.policy.metadata.namespace
    )
    if result.errors:
        raise WhatIfError("\n".join(_located(error, fields) for error in result.errors))
    return result.policies[0].policy


def _set(spec: dict[str, Any], override: Override) -> str:
    """Apply one override; the dotted field path it changed, as validation errors name it."""
    node: Any = spec
    path = override.path
    where = "spec"
    for index, part in enumerate(path[:-1]):
        if part == "checks" and index == 0:
            checks = node.get("checks")
            if len(path) < 3:
                raise WhatIfError(
                    f"--what-if {override.text!r}: name a check and a field: checks.<name>.<field>"
                )
            named = [
                position
                for position, check in enumerate(checks or [])
                if isinstance(check, dict) and check.get("name") == path[1]
            ]
            if not named:
                names = ", ".join(str(check.get("name")) for check in checks or [] if isinstance(check, dict))
                raise WhatIfError(
                    f"--what-if {override.text!r}: the policy has no check {path[1]!r} (it has {names})"
                )
            node, where = checks[named[0]], f"spec.checks[{named[0]}]"
            rest = path[2:]
            for inner in rest[:-1]:
                node = _child(node, inner, override, where)
                where = f"{where}.{inner}"
            node[rest[-1]] = override.value
            return f"{where}.{rest[-1]}"
        node = _child(node, part, override, where)
        where = f"{where}.{part}"
    node[path[-1]] = override.value
    return f"{where}.{path[-1]}"


def _child(node: dict[str, Any], part: str, override: Override, where: str) -> dict[str, Any]:
    child = node.setdefault(part, {})
    if not isinstance(child, dict):
        raise WhatIfError(f"--what-if {override.text!r}: {where}.{part} is not a mapping")
    return child


def _located(error: PolicyError, fields: Sequence[tuple[Override, str]]) -> str:
    """Name the override a validation error comes from (the file itself was valid)."""
    if error.field is not None:
        for override, dotted in fields:
            if error.field == dotted or error.field.startswith((dotted + ".", dotted + "[")):
                return f"--what-if {override.text}: {error.field}: {error.message}"
    where = f"{error.field}: " if error.field else ""
    return f"--what-if: {where}{error.message}"
