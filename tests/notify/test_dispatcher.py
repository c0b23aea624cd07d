from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import structlog
from prometheus_client import CollectorRegistry

from canary.metrics.client import PrometheusConfig
from canary.notify.delivery import TargetKind
from canary.notify.destinations import destination_for, events_destination
from canary.notify.dispatcher import Destination, NotificationDispatcher, RetryPolicy
from canary.notify.message import Notification, NotificationAction, Severity
from canary.notify.metrics import PrometheusDeliveryRecorder
from canary.notify.secrets import Redactor, SecretResolver
from canary.policy.model import NotifyTarget, SecretRef, SlackTarget, WebhookTarget
from canary.retrying import NOTIFICATION_RETRY, PROMETHEUS_RETRY
from canary.rollout.vocabulary import decision_id
from tests.notify.support import (
    WAIT,
    EventApiServer,
    Receiver,
    Reply,
    make_notification,
    rollback_notification,
)


class Harness:
    """A dispatcher with real senders, an isolated metrics registry and a recorded (instant) sleep."""

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        self.environ = environ if environ is not None else {}
        self.redactor = Redactor()
        self.resolver = SecretResolver(self.redactor, self.environ)
        self.registry = CollectorRegistry()
        self.sleeps: list[float] = []
        self.dispatcher: NotificationDispatcher | None = None

    def slack(
        self, receiver: Receiver | str, *, env: str = "SLACK_WEBHOOK_URL", min_severity: str = "info"
    ) -> Destination:
        url = receiver if isinstance(receiver, str) else receiver.url + "/services/T0/B0/slack-secret-token"
        self.environ[env] = url
        target = NotifyTarget(
            slack=SlackTarget(webhook_url_from=SecretRef(env=env)), min_severity=min_severity
        )
        return destination_for(target, resolver=self.resolver, timeout=(2.0, WAIT + 5))

    def webhook(self, receiver: Receiver, *, env: str = "DEPLOY_HOOK_URL") -> Destination:
        self.environ[env] = receiver.url + "/hooks/deploy?token=hook-secret-token"
        target = NotifyTarget(webhook=WebhookTarget(url_from=SecretRef(env=env)))
        return destination_for(target, resolver=self.resolver, timeout=(2.0, WAIT + 5))

    def start(self, defaults: tuple[Destination, ...] = (), **options: object) -> NotificationDispatcher:
        self.dispatcher = NotificationDispatcher(
            defaults,
            recorder=PrometheusDeliveryRecorder(self.registry),
            redactor=self.redactor,
            sleep=self.sleeps.append,  # backoff is recorded, not slept
            rng=random.Random(7),
            **options,  # type: ignore[arg-type]
        )
        return self.dispatcher

    def count(self, kind: TargetKind, outcome: str) -> float:
        value = self.registry.get_sample_value(
            "kserve_canary_notifications_total", {"target_kind": kind.value, "outcome": outcome}
        )
        return value or 0.0

    def retries(self, kind: TargetKind) -> float:
        return (
            self.registry.get_sample_value(
                "kserve_canary_notification_retries_total", {"target_kind": kind.value}
            )
            or 0.0
        )


@pytest.fixture
def harness() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    if harness.dispatcher is not None:
        harness.dispatcher.close(timeout=WAIT)


def _ids(receiver: Receiver) -> list[str]:
    return [
        request.json()["blocks"][-1]["elements"][0]["text"].split("`")[3] for request in receiver.requests
    ]


def _notification(number: int, severity: Severity = Severity.INFO) -> Notification:
    action = NotificationAction.ADVANCED if severity is Severity.INFO else NotificationAction.ROLLED_BACK
    return make_notification(id=decision_id("n", number), severity=severity, action=action)


def _closed_port_url(path: str) -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"  # nothing listens there any more: connection refused


