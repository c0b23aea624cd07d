"""Fuzzing what Prometheus (or whatever answers in its place) sends back, through the real client.

A loopback HTTP server answers every request with the drawn response — status code, content type and
body, or a broken connection — and the product's :class:`PrometheusClient` and evidence source ask it.
Bodies are Prometheus envelopes drawn field by field (``status``, ``data``, ``resultType``, series,
sample values such as ``"NaN"``, ``"1e999"``, 5,000 digits, ``errorType``, ``warnings``) and then maybe
broken: truncated, nested 100,000 deep, a BOM, bytes that are not UTF-8, an HTML page, nothing.

What must hold for every response:

* ``instant`` returns an outcome with exactly one of an answer or a failure, the failure of one of
  the named :class:`ErrorClass` values with a short detail; a Prometheus ``errorType`` names the class;
  a 200 that is not a Prometheus envelope is ``malformed-response``; nothing raises;
* the label look-ups return names or a failure; ``parse_single`` / ``parse_grouped`` return a value,
  no value, or a failure: never ``KeyError``, ``TypeError``, ``AttributeError``, ``OverflowError``;
* ``collect`` returns evidence for every check, each measurement ok (a finite value), no-data,
  invalid-value or an error of a named class — and never the evidence source's last line of defence
  ("internal error"), which would mean an exception got that far.
"""

from __future__ import annotations

import json
import math
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canary.evidence import ErrorClass, EvidenceRequest, EvidenceStatus
from canary.metrics.client import PrometheusClient, PrometheusConfig, QueryFailure, RetryPolicy
from canary.metrics.plan import GroupedAnswer, parse_grouped, parse_single
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.policy.model import PromotionPolicy

from .support import fuzz_settings

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SECRET = "tenant-secret-value"  # sent as a header: must never appear in a detail


@dataclass(frozen=True)
class Response:
    status: int
    content_type: str | None
    body: bytes
    fault: str = "none"  # none | close | short | gzip | chunked


class FuzzedPrometheus:
    """A loopback HTTP/1.1 server answering every request with :attr:`response` (set per example)."""

    def __init__(self) -> None:
        self.response = Response(200, "application/json", b"{}")
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                outer.requests += 1
                response = outer.response
                try:
                    if response.fault == "close":
                        self.close_connection = True
                        return  # no status line at all
                    self.send_response(response.status)
                    if response.content_type is not None:
                        self.send_header("Content-Type", response.content_type)
                    body = response.body
                    if response.fault == "gzip":
                        self.send_header("Content-Encoding", "gzip")
                    if response.fault == "chunked":
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        self.wfile.write(b"zz\r\n" + body[:10])  # not a chunk size
                        self.close_connection = True
                        return
                    declared = len(body) + (100 if response.fault == "short" else 0)
                    self.send_header("Content-Length", str(declared))
                    # One response per connection: a 204 or 304 whose body the client rightly ignores
                    # must not be read as the start of the next answer.
                    self.send_header("Connection", "close")
                    self.close_connection = True
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True

            do_GET = _answer
            do_POST = _answer

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def prometheus() -> Iterator[FuzzedPrometheus]:
    server = FuzzedPrometheus()
    yield server
    server.close()


def prometheus_config(url: str) -> PrometheusConfig:
    return PrometheusConfig(
        url=url,
        headers={"X-Scope-OrgID": SECRET},
        timeout=0.5,
        connect_timeout=1.0,
        retry=RetryPolicy(attempts=2, backoff=0.0, max_backoff=0.0),
    )


@pytest.fixture(scope="module")
def client(prometheus: FuzzedPrometheus) -> Iterator[PrometheusClient]:
    # No pause between retries: the retry path runs, the clock does not.
    made = PrometheusClient(prometheus_config(prometheus.url), sleep=lambda _seconds: None)
    yield made
    made.close()


# -- drawn responses -------------------------------------------------------------------------------

