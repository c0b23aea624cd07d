"""What Prometheus (or whatever answers at its URL) says is read within bounds (issue #34, finding 7):
no redirect is followed, so the configured headers never leave for another origin and the other
origin's text never reaches a detail; every answer has one deadline for the whole attempt; no
answer is read past its cap. Each way the client asks, against a real loopback server scripted byte
by byte (tests/loopback.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from canary.controller.settings import PrometheusSettings
from canary.evidence import ErrorClass
from canary.metrics.client import (
    PrometheusClient,
    PrometheusConfig,
    QueryFailure,
    RetryPolicy,
    vector_decoder,
)
from tests.loopback import Exchange, MiB, loopback

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
HEADERS = {"X-Scope-OrgID": "tenant-s3cr3t", "X-Api-Key": "api-key-s3cr3t"}
# What the kernel buffers between the two ends of a loopback connection: the bytes a server "sent"
# to a client that stopped reading are at most this much past what the client read.
BUFFERED = 16 * MiB
EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


class Series(msgspec.Struct):
    metric: dict[str, str]
    value: tuple[float, str]


TYPED = vector_decoder(Series)  # as the evidence pipeline reads its counter sample


def _client(url: str, **overrides: object) -> PrometheusClient:
    config = PrometheusConfig(
        url=url,
        headers=HEADERS,
        retry=RetryPolicy(attempts=3, backoff=0.0),
        **overrides,  # type: ignore[arg-type]
    )
    return PrometheusClient(config)


def _failure(outcome: object) -> QueryFailure:
    failure = outcome if isinstance(outcome, QueryFailure) else getattr(outcome, "failure", None)
    assert isinstance(failure, QueryFailure), f"expected a failure, got {outcome!r}"
    return failure


# Every way the client asks: the library's instant query, the typed one, a long query as a form
# body, a range query, a label look-up.
ASKS: dict[str, Callable[[PrometheusClient], object]] = {
    "instant": lambda client: client.instant("sum(up)", AT),
    "typed": lambda client: client.instant("sum(up)", AT, typed=TYPED),
    "long-post": lambda client: client.instant("sum(up) + " * 600 + "1", AT),
    "range": lambda client: client.range_query("sum(up)", AT - timedelta(minutes=5), AT, 30.0),
    "labels": lambda client: client.label_values("revision", ["up"], AT - timedelta(hours=1), AT)[0],
}


@pytest.mark.parametrize("ask", ASKS.values(), ids=ASKS.keys())
def test_a_redirect_is_reported_by_its_status_and_never_followed(
    ask: Callable[[PrometheusClient], object],
) -> None:
    """Finding 7: on a 302 to another origin the tenant and API-key headers went along, and the
    target's text came back in details that Events and notifications show."""

    def elsewhere_says(exchange: Exchange) -> None:
        exchange.head(200, {"Content-Type": "application/json"})
        exchange.write(b'{"status":"error","errorType":"execution","error":"[click](https://evil.example)"}')

    with loopback(elsewhere_says) as elsewhere:

        def redirect(exchange: Exchange) -> None:
            exchange.head(302, {"Location": f"{elsewhere.url}/api/v1/query", "Content-Type": "text/html"})
            exchange.write(b"<a href='https://evil.example'>Moved to the attacker's login page</a>")

        with loopback(redirect) as prometheus:
            client = _client(prometheus.url, max_get_length=200)
            failure = _failure(ask(client))
            client.close()
    assert elsewhere.seen == [], "the redirect was followed (with the configured headers)"
    assert failure.http_status == 302
    assert failure.detail == "HTTP 302 Found: a redirect, not followed"
    assert len(prometheus.seen) == 1, "a redirect is not retried"


def test_a_trickled_answer_is_cut_at_the_attempts_deadline() -> None:
    """Finding 7: an answer trickled a byte a second returned after 27 s on a 3 s timeout."""

    def trickle(exchange: Exchange) -> None:
        exchange.head(200, {"Content-Type": "application/json", "Content-Length": str(len(EMPTY))})
        exchange.trickle(EMPTY, 0.1)  # 6 s, a byte each 0.1 s: no single read ever times out

    with loopback(trickle) as prometheus:
        client = _client(prometheus.url, timeout=0.5)  # Prometheus' timeout; the client's deadline 1.5 s
        started = time.monotonic()
        failure = _failure(client.instant("sum(up)", AT))
        elapsed = time.monotonic() - started
        client.close()
    assert elapsed < 3.0, f"held {elapsed:.1f}s on a 1.5s deadline"
    assert failure.error_class is ErrorClass.TIMEOUT
    assert (
        failure.detail == f"{prometheus.url}: no complete answer within 1.5s (client deadline; not retried)"
    )
    assert failure.http_status == 200
    assert len(prometheus.seen) == 1


def test_an_error_answer_is_read_no_further_than_an_error_can_be() -> None:
    """Finding 7: a 400 MB 503 answer took the controller to 2.8 GiB."""

    def huge_503(exchange: Exchange) -> None:
        exchange.head(503, {"Content-Type": "text/plain", "Content-Length": str(48 * MiB)})
        exchange.stream(48 * MiB)

    with loopback(huge_503) as prometheus:
        client = _client(prometheus.url)
        failure = _failure(client.instant("sum(up)", AT))
        client.close()
    assert prometheus.sent < BUFFERED, f"{prometheus.sent / MiB:.0f} MiB of the answer were read"
    assert failure.error_class is ErrorClass.UNAVAILABLE
    assert failure.detail == "HTTP 503 Service Unavailable: an answer larger than 64 KiB, not read"
    assert len(prometheus.seen) == 1, "an answer too large to read is not asked for again"


@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
def test_an_answer_past_the_configured_cap_is_not_read(declared: bool) -> None:
    def huge_200(exchange: Exchange) -> None:
        length = {"Content-Length": str(48 * MiB)} if declared else {}
        exchange.head(200, {"Content-Type": "application/json", **length})
        exchange.write(b'{"status":"success","data":{"resultType":"vector","result":[')
        exchange.stream(48 * MiB)

    with loopback(huge_200) as prometheus:
        client = _client(prometheus.url, max_answer_bytes=1 * MiB)
        failure = _failure(client.instant("sum(up)", AT, typed=TYPED))
        client.close()
    assert prometheus.sent < BUFFERED, f"{prometheus.sent / MiB:.0f} MiB of the answer were read"
    assert failure.error_class is ErrorClass.MALFORMED_RESPONSE
    assert failure.detail == ("HTTP 200 OK: an answer larger than 1 MiB (max_answer_bytes), not read")


def test_the_default_cap_holds_a_thousand_rollouts_counter_sample() -> None:
    """benchmarks/scale.py at 1,000 rollouts: a counter sample of about 100,000 series (canary and
    stable revisions, their pods, code classes and buckets), each about 250 bytes of JSON with
    Kubernetes names of usual length. The default must hold it with room for a fleet that grows."""
    assert PrometheusConfig(url="http://p:9090").max_answer_bytes >= 4 * 100_000 * 250


def test_the_controller_setting_defaults_to_the_clients_cap() -> None:
    assert PrometheusSettings().max_answer_bytes == PrometheusConfig(url="http://p:9090").max_answer_bytes
