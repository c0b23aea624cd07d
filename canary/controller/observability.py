"""The controller's own telemetry: Prometheus metrics, /healthz and /readyz, structured logs.

Every value used in a decision is exported (``kserve_canary_check_value``), not only logged — the
peers' users asked for exactly that (Flagger #1815, Argo Rollouts #2276).
"""

from __future__ import annotations

import contextlib
import functools
import io
import ipaddress
import logging
import os
import selectors
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from canary.policy.model import Check

__all__ = ["ControllerMetrics", "HealthServer", "configure_logging", "default_bind_address"]

# The dashboard encodes a phase as its index here: a new phase is appended, never inserted.
PHASES = ("Idle", "Pending", "Progressing", "Baking", "Succeeded", "RolledBack", "Paused", "Promoting")


_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)  # buckets of a query's or a reconcile's duration


class ControllerMetrics:
    """All metrics in one registry of their own, so several controllers can live in one test process."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        counter = functools.partial(Counter, registry=self.registry)
        gauge = functools.partial(Gauge, registry=self.registry)
        histogram = functools.partial(Histogram, registry=self.registry)
        labels = ("namespace", "inference_service")
        self.rollouts = RolloutGauges()  # phase, step, weight, each check's verdict, value and limits
        self.registry.register(self.rollouts)
        self.decisions = counter(
            "kserve_canary_decisions", "Decisions taken, by action.", (*labels, "action")
        )
        self.query_duration = histogram(
            "kserve_canary_prometheus_query_duration_seconds",
            "Duration of evidence collection per evaluation.",
            buckets=_SECONDS,
        )
        self.query_errors = counter(
            "kserve_canary_prometheus_query_errors",
            "Prometheus queries that failed, by error class.",
            ("error_class",),
        )
        self.reconcile_duration = histogram(
            "kserve_canary_reconcile_duration_seconds",
            "Duration of one reconcile of one InferenceService.",
            buckets=_SECONDS,
        )
        self.reconcile_errors = counter(
            "kserve_canary_reconcile_errors", "Reconciles that failed, by reason.", ("reason",)
        )
        self.leader = gauge("kserve_canary_leader", "1 while this replica holds the lease.")
        self.policies = gauge(
            "kserve_canary_policies",
            "Policies loaded (loaded), policy files and PromotionPolicy objects with errors "
            "(invalid-files, invalid-objects), and models held by a conflict (held).",
            ("state",),
        )
        self.state_writes = counter(
            "kserve_canary_state_writes",
            "State ConfigMap writes, by the reason the change had to be stored "
            "(canary.rollout.persistence: phase, step, intent, failure-streak, explain-..., first).",
            ("reason",),
        )
        self.state_writes_skipped = counter(
            "kserve_canary_state_writes_skipped",
            "Evaluations whose new state only refreshed numbers, so nothing was written.",
        )
        self.api_requests = counter(
            "kserve_canary_api_requests",
            "Kubernetes API requests this process made, by kind (read: GET, list, watch; write).",
            ("kind",),
        )
        self.configmaps_ignored = counter(
            "kserve_canary_configmaps_ignored",
            "ConfigMaps labelled as kserve-canary's that it did not write (name, document, size or count "
            "per namespace), seen in a list or a watch event and not kept, by namespace.",
            ("namespace",),
        )
        self._tick_metrics()
        self._api_lock = threading.Lock()
        self._api_counts = {"read": 0, "write": 0}
        # Notification deliveries are counted by canary.notify's PrometheusDeliveryRecorder.

    def _tick_metrics(self) -> None:
        """The tick's own: its duration, the rollouts it decided, carried or skipped, its last run."""
        counter = functools.partial(Counter, registry=self.registry)
        self.tick_duration = Histogram(
            "kserve_canary_tick_duration_seconds",
            "Duration of one tick: read every due rollout, collect their evidence at once, decide and write.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32),
            registry=self.registry,
        )
        self.tick_rollouts = counter(
            "kserve_canary_tick_rollouts",
            "Rollouts by tick outcome: due; decided (or failed) as each decision finishes; carried (not "
            "read before the budget ran out: first in the next tick); in-flight (evidence in hand, still "
            "deciding when the budget ran out); skipped (not owned, or caches not listed yet).",
            ("outcome",),
        )
        self.tick_last = Gauge(
            "kserve_canary_tick_last",
            "The last tick: due and decided rollouts, rollouts carried over, evidence collect calls, "
            "Kubernetes API reads and writes made while it ran, its duration in seconds.",
            ("measure",),
            registry=self.registry,
        )
        self.ticks = counter("kserve_canary_ticks", "Ticks run.")

    def count_api_requests(self, api_client: Any) -> None:
        """Count every request ``api_client`` sends (kubernetes.client.ApiClient), reads and writes."""
        send = api_client.call_api
        counter = self.api_requests

        def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            kind = "read" if method.upper() in ("GET", "HEAD") else "write"
            counter.labels(kind).inc()
            with self._api_lock:
                self._api_counts[kind] += 1
            return send(method, url, *args, **kwargs)

        api_client.call_api = counted

    def api_totals(self) -> tuple[int, int]:
        """Kubernetes API reads and writes counted so far (:meth:`count_api_requests`)."""
        with self._api_lock:
            return self._api_counts["read"], self._api_counts["write"]

    def set_phase(self, namespace: str, inference_service: str, phase: str) -> None:
        self.rollouts.update(namespace, inference_service, phase=phase)

    def set_step(self, namespace: str, inference_service: str, step: int) -> None:
        self.rollouts.update(namespace, inference_service, step=step)

    def set_weight(self, namespace: str, inference_service: str, weight: float) -> None:
        self.rollouts.update(namespace, inference_service, weight=weight)

    def set_verdict(self, namespace: str, inference_service: str, check: str, verdict: str) -> None:
        self.rollouts.update_check(namespace, inference_service, check, verdict=verdict)

    def set_check_value(
        self, namespace: str, inference_service: str, check: str, revision: str, value: float
    ) -> None:
        self.rollouts.update_check(namespace, inference_service, check, value=(revision, value))

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
        applying = {bound: value for bound, value in bounds.items() if value is not None}
        self.rollouts.update_check(namespace, inference_service, check.name, limits=applying)

    def forget(self, namespace: str, inference_service: str) -> None:
        """Drop a model's series (its policy is gone, or another replica owns it now) so dashboards
        do not show ghosts."""
        self.rollouts.forget(namespace, inference_service)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(slots=True)
