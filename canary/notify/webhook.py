"""Generic webhooks: a documented, versioned JSON payload, optionally signed with HMAC-SHA256.

Request
-------
``POST <url>`` (the URL comes from the policy's ``urlFrom``; redirects are not followed) with headers:

* ``Content-Type: application/json`` — the body is UTF-8 JSON;
* ``User-Agent: kserve-canary/<version>``;
* ``Idempotency-Key: <id>`` — the decision id; a retried or re-sent delivery of the same decision
  carries the same key, so receivers can de-duplicate;
* with ``secretFrom`` configured:
  ``X-Kserve-Canary-Timestamp: <unix seconds>`` and
  ``X-Kserve-Canary-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>.<raw body>")>``.
  Each attempt is signed afresh, so the timestamp is the attempt's. Verify with
  :func:`verify_signature` (constant-time, with a replay window).

Any 2xx is success. 408/425/429 (honouring ``Retry-After``), 5xx, timeouts and connection errors
are retried with backoff; other answers are final.

Payload (``apiVersion: kserve-canary.dev/v1alpha1``, ``kind: RolloutNotification``)
---------------------------------------------------------------------------------
Receivers must ignore fields they do not know: within a version, fields are only added (and are
optional); anything else changes ``apiVersion``. The JSON Schema is
``docs/notification-payload.schema.json``.

=========================== ====================================================================
field                       meaning
=========================== ====================================================================
``apiVersion``              ``"kserve-canary.dev/v1alpha1"``: the payload's version
``kind``                    ``"RolloutNotification"``
``id``                      deterministic decision id; equals the ``Idempotency-Key`` header
``time``                    when the decision was made, RFC 3339 UTC (``2025-01-31T12:00:00.000Z``)
``severity``                ``"info"`` or ``"warning"`` (rollbacks, pauses, problems)
``action``                  ``started`` ``advanced`` ``promoted`` ``succeeded`` ``rolled-back``
                            ``paused`` ``resumed`` ``approved`` ``aborted`` ``inconclusive``
                            ``waiting`` ``unguarded-rollout`` ``prometheus-unavailable`` ... (new
                            actions may appear: treat unknown ones by ``severity``)
``reason``                  the Kubernetes Event reason, UpperCamelCase (``CanaryAdvanced``)
``summary``                 one sentence: what happened and why
``reasons``                 list of sentences with the numbers behind the decision
``inferenceService``        ``{namespace, name, uid}``; ``uid`` is null when unknown
``policy``                  the PromotionPolicy's name
``phase``                   the rollout's phase after the decision (``Progressing``, ``RolledBack``...)
``revisions``               ``{canary, stable}``: Knative revision names, null when there is none
``traffic``                 ``{from, to}``: ``canaryTrafficPercent`` before and after (0-100); null
                            means the field is not set — for ``to`` on a promotion: removed, the
                            canary now serves 100%
``checks``                  list, one per check of the last evaluation:
``checks[].name``           the check's name in the policy
``checks[].verdict``        ``pass``, ``fail``, ``not-yet``, ``no-data`` or ``error`` (query failed)
``checks[].critical``       a failure rolls back at once
``checks[].value``          the canary's value, formatted for people (``"612ms"``), ``""`` if none
``checks[].limit``          the condition, comparator first (``"≤ 800ms"``)
``checks[].stable``         the stable revision's value, formatted, ``""`` when not compared
``checks[].samples``        what the value rests on (``"1234 requests"``), ``""`` if unknown
``checks[].detail``         why there is no data / what failed, ``""`` otherwise
``checks[].statement``      counted checks: the verdict as a sentence with its numbers, ``""`` otherwise
``checks[].measured``       ``{canary, stable, unit}`` canonical numbers (seconds, ratio 0-1,
                            bytes, MiB, count, none) or null; ``canary``/``stable`` may be null
                            (unknown, or not finite: the text fields show ``+Inf``/``NaN``)
``controller``              ``{name: "kserve-canary", version}``
``cluster``                 optional (revision 2): ``{name}``, the controller's ``--cluster-name``;
                            absent when none is configured
``links``                   optional (revision 2): ``{dashboard}``, the rollout's page on the
                            dashboard (``--dashboard-url`` + ``/#/rollouts/<ns>/<name>``); absent
                            when no dashboard URL is configured
=========================== ====================================================================

Schema revisions within ``v1alpha1`` only add optional fields: revision 1 had none of ``cluster`` and
``links``; a revision-1 receiver that ignores unknown fields reads revision 2 unchanged.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from typing import Any

from canary import __version__
from canary.notify.delivery import DEFAULT_TIMEOUT, USER_AGENT, Clock, utc_now
from canary.notify.message import NO_CONTEXT, NOTIFICATION_KIND, CheckLine, MessageContext, Notification
from canary.notify.posting import SecretUrlSender
from canary.notify.secrets import SecretResolver
from canary.policy.model import SecretRef

__all__ = [
    "IDEMPOTENCY_HEADER",
    "SIGNATURE_HEADER",
    "SIGNATURE_TOLERANCE",
    "TIMESTAMP_HEADER",
    "WebhookSender",
    "encode_payload",
    "sign",
    "verify_signature",
    "webhook_payload",
]

IDEMPOTENCY_HEADER = "Idempotency-Key"
TIMESTAMP_HEADER = "X-Kserve-Canary-Timestamp"
SIGNATURE_HEADER = "X-Kserve-Canary-Signature"
SIGNATURE_TOLERANCE = 300.0  # seconds a signed request stays acceptable (replay window)
_SIGNATURE_SCHEME = "sha256="


def _rfc3339(notification: Notification) -> str:
    return notification.time.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _finite(number: float | None) -> float | None:
    # JSON has no NaN/Infinity (json.dumps would emit invalid JSON); the text field says "+Inf".
    return number if number is not None and math.isfinite(number) else None


def _check(check: CheckLine) -> dict[str, Any]:
    measured: dict[str, Any] | None = None
    if check.value_number is not None or check.stable_number is not None:
        measured = {
            "canary": _finite(check.value_number),
            "stable": _finite(check.stable_number),
            "unit": (check.unit.value if check.unit is not None else "none"),
        }
    return {
        "name": check.name,
        "verdict": check.verdict.value,
        "critical": check.critical,
        "value": check.value,
        "limit": check.limit,
        "stable": check.stable,
        "samples": check.samples,
        "detail": check.detail,
        "statement": check.statement,
        "measured": measured,
    }


def webhook_payload(notification: Notification, context: MessageContext = NO_CONTEXT) -> dict[str, Any]:
    """The documented, versioned JSON document (see the module docstring); ``context`` adds the
    cluster's name and the dashboard link, when the controller is configured with them."""
    payload: dict[str, Any] = {
        "apiVersion": notification.schema_version,
        "kind": NOTIFICATION_KIND,
        "id": notification.id,
        "time": _rfc3339(notification),
        "severity": notification.severity.value,
        "action": notification.action.value,
        "reason": notification.reason,
        "summary": notification.summary,
        "reasons": list(notification.reasons),
        "inferenceService": {
            "namespace": notification.namespace,
            "name": notification.inference_service,
            "uid": notification.inference_service_uid,
        },
        "policy": notification.policy,
        "phase": notification.phase,
        "revisions": {"canary": notification.canary_revision, "stable": notification.stable_revision},
        "artefacts": {
            "canary": notification.canary_artefact.as_dict() if notification.canary_artefact else None,
            "stable": notification.stable_artefact.as_dict() if notification.stable_artefact else None,
        },
        "traffic": {"from": notification.from_weight, "to": notification.to_weight},
        "checks": [_check(check) for check in notification.checks],
        "controller": {"name": "kserve-canary", "version": __version__},
    }
    if context.cluster:
        payload["cluster"] = {"name": context.cluster}
    link = context.link(notification)
    if link:
        payload["links"] = {"dashboard": link}
    return payload


