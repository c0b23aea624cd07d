"""Real HTTP on loopback for the notification tests: a scriptable receiver (Slack / webhook) and a
small Kubernetes apiserver stand-in that stores Events (create, merge-patch, list).

Fixtures are in ``conftest.py``; helpers are imported from here."""

from __future__ import annotations

import json
import re
import threading
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes.client import ApiClient, Configuration

from canary.notify.message import CheckLine, CheckVerdict, Notification, NotificationAction, Severity
from canary.policy.units import Unit
from canary.rollout.vocabulary import decision_id

WAIT = 10.0  # generous upper bound for "eventually"; tests finish as soon as the condition holds


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False  # block until the receiver is released (a slow/hanging endpoint)
    echo_request: bool = False  # answer with the request line (receivers that echo URLs in errors)


class Receiver:
    """An HTTP server on 127.0.0.1 answering from a script of replies (then 200 "ok")."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.script: deque[Reply] = deque()
        self.changed = threading.Condition()
        self.release = threading.Event()
        self.entered_hang = threading.Event()
        self.in_flight = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def reply(self, *replies: Reply) -> None:
        self.script.extend(replies)

    def wait_for(self, count: int, timeout: float = WAIT) -> list[Recorded]:
        with self.changed:
            if not self.changed.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"expected {count} requests, got {len(self.requests)}")
            return list(self.requests)

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                recorded = Recorded("POST", self.path, dict(self.headers.items()), body)
                reply = receiver.script.popleft() if receiver.script else Reply()
                with receiver.changed:
                    receiver.requests.append(recorded)
                    receiver.in_flight += 1
                    receiver.changed.notify_all()
                try:
                    if reply.hang:
                        receiver.entered_hang.set()
                        receiver.release.wait(WAIT)
                    payload = f"{self.command} {self.path}".encode() if reply.echo_request else reply.body
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                finally:
                    with receiver.changed:
                        receiver.in_flight -= 1
                        receiver.changed.notify_all()

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


# ---------------------------------------------------------------------------------------------
# A minimal apiserver for core/v1 Events: enough to exercise create / 409 / merge-patch / 404.

_EVENTS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/events(?:/(?P<name>[^/?]+))?(?:\?.*)?$")


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merge(result.get(key), value)
    return result


class EventApiServer:
    """Stores Events per namespace/name over real HTTP; ``fail_next`` scripts error answers."""

    def __init__(self) -> None:
        self.events: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[Recorded] = []
        self.fail_next: deque[tuple[int, dict[str, str]]] = deque()
        self.lock = threading.Condition()
        self._version = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def api_client(self) -> ApiClient:
        configuration = Configuration(host=self.url)
        return ApiClient(configuration)

    def wait_for_requests(self, count: int, timeout: float = WAIT) -> list[Recorded]:
        with self.lock:
            if not self.lock.wait_for(lambda: len(self.requests) >= count, timeout):
                raise AssertionError(f"expected {count} apiserver requests, got {len(self.requests)}")
            return list(self.requests)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(
                self, code: int, reason: str, message: str, headers: dict[str, str] | None = None
            ) -> None:
                body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
                self._answer(code, {**body, "reason": reason, "code": code}, headers)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                with server.lock:
                    server.requests.append(
                        Recorded(self.command, self.path, dict(self.headers.items()), body)
                    )
                    server.lock.notify_all()
                    failure = server.fail_next.popleft() if server.fail_next else None
                if failure is not None:
                    code, headers = failure
                    self._status(code, "Scripted", f"scripted failure {code}", headers)
                    return
                match = _EVENTS.match(self.path)
                if match is None:
                    self._status(404, "NotFound", f"no route {self.path}")
                    return
                namespace, name = match["ns"], match["name"]
                with server.lock:
                    if self.command == "POST" and name is None:
                        event = json.loads(body)
                        key = (namespace, event["metadata"]["name"])
                        if key in server.events:
                            self._status(409, "AlreadyExists", f'events "{key[1]}" already exists')
                            return
                        server._version += 1
                        event["metadata"]["namespace"] = namespace
                        event["metadata"]["resourceVersion"] = str(server._version)
                        server.events[key] = event
                        self._answer(201, event)
                    elif self.command == "PATCH" and name is not None:
                        if self.headers.get("Content-Type") != "application/merge-patch+json":
                            self._status(415, "UnsupportedMediaType", "this server only merge-patches")
                            return
                        key = (namespace, name)
                        if key not in server.events:
                            self._status(404, "NotFound", f'events "{name}" not found')
                            return
                        server._version += 1
                        patched = _merge(server.events[key], json.loads(body))
                        patched["metadata"]["resourceVersion"] = str(server._version)
                        server.events[key] = patched
                        self._answer(200, patched)
                    elif self.command == "GET" and name is None:
                        items = [event for (ns, _), event in server.events.items() if ns == namespace]
                        self._answer(
                            200, {"kind": "EventList", "apiVersion": "v1", "metadata": {}, "items": items}
                        )
                    else:
                        self._status(405, "MethodNotAllowed", f"{self.command} {self.path}")

            do_POST = do_PATCH = do_GET = _handle

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler


# ---------------------------------------------------------------------------------------------
# Notifications


DECISION_TIME = datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)


def make_notification(**overrides: Any) -> Notification:
    """An 'advanced 10% → 30%' decision with three checks; override anything."""
    values: dict[str, Any] = {
        "id": decision_id("ml", "llama-chat", "llama-chat-predictor-00002", "advanced", 30),
        "time": DECISION_TIME,
        "namespace": "ml",
        "inference_service": "llama-chat",
        "policy": "llama-chat-policy",
        "canary_revision": "llama-chat-predictor-00002",
        "stable_revision": "llama-chat-predictor-00001",
        "action": NotificationAction.ADVANCED,
        "severity": Severity.INFO,
        "phase": "Progressing",
        "summary": "Step 10% held 10m with every check passing; advancing to 30%.",
        "from_weight": 10,
        "to_weight": 30,
        "reasons": ("3 of 3 checks passed over 10m on 1,840 canary requests (minRequests 100).",),
        "checks": (
            CheckLine(
                "p99",
                CheckVerdict.PASS,
                value="612ms",
                limit="≤ 800ms and ≤ +20% vs stable",
                stable="540ms",
                samples="1840 requests",
                value_number=0.612,
                stable_number=0.54,
                unit=Unit.SECONDS,
            ),
            CheckLine(
                "errors",
                CheckVerdict.PASS,
                value="0.11%",
                limit="≤ 1%",
                stable="0.09%",
                samples="1840 requests",
                value_number=0.0011,
                stable_number=0.0009,
                unit=Unit.RATIO,
            ),
            CheckLine(
                "oom",
                CheckVerdict.PASS,
                value="0",
                limit="≤ 0",
                critical=True,
                value_number=0,
                unit=Unit.COUNT,
            ),
        ),
        "inference_service_uid": "6f1c2a1e-0d7b-4d0e-9d38-1b0c7a1f2e3d",
    }
    values.update(overrides)
    return Notification(**values)


def rollback_notification(**overrides: Any) -> Notification:
    values: dict[str, Any] = {
        "id": decision_id("ml", "llama-chat", "llama-chat-predictor-00002", "rolled-back"),
        "action": NotificationAction.ROLLED_BACK,
        "severity": Severity.WARNING,
        "phase": "RolledBack",
        "summary": "Critical check oom failed at 30%; rolled back to the stable revision.",
        "from_weight": 30,
        "to_weight": 0,
        "reasons": ("oom: 2 OOMKilled restarts of the canary, limit ≤ 0 (critical).",),
        "checks": (
            CheckLine(
                "oom",
                CheckVerdict.FAIL,
                value="2",
                limit="≤ 0",
                critical=True,
                value_number=2,
                unit=Unit.COUNT,
            ),
            CheckLine("p99", CheckVerdict.NO_DATA, limit="≤ 800ms", detail="12 requests < minRequests 100"),
            CheckLine("kv-cache", CheckVerdict.ERROR, limit="≤ 95%", detail="Prometheus timed out"),
        ),
    }
    values.update(overrides)
    return make_notification(**values)
