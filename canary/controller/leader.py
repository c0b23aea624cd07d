"""Elections on ``coordination.k8s.io/v1`` Leases, with fencing: one mechanism for leadership and shards.

Two replicas must never drive the same rollout. The client library's ``LeaseLock`` elector blocks,
never stops the leading thread, does not release the lease on shutdown and renews without a request
timeout, so this is a small loop of our own. :class:`LeaseElector` is what every election here does
with a Lease:

* acquire or renew every ``retry_period`` (with a request timeout), each write under the
  resourceVersion read (the loser of a race gets a 409) — a replica that has not renewed within
  ``renew_deadline`` stops considering itself the holder *before* the lease expires for others;
* fence: re-read the Lease just before every write and refuse (:class:`NotLeader`) unless this
  replica renewed it within ``renew_deadline`` and the Lease names it as holder with a ``renewTime``
  less than ``renew_deadline`` old, so a paused or partitioned ex-holder cannot write;
* release: empty the holder on shutdown so a successor takes over at once.

:class:`LeaderElector` holds the one Lease ``<name>`` (``--shards 1``: the leader drives every
rollout); :class:`~canary.controller.shards.ShardedElector` holds one Lease per shard.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Generic, Required, TypedDict, TypeVar

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

__all__ = ["ElectorOptions", "LeaderElector", "LeaseElector", "NotLeader", "SeenLease"]

log = structlog.get_logger(__name__)

Held = TypeVar("Held")  # what an elector tells ``on_change`` it holds


class NotLeader(Exception):
    """This replica does not hold the lease: the write is refused."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def micro(value: datetime | None) -> datetime | None:
    """A MicroTime the client can send: it drops a zero fraction, which the apiserver refuses."""
    if value is None or value.microsecond:
        return value
    return value.replace(microsecond=1)


