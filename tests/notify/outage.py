"""A loopback receiver that goes through an outage on purpose: 500s, then connection refused (it stops
listening), then slow answers, then healthy again — on the same port throughout, as a real Slack or
webhook endpoint would be."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["OutageReceiver", "Received"]


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    status: int  # what it was answered

    @property
    def accepted(self) -> bool:
        return 200 <= self.status < 300


class OutageReceiver:
    def __init__(self) -> None:
        self.status = 200
        self.delay = 0.0  # seconds before answering
        self._requests: list[Received] = []
        self._arrived = 0  # requests read, answered or not yet
        self._changed = threading.Condition()
        self._server = self._listen(("127.0.0.1", 0))
        self._address = self._server.server_address[:2]

    # -- the outage ------------------------------------------------------------------------------

    def go_down(self) -> None:
        """Connection refused from now on."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def come_up(self, status: int = 200, delay: float = 0.0) -> None:
        self.status, self.delay = status, delay
        if self._server is None:
            self._server = self._listen((str(self._address[0]), int(self._address[1])))

    def stop(self) -> None:
        self.go_down()

    # -- what it saw -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self._address[0]!s}:{self._address[1]}"

    @property
    def requests(self) -> list[Received]:
        with self._changed:
            return list(self._requests)

    def accepted(self, path: str = "") -> list[Received]:
        return [r for r in self.requests if r.accepted and r.path.startswith(path)]

    def wait_accepted(self, path: str, count: int = 1, timeout: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [r for r in self._requests if r.accepted and r.path.startswith(path)]
                if len(found) >= count:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{len(found)} of {count} accepted requests to {path} within {timeout}s "
                        f"({len(self._requests)} received)"
                    )
                self._changed.wait(remaining)

    def wait_requests(self, count: int, timeout: float = 30.0) -> list[Received]:
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._requests) >= count, timeout):
                raise AssertionError(f"expected {count} requests, got {len(self._requests)}")
            return list(self._requests)

    def wait_arrivals(self, count: int, timeout: float = 30.0) -> None:
        """Wait until ``count`` requests have been read, before their (delayed) answers."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._arrived >= count, timeout):
                raise AssertionError(f"expected {count} requests to arrive, got {self._arrived}")

    # -- serving ---------------------------------------------------------------------------------

    def _listen(self, address: tuple[str, int]) -> ThreadingHTTPServer:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, delay = receiver.status, receiver.delay
                with receiver._changed:
                    receiver._arrived += 1
                    receiver._changed.notify_all()
                if delay:
                    time.sleep(delay)
                with receiver._changed:
                    receiver._requests.append(Received(self.path, dict(self.headers.items()), body, status))
                    receiver._changed.notify_all()
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    return  # the sender timed out and went away

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(address, Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        return server
