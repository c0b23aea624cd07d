"""A fault-injecting HTTP proxy on loopback, for the fault suite (``tests/faults``).

Put it between the controller and a real server — Prometheus, or the API emulator — and switch
faults on and off from the test, in process::

    with FaultProxy(prometheus.url) as proxy:
        controller = stack.start_controller(prometheus_url=proxy.url)
        rule = proxy.add(ProxyFault.malformed_json(), path=r"/api/v1/query")
        ...
        proxy.remove(rule)

Without a matching fault every request is forwarded unchanged (keep-alive, bodies, headers; watch
streams are relayed chunk by chunk). Faults, matched in the order added (``path`` and ``body`` are
regular expressions searched in the request path and in the query string plus body):

* a canned answer: any status, content type and body — ``status: error`` envelopes, HTML from an
  auth proxy, truncated JSON (:meth:`ProxyFault.answer` and the named constructors);
* ``hang`` (the request is read and never answered until the fault's time is up, then the
  connection is closed), ``delay`` (answered normally, late), ``reset`` (closed at once: a server
  that is down);
* ``drop-response`` (forwarded, the server acts on it, the answer is thrown away and the connection
  closed: a lost response after commit);
* ``rewrite`` of a Prometheus vector answer: the value of every series whose labels match
  ``series`` becomes ``NaN``/``+Inf``/``-Inf``, or the series disappear (``empty``);
* for watches (``?watch=``): ``watch-gone`` (one ``ERROR`` event with a 410 ``Status``, then the
  end) and ``watch-drop`` (relayed for ``after_seconds``, then the connection is cut).

Every request is logged with the fault that answered it (:attr:`FaultProxy.log`), so a test can
say when a fault was actually seen by the client.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import re
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit

__all__ = ["FaultProxy", "ProxiedRequest", "ProxyFault", "ProxyRule"]

FaultKind = Literal[
    "answer", "hang", "delay", "reset", "drop-response", "rewrite", "watch-gone", "watch-drop"
]
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "content-length",
    "host",
}


@dataclass(frozen=True)
class ProxyFault:
    """What to do with a matching request (build it with the class methods)."""

    kind: FaultKind
    status: int = 200
    content_type: str = "application/json"
    body: bytes = b""
    seconds: float = 0.0  # hang: how long before the connection is closed; delay: added latency
    value: str = ""  # rewrite: "NaN", "+Inf", "-Inf" or "empty"
    series: str = ""  # rewrite: regex searched in each series' labels (as sorted JSON)

    @classmethod
    def answer(cls, status: int, body: bytes | str, content_type: str = "application/json") -> ProxyFault:
        return cls("answer", status, content_type, body.encode() if isinstance(body, str) else body)

    @classmethod
    def status_error(cls) -> ProxyFault:
        """Prometheus' own error envelope (HTTP 422, ``errorType: execution``)."""
        return cls.answer(
            422, json.dumps({"status": "error", "errorType": "execution", "error": "injected: query failed"})
        )

    @classmethod
    def malformed_json(cls) -> ProxyFault:
        return cls.answer(200, '{"status":"success","data":{"resultType":"vector","result":[{"metric":')

    @classmethod
    def html(cls) -> ProxyFault:
        """An authenticating proxy's login page, with 200."""
        return cls.answer(200, "<html><body><h1>Sign in</h1></body></html>", "text/html; charset=utf-8")

    @classmethod
    def hang(cls, seconds: float = 60.0) -> ProxyFault:
        return cls("hang", seconds=seconds)

    @classmethod
    def delay(cls, seconds: float) -> ProxyFault:
        return cls("delay", seconds=seconds)

    @classmethod
    def reset(cls) -> ProxyFault:
        return cls("reset")

    @classmethod
    def drop_response(cls) -> ProxyFault:
        return cls("drop-response")

    @classmethod
    def rewrite(cls, value: str, series: str) -> ProxyFault:
        if value not in {"NaN", "+Inf", "-Inf", "empty"}:
            raise ValueError(f"a rewrite is NaN, +Inf, -Inf or empty, not {value!r}")
        return cls("rewrite", value=value, series=series)

    @classmethod
    def watch_gone(cls) -> ProxyFault:
        return cls("watch-gone")

    @classmethod
    def watch_drop(cls, after_seconds: float = 0.0) -> ProxyFault:
        return cls("watch-drop", seconds=after_seconds)


