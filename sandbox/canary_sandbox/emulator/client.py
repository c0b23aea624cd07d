"""A small client for the emulator's admin API, for tests and the demo in another process."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

__all__ = ["AdminApiError", "EmulatorAdminClient"]

JsonObject = dict[str, Any]


class AdminApiError(RuntimeError):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"emulator admin API answered {status}: {body}")
        self.status = status
        self.body = body


class EmulatorAdminClient:
    """``/emulator/v1/...`` over HTTP (standard library only)."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _call(
        self, method: str, path: str, body: JsonObject | None = None, query: JsonObject | None = None
    ) -> Any:
        address = f"{self.url}/emulator/v1/{path}"
        if query:
            address += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(address, data=data, method=method)  # noqa: S310 - http(s) only
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            raise AdminApiError(error.code, error.read().decode(errors="replace")) from None

    def healthz(self) -> JsonObject:
        result: JsonObject = self._call("GET", "healthz")
        return result

    def clock(self) -> JsonObject:
        result: JsonObject = self._call("GET", "clock")
        return result

    def advance(self, seconds: float) -> JsonObject:
        """Step a manual clock (the emulator was started with ``--manual-clock``)."""
        result: JsonObject = self._call("POST", "clock/advance", {"seconds": seconds})
        return result

    def config(self) -> JsonObject:
        result: JsonObject = self._call("GET", "config")
        return result

    def patch_config(self, **fields: float) -> JsonObject:
        """E.g. ``patch_config(reconcileDelaySeconds=0.2, scaleDownGraceSeconds=5)``."""
        result: JsonObject = self._call("PATCH", "config", dict(fields))
        return result

    def revisions(self, namespace: str, inference_service: str) -> JsonObject:
        """``{"revisionCount": n, "items": [{name, state, trafficPercent, pods, ...}]}``."""
        result: JsonObject = self._call(
            "GET", f"namespaces/{namespace}/inferenceservices/{inference_service}/revisions"
        )
        return result

    def all_revisions(self) -> JsonObject:
        result: JsonObject = self._call("GET", "revisions")
        return result

    def knative_service(self, namespace: str, inference_service: str) -> JsonObject:
        result: JsonObject = self._call(
            "GET", f"namespaces/{namespace}/inferenceservices/{inference_service}/knativeservice"
        )
        return result

    def set_revision_behaviour(self, namespace: str, revision: str, **behaviour: Any) -> JsonObject:
        """``readyAfterSeconds`` (None: never), ``failAfterSeconds``, ``failureMessage``, ``replicas``."""
        result: JsonObject = self._call(
            "PUT", f"namespaces/{namespace}/revisions/{revision}/behaviour", behaviour
        )
        return result

    def set_default_behaviour(self, namespace: str, inference_service: str, **behaviour: Any) -> JsonObject:
        """How the InferenceService's next revisions behave (same fields as a revision's)."""
        path = f"namespaces/{namespace}/inferenceservices/{inference_service}/revision-behaviour"
        result: JsonObject = self._call("PUT", path, behaviour)
        return result

    def set_revision_state(self, namespace: str, revision: str, state: str, message: str = "") -> JsonObject:
        """Force ``Ready``, ``Failed`` (with a message) or ``Pending`` now."""
        result: JsonObject = self._call(
            "POST", f"namespaces/{namespace}/revisions/{revision}/state", {"state": state, "message": message}
        )
        return result

    def requests(
        self, method: str | None = None, path: str | None = None, since: int = 0
    ) -> list[JsonObject]:
        """Logged API requests: ``{sequence, method, path, contentType, status, body, changedPaths, ...}``."""
        result = self._call("GET", "requests", query={"method": method, "path": path, "since": since})
        items: list[JsonObject] = result["items"]
        return items

    def clear_requests(self) -> None:
        self._call("DELETE", "requests")

    def add_fault(
        self,
        path: str,
        *,
        status: int | None = None,
        method: str | None = None,
        count: int | None = 1,
        delay_seconds: float = 0.0,
        message: str = "",
    ) -> int:
        """Make the next ``count`` requests whose path matches the regex ``path`` fail (or wait)."""
        body: JsonObject = {"path": path, "count": count, "delaySeconds": delay_seconds, "message": message}
        if status is not None:
            body["status"] = status
        if method is not None:
            body["method"] = method
        fault_id: int = self._call("POST", "faults", body)["id"]
        return fault_id

    def faults(self) -> list[JsonObject]:
        items: list[JsonObject] = self._call("GET", "faults")["items"]
        return items

    def clear_faults(self) -> None:
        self._call("DELETE", "faults")
