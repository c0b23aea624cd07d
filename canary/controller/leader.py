"""Leader election on a ``coordination.k8s.io/v1`` Lease, with fencing.

Two replicas must never drive the same rollout. The client library's ``LeaseLock`` elector blocks,
never stops the leading thread, does not release the lease on shutdown and renews without a request
timeout, so this is a small loop of our own:

* acquire or renew every ``retry_period`` (with a request timeout) — a replica that has not renewed
  within ``renew_deadline`` stops considering itself the leader *before* the lease expires for others;
* :meth:`LeaderElector.fence` re-reads the Lease just before every write and refuses unless this
  replica is the holder and the lease is unexpired, so a paused or partitioned ex-leader cannot write;
* :meth:`LeaderElector.release` empties the holder on shutdown so a successor takes over at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

__all__ = ["LeaderElector", "NotLeader"]

log = structlog.get_logger(__name__)


class NotLeader(Exception):
    """This replica does not hold the lease: the write is refused."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


class LeaderElector:
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
        on_change: Callable[[bool], None] | None = None,
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
        self._last_renewed: float | None = None  # monotonic time of our last successful renewal
        self._lock = threading.Lock()
        self._leading = False

    # -- state -----------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        """Cheap local view: we renewed within the renew deadline."""
        with self._lock:
            return (
                self._last_renewed is not None
                and self._monotonic() - self._last_renewed < self._renew_deadline
            )

    def fence(self) -> None:
        """A fresh check, from the API, just before a write. Raises :class:`NotLeader`."""
        if not self.is_leader:
            raise NotLeader(f"{self.identity} has not renewed lease {self.namespace}/{self.name} in time")
        lease = self._read()
        if lease is None or lease.spec is None:
            raise NotLeader(f"lease {self.namespace}/{self.name} does not exist")
        spec = lease.spec
        if spec.holder_identity != self.identity:
            raise NotLeader(f"lease {self.namespace}/{self.name} is held by {spec.holder_identity!r}")
        if self._expired(spec):
            raise NotLeader(f"lease {self.namespace}/{self.name} has expired")

    # -- acquire / renew / release -----------------------------------------------------------------

    def try_acquire_or_renew(self) -> bool:
        now = self._wall()
        if now.microsecond == 0:
            # The client serialises with isoformat(), which drops a zero fraction; the apiserver
            # refuses a MicroTime without one.
            now = now.replace(microsecond=1)
        started = self._monotonic()
        try:
            lease = self._read()
            if lease is None:
                self._api.create_namespaced_lease(
                    self.namespace, self._body(now, None, transitions=0), _request_timeout=self._timeout
                )
            else:
                spec = lease.spec or client.V1LeaseSpec()
                holder = spec.holder_identity
                if holder and holder != self.identity and not self._expired(spec):
                    self._set_leading(False, None)
                    return False
                transitions = (spec.lease_transitions or 0) + (0 if holder == self.identity else 1)
                acquire_time = spec.acquire_time if holder == self.identity else None
                body = self._body(now, acquire_time, transitions=transitions)
                if body.metadata is not None and lease.metadata is not None:
                    body.metadata.resource_version = lease.metadata.resource_version
                self._api.replace_namespaced_lease(
                    self.name, self.namespace, body, _request_timeout=self._timeout
                )
        except ApiException as error:
            # 409: somebody else wrote the lease first; anything else: try again next period.
            log.info("lease update failed", lease=self.name, status=error.status, identity=self.identity)
            self._set_leading(self.is_leader, None)
            return False
        except Exception as error:  # network errors, timeouts
            log.warning("lease update failed", lease=self.name, error=str(error), identity=self.identity)
            self._set_leading(self.is_leader, None)
            return False
        self._set_leading(True, started)
        return True

    def release(self) -> None:
        """Give the lease up (on shutdown) so another replica can take over at once."""
        with self._lock:
            was_leading = self._last_renewed is not None
            self._last_renewed = None
        if not was_leading:
            return
        try:
            lease = self._read()
            if lease is not None and lease.spec is not None and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.renew_time = None
                lease.spec.acquire_time = None
                self._api.replace_namespaced_lease(
                    self.name, self.namespace, lease, _request_timeout=self._timeout
                )
                log.info("lease released", lease=self.name, identity=self.identity)
        except Exception as error:
            log.warning("lease release failed", lease=self.name, error=str(error))
        self._set_leading(False, None)

    def run(self, stop: threading.Event) -> None:
        """Renew until ``stop`` is set, then release. Meant for a daemon thread."""
        while not stop.is_set():
            self.try_acquire_or_renew()
            stop.wait(self._retry_period)
        self.release()

    # -- helpers -----------------------------------------------------------------------------------

    def _read(self) -> client.V1Lease | None:
        try:
            return self._api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._timeout)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def _expired(self, spec: client.V1LeaseSpec) -> bool:
        if spec.renew_time is None:
            return True
        duration = spec.lease_duration_seconds or self._lease_duration
        renewed = spec.renew_time if spec.renew_time.tzinfo else spec.renew_time.replace(tzinfo=UTC)
        return self._wall() > renewed + timedelta(seconds=duration)

    def _body(self, now: datetime, acquire_time: datetime | None, *, transitions: int) -> client.V1Lease:
        return client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=round(self._lease_duration),
                acquire_time=acquire_time or now,
                renew_time=now,
                lease_transitions=transitions,
            ),
        )

    def _set_leading(self, leading: bool, renewed_at: float | None) -> None:
        with self._lock:
            if renewed_at is not None:
                self._last_renewed = renewed_at
            elif not leading:
                self._last_renewed = None
            changed = leading != self._leading
            self._leading = leading
        if changed:
            log.info("leadership changed", leading=leading, identity=self.identity, lease=self.name)
            if self._on_change is not None:
                self._on_change(leading)
