"""A loopback HTTP server whose answers are scripted byte by byte: huge, trickled, cut short,
redirected. For the tests of what the controller reads from URLs it does not own (gates, chat and
webhook receivers, Prometheus): every answer bounded in time and in bytes.

``Loopback(script)`` listens on 127.0.0.1 only; ``script(exchange)`` answers each request. HTTP/1.0
answers (the server's default): without a ``Content-Length`` the body ends when the script returns
and the connection closes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MiB = 1024 * 1024


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]


class Exchange:
    """One request being answered; ``write`` says whether the client still reads."""

    def __init__(self, handler: BaseHTTPRequestHandler, server: Loopback) -> None:
        self._handler = handler
        self._server = server

    def head(self, status: int, headers: Mapping[str, str] = {}) -> None:
        self._handler.send_response(status)
        for name, value in headers.items():
            self._handler.send_header(name, value)
        self._handler.end_headers()
        self._handler.wfile.flush()

    def write(self, data: bytes) -> bool:
        try:
            self._handler.wfile.write(data)
            self._handler.wfile.flush()
        except OSError:  # the client hung up
            return False
        with self._server.lock:
            self._server.sent += len(data)
        return True

    def stream(self, total: int, chunk: int = 256 * 1024) -> None:
        """``total`` bytes of "x" as fast as the client takes them (until it hangs up)."""
        block = b"x" * chunk
        for _ in range(total // chunk):
            if not self.write(block):
                return

    def trickle(self, data: bytes, every: float) -> None:
        """``data`` one byte every ``every`` seconds (until the client hangs up)."""
        for index in range(len(data)):
            if not self.write(data[index : index + 1]):
                return
            time.sleep(every)


class Loopback:
    """An HTTP server on 127.0.0.1 answering every request with ``script``."""

    def __init__(self, script: Callable[[Exchange], None]) -> None:
        self.seen: list[Seen] = []
        self.sent = 0  # body bytes the client took
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                with outer.lock:
                    outer.seen.append(Seen(self.command, self.path, dict(self.headers.items())))
                with contextlib.suppress(OSError):  # the client hung up
                    script(Exchange(self, outer))

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def loopback(script: Callable[[Exchange], None]) -> Iterator[Loopback]:
    server = Loopback(script)
    try:
        yield server
    finally:
        server.stop()
