"""A metrics endpoint on loopback whose exposition text comes from a callable.

Give it a function returning Prometheus text exposition (it is called on every scrape, so the
function can let counters grow, reset, or series appear and disappear over time) and point a
:class:`~canary_sandbox.prometheus.PrometheusServer` at :attr:`FixtureExporter.target`::

    with FixtureExporter(lambda: f"requests_total {{pod=\\"a\\"}} {count()}\\n") as exporter:
        with PrometheusServer(scrape_targets=[exporter.target]) as prometheus:
            ...

It also counts the scrapes it served (:attr:`scrapes`), which lets a test wait for fresh data.

:class:`IngestionLag` wraps a render function so that Prometheus holds its samples ``lag`` seconds
late, as behind remote write, a Thanos sidecar's upload or Mimir's ingesters: each scrape is
answered with the exposition rendered at least ``lag`` ago, every sample carrying the time it was
rendered. The newest samples are simply not there yet, and ``timestamp()`` says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self

__all__ = ["FixtureExporter", "IngestionLag"]

_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class FixtureExporter:
    """Serves ``render()`` at ``/metrics`` on 127.0.0.1 (a free port) from a background thread."""

    def __init__(self, render: Callable[[], str]) -> None:
        self._render = render
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._scrapes = 0
        self._lock = threading.Lock()

    @property
    def scrapes(self) -> int:
        with self._lock:
            return self._scrapes

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the exporter is not running")
        return int(self._server.server_address[1])

    @property
    def target(self) -> str:
        """``host:port`` as a Prometheus static target."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> Self:
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                try:
                    body = exporter._render().encode("utf-8")
                except Exception as error:  # a broken fixture shows up as a failed scrape, not a hang
                    self.send_error(500, explain=str(error))
                    return
                with exporter._lock:
                    exporter._scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", _CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return  # scrapes every second would flood the test output

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fixture-exporter", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()


class IngestionLag:
    """``render`` as Prometheus sees it behind an ingestion lag of ``lag`` seconds.

    Every call renders now and keeps the text with its time; it answers the newest text rendered at
    least ``lag`` seconds ago, each sample line with that time as its explicit timestamp (the text
    format's optional third field, in milliseconds; Prometheus stores scraped samples at their own
    timestamps: ``honor_timestamps`` is true by default). Before ``lag`` has passed it answers
    nothing. Samples with their own timestamps get no staleness markers (Prometheus 2.42), so a
    series that disappears stays visible for the 5-minute lookback instead of ending at once.
    """

    def __init__(self, render: Callable[[], str], lag: float, clock: Callable[[], float] = time.time) -> None:
        if lag < 0:
            raise ValueError("the ingestion lag cannot be negative")
        self._render = render
        self.lag = lag
        self._clock = clock
        self._kept: list[tuple[float, str]] = []  # (rendered at, text), oldest first
        self._lock = threading.Lock()

    def __call__(self) -> str:
        now = self._clock()
        text = self._render()
        with self._lock:
            self._kept.append((now, text))
            ripe = [index for index, (at, _) in enumerate(self._kept) if at <= now - self.lag]
            if not ripe:
                return ""
            del self._kept[: ripe[-1]]  # the newest ripe one stays: it is served until a newer ripens
            at, served = self._kept[0]
        return _stamped(served, round(at * 1000))


def _stamped(text: str, millis: int) -> str:
    """Every sample line of an exposition with ``millis`` as its timestamp."""
    lines = [
        line if not line.strip() or line.startswith("#") else f"{line} {millis}" for line in text.splitlines()
    ]
    return "\n".join(lines) + "\n"
