"""What a failed delivery may show, and where a notification may go (issue 17).

A failure becomes a ``NotificationFailed`` Event and a log line built only from the exception class,
the status code and ``scheme://host``: never the exception's text (requests quotes the URL with
``repr``), the reason phrase or the body (a receiver may echo the request; whatever the URL really
points at may answer with its own secrets). And the URL is checked first: https, no loopback,
link-local (cloud metadata), private or unspecified addresses unless the operator allows the host.
"""

from __future__ import annotations

import random
import socket
import time
from urllib.parse import quote

import pytest
import structlog
from prometheus_client import CollectorRegistry

from canary.notify.delivery import DeliveryError
from canary.notify.destinations import destination_for, events_destination
from canary.notify.dispatcher import NotificationDispatcher
from canary.notify.metrics import PrometheusDeliveryRecorder
from canary.notify.secrets import Redactor, SecretResolver
from canary.notify.urls import UnsafeUrl, UrlGuard, origin
from canary.notify.webhook import WebhookSender
from canary.policy.model import NotifyTarget, SecretRef, WebhookTarget
from tests.notify.support import WAIT, EventApiServer, Receiver, Reply, make_notification


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # nothing listens there any more: connection refused


def _forms(secret: str) -> set[str]:
    """The secret as text may carry it: raw, repr-escaped, percent-encoded."""
    return {secret, repr(secret)[1:-1], quote(secret), quote(secret, safe=""), secret.replace("\n", "\\n")}


def test_failed_deliveries_show_neither_the_secret_url_nor_the_response_body(
    receiver: Receiver, apiserver: EventApiServer
) -> None:
    port = _closed_port()
    # What `urlFrom: {file: /proc/self/environ}` used to read: NUL-separated variables of other teams.
    environ_dump = "TEAM_B_TOKEN=tb-4f1e9c2a77\x00HOME=/root\x00PATH=/usr/bin\x00"
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEF\nQCs3cr3tK3yL1n3Tw0\n-----END PRIVATE KEY-----"
    environ = {
        "REFUSED_URL": f"http://127.0.0.1:{port}/hooks/r3fused-s3cret-path?token=refused-q-secret",
        "ECHO_URL": f"{receiver.url}/hooks/ech0-s3cret-path?sig=echo-q-secret",
        "ENVIRON_URL": environ_dump,
        "PEM_URL": pem,
    }
    receiver.reply(
        *[Reply(500, body=b"upstream says: " + environ["ECHO_URL"].encode() + b" tb-4f1e9c2a77")] * 10
    )
    redactor = Redactor()
    resolver = SecretResolver(redactor, environ)
    targets = [
        destination_for(
            NotifyTarget(webhook=WebhookTarget(url_from=SecretRef(env=name))),
            resolver=resolver,
            timeout=(2.0, WAIT),
        )
        for name in environ
    ]
    events = events_destination(apiserver.api_client(), resolver=resolver)
    dispatcher = NotificationDispatcher(
        (events,),
        recorder=PrometheusDeliveryRecorder(CollectorRegistry()),
        redactor=redactor,
        sleep=lambda _: None,
        rng=random.Random(7),
    )
    with structlog.testing.capture_logs() as logs:
        dispatcher.submit(make_notification(), targets)
        deadline = time.monotonic() + WAIT
        while len(apiserver.events) < 1 + len(targets) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert dispatcher.close(timeout=WAIT)

    failed = [
        event["message"] for event in apiserver.events.values() if event["reason"] == "NotificationFailed"
    ]
    assert len(failed) == len(targets)
    shown = repr(logs) + "\n".join(failed) + "\n".join(repr(message) for message in failed)
    secrets = [
        "r3fused-s3cret-path",
        "refused-q-secret",
        "ech0-s3cret-path",
        "echo-q-secret",
        "upstream says",
        "tb-4f1e9c2a77",
        "TEAM_B_TOKEN",
        "MIIEvQIBADANBgkqhkiG9w0BAQEF",
        "QCs3cr3tK3yL1n3Tw0",
        "PRIVATE KEY",
    ]
    for secret in secrets:
        for form in _forms(secret):
            assert form not in shown, f"{form!r} reached an Event or a log line"
    # Still useful: which reference, what kind of failure, which host.
    errors = {log["error"] for log in logs if log["event"] == "notification delivery failed"}
    assert (
        "webhook (env REFUSED_URL): connection failed (ConnectionError) sending to http://127.0.0.1" in errors
    )
    assert "webhook (env ECHO_URL): HTTP 500 Internal Server Error from http://127.0.0.1" in errors
    assert any(error.startswith("webhook (env PEM_URL): request could not be sent (") for error in errors)


