"""What tests need besides the API: a log of the requests clients made, and injected faults."""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from canary_sandbox.emulator.errors import ApiError

__all__ = ["Fault", "FaultInjector", "LoggedRequest", "RequestLog"]

JsonObject = dict[str, Any]

_BODY_LIMIT = 8192  # bodies larger than this are logged as a size and a prefix


@dataclass(frozen=True)
class LoggedRequest:
    """One API request as the emulator answered it."""

    sequence: int
    time: float  # real time, seconds since the epoch
    method: str
    path: str
    query: str
    content_type: str
    status: int
    user_agent: str
    body: Any  # the parsed JSON body, or a summary string for large or non-JSON bodies
    changed_paths: tuple[str, ...] = ()  # dotted paths the request changed in the stored object
    fault: int | None = None  # the id of the injected fault that answered it

    def to_json(self) -> JsonObject:
        return {
            "sequence": self.sequence,
            "time": self.time,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "contentType": self.content_type,
            "status": self.status,
            "userAgent": self.user_agent,
            "body": self.body,
            "changedPaths": list(self.changed_paths),
            "fault": self.fault,
        }

    def touched(self, prefix: str) -> bool:
        """Whether this request changed anything at or under the dotted ``prefix``."""
        return any(path == prefix or path.startswith(prefix + ".") for path in self.changed_paths)


def summarise_body(raw: bytes) -> Any:
    if not raw:
        return None
    if len(raw) > _BODY_LIMIT:
        return f"<{len(raw)} bytes> {raw[:200].decode(errors='replace')}..."
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


class RequestLog:
    """A bounded, thread-safe record of API requests (admin requests are not recorded)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._entries: deque[LoggedRequest] = deque(maxlen=capacity)
        self._sequence = itertools.count(1)
        self._lock = threading.Lock()

    def next_sequence(self) -> int:
        with self._lock:
            return next(self._sequence)

    def add(self, entry: LoggedRequest) -> None:
        with self._lock:
            self._entries.append(entry)

    def entries(
        self, method: str | None = None, path_contains: str | None = None, since: int = 0
    ) -> list[LoggedRequest]:
        with self._lock:
            snapshot = list(self._entries)
        return [
            entry
            for entry in snapshot
            if entry.sequence > since
            and (method is None or entry.method == method.upper())
            and (path_contains is None or path_contains in entry.path)
        ]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


@dataclass
class Fault:
    """Answer the next ``remaining`` matching requests with ``status`` (after ``delay_seconds``).

    Without a status, the request is only delayed (a slow or hanging apiserver) and then served.
    """

    id: int
    path_pattern: str  # a regular expression searched in the request path
    method: str | None = None
    status: int | None = None
    delay_seconds: float = 0.0
    remaining: int | None = 1  # None: until removed
    message: str = ""
    _compiled: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        try:
            self._compiled = re.compile(self.path_pattern)
        except re.error as error:
            raise ApiError.bad_request(f"invalid path pattern {self.path_pattern!r}: {error}") from None
        if self.status is not None and not 400 <= self.status <= 599:
            raise ApiError.bad_request("an injected status must be 4xx or 5xx")

    def matches(self, method: str, path: str) -> bool:
        return (self.method is None or self.method.upper() == method) and bool(self._compiled.search(path))

    def error(self, path: str) -> ApiError:
        assert self.status is not None
        message = self.message or f"injected fault {self.id} for {path}"
        if self.status == 409:
            message = self.message or (
                "Operation cannot be fulfilled: the object has been modified; please apply your changes "
                f"to the latest version and try again (injected fault {self.id})"
            )
        return ApiError(self.status, message)

    def to_json(self) -> JsonObject:
        return {
            "id": self.id,
            "method": self.method,
            "path": self.path_pattern,
            "status": self.status,
            "delaySeconds": self.delay_seconds,
            "remaining": self.remaining,
            "message": self.message,
        }


class FaultInjector:
    """Faults to apply to API requests, matched in the order they were added."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def add(
        self,
        path_pattern: str,
        *,
        method: str | None = None,
        status: int | None = None,
        delay_seconds: float = 0.0,
        count: int | None = 1,
        message: str = "",
    ) -> Fault:
        fault = Fault(next(self._ids), path_pattern, method, status, delay_seconds, count, message)
        with self._lock:
            self._faults.append(fault)
        return fault

    def add_from_json(self, document: JsonObject) -> Fault:
        if not isinstance(document, dict) or not isinstance(document.get("path"), str):
            raise ApiError.bad_request('a fault needs "path" (a regular expression)')
        count = document.get("count", 1)
        if count is not None and (not isinstance(count, int) or count < 1):
            raise ApiError.bad_request('"count" must be a positive integer or null')
        delay = document.get("delaySeconds", 0.0)
        if not isinstance(delay, int | float) or delay < 0:
            raise ApiError.bad_request('"delaySeconds" must be a non-negative number')
        status = document.get("status")
        if status is not None and not isinstance(status, int):
            raise ApiError.bad_request('"status" must be an HTTP status code')
        if status is None and not delay:
            raise ApiError.bad_request('a fault needs "status", "delaySeconds" or both')
        return self.add(
            document["path"],
            method=document.get("method"),
            status=status,
            delay_seconds=float(delay),
            count=count,
            message=str(document.get("message", "")),
        )

    def take(self, method: str, path: str) -> Fault | None:
        """The first matching fault, consuming one of its uses."""
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path):
                    if fault.remaining is not None:
                        fault.remaining -= 1
                        if fault.remaining <= 0:
                            self._faults.remove(fault)
                    return fault
        return None

    def active(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def remove(self, fault_id: int) -> bool:
        with self._lock:
            before = len(self._faults)
            self._faults = [fault for fault in self._faults if fault.id != fault_id]
            return len(self._faults) != before

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
