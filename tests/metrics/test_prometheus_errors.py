"""What Prometheus (or a proxy in front of it) said, named: each faulty answer gets its own error class
and carries Prometheus' own ``errorType``/``error`` text — never a ``KeyError``, never a secret.

A real loopback HTTP server serves each faulty response; the client under test is the product's.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import structlog

from canary.evidence import ErrorClass, EvidenceStatus
from canary.metrics.client import PrometheusClient, PrometheusConfig, RetryPolicy
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.policy.model import PromotionPolicy
from tests.integration.metrics.support import make_policy, make_request

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TOKEN = "s3cr3t-bearer-token"  # must never show up in a detail


@dataclass
class Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    delay: float = 0.0


class FaultyPrometheus:
    """A loopback HTTP server answering every query with one canned (faulty) response."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                outer.requests += 1
                time.sleep(outer.answer.delay)
                try:
                    self.send_response(outer.answer.status)
                    self.send_header("Content-Type", outer.answer.content_type)
                    self.send_header("Content-Length", str(len(outer.answer.body)))
                    self.end_headers()
                    self.wfile.write(outer.answer.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client stopped waiting

            do_GET = _handle
            do_POST = _handle

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def __enter__(self) -> FaultyPrometheus:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def token_file(tmp_path: pytest.TempPathFactory) -> str:
    path = tmp_path / "token"  # type: ignore[operator]
    path.write_text(TOKEN + "\n")
    return str(path)


def _config(port: int, token_file: str, **overrides: object) -> PrometheusConfig:
    return PrometheusConfig(
        url=f"http://reader:pw-in-url@127.0.0.1:{port}/prometheus/api/path",
        headers={"X-Scope-OrgID": "tenant-secret-value"},
        bearer_token_file=token_file,
        retry=RetryPolicy(attempts=3, backoff=0.0),
        **overrides,  # type: ignore[arg-type]
    )


def _assert_no_secrets(detail: str) -> None:
    for secret in (TOKEN, "pw-in-url", "reader:", "tenant-secret-value", "/prometheus/api/path"):
        assert secret not in detail
    for text in ("healthy upstream", "DOCTYPE", "Sign in"):  # what is not a Prometheus answer is not shown
        assert text not in detail


HTML = b"<!DOCTYPE html><html><head><title>Sign in - Corp SSO</title></head><body>" + b"x" * 3000 + b"</body>"
LONG = "y" * 5000

CASES = [
    pytest.param(
        Answer(
            200, b'{"status":"error","errorType":"execution","error":"many-to-many matching not allowed"}'
        ),
        ErrorClass.EXECUTION,
        "HTTP 200 execution: many-to-many matching not allowed",
        1,
        id="200-status-error",
    ),
    pytest.param(
        Answer(400, b'{"status":"error","errorType":"bad_data","error":"1:14: parse error: unclosed left"}'),
        ErrorClass.BAD_QUERY,
        "HTTP 400 bad_data: 1:14: parse error: unclosed left",
        1,
        id="400-bad-data",
    ),
    pytest.param(
        Answer(422, b'{"status":"error","errorType":"execution","error":"vector cannot contain metrics"}'),
        ErrorClass.EXECUTION,
        "HTTP 422 execution: vector cannot contain metrics",
        1,
        id="422-execution",
    ),
    pytest.param(
        Answer(503, b'{"status":"error","errorType":"unavailable","error":"TSDB not ready"}'),
        ErrorClass.UNAVAILABLE,
        "HTTP 503 unavailable: TSDB not ready",
        3,  # nothing ran: retried
        id="503-unavailable",
    ),
    pytest.param(
        Answer(
            503,
            b'{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}',
        ),
        ErrorClass.TIMEOUT,
        "HTTP 503 timeout: query timed out in expression evaluation",
        1,  # a timed-out query is never re-run
        id="503-timeout",
    ),
    pytest.param(
        Answer(503, b"no healthy upstream", "text/plain"),
        ErrorClass.UNAVAILABLE,
        "HTTP 503 Service Unavailable",  # a proxy's text is not shown (issue #34, finding 7)
        3,
        id="503-plain-proxy",
    ),
    pytest.param(
        Answer(200, HTML, "text/html"),
        ErrorClass.MALFORMED_RESPONSE,
        "HTTP 200 text/html, not a Prometheus answer: not JSON",  # the page itself is not shown
        1,
        id="200-html-page",
    ),
    pytest.param(
        Answer(200, b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"val'),
        ErrorClass.MALFORMED_RESPONSE,
        "HTTP 200 application/json, not a Prometheus answer: truncated or invalid JSON",
        1,
        id="200-truncated-json",
    ),
    pytest.param(
        Answer(200, b""),
        ErrorClass.MALFORMED_RESPONSE,
        "HTTP 200 application/json, not a Prometheus answer: an empty body",
        1,
        id="200-empty-body",
    ),
    pytest.param(
        Answer(200, b'{"hello":"world"}'),
        ErrorClass.MALFORMED_RESPONSE,
        "HTTP 200 application/json, not a Prometheus answer: JSON without status and data",
        1,
        id="200-json-wrong-shape",
    ),
    pytest.param(
        Answer(200, b'{"status":"success","data":{"result":[]}}'),
        ErrorClass.MALFORMED_RESPONSE,
        "HTTP 200 application/json, not a Prometheus answer: data without resultType and result",
        1,
        id="200-success-without-result-type",
    ),
    pytest.param(
        Answer(422, ('{"status":"error","errorType":"execution","error":"' + LONG + '"}').encode()),
        ErrorClass.EXECUTION,
        "HTTP 422 execution: yyyy",
        1,
        id="422-long-message-truncated",
    ),
]


@pytest.mark.parametrize(("answer", "error_class", "detail", "tries"), CASES)
def test_each_faulty_answer_is_named_from_what_prometheus_said(
    answer: Answer, error_class: ErrorClass, detail: str, tries: int, token_file: str
) -> None:
    with FaultyPrometheus(answer) as prometheus:
        client = PrometheusClient(_config(prometheus.port, token_file))
        outcome = client.instant("sum(up)", AT)
        client.close()
    assert outcome.answer is None
    assert outcome.failure is not None
    assert outcome.failure.error_class is error_class
    assert outcome.failure.detail.startswith(detail)
    assert len(outcome.failure.detail) <= 500
    assert "KeyError" not in outcome.failure.detail
    _assert_no_secrets(outcome.failure.detail)
    assert outcome.failure.http_status == answer.status
    assert (prometheus.requests, outcome.http_requests) == (tries, tries)


@pytest.mark.parametrize(("answer", "error_class", "detail", "tries"), CASES)
def test_range_queries_name_faulty_answers_as_instant_queries_do(
    answer: Answer, error_class: ErrorClass, detail: str, tries: int, token_file: str
) -> None:
    with FaultyPrometheus(answer) as prometheus:
        client = PrometheusClient(_config(prometheus.port, token_file))
        outcome = client.range_query("sum(up)", AT - timedelta(minutes=10), AT, 30.0)
        client.close()
    assert outcome.answer is None
    assert outcome.failure is not None
    assert outcome.failure.error_class is error_class
    assert outcome.failure.detail.startswith(detail)
    _assert_no_secrets(outcome.failure.detail)
    assert (prometheus.requests, outcome.http_requests) == (tries, tries)


def test_a_failed_counter_sample_is_error_counts_and_error_measurements(token_file: str) -> None:
    policy = make_policy(
        [{"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"}],
        metrics={"requests": "knative-opencensus"},
    )
    body = (
        b'{"status":"error","errorType":"execution","error":"query processing would load too many samples"}'
    )
    request = make_request(policy, "kn118", "llama-predictor-00002", "llama-predictor-00001")
    with (
        FaultyPrometheus(Answer(422, body)) as prometheus,
        PrometheusEvidenceSource(_config(prometheus.port, token_file)) as source,
    ):
        evidence = source.collect(policy, request)
    assert prometheus.requests == 1  # no backfill without a sample
    for side in ("canary", "stable"):
        counts = evidence.counts[side]
        assert (counts.status, counts.error_class) == (EvidenceStatus.ERROR, ErrorClass.EXECUTION)
        assert "too many samples" in counts.detail
    for measurement in (*evidence.canary.values(), *evidence.stable.values()):
        assert (measurement.status, measurement.error_class) == (EvidenceStatus.ERROR, ErrorClass.EXECUTION)


def test_hanging_beyond_the_timeout_is_a_timeout_sent_once(token_file: str) -> None:
    with FaultyPrometheus(Answer(200, b"{}", delay=2.0)) as prometheus:
        client = PrometheusClient(_config(prometheus.port, token_file, timeout=0.2))
        started = time.monotonic()
        outcome = client.instant("sum(up)", AT)
        elapsed = time.monotonic() - started
        client.close()
    assert outcome.failure is not None
    assert outcome.failure.error_class is ErrorClass.TIMEOUT
    assert outcome.failure.detail.startswith(f"http://127.0.0.1:{prometheus.port}: no answer within 1.2s")
    _assert_no_secrets(outcome.failure.detail)
    assert prometheus.requests == 1
    assert elapsed < 2.0


def test_connection_refused_is_unreachable_and_names_only_scheme_and_host(token_file: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = PrometheusClient(_config(port, token_file))
    outcome = client.instant("sum(up)", AT)
    client.close()
    assert outcome.failure is not None
    assert outcome.failure.error_class is ErrorClass.UNREACHABLE
    assert outcome.failure.detail.startswith(f"http://127.0.0.1:{port}: connection refused")
    assert "HTTPConnectionPool" not in outcome.failure.detail
    _assert_no_secrets(outcome.failure.detail)
    assert outcome.http_requests == 3  # certainly never ran: retried


@pytest.fixture
def policy() -> PromotionPolicy:
    return make_policy(
        [{"name": "custom", "promql": "sum(up)", "max": 5}], metrics={"requests": "knative-opencensus"}
    )


def test_a_200_with_status_error_reaches_evidence_without_a_traceback(
    token_file: str, policy: PromotionPolicy
) -> None:
    body = (
        b'{"status":"error","errorType":"bad_data","error":"invalid parameter \\"query\\": 1:1: parse error"}'
    )
    with FaultyPrometheus(Answer(200, body)) as prometheus:
        source = PrometheusEvidenceSource(_config(prometheus.port, token_file), max_parallel_queries=1)
        with structlog.testing.capture_logs() as logs, source:
            evidence = source.collect(policy, make_request(policy, "kn118", "llama-predictor-00002", None))
    custom = evidence.canary["custom"]
    assert (custom.status, custom.error_class) == (EvidenceStatus.ERROR, ErrorClass.BAD_QUERY)
    assert custom.detail == 'HTTP 200 bad_data: invalid parameter "query": 1:1: parse error'
    assert not any(log.get("exc_info") for log in logs)
    assert not any("internal error" in str(log) for log in logs)


class SplitPrometheus(FaultyPrometheus):
    """Instant queries answer an empty vector; range queries time out (Prometheus' own 503)."""

    def __init__(self) -> None:
        super().__init__(Answer(200, b""))
        self.paths: list[str] = []
        outer = self
        handler = self.server.RequestHandlerClass

        class Routed(handler):  # type: ignore[misc, valid-type]
            def _handle(self) -> None:
                outer.paths.append(self.path.split("?")[0])
                if self.path.startswith("/api/v1/query_range"):
                    outer.answer = Answer(
                        503,
                        b'{"status":"error","errorType":"timeout","error":"query timed out in query execution"}',
                    )
                else:
                    outer.answer = Answer(
                        200, b'{"status":"success","data":{"resultType":"vector","result":[]}}'
                    )
                super()._handle()

            do_GET = _handle
            do_POST = _handle

        self.server.RequestHandlerClass = Routed


def test_a_backfill_that_times_out_is_asked_once_more_in_halves_then_is_error_counts() -> None:
    policy = make_policy(
        [{"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"}],
        metrics={"requests": "knative-opencensus", "requestLabels": "scraped"},
    )
    request = make_request(policy, "kn118", "llama-predictor-00002", "llama-predictor-00001")
    with SplitPrometheus() as prometheus:
        config = PrometheusConfig(url=f"http://127.0.0.1:{prometheus.port}", retry=RetryPolicy(attempts=3))
        with PrometheusEvidenceSource(config) as source:
            evidence = source.collect(policy, request)
    # the tick's sample, the backfill of both revisions, then each revision alone — never more
    assert prometheus.paths == ["/api/v1/query"] + ["/api/v1/query_range"] * 3
    for side in ("canary", "stable"):
        counts = evidence.counts[side]
        assert (counts.status, counts.error_class) == (EvidenceStatus.ERROR, ErrorClass.TIMEOUT)
        assert counts.detail.startswith("backfill of the counters: HTTP 503 timeout")
