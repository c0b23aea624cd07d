"""The controller's own telemetry: Prometheus metrics, /healthz and /readyz, structured logs.

Every value used in a decision is exported (``kserve_canary_check_value``), not only logged — the
peers' users asked for exactly that (Flagger #1815, Argo Rollouts #2276).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from canary.policy.model import Check

__all__ = ["ControllerMetrics", "HealthServer", "configure_logging"]

LIMIT_BOUNDS = ("max", "min", "max-vs-stable")
PHASES = ("Idle", "Pending", "Progressing", "Baking", "Succeeded", "RolledBack", "Paused")


class ControllerMetrics:
    """All metrics in one registry of their own, so several controllers can live in one test process."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        labels = ("namespace", "inference_service")
        self.phase = Gauge(
            "kserve_canary_rollout_phase",
            "1 for the rollout's current phase.",
            (*labels, "phase"),
            registry=self.registry,
        )
        self.weight = Gauge(
            "kserve_canary_rollout_weight",
            "Canary traffic percentage last observed in status (-1: no canary).",
            labels,
            registry=self.registry,
        )
        self.step = Gauge(
            "kserve_canary_rollout_step", "Index of the current step.", labels, registry=self.registry
        )
        self.decisions = Counter(
            "kserve_canary_decisions",
            "Decisions taken, by action.",
            (*labels, "action"),
            registry=self.registry,
        )
        self.check_value = Gauge(
            "kserve_canary_check_value",
            "Last measured value of a check, in its canonical unit (seconds, ratio, bytes, count).",
            (*labels, "check", "revision"),
            registry=self.registry,
        )
        self.check_verdict = Gauge(
            "kserve_canary_check_verdict",
            "1 for the last verdict of a check (pass, fail, no-data, error).",
            (*labels, "check", "verdict"),
            registry=self.registry,
        )
        self.check_limit = Gauge(
            "kserve_canary_check_limit",
            "A check's limit in its canonical unit: max and min as written in the policy, "
            "max-vs-stable = stable value x (1 + maxIncrease) while the stable value is above minStable.",
            (*labels, "check", "bound"),
            registry=self.registry,
        )
        self.query_duration = Histogram(
            "kserve_canary_prometheus_query_duration_seconds",
            "Duration of evidence collection per evaluation.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.query_errors = Counter(
            "kserve_canary_prometheus_query_errors",
            "Prometheus queries that failed, by error class.",
            ("error_class",),
            registry=self.registry,
        )
        self.reconcile_duration = Histogram(
            "kserve_canary_reconcile_duration_seconds",
            "Duration of one reconcile of one InferenceService.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "kserve_canary_reconcile_errors",
            "Reconciles that failed, by reason.",
            ("reason",),
            registry=self.registry,
        )
        self.leader = Gauge(
            "kserve_canary_leader", "1 while this replica holds the lease.", registry=self.registry
        )
        self.policies = Gauge(
            "kserve_canary_policies",
            "Policies loaded, and policy files with errors.",
            ("state",),
            registry=self.registry,
        )
        # Notification deliveries are counted by canary.notify's PrometheusDeliveryRecorder.

    def set_phase(self, namespace: str, inference_service: str, phase: str) -> None:
        for candidate in PHASES:
            self.phase.labels(namespace, inference_service, candidate).set(1 if candidate == phase else 0)

    def set_verdict(self, namespace: str, inference_service: str, check: str, verdict: str) -> None:
        for candidate in ("pass", "fail", "no-data", "error"):
            self.check_verdict.labels(namespace, inference_service, check, candidate).set(
                1 if candidate == verdict else 0
            )

    def set_limits(self, namespace: str, inference_service: str, check: Check, stable: float | None) -> None:
        """Export a check's limits (for dashboards drawing values against them).

        ``max`` and ``min`` as written; ``max-vs-stable`` = stable x (1 + maxIncrease) while the
        stable value is known and not below ``minStable``. A bound that does not apply is dropped.
        """
        relative = None
        floor = check.min_stable
        if check.max_increase is not None and stable is not None and (floor is None or stable >= floor):
            relative = stable * (1 + check.max_increase)
        bounds = {"max": check.max, "min": check.min, "max-vs-stable": relative}
        for bound, value in bounds.items():
            if value is None:
                _remove(self.check_limit, namespace, inference_service, check.name, bound)
            else:
                self.check_limit.labels(namespace, inference_service, check.name, bound).set(value)

    def forget(self, namespace: str, inference_service: str, checks: Iterable[str] = ()) -> None:
        """Drop a removed model's series so dashboards do not show ghosts."""
        for candidate in PHASES:
            _remove(self.phase, namespace, inference_service, candidate)
        _remove(self.weight, namespace, inference_service)
        _remove(self.step, namespace, inference_service)
        for check in checks:
            for revision in ("canary", "stable"):
                _remove(self.check_value, namespace, inference_service, check, revision)
            for verdict in ("pass", "fail", "no-data", "error"):
                _remove(self.check_verdict, namespace, inference_service, check, verdict)
            for bound in LIMIT_BOUNDS:
                _remove(self.check_limit, namespace, inference_service, check, bound)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _remove(metric: Gauge, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)


class HealthServer:
    """Serves /metrics, /healthz (the loop is alive) and /readyz (policies loaded, API reachable)."""

    def __init__(
        self,
        metrics: ControllerMetrics,
        *,
        host: str = "0.0.0.0",  # noqa: S104 - a pod serves its probes on all interfaces
        port: int = 8080,
        liveness: Callable[[], tuple[bool, str]],
        readiness: Callable[[], tuple[bool, str]],
    ):
        self._metrics = metrics
        self._liveness = liveness
        self._readiness = readiness
        handler = self._handler()
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, server._metrics.exposition(), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/livez"):
                    ok, why = server._liveness()
                    self._send(200 if ok else 503, why.encode(), "text/plain; charset=utf-8")
                elif path == "/readyz":
                    ok, why = server._readiness()
                    self._send(200 if ok else 503, why.encode(), "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: stay quiet
                return

        return Handler


def configure_logging(
    log_format: str = "auto",
    *,
    level: int = logging.INFO,
    extra_processors: Iterable[Any] = (),
    stream: Any = None,
) -> None:
    """structlog: JSON lines for machines, a readable console format on a TTY (``auto``)."""
    output = stream or sys.stderr
    if log_format == "auto":
        log_format = "console" if output.isatty() else "json"
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=output.isatty())
        if log_format == "console"
        else structlog.processors.JSONRenderer(sort_keys=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *extra_processors,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(output),
        cache_logger_on_first_use=False,
    )


class Heartbeat:
    """The main loop beats; /healthz fails when it has not beaten for ``tolerance`` seconds."""

    def __init__(self, tolerance: float, monotonic: Callable[[], float] = time.monotonic):
        self._tolerance = tolerance
        self._monotonic = monotonic
        self._last = monotonic()

    def beat(self) -> None:
        self._last = self._monotonic()

    def check(self) -> tuple[bool, str]:
        age = self._monotonic() - self._last
        if age > self._tolerance:
            return False, f"main loop stalled for {age:.0f}s\n"
        return True, "ok\n"