class _CheckGauges:
    verdict: str | None = None
    values: dict[str, float] = field(default_factory=dict)  # "canary" / "stable" -> value
    limits: dict[str, float] = field(default_factory=dict)  # bound -> value


@dataclass(slots=True)
class _RolloutGauges:
    phase: str | None = None
    step: int | None = None
    weight: float | None = None
    checks: dict[str, _CheckGauges] = field(default_factory=dict)


class RolloutGauges(Collector):
    """The per-rollout gauges, written out at each scrape from one record per rollout. Values are
    set as the controller decides (the last one stays until changed, as a Gauge's would).

    One small record per rollout instead of labelled Gauge children: those are some 40 objects of
    about 750 bytes per rollout (30 MB at 1,000 rollouts)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rollouts: dict[tuple[str, str], _RolloutGauges] = {}

    def update(
        self,
        namespace: str,
        inference_service: str,
        *,
        phase: str | None = None,
        step: int | None = None,
        weight: float | None = None,
    ) -> None:
        with self._lock:
            record = self._rollouts.setdefault((namespace, inference_service), _RolloutGauges())
            if phase is not None:
                record.phase = phase
            if step is not None:
                record.step = step
            if weight is not None:
                record.weight = weight

    def update_check(
        self,
        namespace: str,
        inference_service: str,
        check: str,
        *,
        verdict: str | None = None,
        value: tuple[str, float] | None = None,
        limits: Mapping[str, float] | None = None,
    ) -> None:
        """``value``: (revision, number); ``limits`` replace the check's bounds."""
        with self._lock:
            record = self._rollouts.setdefault((namespace, inference_service), _RolloutGauges())
            gauges = record.checks.setdefault(check, _CheckGauges())
            if verdict is not None:
                gauges.verdict = verdict
            if value is not None:
                gauges.values[value[0]] = value[1]
            if limits is not None:
                gauges.limits = dict(limits)

    def forget(self, namespace: str, inference_service: str) -> None:
        with self._lock:
            self._rollouts.pop((namespace, inference_service), None)

    def describe(self) -> Iterable[Metric]:
        return _rollout_families()

    def collect(self) -> Iterable[Metric]:
        phase, weight, step, value, verdict, limit = _rollout_families()
        with self._lock:
            for (namespace, name), record in self._rollouts.items():
                self._add(record, namespace, name, (phase, weight, step, value, verdict, limit))
        return [phase, weight, step, value, verdict, limit]

    @staticmethod
    def _add(
        record: _RolloutGauges, namespace: str, name: str, families: Sequence[GaugeMetricFamily]
    ) -> None:
        phase, weight, step, value, verdict, limit = families
        if record.phase is not None:
            for candidate in PHASES:
                phase.add_metric([namespace, name, candidate], 1.0 if candidate == record.phase else 0.0)
        if record.weight is not None:
            weight.add_metric([namespace, name], record.weight)
        if record.step is not None:
            step.add_metric([namespace, name], record.step)
        for check, gauges in record.checks.items():
            for revision, number in gauges.values.items():
                value.add_metric([namespace, name, check, revision], number)
            if gauges.verdict is not None:
                for candidate in VERDICTS:
                    verdict.add_metric(
                        [namespace, name, check, candidate], 1.0 if candidate == gauges.verdict else 0.0
                    )
            for bound, number in gauges.limits.items():
                limit.add_metric([namespace, name, check, bound], number)


