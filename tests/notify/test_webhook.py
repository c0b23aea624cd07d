from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from canary import __version__
from canary.notify.delivery import USER_AGENT
from canary.notify.destinations import destination_for
from canary.notify.message import CheckLine, CheckVerdict, MessageContext, NotificationAction
from canary.notify.secrets import Redactor, SecretResolver
from canary.notify.webhook import (
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WebhookSender,
    encode_payload,
    sign,
    verify_signature,
    webhook_payload,
)
from canary.policy.model import NotifyTarget, SecretRef
from canary.policy.units import Unit
from tests.notify.support import DECISION_TIME, Receiver, make_notification, rollback_notification

DOCS = Path(__file__).resolve().parents[2] / "docs"
SCHEMA = json.loads((DOCS / "notification-payload.schema.json").read_text())
HMAC_KEY = "whsec-7d3f0a9b2c4e6f81"
SENT_AT = int(DECISION_TIME.timestamp()) + 5


def _sender(receiver: Receiver, *, signed: bool) -> WebhookSender:
    environ = {
        "DEPLOY_HOOK_URL": receiver.url + "/hooks/deploy?token=tok-abc-123",
        "DEPLOY_HOOK_SECRET": HMAC_KEY,
    }
    return WebhookSender(
        SecretRef(env="DEPLOY_HOOK_URL"),
        resolver=SecretResolver(Redactor(), environ),
        secret_from=SecretRef(env="DEPLOY_HOOK_SECRET") if signed else None,
        clock=lambda: DECISION_TIME.fromtimestamp(SENT_AT, DECISION_TIME.tzinfo),
    )


def _validate(payload: Any) -> None:
    jsonschema.Draft202012Validator(SCHEMA, format_checker=jsonschema.FormatChecker()).validate(payload)


def test_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_signed_delivery_over_real_http(receiver: Receiver) -> None:
    notification = make_notification()
    _sender(receiver, signed=True).send(notification)

    (request,) = receiver.wait_for(1)
    assert request.path == "/hooks/deploy?token=tok-abc-123"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"] == USER_AGENT == f"kserve-canary/{__version__}"
    assert request.headers[IDEMPOTENCY_HEADER] == notification.id
    assert request.headers[TIMESTAMP_HEADER] == str(SENT_AT)
    assert verify_signature(
        request.body,
        request.headers[TIMESTAMP_HEADER],
        request.headers[SIGNATURE_HEADER],
        HMAC_KEY,
        now=SENT_AT,
    )
    payload = request.json()
    _validate(payload)
    assert payload == webhook_payload(notification)


def test_unsigned_delivery_has_no_signature_headers(receiver: Receiver) -> None:
    _sender(receiver, signed=False).send(make_notification())
    (request,) = receiver.wait_for(1)
    assert TIMESTAMP_HEADER not in request.headers
    assert SIGNATURE_HEADER not in request.headers


def test_payload_content() -> None:
    notification = rollback_notification()
    payload = webhook_payload(notification)
    _validate(payload)
    assert payload["apiVersion"] == "kserve-canary.dev/v1alpha1"
    assert payload["kind"] == "RolloutNotification"
    assert payload["time"] == "2025-03-14T09:26:53.000Z"
    assert payload["severity"] == "warning"
    assert payload["action"] == "rolled-back"
    assert payload["reason"] == "CanaryRolledBack"
    assert payload["inferenceService"] == {
        "namespace": "ml",
        "name": "llama-chat",
        "uid": "6f1c2a1e-0d7b-4d0e-9d38-1b0c7a1f2e3d",
    }
    assert payload["revisions"] == {
        "canary": "llama-chat-predictor-00002",
        "stable": "llama-chat-predictor-00001",
    }
    assert payload["traffic"] == {"from": 30, "to": 0}
    assert payload["checks"][0] == {
        "name": "oom",
        "verdict": "fail",
        "critical": True,
        "value": "2",
        "limit": "≤ 0",
        "stable": "",
        "samples": "",
        "detail": "",
        "statement": "",
        "measured": {"canary": 2, "stable": None, "unit": "count"},
    }
    assert payload["checks"][1]["measured"] is None


def test_every_action_and_promotion_validate_against_the_schema() -> None:
    for action in NotificationAction:
        _validate(webhook_payload(make_notification(action=action)))
    promoted = webhook_payload(
        make_notification(action=NotificationAction.PROMOTED, from_weight=50, to_weight=None)
    )
    assert promoted["traffic"] == {"from": 50, "to": None}
    _validate(
        webhook_payload(
            make_notification(canary_revision=None, stable_revision=None, inference_service_uid=None)
        )
    )


