"""API errors as the apiserver reports them: a ``Status`` object with a reason and an HTTP code.

Messages follow the real apiserver's wording, because clients (and people reading logs) match on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ApiError", "FieldError"]

JsonObject = dict[str, Any]

# Reasons the real apiserver uses for the codes we produce.
_REASON_BY_CODE = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass(frozen=True)
class FieldError:
    """One cause of a 422 Invalid: which field, what kind of problem, and the human text."""

    field: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueTooLong, FieldValueForbidden, ...
    detail: str

    def message(self) -> str:
        return f"{self.field}: {self.detail}"


@dataclass
class ApiError(Exception):
    """An error answer: raise it anywhere in request handling and the server renders it as ``Status``."""

    code: int
    message: str
    reason: str = ""
    details: JsonObject = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.reason:
            self.reason = _REASON_BY_CODE.get(self.code, "Unknown")
        super().__init__(self.message)

    def status(self) -> JsonObject:
        body: JsonObject = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body

    # --- the errors the apiserver produces, with its wording ---------------------------------------

    @classmethod
    def not_found(cls, qualified_resource: str, name: str, group: str = "", plural: str = "") -> ApiError:
        return cls(
            404,
            f'{qualified_resource} "{name}" not found',
            details=_details(name=name, group=group, kind=plural or qualified_resource),
        )

    @classmethod
    def already_exists(cls, qualified_resource: str, name: str, group: str, plural: str) -> ApiError:
        return cls(
            409,
            f'{qualified_resource} "{name}" already exists',
            reason="AlreadyExists",
            details=_details(name=name, group=group, kind=plural),
        )

    @classmethod
    def conflict(cls, qualified_resource: str, name: str, group: str, plural: str, why: str = "") -> ApiError:
        why = (
            why
            or "the object has been modified; please apply your changes to the latest version and try again"
        )
        return cls(
            409,
            f'Operation cannot be fulfilled on {qualified_resource} "{name}": {why}',
            reason="Conflict",
            details=_details(name=name, group=group, kind=plural),
        )

    @classmethod
    def invalid(cls, kind: str, group: str, name: str, causes: list[FieldError]) -> ApiError:
        qualified_kind = f"{kind}.{group}" if group else kind
        joined = ", ".join(cause.message() for cause in causes)
        if len(causes) > 1:
            joined = f"[{joined}]"
        details = _details(name=name, group=group, kind=kind)
        details["causes"] = [
            {"reason": cause.reason, "message": cause.detail, "field": cause.field} for cause in causes
        ]
        return cls(422, f'{qualified_kind} "{name}" is invalid: {joined}', reason="Invalid", details=details)

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, message, reason="BadRequest")

    @classmethod
    def unsupported_media_type(cls, content_type: str, accepted: list[str]) -> ApiError:
        return cls(
            415,
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{', '.join(accepted)}",
            reason="UnsupportedMediaType",
            details={"causes": [{"reason": "UnexpectedServerResponse", "message": content_type}]},
        )

    @classmethod
    def method_not_allowed(cls, method: str, what: str) -> ApiError:
        return cls(
            405,
            f"the server does not allow this method on the requested resource ({method} {what})",
            reason="MethodNotAllowed",
        )

    @classmethod
    def expired(cls, requested: int, oldest: int) -> ApiError:
        return cls(410, f"too old resource version: {requested} ({oldest})", reason="Expired")

    @classmethod
    def path_not_found(cls) -> ApiError:
        return cls(404, "the server could not find the requested resource", reason="NotFound")


def _details(name: str, group: str, kind: str) -> JsonObject:
    details: JsonObject = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    return details