def _resolve(table: dict[str, list[str]]) -> object:
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError("unknown host")
        return table[host]

    return resolve


GUARD = UrlGuard.allowing(
    ["127.0.0.1", "receiver.internal"],
    resolve=_resolve(  # type: ignore[arg-type]
        {
            "hooks.example.com": ["93.184.215.14"],
            "localhost": ["127.0.0.1", "::1"],
            "metadata.google.internal": ["169.254.169.254"],
            "split.example.com": ["93.184.215.14", "10.0.0.7"],
            "receiver.internal": ["10.1.2.3"],
        }
    ),
)


@pytest.mark.parametrize(
    "url",
    ["https://hooks.example.com/services/x", "http://127.0.0.1:8080/hook", "http://receiver.internal/hook"],
)
def test_public_https_and_allowed_hosts_pass(url: str) -> None:
    GUARD.check(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://hooks.example.com/x", "http is allowed only for hosts on --notify-allow-host"),
        ("https://169.254.169.254/latest/meta-data/", "link-local"),
        ("https://metadata.google.internal/computeMetadata/v1/", "link-local"),
        ("https://localhost:8080/healthz", "loopback"),
        ("https://127.0.0.2/", "loopback"),
        ("https://[::ffff:127.0.0.1]/", "loopback"),
        ("https://10.0.0.1/", "private"),
        ("https://192.168.1.1/", "private"),
        ("https://100.64.0.1/", "private"),
        ("https://0.0.0.0/", "unspecified"),
        ("https://split.example.com/", "private"),
        ("https://nowhere.example.com/", "does not resolve"),
        ("file:///etc/passwd", "only https"),
        ("gopher://hooks.example.com/", "only https"),
        ("TEAM_B_TOKEN=tb-4f1e9c2a77\x00HOME=/root", "control characters"),
        ("-----BEGIN KEY-----\nMIIsecret\n-----END KEY-----", "control characters"),
        ("https:///no-host", "no valid host"),
    ],
)
def test_urls_that_reach_inside_the_cluster_are_refused(url: str, reason: str) -> None:
    with pytest.raises(UnsafeUrl, match=reason) as refused:
        GUARD.check(url)
    for fragment in ("tb-4f1e9c2a77", "MIIsecret", "meta-data", "computeMetadata", "/etc/passwd"):
        assert fragment not in str(refused.value)


def test_origin_is_scheme_and_host_only() -> None:
    assert origin("https://user:pw@hooks.slack.com:443/services/T/B/X?token=y") == "https://hooks.slack.com"
    assert origin("TEAM_B_TOKEN=secret") == "<invalid URL>"


def test_a_refused_url_is_never_contacted(receiver: Receiver) -> None:
    resolver = SecretResolver(Redactor(), {"HOOK": f"{receiver.url}/hook"}, url_guard=UrlGuard())
    sender = WebhookSender(SecretRef(env="HOOK"), resolver=resolver, timeout=(2.0, WAIT))
    with pytest.raises(DeliveryError, match=r"^webhook \(env HOOK\): URL refused: http://127.0.0.1: http is"):
        sender.send(make_notification())
    assert receiver.requests == []
    allowed = SecretResolver(
        Redactor(), {"HOOK": f"{receiver.url}/hook"}, url_guard=UrlGuard.allowing(["127.0.0.1"])
    )
    WebhookSender(SecretRef(env="HOOK"), resolver=allowed, timeout=(2.0, WAIT)).send(make_notification())
    assert len(receiver.wait_for(1)) == 1
