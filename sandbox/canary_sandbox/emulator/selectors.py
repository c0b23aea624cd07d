"""Label and field selectors, in the syntax the apiserver accepts in ``labelSelector``/``fieldSelector``."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from canary_sandbox.emulator.errors import ApiError

__all__ = ["FieldSelector", "LabelSelector"]

_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside ``( )`` (set-based requirements contain commas)."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts if part.strip()]


@dataclass(frozen=True)
class _Requirement:
    key: str
    operator: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "exists":
            return present
        if self.operator == "!":
            return not present
        if self.operator in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" match objects that lack the label, as in Kubernetes.
        return not present or value not in self.values


_SET_BASED = re.compile(r"^(?P<key>[^\s!=]+)\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)$")
_EQUALITY = re.compile(r"^(?P<key>[^\s!=]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s,=!()]*)$")


class LabelSelector:
    """``app=x,tier!=db,env in (a,b),!legacy,gpu`` — equality and set-based requirements."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.requirements = [self._parse(part) for part in _split_top_level(text)]

    @staticmethod
    def _parse(part: str) -> _Requirement:
        if match := _SET_BASED.match(part):
            values = frozenset(v.strip() for v in match["values"].split(",") if v.strip())
            requirement = _Requirement(match["key"], match["op"], values)
        elif match := _EQUALITY.match(part):
            operator = "=" if match["op"] in ("=", "==") else "!="
            requirement = _Requirement(match["key"], operator, frozenset({match["value"]}))
        elif part.startswith("!"):
            requirement = _Requirement(part[1:].strip(), "!", frozenset())
        else:
            requirement = _Requirement(part, "exists", frozenset())
        if not _LABEL_KEY.match(requirement.key):
            raise ApiError.bad_request(f'unable to parse requirement: invalid label key "{requirement.key}"')
        return requirement

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        return all(requirement.matches(labels or {}) for requirement in self.requirements)


def _lookup(obj: Mapping[str, Any], dotted: str) -> str:
    node: Any = obj
    for part in dotted.split("."):
        if not isinstance(node, Mapping):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, Mapping) and dotted == "source":
        return str(node.get("component", ""))
    return str(node)


class FieldSelector:
    """``metadata.name=x,status.phase!=Running`` over the fields a resource supports."""

    def __init__(self, text: str, supported: tuple[str, ...], value_of: Callable[[Any, str], str] = _lookup):
        self.text = text
        self.terms: list[tuple[str, bool, str]] = []
        self._value_of = value_of
        allowed = {"metadata.name", "metadata.namespace", *supported}
        for part in _split_top_level(text):
            match = re.match(r"^([^!=]+)(==|=|!=)(.*)$", part)
            if not match:
                raise ApiError.bad_request(f'invalid field selector: "{part}"')
            field, operator, value = match[1].strip(), match[2], match[3].strip()
            if field not in allowed:
                raise ApiError.bad_request(f'field label not supported: "{field}"')
            self.terms.append((field, operator != "!=", value))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((self._value_of(obj, field) == value) == equal for field, equal, value in self.terms)