def _wait_until(condition: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


# -- retries --------------------------------------------------------------------------------------


def test_two_503s_then_success_is_one_delivery_with_backoff(harness: Harness, receiver: Receiver) -> None:
    receiver.reply(Reply(503, b"busy"), Reply(503, b"busy"))
    slack = harness.slack(receiver)
    dispatcher = harness.start()
    submission = dispatcher.submit(make_notification(), [slack])
    assert submission.accepted == (slack.key,)
    assert dispatcher.close(timeout=WAIT)

    assert len(receiver.requests) == 3
    assert receiver.requests[0].body == receiver.requests[2].body  # the same message, retried
    assert harness.count(TargetKind.SLACK, "delivered") == 1
    assert harness.count(TargetKind.SLACK, "failed") == 0
    assert harness.retries(TargetKind.SLACK) == 2
    # Exponential with equal jitter: 1st wait in [0.5, 1], 2nd in [1, 2].
    assert len(harness.sleeps) == 2
    assert 0.5 <= harness.sleeps[0] <= 1.0 <= harness.sleeps[1] <= 2.0


def test_400_is_not_retried(harness: Harness, receiver: Receiver) -> None:
    receiver.reply(Reply(400, b"invalid_payload"))
    slack = harness.slack(receiver)
    dispatcher = harness.start()
    dispatcher.submit(make_notification(), [slack])
    assert dispatcher.close(timeout=WAIT)
    assert len(receiver.requests) == 1
    assert harness.sleeps == []
    assert harness.count(TargetKind.SLACK, "failed") == 1


def test_429_retry_after_is_honoured(harness: Harness, receiver: Receiver) -> None:
    receiver.reply(Reply(429, b"rate_limited", {"Retry-After": "20"}))
    slack = harness.slack(receiver)
    dispatcher = harness.start()
    dispatcher.submit(make_notification(), [slack])
    assert dispatcher.close(timeout=WAIT)
    assert len(receiver.requests) == 2
    assert harness.sleeps == [20.0]
    assert harness.count(TargetKind.SLACK, "delivered") == 1


def test_attempts_are_bounded_and_delays_capped(harness: Harness, receiver: Receiver) -> None:
    receiver.reply(*[Reply(502, b"bad gateway")] * 6)
    slack = harness.slack(receiver)
    dispatcher = harness.start(retry=replace(NOTIFICATION_RETRY, attempts=6, backoff=1.0, max_backoff=4.0))
    dispatcher.submit(make_notification(), [slack])
    assert dispatcher.close(timeout=WAIT)
    assert len(receiver.requests) == 6
    assert len(harness.sleeps) == 5
    assert all(delay <= 4.0 for delay in harness.sleeps)
    assert harness.sleeps[-1] >= 2.0  # capped ceiling 4s, at least half of it
    assert harness.count(TargetKind.SLACK, "failed") == 1


def test_one_retry_policy_shape_for_notifications_and_prometheus() -> None:
    assert RetryPolicy is type(PrometheusConfig(url="http://p:9090").retry)
    assert PrometheusConfig(url="http://p:9090").retry == PROMETHEUS_RETRY
    assert (NOTIFICATION_RETRY.attempts, NOTIFICATION_RETRY.jitter) == (5, True)


def test_the_retry_budget_bounds_the_total_backoff(harness: Harness, receiver: Receiver) -> None:
    receiver.reply(*[Reply(503, b"unavailable")] * 10)
    slack = harness.slack(receiver)
    budget = replace(NOTIFICATION_RETRY, attempts=10, backoff=1.0, max_backoff=4.0, budget=6.0)
    dispatcher = harness.start(retry=budget)
    dispatcher.submit(make_notification(), [slack])
    assert dispatcher.close(timeout=WAIT)
    assert sum(harness.sleeps) <= 6.0
    assert 2 <= len(receiver.requests) < 10  # the budget, not the attempts, ended it
    assert len(receiver.requests) == len(harness.sleeps) + 1
    assert harness.count(TargetKind.SLACK, "failed") == 1


# -- de-duplication and filtering -------------------------------------------------------------------


def test_the_same_decision_is_delivered_once_per_destination(
    harness: Harness, receiver_factory: Callable[[], Receiver]
) -> None:
    slack_receiver, hook_receiver = receiver_factory(), receiver_factory()
    slack, hook = harness.slack(slack_receiver), harness.webhook(hook_receiver)
    dispatcher = harness.start()
    notification = make_notification()
    first = dispatcher.submit(notification, [slack, hook])
    again = dispatcher.submit(notification, [slack, hook])  # e.g. the next tick re-derives it
    other = dispatcher.submit(_notification(2), [slack])
    assert dispatcher.close(timeout=WAIT)

    assert first.accepted == (slack.key, hook.key)
    assert again.duplicates == (slack.key, hook.key)
    assert again.accepted == ()
    assert other.accepted == (slack.key,)
    assert len(slack_receiver.requests) == 2
    assert len(hook_receiver.requests) == 1
    assert harness.count(TargetKind.SLACK, "duplicate") == 1
    assert harness.count(TargetKind.WEBHOOK, "duplicate") == 1


def test_min_severity_filters_per_destination(
    harness: Harness, receiver_factory: Callable[[], Receiver]
) -> None:
    all_receiver, warnings_receiver = receiver_factory(), receiver_factory()
    everything = harness.slack(all_receiver, env="SLACK_ALL")
    warnings_only = harness.slack(warnings_receiver, env="SLACK_ONCALL", min_severity="warning")
    dispatcher = harness.start()
    info = dispatcher.submit(make_notification(), [everything, warnings_only])
    warning = dispatcher.submit(rollback_notification(), [everything, warnings_only])
    assert dispatcher.close(timeout=WAIT)

    assert info.filtered == (warnings_only.key,)
    assert warning.accepted == (everything.key, warnings_only.key)
    assert len(all_receiver.requests) == 2
    assert [request.json()["blocks"][0]["text"]["text"] for request in warnings_receiver.requests] == [
        "⏪ llama-chat: canary rolled back 30% → 0%"
    ]
    assert harness.count(TargetKind.SLACK, "filtered") == 1


# -- never blocking -----------------------------------------------------------------------------------


def test_a_hanging_slack_blocks_neither_submit_nor_the_webhook(
    harness: Harness, receiver_factory: Callable[[], Receiver]
) -> None:
    slack_receiver, hook_receiver = receiver_factory(), receiver_factory()
    slack_receiver.reply(Reply(hang=True))
    slack, hook = harness.slack(slack_receiver), harness.webhook(hook_receiver)
    dispatcher = harness.start()

    dispatcher.submit(_notification(1), [slack, hook])
    assert slack_receiver.entered_hang.wait(WAIT)
    # Slack is now stuck inside a request. Submitting more must return while it still is ...
    submission = dispatcher.submit(_notification(2), [slack, hook])
    assert slack_receiver.in_flight == 1
    assert submission.accepted == (slack.key, hook.key)
    # ... and the webhook gets both notifications while Slack is still stuck on the first.
    hook_receiver.wait_for(2)
    assert slack_receiver.in_flight == 1
    assert len(slack_receiver.requests) == 1

    slack_receiver.release.set()
    assert dispatcher.close(timeout=WAIT)
    assert len(slack_receiver.requests) == 2  # order kept within the Slack lane
    assert [r.json()["id"] for r in hook_receiver.requests] == [_notification(1).id, _notification(2).id]


def test_a_full_queue_drops_info_before_warnings(harness: Harness, receiver: Receiver) -> None:
    receiver.reply(Reply(hang=True))
    slack = harness.slack(receiver)
    dispatcher = harness.start(queue_capacity=2)

    dispatcher.submit(_notification(0), [slack])  # in flight, hanging
    assert receiver.entered_hang.wait(WAIT)
    dispatcher.submit(_notification(1, Severity.WARNING), [slack])  # queue: w1
    dispatcher.submit(_notification(2), [slack])  # queue: w1 i2 (full)
    third = dispatcher.submit(_notification(3, Severity.WARNING), [slack])  # i2 dropped: w1 w3
    fourth = dispatcher.submit(_notification(4), [slack])  # only warnings queued: i4 itself dropped
    fifth = dispatcher.submit(_notification(5, Severity.WARNING), [slack])  # oldest warning w1 dropped: w3 w5
    assert third.accepted == (slack.key,)
    assert fourth.dropped == (slack.key,)
    assert fifth.accepted == (slack.key,)

    receiver.release.set()
    _wait_until(lambda: harness.count(TargetKind.SLACK, "delivered") == 3)
    # i4 was refused at the door, never accepted: submitting it again is not a duplicate.
    assert dispatcher.submit(_notification(4), [slack]).accepted == (slack.key,)
    assert dispatcher.close(timeout=WAIT)
    assert _ids(receiver) == [_notification(n).id for n in (0, 3, 5, 4)]
    assert harness.count(TargetKind.SLACK, "dropped") == 3


def test_close_gives_up_at_its_deadline_and_counts_what_is_left(harness: Harness, receiver: Receiver) -> None:
    receiver.reply(Reply(hang=True))
    slack = harness.slack(receiver)
    dispatcher = harness.start()
    dispatcher.submit(_notification(1), [slack])
    assert receiver.entered_hang.wait(WAIT)
    dispatcher.submit(_notification(2), [slack])
    dispatcher.submit(_notification(3), [slack])

    assert dispatcher.close(timeout=0.05) is False
    assert harness.count(TargetKind.SLACK, "dropped") == 2
    late = dispatcher.submit(_notification(4), [slack])
    assert late.dropped == (slack.key,)
    assert harness.count(TargetKind.SLACK, "dropped") == 3
    receiver.release.set()
    _wait_until(lambda: harness.count(TargetKind.SLACK, "delivered") == 1)  # the in-flight one completes
    assert len(receiver.requests) == 1


def test_shutdown_interrupts_a_backoff_wait(receiver: Receiver) -> None:
    # The default sleep (not injected here) must wake up when close() gives up.
    receiver.reply(Reply(429, b"slow down", {"Retry-After": "60"}))
    harness = Harness()
    slack = harness.slack(receiver)
    dispatcher = NotificationDispatcher(
        recorder=PrometheusDeliveryRecorder(harness.registry), redactor=harness.redactor
    )
    dispatcher.submit(make_notification(), [slack])
    receiver.wait_for(1)
    _wait_until(lambda: harness.retries(TargetKind.SLACK) == 1)
    assert dispatcher.close(timeout=0.05) is False
    _wait_until(lambda: harness.count(TargetKind.SLACK, "dropped") == 1)
    assert len(receiver.requests) == 1


# -- failures that are not the network ----------------------------------------------------------------


def test_a_missing_secret_fails_that_notification_only(
    harness: Harness, receiver: Receiver, tmp_path: Path
) -> None:
    url_file = tmp_path / "url"
    target = NotifyTarget(webhook=WebhookTarget(url_from=SecretRef(file=str(url_file))))
    hook = destination_for(target, resolver=harness.resolver)
    dispatcher = harness.start()
    with structlog.testing.capture_logs() as logs:
        dispatcher.submit(_notification(1), [hook])
        _wait_until(lambda: harness.count(TargetKind.WEBHOOK, "failed") == 1)
        url_file.write_text(receiver.url + "/hook\n")  # the Secret gets mounted
        dispatcher.submit(_notification(2), [hook])
        assert dispatcher.close(timeout=WAIT)
    assert harness.sleeps == []  # configuration errors are not retried
    assert [r.json()["id"] for r in receiver.requests] == [_notification(2).id]
    failure = next(log for log in logs if log["event"] == "notification delivery failed")
    assert failure["error"] == f"file {url_file} cannot be read: No such file or directory"


class _BrokenSender:
    """A sender with a bug (any Sender implementation may have one)."""

    def __init__(self) -> None:
        self.calls = 0

    def send(self, notification: Notification) -> None:
        self.calls += 1
        if self.calls == 1:
            raise KeyError("https://hooks.example.com/secret-path-123456")


def test_a_sender_bug_does_not_kill_its_lane(harness: Harness) -> None:
    harness.redactor.add("https://hooks.example.com/secret-path-123456")
    sender = _BrokenSender()
    destination = Destination("custom", TargetKind.WEBHOOK, sender)
    dispatcher = harness.start()
    with structlog.testing.capture_logs() as logs:
        dispatcher.submit(_notification(1), [destination])
        dispatcher.submit(_notification(2), [destination])
        assert dispatcher.close(timeout=WAIT)
    assert sender.calls == 2
    assert harness.count(TargetKind.WEBHOOK, "failed") == 1
    assert harness.count(TargetKind.WEBHOOK, "delivered") == 1
    assert "secret-path-123456" not in repr(logs)
    assert any(
        log["event"] == "notification sender raised unexpectedly" and "KeyError" in log["traceback"]
        for log in logs
    )


# -- secrets ------------------------------------------------------------------------------------------


def test_secrets_never_reach_logs_or_events_even_when_errors_quote_the_url(
    harness: Harness, receiver: Receiver, apiserver: EventApiServer
) -> None:
    slack_url = _closed_port_url("/services/T0SECRET/B0SECRET/xoxSecretToken42")
    slack = harness.slack(slack_url)  # connection refused: requests' error quotes the URL path
    receiver.reply(*[Reply(500, echo_request=True)] * 3)  # a receiver that echoes the URL back
    hook = harness.webhook(receiver)
    events = events_destination(apiserver.api_client(), resolver=harness.resolver)
    with structlog.testing.capture_logs() as logs:
        dispatcher = harness.start((events,), retry=replace(NOTIFICATION_RETRY, attempts=3))
        dispatcher.submit(make_notification(), [slack, hook])
        # the decision's own event + one NotificationFailed event per failed destination
        _wait_until(lambda: len(apiserver.events) == 3)
        assert dispatcher.close(timeout=WAIT)

    assert harness.count(TargetKind.SLACK, "failed") == 1
    assert harness.count(TargetKind.WEBHOOK, "failed") == 1
    rendered_logs = repr(logs)
    messages = [event["message"] for event in apiserver.events.values()]
    for secret in ("T0SECRET", "xoxSecretToken42", "hook-secret-token", "slack-secret-token"):
        assert secret not in rendered_logs
        assert all(secret not in message for message in messages)
    # The errors are still useful: what failed, where (by reference), and why.
    errors = [log["error"] for log in logs if log["event"] == "notification delivery failed"]
    assert any(
        error.startswith("slack webhook (env SLACK_WEBHOOK_URL): connection failed") for error in errors
    )
    assert any(error.startswith("webhook (env DEPLOY_HOOK_URL): HTTP 500") for error in errors)
    failed_events = [event for event in apiserver.events.values() if event["reason"] == "NotificationFailed"]
    assert len(failed_events) == 2
    assert all(event["type"] == "Warning" for event in failed_events)
    assert any(
        "not delivered to slack env SLACK_WEBHOOK_URL after 3 attempt(s)" in e["message"]
        for e in failed_events
    )


def test_events_destination_gets_every_decision(harness: Harness, apiserver: EventApiServer) -> None:
    events = events_destination(apiserver.api_client(), resolver=harness.resolver)
    dispatcher = harness.start((events,))
    dispatcher.submit(make_notification())
    dispatcher.submit(rollback_notification())
    assert dispatcher.close(timeout=WAIT)
    assert sorted(event["reason"] for event in apiserver.events.values()) == [
        "CanaryAdvanced",
        "CanaryRolledBack",
    ]
    assert harness.count(TargetKind.KUBERNETES_EVENT, "delivered") == 2


def test_submit_from_many_threads(harness: Harness, receiver: Receiver) -> None:
    slack = harness.slack(receiver)
    dispatcher = harness.start()
    threads = [
        threading.Thread(target=lambda n=n: dispatcher.submit(_notification(n % 20), [slack]))
        for n in range(60)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert dispatcher.close(timeout=WAIT)
    assert len(receiver.requests) == 20
    assert harness.count(TargetKind.SLACK, "duplicate") == 40
