"""The fault suite's proxy (canary_sandbox.faultproxy) in front of a small loopback server."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from canary_sandbox.faultproxy import FaultProxy, ProxyFault
from canary_sandbox.stack import wait_until

VECTOR = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [
            {"metric": {"revision": "m-predictor-00001"}, "value": [1, "0.5"]},
            {"metric": {"revision": "m-predictor-00002"}, "value": [1, "0.7"]},
        ],
    },
}


class Upstream:
    def __init__(self) -> None:
        self.writes = 0
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                payload = json.dumps(VECTOR).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_PATCH(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                upstream.writes += 1
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    started = Upstream()
    yield started
    started.server.shutdown()
    started.server.server_close()


@pytest.fixture
def proxy(upstream: Upstream) -> Iterator[FaultProxy]:
    with FaultProxy(upstream.url) as started:
        yield started


def request(
    proxy: FaultProxy, method: str = "GET", path: str = "/api/v1/query?query=up"
) -> tuple[int, bytes]:
    host, port = proxy.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=3)
    try:
        connection.request(method, path, body=b"{}" if method != "GET" else None)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_without_a_fault_everything_is_forwarded(proxy: FaultProxy) -> None:
    status, body = request(proxy)
    assert status == 200
    assert json.loads(body) == VECTOR
    assert wait_until(lambda: [entry.fault for entry in proxy.log] == [None], 3)


def test_a_rewrite_touches_only_the_matching_series(proxy: FaultProxy) -> None:
    proxy.add(ProxyFault.rewrite("NaN", "m-predictor-00002"))
    result = json.loads(request(proxy)[1])["data"]["result"]
    assert [series["value"][1] for series in result] == ["0.5", "NaN"]
    proxy.clear()
    proxy.add(ProxyFault.rewrite("empty", "m-predictor-00002"))
    assert len(json.loads(request(proxy)[1])["data"]["result"]) == 1


def test_canned_answers_and_a_reset(proxy: FaultProxy) -> None:
    rule = proxy.add(ProxyFault.status_error(), count=1)
    status, body = request(proxy)
    assert (status, json.loads(body)["status"]) == (422, "error")
    assert rule.hits == 1
    proxy.add(ProxyFault.html(), count=1)
    assert request(proxy)[1].startswith(b"<html>")
    proxy.add(ProxyFault.malformed_json(), count=1)
    with pytest.raises(json.JSONDecodeError):
        json.loads(request(proxy)[1])
    proxy.add(ProxyFault.reset(), count=1)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        request(proxy)
    assert request(proxy)[0] == 200, "count=1: the next request is served again"


def test_a_dropped_response_was_still_applied_upstream(proxy: FaultProxy, upstream: Upstream) -> None:
    proxy.add(ProxyFault.drop_response(), method="PATCH", count=1)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        request(proxy, "PATCH", "/x")
    assert upstream.writes == 1
    assert wait_until(lambda: [entry.fault for entry in proxy.log] == ["drop-response"], 3)


def test_a_watch_gone_answers_one_410_error_event(proxy: FaultProxy) -> None:
    proxy.add(ProxyFault.watch_gone())
    status, body = request(proxy, "GET", "/api/v1/pods?watch=1")
    event = json.loads(body.splitlines()[0])
    assert (status, event["type"], event["object"]["code"]) == (200, "ERROR", 410)