@dataclass
class ProxyRule:
    id: int
    fault: ProxyFault
    path: str = ""
    body: str = ""
    method: str | None = None
    remaining: int | None = None  # None: until removed
    hits: int = 0  # requests it answered so far
    _path: re.Pattern[str] = field(init=False, repr=False)
    _body: re.Pattern[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._path = re.compile(self.path)
        self._body = re.compile(self.body)

    def matches(self, method: str, path: str, text: str, watch: bool) -> bool:
        if self.fault.kind.startswith("watch-") != watch:
            return False
        return (
            (self.method is None or self.method == method)
            and bool(self._path.search(path))
            and bool(self._body.search(text))
        )


@dataclass(frozen=True)
class ProxiedRequest:
    time: float  # real time the request arrived
    method: str
    path: str
    text: str  # query string and body, decoded
    status: int | None  # what the client got; None: no answer (hang, reset, drop)
    fault: FaultKind | None
    rule: int | None
    done: float  # real time it was finished


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], owner: FaultProxy) -> None:
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        owner = self.server.owner
        arrived = time.time()
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        parts = urlsplit(self.path)
        text = parts.query + "\n" + body.decode(errors="replace")
        watch = "watch=1" in parts.query or "watch=true" in parts.query.lower()
        rule = owner.take(method, parts.path, text, watch)
        fault = rule.fault if rule is not None else None
        status: int | None = None
        try:
            # A grouped query answers many series at once: every rewrite rule it matches applies.
            rewrites = owner.rewrites(method, parts.path, text, watch)
            status = self._serve(method, body, fault, watch, rewrites)
        except (BrokenPipeError, ConnectionResetError, TimeoutError, OSError):
            self.close_connection = True
        finally:
            owner.record(
                ProxiedRequest(
                    arrived,
                    method,
                    parts.path,
                    text,
                    status,
                    fault.kind if fault is not None else None,
                    rule.id if rule is not None else None,
                    time.time(),
                )
            )

    def _serve(
        self,
        method: str,
        body: bytes,
        fault: ProxyFault | None,
        watch: bool,
        rewrites: list[ProxyFault] | None = None,
    ) -> int | None:
        owner = self.server.owner
        if fault is not None:
            if fault.kind == "answer":
                self._reply(fault.status, fault.content_type, fault.body)
                return fault.status
            if fault.kind == "hang":
                owner.stopping.wait(fault.seconds)
                self._abort()
                return None
            if fault.kind == "reset":
                self._abort()
                return None
            if fault.kind == "delay":
                owner.stopping.wait(fault.seconds)
            if fault.kind == "watch-gone":
                gone = {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": "too old resource version (injected)",
                        "reason": "Expired",
                        "code": 410,
                    },
                }
                self._start_stream(200, "application/json")
                self._chunk(json.dumps(gone).encode() + b"\n")
                self._chunk(b"")
                return 200
        upstream = http.client.HTTPConnection(
            owner.upstream_host, owner.upstream_port, timeout=None if watch else owner.timeout
        )
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            # Plain answers only, so that a rewrite can read them (the client accepts gzip).
            headers = {k: v for k, v in headers.items() if k.lower() != "accept-encoding"}
            upstream.request(method, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            if watch:
                cut = fault.seconds if fault is not None and fault.kind == "watch-drop" else None
                return self._relay_stream(upstream, response, cut)
            payload = response.read()
            if fault is not None and fault.kind == "drop-response":
                self._abort()
                return None
            content_type = response.getheader("Content-Type", "application/json")
            for rewrite in rewrites or ():
                payload = _rewrite(payload, rewrite)
            self._reply(response.status, content_type, payload, response.getheaders())
            return response.status
        finally:
            upstream.close()

    def _relay_stream(
        self,
        upstream: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        cut_after: float | None,
    ) -> int:
        self._start_stream(response.status, response.getheader("Content-Type", "application/json"))
        timer: threading.Timer | None = None

        def cut() -> None:
            self._abort()
            if upstream.sock is not None:
                with contextlib.suppress(OSError):
                    upstream.sock.shutdown(socket.SHUT_RDWR)

        if cut_after is not None:
            timer = threading.Timer(cut_after, cut)
            timer.daemon = True
            timer.start()
        self.server.owner.streams.add(cut)
        try:
            for _ in itertools.count():
                try:
                    data = response.read1(65536)
                except (OSError, http.client.HTTPException):
                    return response.status
                if not data or self.server.owner.stopping.is_set():
                    break
                self._chunk(data)
            self._chunk(b"")
        finally:
            self.server.owner.streams.discard(cut)
            if timer is not None:
                timer.cancel()
        return response.status

    def _start_stream(self, status: int, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _reply(
        self,
        status: int,
        content_type: str,
        payload: bytes,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        self.send_response(status)
        for key, value in headers or []:
            if key.lower() not in _HOP_BY_HOP and key.lower() not in {"content-type", "date", "server"}:
                self.send_header(key, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.wfile.flush()

    def _abort(self) -> None:
        """Close the connection without an answer (a reset, as far as the client can tell)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.shutdown(socket.SHUT_RDWR)


def _rewrite(payload: bytes, fault: ProxyFault) -> bytes:
    try:
        document = json.loads(payload)
        result = document["data"]["result"]
    except (ValueError, KeyError, TypeError):
        return payload
    if not isinstance(result, list):
        return payload
    pattern = re.compile(fault.series)
    kept = []
    for series in result:
        labels = json.dumps(series.get("metric", {}), sort_keys=True) if isinstance(series, dict) else ""
        if not pattern.search(labels):
            kept.append(series)
            continue
        if fault.value == "empty":
            continue
        if isinstance(series.get("value"), list) and len(series["value"]) == 2:
            series["value"][1] = fault.value
        kept.append(series)
    document["data"]["result"] = kept
    return json.dumps(document).encode()


class FaultProxy:
    """``FaultProxy(upstream_url)``: a context manager; ``url`` is where clients connect."""

    def __init__(
        self,
        upstream: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        timeout: float = 60.0,
        log_size: int = 20_000,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"the upstream must be http://host:port, not {upstream!r}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port
        self.timeout = timeout
        self.stopping = threading.Event()
        self._rules: list[ProxyRule] = []
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._log: deque[ProxiedRequest] = deque(maxlen=log_size)
        self.streams: set[Callable[[], None]] = set()  # a way to cut each watch being relayed
        self._http = _Server((host, port), self)
        self._thread = threading.Thread(
            target=self._http.serve_forever, args=(0.05,), name="fault-proxy", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    # -- faults -------------------------------------------------------------------------------

    def add(
        self,
        fault: ProxyFault,
        *,
        path: str = "",
        body: str = "",
        method: str | None = None,
        count: int | None = None,
        first: bool = False,
    ) -> ProxyRule:
        """Add a rule; the first matching rule answers a request (``first``: ahead of the others)."""
        rule = ProxyRule(next(self._ids), fault, path, body, method, count)
        with self._lock:
            if first:
                self._rules.insert(0, rule)
            else:
                self._rules.append(rule)
        return rule

    def remove(self, rule: ProxyRule) -> None:
        with self._lock:
            self._rules = [existing for existing in self._rules if existing.id != rule.id]

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def cut_watches(self) -> int:
        """Cut every watch being relayed now (as a restarted apiserver or a load balancer does)."""
        cuts = list(self.streams)
        for cut in cuts:
            cut()
        return len(cuts)

    def rewrites(self, method: str, path: str, text: str, watch: bool) -> list[ProxyFault]:
        """Every rewrite rule matching the request: they all apply to its answer (a grouped query
        answers the series of many revisions at once)."""
        with self._lock:
            matched = [
                rule
                for rule in self._rules
                if rule.fault.kind == "rewrite" and rule.matches(method, path, text, watch)
            ]
            for rule in matched:
                rule.hits += 1
            return [rule.fault for rule in matched]

    def take(self, method: str, path: str, text: str, watch: bool) -> ProxyRule | None:
        """The first matching rule that is not a rewrite (rewrites: :meth:`rewrites`)."""
        with self._lock:
            for rule in self._rules:
                if rule.fault.kind != "rewrite" and rule.matches(method, path, text, watch):
                    rule.hits += 1
                    if rule.remaining is not None:
                        rule.remaining -= 1
                        if rule.remaining <= 0:
                            self._rules.remove(rule)
                    return rule
        return None

    # -- what happened ------------------------------------------------------------------------

    def record(self, entry: ProxiedRequest) -> None:
        with self._lock:
            self._log.append(entry)

    @property
    def log(self) -> list[ProxiedRequest]:
        with self._lock:
            return list(self._log)