VERDICTS = ("pass", "fail", "not-yet", "no-data", "error")
_ROLLOUT = ["namespace", "inference_service"]


def _rollout_families() -> list[GaugeMetricFamily]:
    return [
        GaugeMetricFamily(
            "kserve_canary_rollout_phase", "1 for the rollout's current phase.", labels=[*_ROLLOUT, "phase"]
        ),
        GaugeMetricFamily(
            "kserve_canary_rollout_weight",
            "Canary traffic percentage last observed in status (-1: no canary).",
            labels=_ROLLOUT,
        ),
        GaugeMetricFamily("kserve_canary_rollout_step", "Index of the current step.", labels=_ROLLOUT),
        GaugeMetricFamily(
            "kserve_canary_check_value",
            "Last measured value of a check, in its canonical unit (seconds, ratio, bytes, count).",
            labels=[*_ROLLOUT, "check", "revision"],
        ),
        GaugeMetricFamily(
            "kserve_canary_check_verdict",
            "1 for the last verdict of a check (pass, fail, no-data, error).",
            labels=[*_ROLLOUT, "check", "verdict"],
        ),
        GaugeMetricFamily(
            "kserve_canary_check_limit",
            "A check's limit in its canonical unit: max and min as written in the policy, "
            "max-vs-stable = stable value x (1 + maxIncrease) while the stable value is above minStable.",
            labels=[*_ROLLOUT, "check", "bound"],
        ),
    ]


def default_bind_address(environ: Mapping[str, str] = os.environ) -> str:
    """Where the probes and /metrics listen unless ``--metrics-bind-address`` says otherwise.

    The pod's own IP (the manifests set ``POD_IP`` from the downward API: the kubelet probes it and
    Prometheus scrapes it), never every interface; outside a pod, loopback only.
    """
    return environ.get("POD_IP", "").strip() or "127.0.0.1"


