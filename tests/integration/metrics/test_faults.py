"""Prometheus failing: every failure is classified evidence, none escapes, timeouts are never re-run."""

from __future__ import annotations

import base64
import subprocess
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import requests
from canary_sandbox.prometheus import PrometheusServer, free_port

from canary.evidence import REQUESTS, ErrorClass, EvidenceStatus
from canary.metrics import PrometheusConfig, RetryPolicy
from canary.metrics.client import PrometheusClient
from tests.integration.metrics.support import AT, Scenario, make_policy, make_request

CHECKS = [
    {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"},
    {"name": "oom", "metric": "oom-kills", "max": 0},
]
EXPLICIT = {
    "requests": "knative-opencensus",
    "requestLabels": "scraped",
    "gpuLabels": "pod",
    "kubeStateLabels": "pod",
}


class Relay:
    """A loopback HTTP relay in front of a server: records requests, may delay or answer itself."""

    def __init__(
        self, upstream: str | None, *, delay: float = 0.0, status: int | None = None, body: bytes = b""
    ) -> None:
        self.upstream = upstream
        self.delay = delay
        self.status = status
        self.body = body
        self.seen: list[dict[str, str]] = []
        self.bodies: list[bytes] = []
        relay = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                payload = self.rfile.read(length) if length else b""
                relay.seen.append({**dict(self.headers.items()), "path": self.path, "method": self.command})
                relay.bodies.append(payload)
                time.sleep(relay.delay)
                if relay.status is not None:
                    status, content, content_type = relay.status, relay.body, "application/json"
                else:
                    assert relay.upstream is not None
                    answer = requests.request(
                        self.command,
                        relay.upstream + self.path,
                        data=payload or None,
                        headers={"Content-Type": self.headers.get("Content-Type", "")} if payload else None,
                        timeout=30,
                    )
                    status, content = answer.status_code, answer.content
                    content_type = answer.headers.get("Content-Type", "application/json")
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(content)))
                    self.end_headers()
                    self.wfile.write(content)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting: that is what some tests are about

            do_GET = _handle
            do_POST = _handle

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def queries(self) -> int:
        return sum(1 for request in self.seen if request["path"].startswith("/api/v1/query"))

    def __enter__(self) -> Relay:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _prometheus_503s(url: str) -> float:
    for line in requests.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith('prometheus_http_requests_total{code="503",handler="/api/v1/query"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_prometheus_down_is_unreachable_error_evidence(production: Scenario) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    config = PrometheusConfig(url=closed, retry=RetryPolicy(attempts=3, backoff=0.05))
    policy = make_policy(CHECKS)  # requests: auto, so detection fails first
    started = time.monotonic()
    with production.source(config=config) as source:
        evidence = source.collect(
            policy, make_request(policy, "kn118", "llama-predictor-00002", "llama-predictor-00001")
        )
    elapsed = time.monotonic() - started
    measurements = [*evidence.canary.values(), *evidence.stable.values()]
    assert {m.status for m in measurements} == {EvidenceStatus.ERROR}
    assert {m.error_class for m in measurements} == {ErrorClass.UNREACHABLE}
    assert "detection failed" in evidence.canary["errors"].detail  # an error, never a "no data"
    # the request family's and kube-state-metrics' detections, each tried three times with a short
    # backoff (the OOM check then has no query of its own: its labels are unknown)
    assert evidence.queries == 6
    assert elapsed < 3


def test_unavailable_is_retried_a_bounded_number_of_times(production: Scenario) -> None:
    body = b'{"status":"error","errorType":"unavailable","error":"starting up"}'
    with Relay(None, status=503, body=body) as relay:
        config = PrometheusConfig(url=relay.url, retry=RetryPolicy(attempts=4, backoff=0.01))
        policy = make_policy(CHECKS, metrics=EXPLICIT)
        with production.source(config=config) as source:
            evidence = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
    # Prometheus answered (it was reached): "unavailable", in its own words
    assert evidence.canary["oom"].error_class is ErrorClass.UNAVAILABLE
    assert evidence.canary["oom"].detail == "HTTP 503 unavailable: starting up"
    # the tick's counter sample (request-count and errors; no backfill without it) and oom, four
    # tries each
    assert relay.queries() == 8 == evidence.queries


def test_slow_beyond_the_timeout_is_a_timeout_and_is_not_rerun(production: Scenario) -> None:
    with Relay(production.url, delay=2.5) as relay:
        config = PrometheusConfig(url=relay.url, timeout=0.3, retry=RetryPolicy(attempts=3, backoff=0.01))
        policy = make_policy([{"name": "oom", "metric": "oom-kills", "max": 0}], metrics=EXPLICIT)
        started = time.monotonic()
        with production.source(config=config, max_parallel_queries=1) as source:
            evidence = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
        elapsed = time.monotonic() - started
    for key in (REQUESTS, "oom"):
        measurement = evidence.canary[key]
        assert (measurement.status, measurement.error_class) == (EvidenceStatus.ERROR, ErrorClass.TIMEOUT)
        assert 1.2 <= measurement.duration < 2.5  # timeout + 1 s of client grace, not the relay's 2.5 s
    assert relay.queries() == 2  # each query sent once: a timed-out query is never re-run
    assert elapsed < 5


def test_prometheus_own_timeout_is_a_timeout_and_is_not_rerun(production: Scenario) -> None:
    before = _prometheus_503s(production.url)
    config = PrometheusConfig(url=production.url, timeout=1e-6, retry=RetryPolicy(attempts=3, backoff=0.01))
    policy = make_policy(CHECKS, metrics=EXPLICIT)
    with production.source(config=config) as source:
        evidence = source.collect(
            policy, make_request(policy, "kn118", "llama-predictor-00002", "llama-predictor-00001")
        )
    errors = evidence.canary["errors"]
    assert (errors.status, errors.error_class) == (EvidenceStatus.ERROR, ErrorClass.TIMEOUT)
    assert "HTTP 503 timeout" in errors.detail
    # Prometheus itself counted one 503 per query: the counter sample, oom — nothing re-run
    assert _prometheus_503s(production.url) - before == 2 == evidence.queries


def test_tenant_header_and_bearer_token_file_reach_prometheus(
    production: Scenario, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    token.write_text("first-token\n")
    with Relay(production.url) as relay:
        config = PrometheusConfig(
            url=relay.url, headers={"X-Scope-OrgID": "team-a"}, bearer_token_file=str(token)
        )
        policy = make_policy(CHECKS, metrics=EXPLICIT)
        with production.source(config=config) as source:
            first = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
            token.write_text("rotated-token\n")  # service-account tokens rotate: re-read on every request
            next_tick = make_request(
                policy, "kn118", "llama-predictor-00002", None, at=AT + timedelta(seconds=30)
            )
            source.collect(policy, next_tick)
        monkeypatch.setenv("PROM_PASSWORD", "pa:ss")
        basic = PrometheusConfig(
            url=relay.url, basic_auth_username="reader", basic_auth_password_env="PROM_PASSWORD"
        )
        with production.source(config=basic) as source:
            source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
    assert first.canary["oom"].value == 1.0  # the relayed answers are real
    # first: the counter sample, its backfill (a range query) and oom; second (the same tick): oom
    # first: the request and restart counters' samples and backfills; the next tick: the two samples
    paths = [request["path"].split("?")[0] for request in relay.seen]
    assert sorted(paths[:4]) == ["/api/v1/query"] * 2 + ["/api/v1/query_range"] * 2
    assert paths[4:6] == ["/api/v1/query"] * 2
    assert len(paths) == 4 + 2 + 4
    assert {request["X-Scope-OrgID"] for request in relay.seen[:6]} == {"team-a"}
    assert {request["Authorization"] for request in relay.seen[:4]} == {"Bearer first-token"}
    assert {request["Authorization"] for request in relay.seen[4:6]} == {"Bearer rotated-token"}
    expected = "Basic " + base64.b64encode(b"reader:pa:ss").decode()
    assert {request["Authorization"] for request in relay.seen[6:]} == {expected}


def test_long_queries_are_posted_as_a_form_body(production: Scenario) -> None:
    with Relay(production.url) as relay:
        config = PrometheusConfig(url=relay.url, max_get_length=300)
        policy = make_policy([{"name": "oom", "metric": "oom-kills", "max": 0}], metrics=EXPLICIT)
        with production.source(config=config) as source:
            evidence = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
    assert evidence.canary["oom"].value == 1.0
    long_ones = [request for request in relay.seen if request["method"] == "POST"]
    assert long_ones, "the OOM query is longer than 300 characters"
    assert all("query=" not in request["path"] for request in long_ones)
    assert any(b"kube_pod_container_status_restarts_total" in body for body in relay.bodies)
    # the counter samples' backfills are range queries: long, so POSTed as a form body as well
    ranges = [request for request in long_ones if request["path"].startswith("/api/v1/query_range")]
    assert len(ranges) == 2  # request and restart counters
    assert evidence.counts["canary"].status is EvidenceStatus.OK and evidence.counts["canary"].tallies


def test_a_long_query_asked_again_is_posted_as_the_same_form_and_another_as_its_own(
    production: Scenario,
) -> None:
    """The form encoding of a long query is kept between ticks (the grouped queries repeat): the
    body of each POST still says its own query, and Prometheus answers each as asked."""
    padding = " + ".join(["0"] * 200)  # longer than max_get_length, Prometheus still reads it
    first = f'count(revision_request_count{{namespace_name="kn118"}}) + {padding}'
    second = f'count(revision_request_count{{namespace_name="nowhere"}}) + {padding}'
    with Relay(production.url) as relay:
        client = PrometheusClient(PrometheusConfig(url=relay.url, max_get_length=300))
        answers = [client.instant(query, AT) for query in (first, first, second, first)]
        client.close()
    assert [request["method"] for request in relay.seen] == ["POST"] * 4
    asked = [parse_qs(body.decode())["query"] for body in relay.bodies]
    assert asked == [[first], [first], [second], [first]]
    counts = [
        [float(series["value"][1]) for series in answer.answer.result] if answer.answer else None
        for answer in answers
    ]
    assert counts[0] == counts[1] == counts[3] and counts[0] and counts[0][0] > 0, counts
    assert counts[2] == [], counts  # no series in that namespace: count() of nothing is empty


def test_short_range_queries_are_sent_by_get(production: Scenario) -> None:
    with Relay(production.url) as relay:
        client = PrometheusClient(PrometheusConfig(url=relay.url))
        outcome = client.range_query("sum(revision_request_count)", AT - timedelta(seconds=60), AT, 5.0)
        client.close()
    assert outcome.failure is None and outcome.answer is not None
    assert outcome.answer.result_type == "matrix"
    (series,) = outcome.answer.result
    assert len(series["values"]) == 13  # AT-60 .. AT every 5 s
    (request,) = relay.seen
    assert request["method"] == "GET" and request["path"].startswith("/api/v1/query_range?")
    assert "step=5" in request["path"] and "timeout=" in request["path"]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    ca_key, ca, key, csr, cert = (
        directory / name for name in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "1",
        "-subj",
        "/CN=test-ca",
    )
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(csr),
        "-subj",
        "/CN=127.0.0.1",
    )
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "1", "-extfile", str(extensions))  # fmt: skip
    return ca, cert, key


def test_tls_with_a_ca_bundle_and_without_it(
    production: Scenario, certificates: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = certificates
    policy = make_policy([{"name": "custom", "promql": "vector(3)", "max": 5}], metrics=EXPLICIT)
    with PrometheusServer(tls_cert_file=cert, tls_key_file=key) as secure:
        assert secure.url.startswith("https://")
        trusted = PrometheusConfig(url=secure.url, ca_file=str(ca))
        untrusted = PrometheusConfig(url=secure.url, retry=RetryPolicy(attempts=3, backoff=0.01))
        with production.source(config=trusted) as source:
            good = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
        with production.source(config=untrusted) as source:
            bad = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
    assert good.canary["custom"].value == 3.0
    assert bad.canary["custom"].error_class is ErrorClass.UNREACHABLE
    assert "TLS" in bad.canary["custom"].detail
    assert bad.queries == 2  # request-count and the custom check, each once: a TLS failure is not retried