_TEXT = st.text(max_size=10)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=5,
)
SAMPLE_VALUES = st.one_of(
    st.sampled_from(["1", "0", "0.25", "1e-07", "NaN", "+Inf", "-Inf", "1e999", "-0", "9" * 5000, "", "abc"]),
    st.floats().map(repr),
    st.integers(),
    _JSON,
)
TIMESTAMPS = st.one_of(st.just(AT.timestamp()), st.floats(), st.integers(), _TEXT)
LABELS = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "kserve_canary_namespace": st.one_of(st.just("ml"), _JSON),
            "kserve_canary_revision": st.one_of(st.sampled_from(["llama-00001", "llama-00002"]), _JSON),
            "kserve_canary_field": st.one_of(st.sampled_from(["value", "samples", "used", "total"]), _JSON),
            "__name__": _TEXT,
        },
    ),
    _JSON,
)
SERIES = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "metric": LABELS,
            "value": st.one_of(st.tuples(TIMESTAMPS, SAMPLE_VALUES).map(list), _JSON),
            "values": st.lists(st.tuples(TIMESTAMPS, SAMPLE_VALUES).map(list), max_size=2),
            "histogram": _JSON,
        },
    ),
    _JSON,
)
RESULTS = st.one_of(
    st.lists(SERIES, max_size=3),
    st.tuples(TIMESTAMPS, SAMPLE_VALUES).map(list),
    st.lists(_TEXT, max_size=3),  # label names or values
    _JSON,
)
DATA = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "resultType": st.one_of(st.sampled_from(["vector", "scalar", "matrix", "string"]), _JSON),
            "result": RESULTS,
        },
    ),
    st.lists(_TEXT, max_size=4),
    _JSON,
)
ENVELOPES = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "status": st.one_of(st.sampled_from(["success", "error"]), _JSON),
            "data": DATA,
            "errorType": st.one_of(
                st.sampled_from(["bad_data", "execution", "timeout", "unavailable", "internal"]), _JSON
            ),
            "error": st.one_of(_TEXT, _JSON, st.just(SECRET)),
            "warnings": st.one_of(st.lists(_TEXT, max_size=2), _JSON),
            "infos": _JSON,
        },
    ),
    _JSON,
)
STATUSES = st.one_of(
    st.sampled_from([200, 200, 200, 400, 422, 503, 502, 504, 429, 500, 404, 401, 204, 301]),
    st.integers(200, 599),  # a 1xx is not a final answer: the client would wait for one
)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "application/json; charset=utf-16",
        "application/json; charset=bogus",
        "text/html",
        "text/plain",
        None,
    ]
)
_BODY_BREAKS = ["none"] * 6 + ["truncate", "nest", "bom", "latin1", "html", "empty", "nan", "huge"]
FAULTS = st.sampled_from(["none"] * 20 + ["close", "short", "gzip", "chunked"])


@st.composite
def responses(draw: st.DrawFn) -> Response:
    body = json.dumps(draw(ENVELOPES), allow_nan=True).encode()
    kind = draw(st.sampled_from(_BODY_BREAKS))
    where = draw(st.integers(0, len(body)))
    if kind == "truncate":
        body = body[:where]
    elif kind == "nest":
        depth = draw(st.sampled_from([100, 5_000, 100_000]))
        inner = b"[" * depth + b"]" * depth
        body = b'{"status":"success","data":' + inner + b"}" if draw(st.booleans()) else b"[" * depth
    elif kind == "bom":
        body = b"\xef\xbb\xbf" + body
    elif kind == "latin1":
        body = body[:where] + b"\xff\xfe\x80" + body[where:]
    elif kind == "html":
        body = b"<!DOCTYPE html><html><body>502 Bad Gateway " + SECRET.encode() + b"</body></html>"
    elif kind == "empty":
        body = b""
    elif kind == "nan":
        body = body.replace(b'"1"', b"NaN").replace(b"0", b"Infinity", 1)
    elif kind == "huge":
        body = body.replace(b"1", b"9" * 5000, 1)
    return Response(draw(STATUSES), draw(CONTENT_TYPES), body, draw(FAULTS))


_NUMBERS = st.one_of(
    st.floats(0, 1e6).map(repr),
    st.integers(0, 10**6).map(str),
    st.sampled_from(["0", "1e-07", "NaN", "+Inf", "-Inf", "1e999", "9" * 400, "x"]),
)


# Mostly what a grouped query answers (both revisions, a value and its samples), sometimes less or more.
_REVISION_SETS = st.sampled_from(
    [["llama-00002", "llama-00001"]] * 3 + [["llama-00002"], [], ["other"], ["llama-00002", "llama-00002"]]
)
_FIELD_SETS = st.sampled_from(
    [["value", "samples"]] * 3 + [["value", "samples", "fraction"], ["value"], [None], ["samples"]]
)


@st.composite
def plausible_responses(draw: st.DrawFn) -> Response:
    """A successful vector answer of the shape the evidence source asks for, with odd numbers in it."""
    series = []
    for revision in draw(_REVISION_SETS):
        for field in draw(_FIELD_SETS):
            labels: Any = {
                "kserve_canary_namespace": "ml",
                "kserve_canary_revision": revision,
                **({"kserve_canary_field": field} if field else {}),
            }
            odd = draw(st.integers(0, 9))
            if odd == 0:
                labels = draw(_JSON)  # not an object of strings
            elif odd == 1:
                labels[draw(st.sampled_from(sorted(labels)))] = draw(_JSON)
            series.append({"metric": labels, "value": [AT.timestamp(), draw(_NUMBERS)]})
    if draw(st.integers(0, 4)) == 0:
        data: Any = {"resultType": "scalar", "result": [AT.timestamp(), draw(_NUMBERS)]}
    else:
        data = {"resultType": "vector", "result": series}
    body = {"status": "success", "data": data, **({"warnings": ["slow"]} if draw(st.booleans()) else {})}
    return Response(200, "application/json", json.dumps(body).encode())


def _envelope(response: Response) -> Any:
    """The body as the client reads it: in the charset the response declares (UTF-16 makes UTF-8 bytes
    garbage), UTF-8 otherwise (an unknown charset too)."""
    declared = "utf-16" if "charset=utf-16" in (response.content_type or "") else "utf-8"
    try:
        return json.loads(response.body.decode(declared, "replace"))
    except (ValueError, RecursionError):
        return None