def encode_payload(notification: Notification, context: MessageContext = NO_CONTEXT) -> bytes:
    """The exact bytes that are sent (and signed): compact UTF-8 JSON."""
    payload = webhook_payload(notification, context)
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def sign(body: bytes, timestamp: str, secret: str | bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256 over ``"<timestamp>.<body>"``.

    The timestamp is inside the signed bytes so an old request cannot be replayed with a new one.
    """
    mac = hmac.new(_key(secret), timestamp.encode() + b"." + body, hashlib.sha256)
    return _SIGNATURE_SCHEME + mac.hexdigest()


def verify_signature(
    body: bytes,
    timestamp: str,
    signature: str,
    secret: str | bytes,
    *,
    now: float | None = None,
    tolerance: float = SIGNATURE_TOLERANCE,
) -> bool:
    """Check a received request: ``body`` is the raw request body (before any JSON parsing),
    ``timestamp`` and ``signature`` the two headers. True only if the signature matches (compared in
    constant time) and the timestamp is within ``tolerance`` seconds of ``now`` (default: the clock).
    """
    try:
        sent_at = int(timestamp)
    except (TypeError, ValueError):
        return False
    current = time.time() if now is None else now
    if abs(current - sent_at) > tolerance:
        return False
    return hmac.compare_digest(sign(body, timestamp, secret), signature.strip())


class WebhookSender(SecretUrlSender):
    """POSTs :func:`webhook_payload` to the URL read from ``url_from``, signed if ``secret_from`` is set."""

    def __init__(
        self,
        url_from: SecretRef,
        *,
        resolver: SecretResolver,
        secret_from: SecretRef | None = None,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        clock: Clock = utc_now,
        context: MessageContext = NO_CONTEXT,
    ) -> None:
        super().__init__("webhook", url_from, resolver=resolver, timeout=timeout, clock=clock)
        self._secret_from = secret_from
        self._context = context

    def send(self, notification: Notification) -> None:
        url = self._url()
        # The key is read before the body is scrubbed, so the body cannot carry it either.
        secret = None if self._secret_from is None else self._resolver.resolve_key(self._secret_from)
        body = encode_payload(self._scrubbed(notification), self._context)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            IDEMPOTENCY_HEADER: notification.id,
        }
        if secret is not None:
            timestamp = str(int(self._clock().timestamp()))
            headers[TIMESTAMP_HEADER] = timestamp
            headers[SIGNATURE_HEADER] = sign(body, timestamp, secret)
        self._post(url, body, headers)
