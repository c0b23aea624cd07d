"""A loopback webhook receiver: records every POST it gets (for the demo and end-to-end tests)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["ReceivedRequest", "WebhookReceiver"]


@dataclass(frozen=True)
class ReceivedRequest:
    path: str
    headers: dict[str, str]
    body: bytes
    received_at: float
    answered: int | None = 200  # the status the receiver answered with; None: closed without one

    def json(self) -> Any:
        return json.loads(self.body)


class WebhookReceiver:
    """``with WebhookReceiver() as hook: ... hook.url ... hook.wait_for(lambda r: ...)``."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, status: int = 200):
        # Faults, switchable at any time: the answer's status, a delay before it (real seconds), or
        # ``close`` (the connection is closed without an answer). Every POST is recorded either way.
        self.status = status
        self.delay_seconds = 0.0
        self.close = False
        self._requests: list[ReceivedRequest] = []
        self._condition = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                answered = None if receiver.close else receiver.status
                request = ReceivedRequest(self.path, dict(self.headers.items()), body, time.time(), answered)
                with receiver._condition:
                    receiver._requests.append(request)
                    receiver._condition.notify_all()
                if receiver.delay_seconds:
                    time.sleep(receiver.delay_seconds)
                if receiver.close:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook-receiver", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._condition:
            return list(self._requests)

    def wait_for(
        self, predicate: Callable[[ReceivedRequest], bool], timeout: float = 30.0
    ) -> ReceivedRequest:
        """The first request (received so far or later) matching ``predicate``; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout
        with self._condition:
            while True:
                for request in self._requests:
                    if predicate(request):
                        return request
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"no matching request within {timeout}s ({len(self._requests)} received)"
                    )
                self._condition.wait(remaining)

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