def _check_failure(failure: QueryFailure) -> None:
    assert isinstance(failure.error_class, ErrorClass)
    assert isinstance(failure.detail, str) and len(failure.detail) <= 500
    assert SECRET not in failure.detail, failure.detail


@fuzz_settings(300)
@given(response=st.one_of(responses(), plausible_responses()))
def test_instant_queries_and_label_lookups(
    prometheus: FuzzedPrometheus, client: PrometheusClient, response: Response
) -> None:
    prometheus.response = response
    outcome = client.instant('sum(rate(x{revision="llama-00002"}[5m]))', AT)
    assert (outcome.answer is None) != (outcome.failure is None), outcome
    assert outcome.http_requests >= 1
    envelope = _envelope(response)
    if outcome.failure is not None:
        _check_failure(outcome.failure)
        error_type = envelope.get("errorType") if isinstance(envelope, dict) else None
        named = {"bad_data": ErrorClass.BAD_QUERY, "execution": ErrorClass.EXECUTION, "timeout": ErrorClass.TIMEOUT,
                 "unavailable": ErrorClass.UNAVAILABLE}  # fmt: skip
        prometheus_like = isinstance(envelope, dict) and "status" in envelope  # else: not an envelope at all
        success = prometheus_like and response.status == 200 and envelope.get("status") == "success"
        redirect = 300 <= response.status < 400  # reported by its status, its body never read
        if redirect and response.fault == "none":
            assert outcome.failure.detail.endswith("a redirect, not followed"), (response, outcome)
        if (
            response.fault == "none"
            and not redirect
            and prometheus_like
            and isinstance(error_type, str)
            and error_type in named
        ):
            assert success or outcome.failure.error_class is named[error_type], (response, outcome)
        if response.fault == "none" and response.status == 200 and not isinstance(envelope, dict):
            assert outcome.failure.error_class is ErrorClass.MALFORMED_RESPONSE, (response, outcome)
    else:
        assert outcome.answer is not None
        assert response.status == 200 and isinstance(envelope, dict) and envelope.get("status") == "success"
        assert all(isinstance(warning, str) for warning in outcome.answer.warnings)
    single = parse_single(outcome)
    assert single is None or isinstance(single, float | QueryFailure), single
    grouped = parse_grouped(outcome)
    assert isinstance(grouped, GroupedAnswer | QueryFailure), grouped
    for parsed in (single, grouped):
        if isinstance(parsed, QueryFailure):
            _check_failure(parsed)
    names, http_requests = client.label_values("__name__", ['{__name__=~"x.*"}'], AT - timedelta(hours=1), AT)
    assert http_requests >= 1
    if isinstance(names, QueryFailure):
        _check_failure(names)
    else:
        assert all(isinstance(name, str) for name in names)


POLICY = PromotionPolicy.model_validate(
    {
        "apiVersion": "kserve-canary.dev/v1alpha1",
        "kind": "PromotionPolicy",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "target": {"inferenceService": "llama"},
            "metrics": {"requests": "knative-opencensus", "gpuLabels": "pod"},
            "checks": [
                {"name": "p99", "metric": "latency", "max": "800ms", "maxIncrease": "20%"},
                {"name": "errors", "metric": "error-rate", "max": "1%"},
                {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": "90%"},
                {"name": "custom", "promql": 'max(x{revision="{{ revision }}"})', "max": 5},
            ],
        },
    }
)
REQUEST = EvidenceRequest(
    namespace="ml",
    inference_service="llama",
    canary_revision="llama-00002",
    stable_revision="llama-00001",
    window_start=AT - timedelta(minutes=10),
    at=AT,
    checks=tuple(POLICY.spec.checks),
)


def test_evidence_collection(prometheus: FuzzedPrometheus, client: PrometheusClient) -> None:
    statuses: Counter[str] = Counter()
    # One query at a time: every query of a collection gets the same drawn response.
    source = PrometheusEvidenceSource(
        prometheus_config(prometheus.url), client=client, max_parallel_queries=1
    )

    @fuzz_settings(120)
    @given(response=st.one_of(responses(), plausible_responses()))
    def run(response: Response) -> None:
        prometheus.response = response
        evidence = source.collect(POLICY, REQUEST)
        assert {check.name for check in POLICY.spec.checks} <= set(evidence.canary)
        for measurement in [*evidence.canary.values(), *evidence.stable.values()]:
            statuses[measurement.status.value] += 1
            assert isinstance(measurement.status, EvidenceStatus)
            assert not measurement.detail.startswith("internal error"), measurement
            assert SECRET not in measurement.detail, measurement.detail
            if measurement.status is EvidenceStatus.OK:
                assert measurement.value is not None and math.isfinite(measurement.value), measurement
            elif measurement.status is EvidenceStatus.ERROR:
                assert isinstance(measurement.error_class, ErrorClass), measurement

    run()
    # Answers were read as values, as no data, as invalid values and as errors: all four are reached.
    assert all(statuses[status.value] > 0 for status in EvidenceStatus), statuses
