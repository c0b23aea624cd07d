from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime, timedelta
from typing import Any

import pytest

from canary.notify.delivery import DeliveryError
from canary.notify.events import MESSAGE_LIMIT, KubernetesEventSender, event_message, event_name
from canary.notify.message import (
    CheckLine,
    CheckVerdict,
    MessageContext,
    Notification,
    NotificationAction,
    Severity,
)
from canary.notify.secrets import Redactor
from tests.notify.support import DECISION_TIME, EventApiServer, make_notification, rollback_notification


class SteppingClock:
    def __init__(self) -> None:
        self.now = DECISION_TIME

    def __call__(self) -> datetime:
        return self.now


def _sender(
    apiserver: EventApiServer, clock: SteppingClock | None = None, redactor: Redactor | None = None
) -> KubernetesEventSender:
    return KubernetesEventSender(
        apiserver.api_client(),
        reporting_instance="kserve-canary-7d9f-abcde",
        clock=clock or SteppingClock(),
        redactor=redactor or Redactor(),
    )


def test_event_on_the_inference_service(apiserver: EventApiServer) -> None:
    notification = rollback_notification()
    _sender(apiserver).send(notification)

    (request,) = apiserver.requests
    assert (request.method, request.path) == ("POST", "/api/v1/namespaces/ml/events")
    event = apiserver.events[("ml", event_name(notification))]
    assert event["involvedObject"] == {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "name": "llama-chat",
        "namespace": "ml",
        "uid": "6f1c2a1e-0d7b-4d0e-9d38-1b0c7a1f2e3d",
    }
    assert event["type"] == "Warning"
    assert event["reason"] == "CanaryRolledBack"
    assert event["source"] == {"component": "kserve-canary"}
    assert event["reportingComponent"] == "kserve-canary"
    assert event["reportingInstance"] == "kserve-canary-7d9f-abcde"
    assert event["count"] == 1
    assert event["firstTimestamp"] == event["lastTimestamp"]
    assert event["firstTimestamp"].startswith("2025-03-14T09:26:53")
    assert event["metadata"]["annotations"] == {"kserve-canary.dev/decision-id": notification.id}
    message = event["message"]
    assert message.startswith("Critical check oom failed at 30%; rolled back to the stable revision.")
    assert "traffic 30% → 0%" in message
    # The checks that did not pass come right after the verdict, with their numbers.
    assert message.index(
        "Not passing: oom 2, not ≤ 0 [fail]; kv-cache query failed: Prometheus timed out"
    ) < (message.index("traffic 30% → 0%"))


def test_info_decisions_are_normal_events(apiserver: EventApiServer) -> None:
    _sender(apiserver).send(make_notification())
    (event,) = apiserver.events.values()
    assert event["type"] == "Normal"
    assert event["reason"] == "CanaryAdvanced"
    assert "p99 612ms ≤ 800ms and ≤ +20% vs stable (stable 540ms), 1840 requests [pass]" in event["message"]


def test_identical_events_are_aggregated_by_patching_count(apiserver: EventApiServer) -> None:
    clock = SteppingClock()
    sender = _sender(apiserver, clock)
    outage = make_notification(
        action=NotificationAction.PROMETHEUS_UNAVAILABLE,
        severity=Severity.WARNING,
        summary="Prometheus is unreachable.",
        checks=(),
        reasons=(),
    )
    sender.send(outage)
    clock.now += timedelta(minutes=1)
    sender.send(make_notification(**{**_fields(outage), "id": "d-second-tick"}))
    clock.now += timedelta(minutes=1)
    sender.send(make_notification(**{**_fields(outage), "id": "d-third-tick"}))

    assert [(r.method, r.headers.get("Content-Type")) for r in apiserver.requests] == [
        ("POST", "application/json"),
        ("PATCH", "application/merge-patch+json"),
        ("PATCH", "application/merge-patch+json"),
    ]
    (event,) = apiserver.events.values()
    assert event["count"] == 3
    assert event["firstTimestamp"].startswith("2025-03-14T09:26:53")
    assert event["lastTimestamp"] == "2025-03-14T09:28:53Z"
    assert json.loads(apiserver.requests[2].body) == {"count": 3, "lastTimestamp": "2025-03-14T09:28:53Z"}


def test_aggregation_ends_after_the_window_or_when_the_event_expired(apiserver: EventApiServer) -> None:
    clock = SteppingClock()
    sender = _sender(apiserver, clock)
    base = _fields(make_notification(summary="Holding: no data.", checks=(), reasons=()))
    sender.send(make_notification(**{**base, "id": "d-1"}))
    clock.now += timedelta(minutes=11)  # beyond the 10-minute window: a new event
    sender.send(make_notification(**{**base, "id": "d-2"}))
    assert len(apiserver.events) == 2
    apiserver.events.clear()  # the apiserver's TTL removed them
    clock.now += timedelta(minutes=1)
    sender.send(make_notification(**{**base, "id": "d-3"}))  # PATCH -> 404 -> create
    assert [r.method for r in apiserver.requests] == ["POST", "POST", "PATCH", "POST"]
    assert len(apiserver.events) == 1