class HealthServer:
    """Serves /metrics, /healthz (the loop is alive) and /readyz (policies loaded, API reachable).

    Bounded by construction, so that clients cannot exhaust the process:

    * one thread multiplexes every connection until its request head (up to the blank line) has
      arrived; a connection that has not sent it within ``request_timeout`` seconds is closed, and
      beyond ``max_pending`` waiting connections the oldest is closed (a probe sends its request at
      once, a half-sent request only ever waits);
    * complete requests run on a fixed pool of ``max_workers`` threads; when ``max_queued``
      requests already wait for one, a new one is closed unanswered;
    * every response is written with a socket timeout of ``request_timeout`` and the connection is
      then closed (HTTP/1.0, no keep-alive), and a request head over 16 KiB is refused.
    """

    MAX_HEAD_BYTES = 16 * 1024

    def __init__(
        self,
        metrics: ControllerMetrics,
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        liveness: Callable[[], tuple[bool, str]],
        readiness: Callable[[], tuple[bool, str]],
        request_timeout: float = 5.0,
        max_workers: int = 4,
        max_pending: int = 64,
        max_queued: int = 16,
    ):
        self._metrics = metrics
        self._liveness = liveness
        self._readiness = readiness
        self._timeout = request_timeout
        self._max_pending = max_pending
        self._handler_class = self._handler()
        family = socket.AF_INET6 if _is_ipv6(host) else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host.strip("[]"), port))
            self._listener.listen(128)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self._wake_reader, self._wake_writer = socket.socketpair()
        self._wake_reader.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_reader, selectors.EVENT_READ, None)
        # Connections whose request head is incomplete, oldest first: socket -> (deadline, bytes so far).
        self._pending: OrderedDict[socket.socket, tuple[float, bytearray]] = OrderedDict()
        self._workers = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="health-worker")
        self._queued = threading.BoundedSemaphore(max_workers + max_queued)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="health-server", daemon=True)

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def address(self) -> str:
        return str(self._listener.getsockname()[0])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_writer.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        else:
            self._close_all()
        self._workers.shutdown(wait=True, cancel_futures=True)

    # -- the connection loop --------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                next_deadline = min((deadline for deadline, _ in self._pending.values()), default=now + 1)
                for key, _ in self._selector.select(timeout=max(0.01, min(1.0, next_deadline - now))):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_reader:
                        with contextlib.suppress(OSError):
                            self._wake_reader.recv(64)
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                self._expire(time.monotonic())
        finally:
            self._close_all()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # e.g. EMFILE: the next round tries again
            connection.setblocking(False)
            self._pending[connection] = (time.monotonic() + self._timeout, bytearray())
            self._selector.register(connection, selectors.EVENT_READ, None)
            while len(self._pending) > self._max_pending:
                oldest = next(iter(self._pending))
                self._drop(oldest)

    def _read(self, connection: socket.socket) -> None:
        if connection not in self._pending:
            return
        try:
            chunk = connection.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(connection)
            return
        _, head = self._pending[connection]
        head.extend(chunk)
        if b"\r\n\r\n" not in head and b"\n\n" not in head:
            if len(head) > self.MAX_HEAD_BYTES:
                self._drop(connection)
            return
        self._unwatch(connection)
        if not self._queued.acquire(blocking=False):
            _close(connection)  # every worker busy and the queue full: shed the request
            return
        try:
            self._workers.submit(self._respond, connection, bytes(head))
        except RuntimeError:  # shutting down
            self._queued.release()
            _close(connection)

    def _expire(self, now: float) -> None:
        for connection, (deadline, _) in list(self._pending.items()):
            if deadline <= now:
                self._drop(connection)

    def _unwatch(self, connection: socket.socket) -> None:
        self._pending.pop(connection, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(connection)

    def _drop(self, connection: socket.socket) -> None:
        self._unwatch(connection)
        _close(connection)

    def _close_all(self) -> None:
        for connection in list(self._pending):
            self._drop(connection)
        with contextlib.suppress(OSError):
            self._selector.close()
        for sock in (self._listener, self._wake_reader, self._wake_writer):
            with contextlib.suppress(OSError):
                sock.close()

    # -- one request, on a worker -----------------------------------------------------------------

    def _respond(self, connection: socket.socket, head: bytes) -> None:
        try:
            connection.setblocking(True)
            connection.settimeout(self._timeout)
            self._handler_class(connection, head)
        except OSError:
            pass  # the client went away or stopped reading: nothing to answer
        finally:
            _close(connection)
            self._queued.release()

    def _handler(self) -> type[_Handler]:
        server = self

        class Handler(_Handler):
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

        return Handler


class _Handler(BaseHTTPRequestHandler):
    """One request whose head has already been read; the answer goes to the connection."""

    def __init__(self, connection: socket.socket, head: bytes):  # no socketserver underneath
        self.request = self.connection = connection
        self.client_address = ("", 0)
        self.server = None  # type: ignore[assignment]
        self.rfile = io.BytesIO(head)
        self.wfile = connection.makefile("wb")
        try:
            self.handle_one_request()
            self.wfile.flush()
        finally:
            with contextlib.suppress(OSError):
                self.wfile.close()

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: stay quiet
        return


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).version == 6
    except ValueError:
        return False


def _close(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.close()


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
