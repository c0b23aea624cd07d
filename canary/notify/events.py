"""Kubernetes Events on the InferenceService: what ``kubectl describe inferenceservice`` shows.

One ``core/v1`` Event per decision, on the InferenceService (``serving.kserve.io/v1beta1``), from
the component ``kserve-canary``: type ``Warning`` for warning-severity decisions, ``Normal`` otherwise;
the notification's reason (``CanaryAdvanced``, ``CanaryRolledBack``, ``PrometheusUnavailable``, ...);
a message of at most 1024 UTF-8 bytes that leads with the verdict and the numbers of the checks that
did not pass, cut at a clause boundary when it is longer.

Identical events are aggregated the way client-go's EventCorrelator does it: an event with the same
object, type, reason and message as one this process created less than ``aggregation_window`` ago
patches that event's ``count`` and ``lastTimestamp`` instead of creating another one (e.g. a
Prometheus outage reported every interval shows up once, with a count).

Event names are derived from the decision id (``<inferenceService>.<hash>``), so re-sending a
decision — a retry after a timeout that did reach the apiserver, or the same decision after a
controller restart — finds the event already there (409) and counts as delivered, not duplicated.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import urllib3
from kubernetes.client import (
    ApiClient,
    CoreV1Api,
    CoreV1Event,
    V1EventSource,
    V1ObjectMeta,
    V1ObjectReference,
)
from kubernetes.client.exceptions import ApiException

from canary.notify.delivery import (
    DEFAULT_TIMEOUT,
    Clock,
    DeliveryError,
    is_retryable_status,
    parse_retry_after,
    utc_now,
)
from canary.notify.message import (
    NO_CONTEXT,
    CheckLine,
    CheckVerdict,
    MessageContext,
    Notification,
    Severity,
    story,
)
from canary.notify.secrets import DEFAULT_REDACTOR, Redactor

__all__ = [
    "COMPONENT",
    "DECISION_ANNOTATION",
    "INFERENCE_SERVICE_API_VERSION",
    "MESSAGE_LIMIT",
    "KubernetesEventSender",
    "event_message",
    "event_name",
]

COMPONENT = "kserve-canary"
INFERENCE_SERVICE_API_VERSION = "serving.kserve.io/v1beta1"
DECISION_ANNOTATION = "kserve-canary.dev/decision-id"
# The API server's limit (k8s.io/kubernetes pkg/apis/core/validation/events.go, NoteLengthLimit = 1024,
# checked with Go's len(): bytes, not characters) on events.k8s.io/v1 `note` and on core/v1 `message`
# of events that carry reportingController. "≤" and emoji are 3-4 bytes: the budget is in UTF-8 bytes.
MESSAGE_LIMIT = 1024
_ERROR_EXCERPT = 300


def event_name(notification: Notification) -> str:
    """``<inferenceService>.<16 hex>``: a valid object name, the same for the same decision."""
    digest = hashlib.sha256(notification.id.encode()).hexdigest()[:16]
    return f"{notification.inference_service}.{digest}"


_VERDICT_ORDER = {
    CheckVerdict.FAIL: 0,
    CheckVerdict.ERROR: 1,
    CheckVerdict.NO_DATA: 2,
    CheckVerdict.NOT_YET: 3,
    CheckVerdict.PASS: 4,
}


def _check_phrase(checks: Sequence[CheckLine]) -> str:
    return "; ".join(f"{check.name} {check.describe()} [{check.verdict.value}]" for check in checks)


def _utf8_len(text: str) -> int:
    return len(text.encode())


def _cut(text: str, budget: int) -> str:
    """``text`` cut to ``budget`` bytes at the last clause boundary that fits, with an ellipsis; ``""``
    if no clause fits. Between checks (``; ``) first, so that a check keeps its whole line ("oom 2,
    not ≤ 0"); at a comma only when not even one check fits. Never inside a number."""
    room = budget - _utf8_len(" …")
    if room <= 0:
        return ""
    for boundary in ("; ", ", "):
        best = ""
        for match in re.finditer(re.escape(boundary), text):
            head = text[: match.start()]
            if _utf8_len(head) > room:
                break
            best = head
        if best:
            return f"{best} …"
    return ""


def event_message(
    notification: Notification, redactor: Redactor | None = None, context: MessageContext = NO_CONTEXT
) -> str:
    """The event message, scrubbed, at most :data:`MESSAGE_LIMIT` UTF-8 bytes.

    In order of importance, so that a cut loses the least: the cluster and the summary (the verdict),
    the checks that did not pass (their numbers), the revisions and traffic, the reasons, the passing
    checks. What does not fit is left out at a sentence or clause boundary with an ellipsis, never
    mid-number; the dashboard link, when configured, is always kept at the end.
    """
    # An Event of namespace N is scrubbed with N's secret values only (and the credential patterns).
    scrub = (redactor or DEFAULT_REDACTOR).for_namespace(notification.namespace).scrub
    summary = notification.summary.rstrip()
    if context.cluster:
        summary = f"[{context.cluster}] {summary}"
    checks = sorted(notification.checks, key=lambda check: _VERDICT_ORDER[check.verdict])
    failing = [check for check in checks if check.verdict is not CheckVerdict.PASS]
    passing = [check for check in checks if check.verdict is CheckVerdict.PASS]
    parts = [summary]
    if failing:
        parts.append(f"Not passing: {_check_phrase(failing)}.")
    revisions = []
    if notification.canary_revision:
        revisions.append(f"canary {notification.canary_revision} ({notification.served('canary')})")
    if notification.stable_revision:
        revisions.append(f"stable {notification.stable_revision} ({notification.served('stable')})")
    if notification.traffic:
        revisions.append(f"traffic {notification.traffic}")
    if revisions:
        sentence = ", ".join(revisions)
        parts.append(sentence[0].upper() + sentence[1:] + ".")
    parts.extend(reason.rstrip() for reason in story(notification))
    if passing:
        parts.append(f"Passing: {_check_phrase(passing)}.")
    link = context.link(notification)
    tail = f" {link}" if link else ""
    budget = MESSAGE_LIMIT - _utf8_len(tail)
    text = ""
    for part in (scrub(part) for part in parts if part):
        candidate = f"{text} {part}" if text else part
        if _utf8_len(candidate) <= budget:
            text = candidate
            continue
        # The first part that does not fit: as many of its clauses as fit, then stop.
        room = budget - (_utf8_len(text) + 1 if text else 0)
        clipped = _cut(part, room)
        if clipped:
            text = f"{text} {clipped}" if text else clipped
        elif text:
            text += " …"
        else:  # one clause longer than the limit: cut at a word, the last resort
            text = part.encode()[: budget - _utf8_len(" …")].decode(errors="ignore").rsplit(" ", 1)[0] + " …"
        break
    return text + tail


@dataclass
class _Recorded:
    name: str
    namespace: str
    count: int
    last_seen: datetime


def _k8s_time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesEventSender:
    """Records notifications as Events through ``api_client`` (any apiserver: real or emulated).

    Needs RBAC ``create`` and ``patch`` on ``events`` (core group) in the InferenceServices' namespaces.
    """

    description = "kubernetes events"

    def __init__(
        self,
        api_client: ApiClient,
        *,
        redactor: Redactor | None = None,
        reporting_instance: str | None = None,
        clock: Clock = utc_now,
        timeout: tuple[float, float] = DEFAULT_TIMEOUT,
        aggregation_window: float = 600.0,
        cache_size: int = 1024,
        context: MessageContext = NO_CONTEXT,
    ) -> None:
        self._api = CoreV1Api(api_client)
        self._context = context
        self._redactor = redactor if redactor is not None else DEFAULT_REDACTOR
        # The pod name in a cluster (HOSTNAME), so `kubectl get events` tells replicas apart.
        self._instance = (reporting_instance or os.environ.get("HOSTNAME") or socket.gethostname())[:128]
        self._clock = clock
        self._timeout = timeout
        self._window = aggregation_window
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._recent: OrderedDict[tuple[str, ...], _Recorded] = OrderedDict()

    def send(self, notification: Notification) -> None:
        now = self._clock().replace(microsecond=0)
        message = event_message(notification, self._redactor, self._context)
        event_type = "Warning" if notification.severity is Severity.WARNING else "Normal"
        key = (
            notification.namespace,
            notification.inference_service,
            notification.inference_service_uid or "",
            event_type,
            notification.reason,
            message,
        )
        with self._lock:
            recorded = self._recent.get(key)
        if (
            recorded is not None
            and (now - recorded.last_seen).total_seconds() <= self._window
            and self._bump(recorded, now)
        ):
            self._remember(key, recorded)
            return
        name = event_name(notification)
        body = CoreV1Event(
            metadata=V1ObjectMeta(
                name=name,
                namespace=notification.namespace,
                annotations={DECISION_ANNOTATION: notification.id},
            ),
            involved_object=V1ObjectReference(
                api_version=INFERENCE_SERVICE_API_VERSION,
                kind="InferenceService",
                name=notification.inference_service,
                namespace=notification.namespace,
                uid=notification.inference_service_uid,
            ),
            type=event_type,
            reason=notification.reason,
            message=message,
            action=notification.action.value,
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self._instance,
        )
        try:
            self._api.create_namespaced_event(
                notification.namespace,
                body,
                _request_timeout=self._timeout,
                # The generated client sends no Content-Type on create (and ignores _content_type
                # there); the apiserver would guess JSON, but say what the body is.
                _headers={"Content-Type": "application/json"},
            )
        except ApiException as error:
            if error.status != 409:
                raise self._delivery_error("create", notification.namespace, error) from None
            # 409: this decision's event exists already (an earlier attempt reached the apiserver,
            # or this is a re-send after a restart). It is recorded: success, not a duplicate.
        except urllib3.exceptions.HTTPError as error:
            raise self._unreachable(error) from None
        self._remember(key, _Recorded(name=name, namespace=notification.namespace, count=1, last_seen=now))

    def _bump(self, recorded: _Recorded, now: datetime) -> bool:
        """Patch count/lastTimestamp of an earlier identical event; False if it is gone (TTL)."""
        patch: dict[str, Any] = {"count": recorded.count + 1, "lastTimestamp": _k8s_time(now)}
        try:
            self._api.patch_namespaced_event(
                recorded.name,
                recorded.namespace,
                patch,
                _request_timeout=self._timeout,
                # The generated client would pick json-patch for a dict body; ours is a merge patch.
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status == 404:
                return False  # expired (events live an hour by default): create a new one
            raise self._delivery_error("patch", recorded.namespace, error) from None
        except urllib3.exceptions.HTTPError as error:
            raise self._unreachable(error) from None
        recorded.count += 1
        recorded.last_seen = now
        return True

    def _remember(self, key: tuple[str, ...], recorded: _Recorded) -> None:
        with self._lock:
            self._recent[key] = recorded
            self._recent.move_to_end(key)
            while len(self._recent) > self._cache_size:
                self._recent.popitem(last=False)

    def _unreachable(self, error: urllib3.exceptions.HTTPError) -> DeliveryError:
        return DeliveryError(
            f"{self.description}: apiserver unreachable: {self._redactor.scrub(str(error))}", retryable=True
        )

    def _delivery_error(self, verb: str, namespace: str, error: ApiException) -> DeliveryError:
        status = int(error.status or 0)
        body = self._redactor.scrub((error.body or "")[:_ERROR_EXCERPT].strip())
        hint = ""
        if status == 403:
            hint = f" (grant the controller create and patch on events in namespace {namespace})"
        headers = error.headers or {}
        return DeliveryError(
            f"{self.description}: {verb} in {namespace} failed: HTTP {status} {error.reason or ''}".rstrip()
            + (f": {body}" if body else "")
            + hint,
            # status 0 is a transport failure reported through ApiException
            retryable=status == 0 or is_retryable_status(status),
            retry_after=parse_retry_after(headers.get("Retry-After"), self._clock()),
            status=status or None,
        )
