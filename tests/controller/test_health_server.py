"""The probe and metrics server cannot be exhausted by its clients (issue 17, item 6).

Before: ``ThreadingHTTPServer`` on 0.0.0.0 without a socket timeout — 300 half-sent requests held
300 threads. Now: a selector thread waits for request heads, a fixed pool answers them, idle
connections are closed after the timeout, and the address is the pod's IP or loopback.
All against the real server, on loopback only, with bounded waits.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from typer.main import get_command

from canary.cli import app
from canary.controller.observability import ControllerMetrics, HealthServer, default_bind_address

HALF_SENT = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # no final CRLF: the head never ends


@contextlib.contextmanager
def serving(**options: float) -> Iterator[HealthServer]:
    server = HealthServer(
        ControllerMetrics(),
        host="127.0.0.1",
        port=0,
        liveness=lambda: (True, "ok\n"),
        readiness=lambda: (True, "ready\n"),
        **options,  # type: ignore[arg-type]
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def half_sent(port: int, count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
        sock.sendall(HALF_SENT)
        sockets.append(sock)
    return sockets


def closed_by_peer(sock: socket.socket, timeout: float) -> bool:
    """True once the server has closed ``sock`` (EOF or reset), False if it stays open."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


def test_300_half_sent_requests_neither_block_probes_nor_hold_threads() -> None:
    threads_before = threading.active_count()
    with serving(request_timeout=30.0) as server:
        attackers = half_sent(server.port, 300)
        try:
            time.sleep(0.3)  # let the server accept them all
            started = time.monotonic()
            status, body = get(server.port, "/healthz")
            assert (status, body) == (200, b"ok\n")
            assert time.monotonic() - started < 2.0
            assert get(server.port, "/metrics")[0] == 200
            # A selector thread and a fixed pool, whatever the number of connections.
            assert threading.active_count() <= threads_before + 1 + 4
        finally:
            for sock in attackers:
                sock.close()


def test_idle_half_sent_connections_are_closed_after_the_timeout() -> None:
    with serving(request_timeout=0.5) as server:
        (idle,) = half_sent(server.port, 1)
        silent = socket.create_connection(("127.0.0.1", server.port), timeout=2)  # sends nothing
        try:
            started = time.monotonic()
            assert closed_by_peer(idle, timeout=5)
            assert closed_by_peer(silent, timeout=5)
            assert 0.4 < time.monotonic() - started < 3
        finally:
            idle.close()
            silent.close()


def test_beyond_max_pending_the_oldest_waiting_connection_is_closed() -> None:
    with serving(request_timeout=30.0, max_pending=8) as server:
        sockets = half_sent(server.port, 9)
        try:
            assert closed_by_peer(sockets[0], timeout=3)
            assert not closed_by_peer(sockets[-1], timeout=0.3)
        finally:
            for sock in sockets:
                sock.close()


def test_a_slow_reader_holds_one_worker_for_at_most_the_timeout() -> None:
    """Complete requests whose answers are never read: the pool still frees itself."""
    with serving(request_timeout=0.5, max_workers=2, max_queued=2) as server:
        readers = []
        for _ in range(6):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=2)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            readers.append(sock)
        try:
            deadline = time.monotonic() + 5
            while True:
                with contextlib.suppress(OSError):
                    if get(server.port, "/healthz", timeout=1)[0] == 200:
                        break
                assert time.monotonic() < deadline, "the pool never recovered"
                time.sleep(0.1)
        finally:
            for sock in readers:
                sock.close()


def test_oversized_request_heads_are_refused() -> None:
    with serving(request_timeout=5.0) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=2)
        try:
            sock.sendall(b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * (HealthServer.MAX_HEAD_BYTES + 10))
            assert closed_by_peer(sock, timeout=3)
        finally:
            sock.close()


def test_stop_closes_the_listener_and_every_waiting_connection() -> None:
    with serving(request_timeout=30.0) as server:
        port = server.port
        waiting = half_sent(port, 3)
    try:
        for sock in waiting:
            assert closed_by_peer(sock, timeout=3)
        with pytest.raises(ConnectionRefusedError):
            get(port, "/healthz", timeout=1)
    finally:
        for sock in waiting:
            sock.close()


def test_bind_address_defaults_to_the_pod_ip_else_loopback() -> None:
    assert default_bind_address({"POD_IP": "10.1.2.3"}) == "10.1.2.3"
    assert default_bind_address({}) == "127.0.0.1"
    assert default_bind_address({"POD_IP": " "}) == "127.0.0.1"
    with serving() as server:
        assert server.address == "127.0.0.1"
    # The run command exposes it as a flag and an environment variable.
    command = get_command(app).commands["run"]  # type: ignore[attr-defined]
    option = next(p for p in command.params if "--metrics-bind-address" in p.opts)
    assert option.envvar == "METRICS_BIND_ADDRESS" and option.default is None


def test_an_ipv6_pod_ip_binds_an_ipv6_socket() -> None:
    """Dual-stack and IPv6-only clusters give the pod an IPv6 POD_IP (here: loopback ::1)."""
    server = HealthServer(
        ControllerMetrics(), host="::1", port=0, liveness=lambda: (True, ""), readiness=lambda: (True, "")
    )
    try:
        assert server.address == "::1"
    finally:
        server.stop()