def aware(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def log_failed(event: str, error: Exception, **context: object) -> None:
    """An API answer (a 409: somebody wrote first) is news; anything else (a timeout) a warning."""
    if isinstance(error, ApiException):
        log.info(event, status=error.status, **context)
    else:
        log.warning(event, error=str(error), **context)


def reason(error: Exception) -> object:
    return error.status if isinstance(error, ApiException) else error


@dataclass(frozen=True)
class SeenLease:
    """One Lease as read."""

    name: str
    holder: str | None
    renew_time: datetime | None
    duration: float
    resource_version: str | None
    annotations: dict[str, str]
    lease: client.V1Lease

    @classmethod
    def of(cls, lease: client.V1Lease, default_duration: float) -> SeenLease:
        spec = lease.spec or client.V1LeaseSpec()
        meta = lease.metadata or client.V1ObjectMeta()
        return cls(
            name=str(meta.name),
            holder=spec.holder_identity or None,
            renew_time=aware(spec.renew_time),
            duration=float(spec.lease_duration_seconds or default_duration),
            resource_version=meta.resource_version,
            annotations=dict(meta.annotations or {}),
            lease=lease,
        )

    def expired(self, now: datetime) -> bool:
        """Not renewed for a whole lease duration by its ``renewTime``, on ``now``'s clock."""
        return self.renew_time is None or now > self.renew_time + timedelta(seconds=self.duration)


class ElectorOptions(TypedDict, total=False):
    """The arguments every elector takes (see :class:`LeaseElector`)."""

    name: Required[str]
    namespace: Required[str]
    identity: Required[str]
    lease_duration: float
    renew_deadline: float
    retry_period: float
    request_timeout: float
    wall_clock: Callable[[], datetime]
    monotonic: Callable[[], float]


class LeaseElector(ABC, Generic[Held]):
    """What every election does with a Lease; a subclass says which Leases it holds (:meth:`tick`,
    :meth:`release`) and tells ``on_change`` (from the renewing thread) whenever what it holds
    changes. ``_reported`` is what it told last: initially nothing held."""

    _reported: Held

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        request_timeout: float = 5.0,
        wall_clock: Callable[[], datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[Held], None] | None = None,
    ):
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self._api = client.CoordinationV1Api(api_client)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self._lease_duration = lease_duration
        self._renew_deadline = renew_deadline
        self._retry_period = retry_period
        self._timeout = request_timeout
        self._wall = wall_clock
        self._monotonic = monotonic
        self._on_change = on_change
        self._lock = threading.Lock()

    @abstractmethod
    def tick(self) -> None:
        """One round: acquire or renew what this replica should hold."""

    @abstractmethod
    def release(self) -> None:
        """Shutdown: give up every Lease held so another replica can take over at once."""

    def run(self, stop: threading.Event) -> None:
        """Renew until ``stop`` is set, then release. Meant for a daemon thread."""
        while not stop.is_set():
            try:
                self.tick()
            except Exception as error:  # never let the renewing thread die
                log.warning("lease round failed", lease=self.name, error=str(error), identity=self.identity)
            stop.wait(self._retry_period)
        self.release()

    # -- one Lease -------------------------------------------------------------------------------

    def _fresh(self, renewed_at: float | None) -> bool:
        """Renewed (``renewed_at``: the monotonic time the renewal was sent) within the renew deadline."""
        return renewed_at is not None and self._monotonic() - renewed_at < self._renew_deadline

    def _fence(self, name: str, renewed_at: float | None) -> None:
        """Raises :class:`NotLeader` unless this replica renewed Lease ``name`` in time and, read
        afresh, it names this replica with a ``renewTime`` younger than the renew deadline: no write
        within ``lease_duration - renew_deadline`` of its expiry for the others."""
        where = f"{self.namespace}/{name}"
        if not self._fresh(renewed_at):
            raise NotLeader(f"{self.identity} has not renewed lease {where} in time")
        try:
            seen = self._read(name)
        except Exception as error:  # a timeout: not known to be held, so not held
            raise NotLeader(f"lease {where} unreadable: {reason(error)}") from error
        if seen is None or seen.holder != self.identity:
            raise NotLeader(f"lease {where} is held by {seen.holder if seen else None!r}")
        age = self._wall() - seen.renew_time if seen.renew_time is not None else None
        if age is None or age >= timedelta(seconds=self._renew_deadline):
            raise NotLeader(f"lease {where} is about to expire")

    def _now(self) -> datetime:
        now = self._wall()
        return now if now.microsecond else now.replace(microsecond=1)  # see micro()

    def _read(self, name: str) -> SeenLease | None:
        """Lease ``name`` as the API has it now; None when there is none."""
        try:
            lease = self._api.read_namespaced_lease(name, self.namespace, _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return SeenLease.of(lease, self._lease_duration)

    def _list(self, selector: str) -> list[SeenLease]:
        found = self._api.list_namespaced_lease(
            self.namespace, label_selector=selector, _request_timeout=self._timeout
        )
        return [SeenLease.of(item, self._lease_duration) for item in found.items or []]

    def _put(self, body: client.V1Lease, *, create: bool) -> client.V1Lease:
        assert body.metadata is not None
        if create:
            return self._api.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout)
        return self._api.replace_namespaced_lease(
            str(body.metadata.name), self.namespace, body, _request_timeout=self._timeout
        )

    def _delete(self, name: str, resource_version: str | None) -> None:
        self._api.delete_namespaced_lease(
            name,
            self.namespace,
            body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(resource_version=resource_version)
            ),
            _request_timeout=self._timeout,
        )

    def _body(
        self,
        name: str,
        now: datetime,
        *,
        acquired: datetime,
        transitions: int,
        resource_version: str | None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> client.V1Lease:
        """Lease ``name`` held by this replica, renewed ``now``."""
        return client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=self.namespace,
                labels=labels,
                annotations=annotations,
                resource_version=resource_version,
            ),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=max(1, round(self._lease_duration)),
                acquire_time=acquired,
                renew_time=now,
                lease_transitions=transitions,
            ),
        )

    def _claim(
        self,
        name: str,
        seen: SeenLease | None,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> client.V1Lease:
        """Take or renew Lease ``name`` over ``seen`` (as read, under its resourceVersion; None:
        create it); the Lease written. Raises what the API raised (409: written since it was read)."""
        now = self._now()
        spec = (seen.lease.spec if seen is not None else None) or client.V1LeaseSpec()
        ours = spec.holder_identity == self.identity
        acquired = micro(aware(spec.acquire_time)) if ours else None
        body = self._body(
            name,
            now,
            acquired=acquired or now,
            transitions=(spec.lease_transitions or 0) + (1 if seen is not None and not ours else 0),
            resource_version=seen.resource_version if seen is not None else None,
            labels=labels,
            annotations=annotations,
        )
        return self._put(body, create=seen is None)

    def _give_up(self, seen: SeenLease) -> None:
        """Empty the holder of ``seen`` (this replica's, as read, under its resourceVersion) so
        another replica takes it at once. A failure is logged: the Lease expires by itself."""
        spec = seen.lease.spec
        if seen.holder != self.identity or spec is None:
            return
        spec.holder_identity = spec.renew_time = spec.acquire_time = None
        try:
            self._put(seen.lease, create=False)
            log.info("lease released", lease=seen.name, identity=self.identity)
        except Exception as error:
            log.warning("lease release failed", lease=seen.name, error=str(error), identity=self.identity)

    def _announce(self, held: Held) -> None:
        with self._lock:
            changed = held != self._reported
            self._reported = held
        if changed:
            log.info("leases held changed", held=held, lease=self.name, identity=self.identity)
            if self._on_change is not None:
                self._on_change(held)


class LeaderElector(LeaseElector[bool]):
    """Leadership: the one Lease ``name``. ``on_change(leading)`` is told when leadership changes."""

    _reported = False
    _last_renewed: float | None = None  # monotonic time of our last successful renewal

    @property
    def is_leader(self) -> bool:
        """Cheap local view: we renewed within the renew deadline."""
        with self._lock:
            return self._fresh(self._last_renewed)

    def fence(self) -> None:
        """A fresh check, from the API, just before a write. Raises :class:`NotLeader`."""
        with self._lock:
            renewed = self._last_renewed
        self._fence(self.name, renewed)

    def tick(self) -> None:
        self.try_acquire_or_renew()

    def try_acquire_or_renew(self) -> bool:
        started = self._monotonic()
        try:
            seen = self._read(self.name)
            if (
                seen is not None
                and seen.holder not in (None, self.identity)
                and not seen.expired(self._wall())
            ):
                self._set_leading(False, None)
                return False
            self._claim(self.name, seen)
        except Exception as error:  # 409: somebody else wrote the lease first; else: next period
            log_failed("lease update failed", error, lease=self.name, identity=self.identity)
            self._set_leading(self.is_leader, None)
            return False
        self._set_leading(True, started)
        return True

    def release(self) -> None:
        with self._lock:
            was_leading = self._last_renewed is not None
            self._last_renewed = None
        if not was_leading:
            return
        try:
            seen = self._read(self.name)
        except Exception as error:  # it expires by itself
            log.warning("lease release failed", lease=self.name, error=str(error))
        else:
            if seen is not None:
                self._give_up(seen)
        self._set_leading(False, None)

    def _set_leading(self, leading: bool, renewed_at: float | None) -> None:
        with self._lock:
            if renewed_at is not None:
                self._last_renewed = renewed_at
            elif not leading:
                self._last_renewed = None
        self._announce(leading)
