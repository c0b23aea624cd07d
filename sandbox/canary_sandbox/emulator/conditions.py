"""Knative's condition manager (knative.dev/pkg/apis ``ConditionSet``), which KServe uses for its status.

The rules matter to a controller reading conditions: the *happy* condition (``Ready``) follows its
dependents — False if any is False (taking that dependent's reason and message), Unknown if any is
Unknown, True only when all are True; conditions that are not dependents carry ``severity: Info``;
``lastTransitionTime`` changes only when the condition changes; conditions are sorted by type.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConditionSet"]

JsonObject = dict[str, Any]

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"


class ConditionSet:
    """Conditions of one status, managed with Knative's semantics (a "living" condition set)."""

    def __init__(
        self, happy: str, dependents: tuple[str, ...], conditions: list[JsonObject], now: str
    ) -> None:
        self.happy = happy
        self.dependents = dependents
        self.now = now
        self._conditions: dict[str, JsonObject] = {c["type"]: dict(c) for c in conditions if "type" in c}

    def get(self, condition_type: str) -> JsonObject | None:
        return self._conditions.get(condition_type)

    def status(self, condition_type: str) -> str:
        condition = self._conditions.get(condition_type)
        return condition["status"] if condition else UNKNOWN

    def is_true(self, condition_type: str) -> bool:
        return self.status(condition_type) == TRUE

    def _severity(self, condition_type: str) -> str:
        return "" if condition_type == self.happy or condition_type in self.dependents else "Info"

    def _set(self, condition_type: str, status: str, reason: str = "", message: str = "") -> None:
        condition: JsonObject = {"type": condition_type, "status": status}
        if severity := self._severity(condition_type):
            condition["severity"] = severity
        if reason:
            condition["reason"] = reason
        if message:
            condition["message"] = message
        previous = self._conditions.get(condition_type)
        unchanged = (
            previous is not None
            and {k: v for k, v in previous.items() if k != "lastTransitionTime"} == condition
        )
        condition["lastTransitionTime"] = (
            previous["lastTransitionTime"] if unchanged and previous else self.now
        )
        self._conditions[condition_type] = condition

    def initialize(self) -> None:
        """Unknown for the happy condition and each dependent not yet set (``InitializeConditions``)."""
        for condition_type in (self.happy, *self.dependents):
            if condition_type not in self._conditions:
                self._set(condition_type, UNKNOWN)

    def mark_true(self, condition_type: str) -> None:
        self._set(condition_type, TRUE)
        if all(self.status(dependent) == TRUE for dependent in self.dependents):
            self._set(self.happy, TRUE)

    def mark_false(self, condition_type: str, reason: str, message: str = "") -> None:
        self._set(condition_type, FALSE, reason, message)
        if condition_type in self.dependents:
            self._set(self.happy, FALSE, reason, message)

    def mark_unknown(self, condition_type: str, reason: str, message: str = "") -> None:
        self._set(condition_type, UNKNOWN, reason, message)
        for dependent in self.dependents:
            if self.status(dependent) == FALSE:
                # A failed dependent trumps Unknown: the happy condition stays (or becomes) False.
                if self.status(self.happy) != FALSE:
                    self._set(self.happy, FALSE, reason, message)
                return
        if condition_type in self.dependents:
            self._set(self.happy, UNKNOWN, reason, message)

    def set_like(self, condition_type: str, source: JsonObject | None) -> None:
        """KServe's ``SetCondition``: copy another condition's status/reason/message (nil = no-op)."""
        if source is None:
            return
        status = source.get("status")
        if status == TRUE:
            self.mark_true(condition_type)
        elif status == FALSE:
            self.mark_false(condition_type, source.get("reason", ""), source.get("message", ""))
        elif status == UNKNOWN:
            self.mark_unknown(condition_type, source.get("reason", ""), source.get("message", ""))

    def as_list(self) -> list[JsonObject]:
        return [dict(self._conditions[key]) for key in sorted(self._conditions)]