def test_non_finite_numbers_become_null_so_the_body_stays_json() -> None:
    check = CheckLine(
        "p99",
        CheckVerdict.FAIL,
        "+Inf",
        "≤ 800ms",
        value_number=math.inf,
        stable_number=math.nan,
        unit=Unit.SECONDS,
    )
    body = encode_payload(make_notification(checks=(check,)))
    payload = json.loads(
        body, parse_constant=lambda constant: pytest.fail(f"invalid JSON constant {constant}")
    )
    _validate(payload)
    assert payload["checks"][0]["measured"] == {"canary": None, "stable": None, "unit": "seconds"}
    assert payload["checks"][0]["value"] == "+Inf"


def test_signature_round_trip_and_tamper_detection() -> None:
    body = encode_payload(make_notification())
    timestamp = str(SENT_AT)
    signature = sign(body, timestamp, HMAC_KEY)
    assert signature.startswith("sha256=")
    assert len(signature) == len("sha256=") + 64
    assert verify_signature(body, timestamp, signature, HMAC_KEY, now=SENT_AT + 299)
    assert verify_signature(body, timestamp, signature, HMAC_KEY.encode(), now=SENT_AT)

    tampered = body.replace(b'"to":30', b'"to":100')
    assert tampered != body
    assert not verify_signature(tampered, timestamp, signature, HMAC_KEY, now=SENT_AT)
    assert not verify_signature(
        body, str(SENT_AT + 1), signature, HMAC_KEY, now=SENT_AT
    )  # timestamp is signed
    assert not verify_signature(body, timestamp, signature, "another-key", now=SENT_AT)
    assert not verify_signature(body, timestamp, signature, HMAC_KEY, now=SENT_AT + 301)  # replay window
    assert not verify_signature(body, "not-a-number", signature, HMAC_KEY, now=SENT_AT)
    assert not verify_signature(body, timestamp, "sha256=" + "0" * 64, HMAC_KEY, now=SENT_AT)


def test_signature_is_over_timestamp_dot_body_as_documented() -> None:
    import hashlib
    import hmac

    body = b'{"kind":"RolloutNotification"}'
    expected = hmac.new(HMAC_KEY.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert sign(body, "1700000000", HMAC_KEY) == f"sha256={expected}"


def _schema_fields(node: Any, prefix: str = "") -> set[str]:
    fields: set[str] = set()
    for name, spec in node.get("properties", {}).items():
        fields.add(prefix + name)
        if "$ref" in spec.get("items", {}):
            fields |= _schema_fields(SCHEMA["$defs"]["check"], f"{prefix}{name}[].")
        elif "properties" in spec:
            fields |= _schema_fields(spec, f"{prefix}{name}.")
    return fields


def test_every_payload_field_is_documented() -> None:
    docs = (DOCS / "notifications.md").read_text()
    undocumented = sorted(field for field in _schema_fields(SCHEMA) if f"`{field}`" not in docs)
    assert undocumented == []


CONTEXT = MessageContext(cluster="prod-eu", dashboard_url="https://canary.example.com/")


def test_the_cluster_name_and_the_dashboard_link_travel_in_the_payload_when_configured(
    receiver: Receiver,
) -> None:
    # Built as the controller builds a policy's webhook destination, with its --cluster-name and
    # --dashboard-url, and delivered over HTTP.
    target = NotifyTarget.model_validate({"webhook": {"urlFrom": {"env": "DEPLOY_HOOK_URL"}}})
    destination = destination_for(
        target,
        resolver=SecretResolver(Redactor(), {"DEPLOY_HOOK_URL": receiver.url + "/hooks/deploy"}),
        context=CONTEXT,
    )
    notification = rollback_notification()
    destination.sender.send(notification)
    (request,) = receiver.wait_for(1)
    payload = request.json()
    _validate(payload)
    assert payload["cluster"] == {"name": "prod-eu"}
    assert payload["links"] == {"dashboard": "https://canary.example.com/#/rollouts/ml/llama-chat"}
    # The same name and link as the chat messages carry.
    assert payload["links"]["dashboard"] == CONTEXT.link(notification)


def test_without_a_cluster_name_or_dashboard_the_payload_is_revision_1_unchanged() -> None:
    payload = webhook_payload(make_notification())
    assert "cluster" not in payload and "links" not in payload
    _validate(payload)
    only_cluster = webhook_payload(make_notification(), MessageContext(cluster="prod-eu"))
    assert only_cluster["cluster"] == {"name": "prod-eu"} and "links" not in only_cluster
    _validate(only_cluster)
    # Revision 2 only adds optional fields: the revision-1 fields are exactly as before.
    with_context = webhook_payload(make_notification(), CONTEXT)
    assert {k: v for k, v in with_context.items() if k not in {"cluster", "links"}} == payload


def test_a_revision_2_payload_with_a_wrong_cluster_or_link_is_refused_by_the_schema() -> None:
    payload = webhook_payload(make_notification(), CONTEXT)
    for broken in (
        {**payload, "cluster": {"name": ""}},
        {**payload, "links": {"dashboard": "canary.example"}},
    ):
        with pytest.raises(jsonschema.ValidationError):
            _validate(broken)
