"""What a chat or webhook receiver answers is read within bounds (issue #34, findings 1 and 7):
at most a few KiB, within one deadline for the whole attempt, never through a redirect. Each sender
against a real loopback server scripted byte by byte (tests/loopback.py)."""

from __future__ import annotations

import time

import pytest

from canary.notify import delivery
from canary.notify.delivery import DeliveryError
from canary.notify.destinations import destination_for
from canary.notify.message import NO_CONTEXT
from canary.notify.secrets import Redactor, SecretResolver
from canary.notify.webhook import WebhookSender
from canary.policy.model import NotifyTarget, SecretRef
from tests.loopback import Exchange, MiB, loopback
from tests.notify.support import make_notification

KINDS = ("slack", "teams", "discord", "webhook")
HUGE = 64 * MiB
# What the kernel buffers between the two ends of a loopback connection before the writer blocks:
# the bytes a server "sent" to a client that stopped reading are at most this much past its limit.
BUFFERED = 16 * MiB


def _send(kind: str, url: str) -> None:
    resolver = SecretResolver(Redactor(), {"HOOK_URL": url + "/hooks/s3cr3t"})
    key = "urlFrom" if kind == "webhook" else "webhookUrlFrom"
    target = NotifyTarget.model_validate({kind: {key: {"env": "HOOK_URL"}}})
    destination_for(target, resolver=resolver, context=NO_CONTEXT, ref="notify[0]").sender.send(
        make_notification()
    )


def test_the_answer_limit_is_a_few_kib() -> None:
    assert 1024 <= delivery.ANSWER_LIMIT <= 16 * 1024


@pytest.mark.parametrize("kind", KINDS)
def test_a_huge_answer_is_read_no_further_than_the_answer_limit(kind: str) -> None:
    """Finding 1: one 200 with a 300 MB body took the controller from 93 to 699 MiB."""

    def huge(exchange: Exchange) -> None:
        exchange.head(200, {"Content-Type": "text/plain"})  # no length: the body ends at the close
        exchange.stream(HUGE)

    with loopback(huge) as server:
        _send(kind, server.url)  # delivered: the status said so; the rest of the answer is not read
    assert server.sent < BUFFERED, f"{server.sent / MiB:.0f} MiB of the answer were read"


@pytest.mark.parametrize("kind", KINDS)
def test_a_redirect_is_reported_by_its_status_neither_followed_nor_read(kind: str) -> None:
    with loopback(lambda exchange: exchange.head(200)) as elsewhere:

        def redirect(exchange: Exchange) -> None:
            exchange.head(302, {"Location": f"{elsewhere.url}/collect?stolen=1"})
            exchange.stream(HUGE)

        with loopback(redirect) as server, pytest.raises(DeliveryError) as failed:
            _send(kind, server.url)
    assert (failed.value.status, failed.value.retryable) == (302, False)
    assert str(failed.value).endswith("HTTP 302 Found from http://127.0.0.1: redirect not followed")
    assert elsewhere.seen == []
    assert server.sent < BUFFERED, f"{server.sent / MiB:.0f} MiB of the redirect's body were read"


def _slow_body(exchange: Exchange) -> None:
    exchange.head(200, {"Content-Length": "60"})
    exchange.trickle(b"x" * 60, 0.1)  # 6 s, a byte each 0.1 s: never a read timeout


def _slow_head(exchange: Exchange) -> None:
    exchange.trickle(b"HTTP/1.0 200 OK\r\nX-Slow: " + b"y" * 60 + b"\r\n\r\n", 0.1)


@pytest.mark.parametrize(
    ("script", "delivered"), [(_slow_body, True), (_slow_head, False)], ids=["body", "status-and-headers"]
)
def test_a_trickled_answer_is_cut_at_the_attempts_deadline(script: object, delivered: bool) -> None:
    """A total deadline per attempt (connect and every read), not a timeout per read."""
    with loopback(script) as server:  # type: ignore[arg-type]
        resolver = SecretResolver(Redactor(), {"HOOK_URL": server.url + "/hooks/s3cr3t"})
        sender = WebhookSender(SecretRef(env="HOOK_URL"), resolver=resolver, timeout=(0.5, 1.0))
        started = time.monotonic()
        try:
            sender.send(make_notification())
            failure = None
        except DeliveryError as error:
            failure = error
        elapsed = time.monotonic() - started
    assert elapsed < 2.5, f"held {elapsed:.1f}s on a 1s deadline"
    if delivered:  # the status arrived in time: delivered, the trickle is closed
        assert failure is None
    else:
        assert failure is not None and failure.retryable and failure.status is None
        assert "timed out" in str(failure) and "s3cr3t" not in str(failure)
