"""The outbox: notifications waiting for Slack or a webhook, kept where a restart cannot lose them.

A notification for a Slack or webhook destination is written here *before* it is sent and removed
once the destination has accepted it (or once it is given up for good, which is reported). A
controller that is killed, or a replica that takes the Lease over, reads the outbox of each rollout
it reconciles and carries on sending: delivery is *at least once*, always with the same idempotency
key (the decision id).

One outbox per rollout (InferenceService), stored through an :class:`OutboxStore` — the controller
wires a ConfigMap next to the InferenceService (:mod:`canary.kserve.outbox`); this module only
knows texts and resourceVersions, so it depends on no Kubernetes client. What is stored is the
rendered notification and *a reference* to its destination (``notify[<index>]`` of the rollout's
policy, with the destination's key, which names the secret reference): never a resolved URL, which
is read from its secret again at send time.

Bounded: at most ``max_entries`` entries and ``max_bytes`` of text per rollout. When a new entry
does not fit, the oldest informational entry is dropped first; if only important ones are left, an
arriving informational entry is dropped instead, and an arriving important one replaces the oldest
important one. Every drop is returned to the caller, which reports it as a lost notification.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from canary.notify.message import (
    NOTIFICATION_API_VERSION,
    CheckLine,
    CheckVerdict,
    Notification,
    NotificationAction,
    Severity,
)
from canary.policy.units import Unit
from canary.rollout.artefact import Artefact

__all__ = [
    "DEFAULT_IMPORTANT_RETRY_FOR",
    "DEFAULT_INFO_RETRY_FOR",
    "IMPORTANT_ACTIONS",
    "MAX_OUTBOX_BYTES",
    "MAX_OUTBOX_ENTRIES",
    "OUTBOX_FORMAT",
    "Outbox",
    "OutboxEntry",
    "OutboxFormatError",
    "OutboxStore",
    "RetryHorizon",
    "is_important",
    "notification_from_dict",
    "notification_to_dict",
]

OUTBOX_FORMAT = 1
MAX_OUTBOX_ENTRIES = 50
MAX_OUTBOX_BYTES = 256 * 1024
DEFAULT_IMPORTANT_RETRY_FOR = 3600.0  # 1h: promote, rollback, pause, unguarded (and every warning)
DEFAULT_INFO_RETRY_FOR = 600.0  # 10m: progress (started, advanced, ...)

# What people must hear about even after a long outage; every warning counts as important too.
IMPORTANT_ACTIONS = frozenset(
    {
        NotificationAction.PROMOTED,
        NotificationAction.SUCCEEDED,
        NotificationAction.ROLLED_BACK,
        NotificationAction.PAUSED,
        NotificationAction.ABORTED,
        NotificationAction.UNGUARDED_ROLLOUT,
    }
)

_CONFLICT_RETRIES = 5


def is_important(notification: Notification) -> bool:
    return notification.severity is Severity.WARNING or notification.action in IMPORTANT_ACTIONS


@dataclass(frozen=True, slots=True)
class RetryHorizon:
    """For how long (seconds, from the decision) a notification is retried before it is lost."""

    important: float = DEFAULT_IMPORTANT_RETRY_FOR
    informational: float = DEFAULT_INFO_RETRY_FOR

    def __post_init__(self) -> None:
        if self.important < 0 or self.informational < 0:
            raise ValueError("a retry horizon must not be negative")

    def for_notification(self, notification: Notification) -> float:
        return self.important if is_important(notification) else self.informational


class OutboxFormatError(ValueError):
    """The stored outbox cannot be read."""


class OutboxStore(Protocol):
    """Where the outbox of one rollout is kept: a text and the version it was read at.

    ``write_outbox`` returns the new version, or None when the stored version is no longer
    ``resource_version`` (somebody wrote in between: read again). ``resource_version`` None creates.
    """

    def read_outbox(self, namespace: str, inference_service: str) -> tuple[str | None, str | None]: ...

    def write_outbox(
        self,
        namespace: str,
        inference_service: str,
        text: str,
        *,
        resource_version: str | None,
        owner_uid: str | None,
    ) -> str | None: ...


# -- the stored form ---------------------------------------------------------------------------


def _time(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def _check_to_dict(check: CheckLine) -> dict[str, Any]:
    return {
        "name": check.name,
        "verdict": check.verdict.value,
        "value": check.value,
        "limit": check.limit,
        "stable": check.stable,
        "samples": check.samples,
        "critical": check.critical,
        "detail": check.detail,
        "valueNumber": check.value_number,
        "stableNumber": check.stable_number,
        "unit": check.unit.value if check.unit is not None else None,
        "statement": check.statement,
    }


def _artefact_to_dict(artefact: Artefact | None) -> dict[str, str | None] | None:
    return None if artefact is None else artefact.as_dict()


def _artefact_from_dict(data: object) -> Artefact | None:
    """An artefact as stored; anything else (an entry written before artefacts were) is unknown."""
    if not isinstance(data, dict):
        return None
    fields = ("storageUri", "image", "runtime", "modelFormat")
    storage_uri, image, runtime, model_format = (
        value if isinstance(value := data.get(key), str) else None for key in fields
    )
    return Artefact(storage_uri=storage_uri, image=image, runtime=runtime, model_format=model_format)


def notification_to_dict(notification: Notification) -> dict[str, Any]:
    """The notification as stored: its facts and texts (it holds no secret)."""
    return {
        "id": notification.id,
        "time": _time(notification.time),
        "namespace": notification.namespace,
        "inferenceService": notification.inference_service,
        "inferenceServiceUid": notification.inference_service_uid,
        "policy": notification.policy,
        "canaryRevision": notification.canary_revision,
        "stableRevision": notification.stable_revision,
        "canaryArtefact": _artefact_to_dict(notification.canary_artefact),
        "stableArtefact": _artefact_to_dict(notification.stable_artefact),
        "action": notification.action.value,
        "severity": notification.severity.value,
        "phase": notification.phase,
        "summary": notification.summary,
        "fromWeight": notification.from_weight,
        "toWeight": notification.to_weight,
        "reason": notification.reason,
        "reasons": list(notification.reasons),
        "checks": [_check_to_dict(check) for check in notification.checks],
        "schemaVersion": notification.schema_version,
    }


def notification_from_dict(data: dict[str, Any]) -> Notification:
    checks = tuple(
        CheckLine(
            name=check["name"],
            verdict=CheckVerdict(check["verdict"]),
            value=check.get("value", ""),
            limit=check.get("limit", ""),
            stable=check.get("stable", ""),
            samples=check.get("samples", ""),
            critical=bool(check.get("critical", False)),
            detail=check.get("detail", ""),
            value_number=check.get("valueNumber"),
            stable_number=check.get("stableNumber"),
            unit=Unit(check["unit"]) if check.get("unit") else None,
            statement=str(check.get("statement", "")),
        )
        for check in data.get("checks", [])
    )
    return Notification(
        id=data["id"],
        time=datetime.fromisoformat(data["time"]),
        namespace=data["namespace"],
        inference_service=data["inferenceService"],
        inference_service_uid=data.get("inferenceServiceUid"),
        policy=data["policy"],
        canary_revision=data.get("canaryRevision"),
        stable_revision=data.get("stableRevision"),
        canary_artefact=_artefact_from_dict(data.get("canaryArtefact")),
        stable_artefact=_artefact_from_dict(data.get("stableArtefact")),
        action=NotificationAction(data["action"]),
        severity=Severity(data["severity"]),
        phase=data["phase"],
        summary=data["summary"],
        from_weight=data.get("fromWeight"),
        to_weight=data.get("toWeight"),
        reason=data.get("reason", ""),
        reasons=tuple(data.get("reasons", ())),
        checks=checks,
        schema_version=data.get("schemaVersion") or NOTIFICATION_API_VERSION,
    )


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    """One notification for one destination, until it is delivered or given up."""

    notification: Notification
    destination: str  # the destination's key: names the secret reference, never the secret
    ref: str  # how the controller finds the destination again: "notify[<index>]" of the policy
    kind: str  # slack, webhook
    queued_at: datetime
    deadline: datetime  # retried until then; lost after

    @property
    def key(self) -> tuple[str, str]:
        return (self.notification.id, self.destination)

    @property
    def important(self) -> bool:
        return is_important(self.notification)

    def to_dict(self) -> dict[str, Any]:
        return {
            "destination": self.destination,
            "ref": self.ref,
            "kind": self.kind,
            "queuedAt": _time(self.queued_at),
            "deadline": _time(self.deadline),
            "notification": notification_to_dict(self.notification),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutboxEntry:
        return cls(
            notification=notification_from_dict(data["notification"]),
            destination=data["destination"],
            ref=data["ref"],
            kind=data["kind"],
            queued_at=datetime.fromisoformat(data["queuedAt"]),
            deadline=datetime.fromisoformat(data["deadline"]),
        )


def encode_entries(entries: Sequence[OutboxEntry]) -> str:
    document = {"format": OUTBOX_FORMAT, "entries": [entry.to_dict() for entry in entries]}
    return json.dumps(document, ensure_ascii=False, separators=(",", ":"))


def decode_entries(text: str | None) -> list[OutboxEntry]:
    if not text:
        return []
    try:
        document = json.loads(text)
        if document.get("format") != OUTBOX_FORMAT:
            raise OutboxFormatError(f"unknown outbox format {document.get('format')!r}")
        return [OutboxEntry.from_dict(entry) for entry in document["entries"]]
    except OutboxFormatError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise OutboxFormatError(f"outbox cannot be read: {type(error).__name__}: {error}") from None


# -- the outbox --------------------------------------------------------------------------------


@dataclass
class _Box:
    entries: list[OutboxEntry]
    version: str | None
    loaded: bool
    lock: threading.Lock


class Outbox:
    """The outboxes of every rollout this controller sends for, through ``store``.

    Each rollout's entries are cached with the version they were written at, so adding and removing
    costs one write and no read; a conflict (another replica wrote: a takeover) reads again and
    re-applies the change. :meth:`pending` always reads (a new leader's view).
    """

    def __init__(
        self,
        store: OutboxStore,
        *,
        max_entries: int = MAX_OUTBOX_ENTRIES,
        max_bytes: int = MAX_OUTBOX_BYTES,
        logger: Any = None,
    ) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("an outbox holds at least one entry")
        self._store = store
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._log = logger if logger is not None else structlog.get_logger("canary.notify")
        self._lock = threading.Lock()
        self._boxes: dict[tuple[str, str], _Box] = {}

    def _box(self, namespace: str, inference_service: str) -> _Box:
        with self._lock:
            key = (namespace, inference_service)
            box = self._boxes.get(key)
            if box is None:
                box = self._boxes[key] = _Box([], None, False, threading.Lock())
            return box

    def _read(self, namespace: str, inference_service: str, box: _Box) -> None:
        text, version = self._store.read_outbox(namespace, inference_service)
        try:
            box.entries = decode_entries(text)
        except OutboxFormatError as error:
            # What cannot be read cannot be sent; it is replaced (and said so), not kept forever.
            self._log.error(
                "notification outbox unreadable: replaced",
                namespace=namespace,
                inference_service=inference_service,
                error=str(error),
            )
            box.entries = []
        box.version = version
        box.loaded = True

    def pending(self, namespace: str, inference_service: str) -> list[OutboxEntry]:
        """What waits in the rollout's outbox, read afresh (after a restart or a takeover)."""
        box = self._box(namespace, inference_service)
        with box.lock:
            self._read(namespace, inference_service, box)
            return list(box.entries)

    def add(self, entries: Sequence[OutboxEntry]) -> list[OutboxEntry]:
        """Store ``entries`` (all of one notification, so of one rollout); returns the entries dropped
        to stay within the bounds — older ones, or some of ``entries`` themselves."""
        if not entries:
            return []
        notification = entries[0].notification
        owner = notification.inference_service_uid
        dropped: list[OutboxEntry] = []

        def change(current: list[OutboxEntry]) -> list[OutboxEntry]:
            dropped.clear()
            known = {entry.key for entry in current}
            updated = [*current, *(entry for entry in entries if entry.key not in known)]
            return self._bounded(updated, set(entries), dropped)

        self._change(notification.namespace, notification.inference_service, change, owner)
        return list(dropped)

    def remove(self, entry: OutboxEntry) -> None:
        """Forget ``entry``: delivered, or given up (and reported)."""
        notification = entry.notification

        def change(current: list[OutboxEntry]) -> list[OutboxEntry]:
            return [queued for queued in current if queued.key != entry.key]

        self._change(
            notification.namespace,
            notification.inference_service,
            change,
            notification.inference_service_uid,
            only_if_changed=True,
        )

    def _bounded(
        self, entries: list[OutboxEntry], arriving: set[OutboxEntry], dropped: list[OutboxEntry]
    ) -> list[OutboxEntry]:
        def fits(candidate: list[OutboxEntry]) -> bool:
            return (
                len(candidate) <= self.max_entries
                and len(encode_entries(candidate).encode()) <= self.max_bytes
            )

        kept = list(entries)
        while kept and not fits(kept):
            old_info = next((e for e in kept if not e.important and e not in arriving), None)
            if old_info is not None:
                victim = old_info
            else:
                new_info = next((e for e in kept if not e.important and e in arriving), None)
                victim = new_info if new_info is not None else kept[0]  # all important: the oldest
            kept.remove(victim)
            dropped.append(victim)
        return kept

    def _change(
        self,
        namespace: str,
        inference_service: str,
        change: Callable[[list[OutboxEntry]], list[OutboxEntry]],
        owner_uid: str | None,
        *,
        only_if_changed: bool = False,
    ) -> None:
        box = self._box(namespace, inference_service)
        with box.lock:
            for _ in range(_CONFLICT_RETRIES):
                if not box.loaded:
                    self._read(namespace, inference_service, box)
                updated = change(box.entries)
                if only_if_changed and updated == box.entries:
                    return
                version = self._store.write_outbox(
                    namespace,
                    inference_service,
                    encode_entries(updated),
                    resource_version=box.version,
                    owner_uid=owner_uid,
                )
                if version is not None:
                    box.entries = updated
                    box.version = version
                    return
                box.loaded = False  # written by somebody else since: read and apply again
            raise RuntimeError(
                f"notification outbox of {namespace}/{inference_service} kept changing while written"
            )
