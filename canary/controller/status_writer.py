"""Writing a PromotionPolicy's status — only when it changed — and its Events.

:class:`StatusWriter` PUTs ``promotionpolicies/status`` (never the spec: a GitOps tool would revert
whatever the controller wrote there) with the resourceVersion the watch cache holds:

* nothing is sent when the projected status equals the one last written, or the one the object
  already carries (after a restart: the status written before it);
* at most one write per object per ``min_interval`` and ``max_per_second`` writes in all (a token
  bucket): a write that is due is deferred to the next pass, never dropped, since the projection is
  computed again from the stored state;
* a 409 (the object changed since the cache read it) reads it again and retries once; a 404 (the
  object was deleted) is ignored.

:class:`PolicyEvents` records Kubernetes Events regarding a PromotionPolicy (an invalid spec, a
conflict): once per object generation and message, named after them, so a restart that posts the
same Event again finds it (409) instead of adding a duplicate.
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

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

from canary.controller.caches import WatchCache
from canary.controller.crsource import POLICY_API_VERSION, POLICY_KIND, PromotionPolicyClient
from canary.kserve.client import ConflictError
from canary.notify.events import COMPONENT, MESSAGE_LIMIT
from canary.notify.secrets import DEFAULT_REDACTOR, Redactor
from canary.policy.status import PromotionPolicyStatus

__all__ = ["PolicyEvents", "StatusWriter", "WriteResult"]

log = structlog.get_logger("kserve_canary.status")

_REMEMBERED_EVENTS = 10_000


@dataclass
class WriteResult:
    outcome: str  # unchanged | written | deferred | gone | failed
    attempts: int = 0


class StatusWriter:
    def __init__(
        self,
        api: PromotionPolicyClient,
        cache: WatchCache,
        *,
        min_interval: float = 1.0,
        max_per_second: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
        redactor: Redactor | None = None,
    ):
        self._api = api
        self._redactor = redactor or DEFAULT_REDACTOR
        self._cache = cache
        self._min_interval = min_interval
        self._rate = max_per_second
        self._monotonic = monotonic
        self._tokens = max(1.0, max_per_second)
        self._refilled = monotonic()
        self._last_write: dict[tuple[str, str], float] = {}
        self._written: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.writes = 0  # status requests sent, for tests and /metrics

    def last_written(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._written.get((namespace, name))

    def forget(self, namespace: str, name: str) -> None:
        self._written.pop((namespace, name), None)
        self._last_write.pop((namespace, name), None)

    def write(self, namespace: str, name: str, status: PromotionPolicyStatus) -> WriteResult:
        # Messages quote policy errors and decision reasons: scrubbed like every log line and Event.
        # With the policy's namespace's secret values only: another team's never mask this one's text.
        redactor = self._redactor.for_namespace(namespace)
        body = cast(dict[str, Any], redactor.scrub_value(status.to_api()))
        key = (namespace, name)
        obj = self._cache.get(namespace, name)
        if obj is None:
            return WriteResult("gone")
        if body == self._written.get(key) and body == (obj.get("status") or {}):
            return WriteResult("unchanged")
        if body == (obj.get("status") or {}):
            self._written[key] = body
            return WriteResult("unchanged")
        if not self._allowed(key):
            return WriteResult("deferred")
        attempts = 0
        for _ in range(2):  # a 409 reads the object again and retries once
            attempts += 1
            self.writes += 1
            try:
                written = self._api.replace_status(namespace, name, {**obj, "status": body})
            except ConflictError:
                obj = self._cache.refresh(namespace, name)
                if obj is None:
                    return WriteResult("gone", attempts)
                if body == (obj.get("status") or {}):
                    self._written[key] = body
                    return WriteResult("unchanged", attempts)
                continue
            except Exception as error:
                log.warning(
                    "status write failed; written again later",
                    policy=f"{namespace}/{name}",
                    error=DEFAULT_REDACTOR.scrub(str(error))[:300],
                )
                return WriteResult("failed", attempts)
            if written is None:
                self.forget(namespace, name)
                return WriteResult("gone", attempts)
            self._cache.put(written)
            self._written[key] = body
            return WriteResult("written", attempts)
        return WriteResult("failed", attempts)

    def _allowed(self, key: tuple[str, str]) -> bool:
        with self._lock:
            now = self._monotonic()
            last = self._last_write.get(key)
            if last is not None and now - last < self._min_interval:
                return False
            self._tokens = min(max(1.0, self._rate), self._tokens + (now - self._refilled) * self._rate)
            self._refilled = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            self._last_write[key] = now
            return True


class PolicyEvents:
    """Events regarding PromotionPolicy objects (``kubectl describe promotionpolicy`` shows them)."""

    def __init__(
        self,
        api_client: ApiClient,
        *,
        redactor: Redactor | None = None,
        request_timeout: float = 10.0,
        reporting_instance: str | None = None,
    ):
        self._api = CoreV1Api(api_client)
        self._redactor = redactor or DEFAULT_REDACTOR
        self._timeout = request_timeout
        self._instance = (reporting_instance or os.environ.get("HOSTNAME") or socket.gethostname())[:128]
        self._sent: set[str] = set()

    def record(
        self,
        obj: dict[str, Any],
        *,
        reason: str,
        message: str,
        now: datetime,
        warning: bool = True,
    ) -> bool:
        """Post one Event about ``obj`` unless this generation already got it; True when posted."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        text = self._redactor.for_namespace(namespace).scrub(message)
        if len(text) > MESSAGE_LIMIT:
            text = text[: MESSAGE_LIMIT - 1] + "…"
        identity = f"{meta.get('uid')}\0{meta.get('generation')}\0{reason}\0{text}"
        if identity in self._sent:
            return False
        digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
        moment = now.replace(microsecond=0)
        body = CoreV1Event(
            metadata=V1ObjectMeta(name=f"{name[:200]}.{digest}", namespace=namespace),
            involved_object=V1ObjectReference(
                api_version=POLICY_API_VERSION,
                kind=POLICY_KIND,
                name=name,
                namespace=namespace,
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            ),
            type="Warning" if warning else "Normal",
            reason=reason,
            message=text,
            count=1,
            first_timestamp=moment,
            last_timestamp=moment,
            source=V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self._instance,
        )
        try:
            self._api.create_namespaced_event(
                namespace,
                body,
                _request_timeout=self._timeout,
                _headers={"Content-Type": "application/json"},
            )
        except ApiException as error:
            if error.status != 409:  # 409: posted before (a restart): recorded, not duplicated
                log.warning(
                    "event about a PromotionPolicy not recorded; trying again later",
                    policy=f"{namespace}/{name}",
                    status=error.status,
                )
                return False
        except Exception as error:
            log.warning(
                "event about a PromotionPolicy not recorded", policy=f"{namespace}/{name}", error=str(error)
            )
            return False
        if len(self._sent) >= _REMEMBERED_EVENTS:
            self._sent.clear()  # at worst one repeat per object, found as a 409 (the same name)
        self._sent.add(identity)
        return True
