"""How notification deliveries went, as Prometheus counters (and a protocol to count them elsewhere).

``kserve_canary_notifications_total{target_kind, outcome}`` counts notifications per destination:

* ``delivered`` — the destination accepted it (possibly after retries);
* ``failed`` — a final error, or retries exhausted;
* ``dropped`` — never attempted: its queue was full (oldest info first), or shutdown came first;
* ``duplicate`` — the same decision was already accepted for this destination;
* ``filtered`` — below the destination's ``minSeverity``.

``kserve_canary_notification_retries_total{target_kind}`` counts attempts that will be retried.

``kserve_canary_notifications_lost_total{channel, reason}`` counts notifications people will never
get (each also a ``NotificationFailed`` Event and an error log line): ``expired`` — still failing
when its retry horizon ran out; ``rejected`` — a final answer (a 4xx other than 408/425/429, a
missing secret, a refused URL); ``dropped`` — no room left in the outbox or the send queue (the
oldest informational one goes first); ``unconfigured`` — waiting in the outbox of a policy that no
longer names its destination.
"""

from __future__ import annotations

import threading
from enum import StrEnum
from typing import Protocol

from prometheus_client import REGISTRY, CollectorRegistry, Counter

__all__ = ["DeliveryRecorder", "Loss", "Outcome", "PrometheusDeliveryRecorder", "default_recorder"]


class Outcome(StrEnum):
    DELIVERED = "delivered"
    FAILED = "failed"
    DROPPED = "dropped"
    DUPLICATE = "duplicate"
    FILTERED = "filtered"


class Loss(StrEnum):
    """Why a notification was given up for good (the ``reason`` of the lost counter)."""

    EXPIRED = "expired"
    REJECTED = "rejected"
    DROPPED = "dropped"
    UNCONFIGURED = "unconfigured"


class DeliveryRecorder(Protocol):
    """Receives delivery results; must be cheap and must not raise (it runs on the caller's path)."""

    def outcome(self, kind: str, outcome: Outcome) -> None: ...

    def retry(self, kind: str) -> None: ...

    def lost(self, kind: str, reason: Loss) -> None: ...


class PrometheusDeliveryRecorder:
    """Counts into ``registry`` (a fresh one per test, the global one in the controller)."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.notifications = Counter(
            "kserve_canary_notifications",
            "Notifications per destination kind and outcome.",
            ["target_kind", "outcome"],
            registry=registry,
        )
        self.retries = Counter(
            "kserve_canary_notification_retries",
            "Notification delivery attempts that failed and will be retried.",
            ["target_kind"],
            registry=registry,
        )
        self.losses = Counter(
            "kserve_canary_notifications_lost",
            "Notifications given up for good, per channel (destination kind) and reason.",
            ["channel", "reason"],
            registry=registry,
        )

    def outcome(self, kind: str, outcome: Outcome) -> None:
        self.notifications.labels(target_kind=kind, outcome=outcome.value).inc()

    def retry(self, kind: str) -> None:
        self.retries.labels(target_kind=kind).inc()

    def lost(self, kind: str, reason: Loss) -> None:
        self.losses.labels(channel=kind, reason=reason.value).inc()


_default: PrometheusDeliveryRecorder | None = None
_default_lock = threading.Lock()


def default_recorder() -> PrometheusDeliveryRecorder:
    """The process-wide recorder on the global registry, created once (metrics register only once)."""
    global _default  # noqa: PLW0603 - a process-wide singleton is what the global registry needs
    with _default_lock:
        if _default is None:
            _default = PrometheusDeliveryRecorder()
        return _default
