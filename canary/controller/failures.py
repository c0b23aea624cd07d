"""A rollout whose reconcile keeps failing says why: a Warning Event on its InferenceService, once per
change of the error with a count, and the latest failure for the PromotionPolicy status (``Stalled``).

The reconciler logs each failure (``reconcile failed``); a person looking at the model sees nothing
in the log. :class:`ReconcileFailures` is told every reconcile's outcome by the tick: a failure with a
new text creates an Event (reason ``ReconcileFailed``); the same text again bumps that Event's
``count`` and ``lastTimestamp`` (as the apiserver's own event recorder aggregates); a success
forgets the failure. ``kserve-canary explain`` shows the latest Warning Events of the InferenceService.
Texts are scrubbed of secrets and cut to fit an Event.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import structlog
from kubernetes.client import (
    ApiClient,
    CoreV1Api,
    CoreV1Event,
    V1EventSource,
    V1ObjectMeta,
    V1ObjectReference,
)
from kubernetes.client.exceptions import ApiException

from canary.notify.events import COMPONENT, INFERENCE_SERVICE_API_VERSION
from canary.notify.secrets import DEFAULT_REDACTOR, Redactor

__all__ = ["FAILED_REASON", "Failure", "ReconcileFailures"]

FAILED_REASON = "ReconcileFailed"
_MAX_MESSAGE = 1024  # an Event's message is for people; the log has the rest
_TIMEOUT = (3.0, 10.0)

log: structlog.stdlib.BoundLogger = structlog.get_logger("kserve_canary.failures")


@dataclass
class Failure:
    """The latest failure of one rollout: its text, since when, how often in a row."""

    error: str
    since: datetime
    count: int
    event: str  # the Event's name


class ReconcileFailures:
    """The latest reconcile failure per rollout (``namespace/name``), told as Warning Events."""

    def __init__(
        self,
        api_client: ApiClient,
        clock: Callable[[], datetime],
        *,
        redactor: Redactor = DEFAULT_REDACTOR,
        dry_run: bool = False,
    ) -> None:
        self._api = CoreV1Api(api_client)
        self._clock = clock
        self._redactor = redactor
        self._dry_run = dry_run
        self._lock = threading.Lock()
        self._failures: dict[str, Failure] = {}

    def of(self, key: str) -> Failure | None:
        with self._lock:
            return self._failures.get(key)

    def observe(self, key: str, error: str | None) -> None:
        """One reconcile of ``key`` ended with ``error`` (None: it succeeded)."""
        if error is None:
            with self._lock:
                self._failures.pop(key, None)
            return
        text = self._redactor.scrub(error)[:_MAX_MESSAGE]
        now = self._clock().replace(microsecond=0)
        with self._lock:
            known = self._failures.get(key)
            if known is not None and known.error == text:
                known.count += 1
                failure, new = known, False
            else:
                digest = hashlib.sha256(f"{key}\n{text}\n{now.isoformat()}".encode()).hexdigest()[:10]
                name = f"{key.split('/', 1)[-1]}.reconcile-failed.{digest}"
                failure, new = Failure(text, now, 1, name), True
                self._failures[key] = failure
        if not self._dry_run:
            self._tell(key, failure, new, now)

    def _tell(self, key: str, failure: Failure, new: bool, now: datetime) -> None:
        namespace, name = key.split("/", 1)
        try:
            if new:
                self._api.create_namespaced_event(
                    namespace,
                    _event(namespace, name, failure, now),
                    _request_timeout=_TIMEOUT,
                    _headers={"Content-Type": "application/json"},
                )
            else:
                patch = {"count": failure.count, "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ")}
                self._api.patch_namespaced_event(
                    failure.event,
                    namespace,
                    patch,
                    _request_timeout=_TIMEOUT,
                    _content_type="application/merge-patch+json",
                )
        except ApiException as error:  # the failure stays in the log and the status
            log.warning("the ReconcileFailed event could not be written", key=key, status=error.status)
        except Exception as error:  # an unreachable apiserver must not end the tick
            log.warning("the ReconcileFailed event could not be written", key=key, error=type(error).__name__)


def _event(namespace: str, name: str, failure: Failure, now: datetime) -> CoreV1Event:
    return CoreV1Event(
        metadata=V1ObjectMeta(name=failure.event, namespace=namespace),
        involved_object=V1ObjectReference(
            api_version=INFERENCE_SERVICE_API_VERSION, kind="InferenceService", name=name, namespace=namespace
        ),
        type="Warning",
        reason=FAILED_REASON,
        message=f"the rollout cannot proceed: {failure.error}",
        action="reconcile",
        count=1,
        first_timestamp=now,
        last_timestamp=now,
        source=V1EventSource(component=COMPONENT),
        reporting_component=COMPONENT,
        reporting_instance=COMPONENT,
    )