def test_resending_a_decision_is_idempotent(apiserver: EventApiServer) -> None:
    notification = make_notification()
    _sender(apiserver).send(notification)
    _sender(apiserver).send(notification)  # a fresh sender: as after a controller restart -> 409
    assert [r.method for r in apiserver.requests] == ["POST", "POST"]
    assert len(apiserver.events) == 1


@pytest.mark.parametrize(
    ("status", "retryable"), [(403, False), (422, False), (429, True), (500, True), (503, True)]
)
def test_apiserver_errors_are_classified(apiserver: EventApiServer, status: int, retryable: bool) -> None:
    apiserver.fail_next.append((status, {"Retry-After": "3"} if status == 429 else {}))
    with pytest.raises(DeliveryError) as failure:
        _sender(apiserver).send(make_notification())
    assert failure.value.retryable is retryable
    assert failure.value.status == status
    if status == 429:
        assert failure.value.retry_after == 3.0
    if status == 403:
        assert "grant the controller create and patch on events in namespace ml" in str(failure.value)


def test_unreachable_apiserver_is_retryable() -> None:
    server = EventApiServer()
    client = server.api_client()
    server.stop()
    sender = KubernetesEventSender(client, reporting_instance="x", redactor=Redactor(), timeout=(0.5, 0.5))
    with pytest.raises(DeliveryError, match="apiserver unreachable") as failure:
        sender.send(make_notification())
    assert failure.value.retryable


def test_message_is_bounded_and_scrubbed() -> None:
    redactor = Redactor()
    redactor.add("https://hooks.example.com/hook/leaked-token-99")
    checks = tuple(CheckLine(f"check-{i}", CheckVerdict.PASS, "1ms", "≤ 2ms", "1ms") for i in range(60))
    message = event_message(
        make_notification(
            summary="Posting to https://hooks.example.com/hook/leaked-token-99 failed.", checks=checks
        ),
        redactor,
    )
    assert len(message.encode()) <= MESSAGE_LIMIT
    assert len(message.encode()) > MESSAGE_LIMIT - 60  # cut at the last clause that fits, not earlier
    # Cut between two checks, never inside one: the last one shown is whole.
    assert message.endswith("(stable 1ms) [pass] …")
    assert "leaked-token-99" not in message
    assert message.startswith("Posting to *** failed.")


def _fields(notification: Notification) -> dict[str, Any]:
    return {field.name: getattr(notification, field.name) for field in dataclasses.fields(notification)}


def _long_rollback(**changes: Any) -> Notification:
    many = tuple(CheckLine(f"latency-{i}", CheckVerdict.PASS, "612ms", "≤ 800ms", "540ms") for i in range(40))
    return dataclasses.replace(
        rollback_notification(), checks=rollback_notification().checks + many, **changes
    )


def test_a_long_message_keeps_the_verdict_and_the_failing_numbers_within_1024_bytes() -> None:
    """The API server counts bytes (Go's len on the note): "≤" is three of them."""
    context = MessageContext(cluster="prod-eu", dashboard_url="https://canary.example.com/")
    message = event_message(_long_rollback(), Redactor(), context)
    assert len(message.encode()) <= MESSAGE_LIMIT < len(message) * 3
    assert message.startswith("[prod-eu] Critical check oom failed at 30%")
    assert "oom 2, not ≤ 0 [fail]" in message
    # The link survives the cut, and it is the rollout's page.
    assert message.endswith(" … https://canary.example.com/#/rollouts/ml/llama-chat")
    # No number is cut: every "latency-N" shown carries its whole line.
    shown = re.findall(r"latency-\d+ [^;]*", message)
    assert shown, message
    assert all(
        line.startswith("latency-") and "612ms ≤ 800ms (stable 540ms) [pass]" in line for line in shown
    )


def test_a_reason_repeating_the_summary_is_said_once() -> None:
    notification = make_notification(
        summary="Step 10% held 10m with every check passing; advancing to 30%.",
        reasons=("Step 10% held 10m with every check passing; advancing to 30%.", "3 of 3 checks passed."),
    )
    message = event_message(notification, Redactor())
    assert message.count("advancing to 30%") == 1
    assert "3 of 3 checks passed." in message


def test_a_cut_keeps_each_check_whole_before_it_cuts_at_a_comma() -> None:
    from canary.notify.events import _cut

    text = "Not passing: oom 2, not ≤ 0 [fail]; p99 950ms, not ≤ 800ms [fail]"
    assert _cut(text, 60) == "Not passing: oom 2, not ≤ 0 [fail] …"
    assert _cut("a 1, b 2, c 3", 12) == "a 1, b 2 …"  # " …" is 4 bytes
    assert _cut("nothing to cut at", 8) == ""
