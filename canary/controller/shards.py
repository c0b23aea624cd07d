"""Sharded leader election: S shard Leases shared fairly by the live replicas, with fencing.

Governed InferenceServices are split into ``shards`` by a stable hash of ``namespace/name``
(:func:`shard_of`: SHA-256, the same in every process and under every ``PYTHONHASHSEED``; never a
label, since labelling an InferenceService restarts its pods). Shard ``i`` is guarded by the Lease
``<name>-shard-<i>`` in the lease namespace; only Leases and resourceVersion preconditions
coordinate the replicas:

* **membership**: every replica renews its own member Lease ``<name>-member-<identity>``; a member
  Lease not renewed within its ``leaseDurationSeconds`` is a dead replica. The live replicas (this
  one always among them) give the **fair share** ``ceil(shards / live)``;
* **acquire**: every ``retry_period`` a replica lists the group's Leases (one request), renews its
  member Lease and the shards it holds (each a replace under the resourceVersion just listed), and
  takes free or expired shards while it holds fewer than its fair share — each taker preferring
  different shards (rendezvous order), a race settled by the resourceVersion (409 for the loser);
* **rebalance**: a replica holding more than its fair share *drains* the surplus: :meth:`owns`
  answers False for it at once (no new work starts), the work in flight (:meth:`working`) finishes,
  and only then is the Lease released (holder emptied) for a newcomer to take — never two writers;
* **takeover**: a killed replica's shards expire ``leaseDurationSeconds`` after its last renewal, its
  member Lease with them, so the survivors' fair share grows and they take the shards over;
* **fencing**: :meth:`fence` refuses (:class:`~canary.controller.leader.NotLeader`) unless this
  replica renewed the shard's Lease within ``renew_deadline`` (< the lease duration, so it stops
  before the others may consider it expired) and the Lease, read afresh, names it as holder with a
  ``renewTime`` less than ``renew_deadline`` old: no write within ``lease_duration - renew_deadline``
  of expiry, as :class:`~canary.controller.leader.LeaderElector` fences with one Lease.

Two guards against configurations that would map a key to two shards: a replica that sees a live
member announcing another shard count, or the single Lease ``<name>`` (``--shards 1``) held, takes
no shard and drains what it holds until that is over.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.controller.leader import NotLeader

__all__ = [
    "LABEL_GROUP",
    "LABEL_ROLE",
    "SHARDS_ANNOTATION",
    "ShardedElector",
    "fair_share",
    "member_lease_name",
    "shard_lease_name",
    "shard_of",
]

log = structlog.get_logger(__name__)

LABEL_GROUP = "kserve-canary.dev/lease-group"  # the base lease name (or its digest when too long)
LABEL_ROLE = "kserve-canary.dev/lease-role"  # "shard" or "member"
SHARDS_ANNOTATION = "kserve-canary.dev/shards"  # on a member Lease: the shard count it uses
SHARD_ANNOTATION = "kserve-canary.dev/shard"  # on a shard Lease: its index


def shard_of(key: str, shards: int) -> int:
    """The shard of ``namespace/name``: stable across processes, versions and hash seeds."""
    if shards < 1:
        raise ValueError("shards must be at least 1")
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % shards


def fair_share(shards: int, live: int) -> int:
    """How many shards one of ``live`` replicas may hold: ``ceil(shards / live)``."""
    return math.ceil(shards / max(1, live))


def shard_lease_name(base: str, index: int) -> str:
    return f"{base}-shard-{index}"


_NOT_DNS = re.compile(r"[^a-z0-9.-]+")
_MAX_NAME = 253


def member_lease_name(base: str, identity: str) -> str:
    """``<base>-member-<identity>``, the identity made a valid object name (lower case, DNS-1123
    characters; a digest suffix when it had to be changed or shortened, so names stay distinct)."""
    safe = _NOT_DNS.sub("-", identity.lower()).strip("-.") or "replica"
    name = f"{base}-member-{safe}"
    if safe != identity or len(name) > _MAX_NAME:
        suffix = hashlib.sha256(identity.encode("utf-8")).hexdigest()[:10]
        name = f"{name[: _MAX_NAME - 11].rstrip('-.')}-{suffix}"
    return name


def _label_value(base: str) -> str:
    if len(base) <= 63 and re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?", base):
        return base
    return hashlib.sha256(base.encode("utf-8")).hexdigest()[:40]


def _preference(identity: str, index: int) -> bytes:
    """Rendezvous order: replicas taking shards at the same moment prefer different ones."""
    return hashlib.sha256(f"{identity}\x00{index}".encode()).digest()


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class _Held:
    renewed_at: float  # monotonic time at which the last successful renewal was sent
    resource_version: str | None
    draining_since: float | None = None
    lease: client.V1Lease | None = None  # as last written: renewed first in the next round


@dataclass(frozen=True)
class _Seen:
    """One Lease of the group as listed."""

    name: str
    holder: str | None
    renew_time: datetime | None
    duration: float
    resource_version: str | None
    annotations: dict[str, str]
    lease: client.V1Lease


class ShardedElector:
    """Holds a fair share of ``shards`` shard Leases; see the module docstring.

    ``on_change(held)`` is called (from the renewing thread) with the shards this replica owns
    whenever that set changes; a shard being drained is no longer owned. A drained shard's Lease is
    released once no work for it is in flight: work inside :meth:`working`, and the keys
    ``in_flight()`` names (a runtime that tracks its own, e.g. from read to write).
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        name: str,
        namespace: str,
        identity: str,
        shards: int,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        request_timeout: float = 5.0,
        member_gc_after: float | None = None,
        wall_clock: Callable[[], datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
        on_change: Callable[[frozenset[int]], None] | None = None,
        in_flight: Callable[[], Collection[str]] = tuple,
    ):
        if shards < 1:
            raise ValueError("shards must be at least 1")
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self._api = client.CoordinationV1Api(api_client)
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.shards = shards
        self.member_name = member_lease_name(name, identity)
        self._group = _label_value(name)
        self._lease_duration = lease_duration
        self._renew_deadline = renew_deadline
        self._retry_period = retry_period
        self._timeout = request_timeout
        # A member Lease of a replica gone for this long is deleted by whoever sees it.
        self._member_gc_after = (
            member_gc_after if member_gc_after is not None else max(300.0, 10 * lease_duration)
        )
        self._wall = wall_clock
        self._monotonic = monotonic
        self._on_change = on_change
        self._in_flight = in_flight
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}
        self._inflight: dict[int, int] = {}
        self._member_version: str | None = None
        self._member_renewed_at: float | None = None
        self._stopping = False
        self._reported: frozenset[int] = frozenset()
        self._observed: dict[str, tuple[str | None, float]] = {}  # lease -> (version, first seen)
        self.live_members = 1  # as last counted (for logs and tests)
        self.blocked: str | None = None  # why no shard may be held, when one of the guards holds

    # -- what the runtime asks -------------------------------------------------------------------

    def shard_of(self, key: str) -> int:
        return shard_of(key, self.shards)

    def owns(self, key: str) -> bool:
        """Cheap, local: this replica holds the key's shard (renewed within the renew deadline) and
        is not draining it. Work may start for the key."""
        with self._lock:
            return self._owns_locked(self.shard_of(key))

    @contextmanager
    def working(self, key: str) -> Iterator[bool]:
        """``with elector.working(key) as mine:`` — the work done inside counts as in flight for the
        key's shard (its Lease is not released before it ends); ``mine`` is :meth:`owns`, checked
        atomically with the registration. When ``mine`` is False, do nothing."""
        index = self.shard_of(key)
        with self._lock:
            mine = self._owns_locked(index)
            if mine:
                self._inflight[index] = self._inflight.get(index, 0) + 1
        try:
            yield mine
        finally:
            if mine:
                with self._lock:
                    self._inflight[index] -= 1
                    if self._inflight[index] == 0:
                        del self._inflight[index]

    def held_shards(self) -> frozenset[int]:
        """The shards this replica owns now (held, fresh, not draining)."""
        with self._lock:
            return frozenset(index for index in self._held if self._owns_locked(index))

    @property
    def is_leader(self) -> bool:
        """Holds at least one shard (for the readiness text and the leader gauge)."""
        return bool(self.held_shards())

    def fence(self, key: str) -> None:
        """A fresh check, from the API, just before a write for ``key``. Raises :class:`NotLeader`
        unless this replica holds the key's shard Lease safely now (a shard being drained still
        counts: its work in flight finishes before the Lease is released)."""
        index = self.shard_of(key)
        lease_name = shard_lease_name(self.name, index)
        with self._lock:
            held = self._held.get(index)
            fresh = held is not None and self._monotonic() - held.renewed_at < self._renew_deadline
        if not fresh:
            raise NotLeader(
                f"{self.identity} does not hold lease {self.namespace}/{lease_name} (renewed in time)"
            )
        try:
            lease = self._api.read_namespaced_lease(
                lease_name, self.namespace, _request_timeout=self._timeout
            )
        except ApiException as error:
            raise NotLeader(f"lease {self.namespace}/{lease_name} unreadable: {error.status}") from error
        except Exception as error:  # a timeout: not known to be held, so not held
            raise NotLeader(f"lease {self.namespace}/{lease_name} unreadable: {error}") from error
        spec = lease.spec
        holder = spec.holder_identity if spec is not None else None
        if holder != self.identity:
            raise NotLeader(f"lease {self.namespace}/{lease_name} is held by {holder!r}")
        renewed = _aware(spec.renew_time) if spec is not None else None
        # Not within lease_duration - renew_deadline of its expiry for the others.
        if renewed is None or self._wall() >= renewed + timedelta(seconds=self._renew_deadline):
            raise NotLeader(f"lease {self.namespace}/{lease_name} is about to expire")

    # -- the renew loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Renew until ``stop`` is set, then release everything. Meant for a daemon thread."""
        while not stop.is_set():
            try:
                self.tick()
            except Exception as error:  # never let the renewing thread die
                log.warning("shard lease round failed", error=str(error), identity=self.identity)
            stop.wait(self._retry_period)
        self.release()

    def tick(self) -> None:
        """One round: renew the shards held (first, each under the resourceVersion it was last
        written with), renew the member Lease, list the group, then drain, release, acquire."""
        renewed_shards = self._renew_held()
        started = self._monotonic()
        now = self._now()
        renewed = self._renew_member(now, started)
        try:
            seen = self._list()
        except Exception as error:
            log.info("shard leases unreadable; trying again", error=str(error), identity=self.identity)
            self._report()
            return
        self._observe(seen, started)
        shards, members = self._split(seen)
        if not renewed:  # refused on a stale or missing resourceVersion: retry on the one listed
            listed = members.get(self.member_name)
            self._member_version = listed.resource_version if listed is not None else None
            self._renew_member(now, started)
        live = {self.identity} | {
            m.holder for m in members.values() if m.holder and not self._expired(m, now)
        }
        self.live_members = len(live)
        share = fair_share(self.shards, len(live))
        self.blocked = self._blocked(members, now)
        self._collect_members(members, now)

        mine = {i for i, s in shards.items() if s.holder == self.identity}
        with self._lock:
            # Shards we believed held but the API says are not ours: gone (taken after expiry).
            for index in list(self._held):
                if index not in mine:
                    log.warning("shard lease lost", shard=index, identity=self.identity)
                    del self._held[index]
            for index in mine:
                self._held.setdefault(index, _Held(renewed_at=-math.inf, resource_version=None))
            # Drain the surplus (or everything while blocked): newest preference last.
            keep = 0 if self.blocked else share
            active = sorted(
                (i for i, h in self._held.items() if h.draining_since is None),
                key=lambda i: _preference(self.identity, i),
            )
            for index in active[keep:]:
                self._held[index].draining_since = started
                log.info(
                    "shard lease draining",
                    shard=index,
                    share=share,
                    live=len(live),
                    blocked=self.blocked,
                    identity=self.identity,
                )
        # Work the runtime has under way (asked after the drain began: what starts later is refused).
        busy = {self.shard_of(key) for key in self._in_flight()}
        with self._lock:
            plan = {
                i: (h.draining_since is not None and self._inflight.get(i, 0) == 0 and i not in busy)
                for i, h in self._held.items()
            }
        for index, release in sorted(plan.items()):
            lease = shards.get(index)
            if lease is None:
                continue
            if release:
                self._release_shard(index, lease)
            elif index not in renewed_shards:
                self._write_shard(index, lease)
        with self._lock:
            room = 0 if self.blocked or self._stopping else share - len(self._held)
        if room > 0:
            free = [i for i in range(self.shards) if i not in shards or self._free(shards[i], now, started)]
            free = [i for i in free if shards.get(i) is None or shards[i].holder != self.identity]
            for index in sorted(free, key=lambda i: _preference(self.identity, i))[:room]:
                self._write_shard(index, shards.get(index))
        self._report()

    def release(self, timeout: float | None = None) -> None:
        """Shutdown: stop owning at once, wait (up to ``timeout``, default the renew deadline) for the
        work in flight, release every shard Lease and delete the member Lease."""
        wait = self._renew_deadline if timeout is None else timeout
        deadline = time.monotonic() + wait
        with self._lock:
            self._stopping = True
        while True:
            with self._lock:
                mine = bool(self._inflight)
            if (not mine and not self._in_flight()) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        with self._lock:
            held = sorted(self._held)
        self._report()
        if held:
            try:
                shards, _ = self._split(self._list())
            except Exception as error:
                log.warning("shard leases unreadable at shutdown", error=str(error))
                shards = {}
            for index in held:
                lease = shards.get(index)
                if lease is not None:
                    self._release_shard(index, lease)
        with self._lock:
            self._held.clear()
        self._delete_member()
        self._report()

    # -- helpers -----------------------------------------------------------------------------------

    def _owns_locked(self, index: int) -> bool:
        held = self._held.get(index)
        return (
            not self._stopping
            and held is not None
            and held.draining_since is None
            and self._monotonic() - held.renewed_at < self._renew_deadline
        )

    def _now(self) -> datetime:
        now = self._wall()
        # The client serialises with isoformat(), which drops a zero fraction; the apiserver refuses
        # a MicroTime without one.
        return now.replace(microsecond=1) if now.microsecond == 0 else now

    def _list(self) -> list[_Seen]:
        found = self._api.list_namespaced_lease(
            self.namespace, label_selector=f"{LABEL_GROUP}={self._group}", _request_timeout=self._timeout
        )
        return [_seen(item, self._lease_duration) for item in found.items or []]

    def _split(self, seen: list[_Seen]) -> tuple[dict[int, _Seen], dict[str, _Seen]]:
        shards: dict[int, _Seen] = {}
        members: dict[str, _Seen] = {}
        for lease in seen:
            role = ((lease.lease.metadata.labels or {}) if lease.lease.metadata else {}).get(LABEL_ROLE)
            if role == "member":
                members[lease.name] = lease
            elif role == "shard":
                for index in range(self.shards):
                    if lease.name == shard_lease_name(self.name, index):
                        shards[index] = lease
        return shards, members

    def _observe(self, seen: list[_Seen], at: float) -> None:
        """Remember when (monotonic) each Lease version was first seen."""
        with self._lock:
            for lease in seen:
                known = self._observed.get(lease.name)
                if known is None or known[0] != lease.resource_version:
                    self._observed[lease.name] = (lease.resource_version, at)

    def _free(self, lease: _Seen, now: datetime, at: float) -> bool:
        """May be taken: no holder, or not renewed for a whole lease duration — by its renewTime on
        this replica's wall clock *and* by this replica's monotonic clock since it first saw this
        version of it (as client-go judges), so a holder whose clock runs behind is not taken over
        while it still renews."""
        if not lease.holder:
            return True
        if self._expired(lease, now):
            with self._lock:
                known = self._observed.get(lease.name)
            return (
                known is not None and known[0] == lease.resource_version and at - known[1] >= lease.duration
            )
        return False

    def _expired(self, lease: _Seen, now: datetime) -> bool:
        return lease.renew_time is None or now > lease.renew_time + timedelta(seconds=lease.duration)

    def _blocked(self, members: dict[str, _Seen], now: datetime) -> str | None:
        for member in members.values():
            if member.holder in (None, self.identity) or self._expired(member, now):
                continue
            announced = member.annotations.get(SHARDS_ANNOTATION)
            if announced != str(self.shards):
                return f"live replica {member.holder} uses {announced} shards, this one {self.shards}"
        try:
            single = self._api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout
            )
        except ApiException as error:
            if error.status == 404:
                return None
            return f"single lease {self.name} unreadable ({error.status})"
        except Exception as error:
            return f"single lease {self.name} unreadable ({error})"
        seen = _seen(single, self._lease_duration)
        self._observe([seen], self._monotonic())
        if not self._free(seen, now, self._monotonic()):
            return f"single lease {self.name} (--shards 1) held by {seen.holder}"
        return None

    def _metadata(
        self, name: str, role: str, resource_version: str | None, annotations: dict[str, str]
    ) -> client.V1ObjectMeta:
        return client.V1ObjectMeta(
            name=name,
            namespace=self.namespace,
            labels={
                LABEL_GROUP: self._group,
                LABEL_ROLE: role,
                "app.kubernetes.io/managed-by": "kserve-canary",
            },
            annotations=annotations,
            resource_version=resource_version,
        )

    def _body(
        self,
        name: str,
        role: str,
        holder: str | None,
        now: datetime | None,
        *,
        acquired: datetime | None,
        transitions: int,
        resource_version: str | None,
        annotations: dict[str, str],
    ) -> client.V1Lease:
        return client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=self._metadata(name, role, resource_version, annotations),
            spec=client.V1LeaseSpec(
                holder_identity=holder,
                lease_duration_seconds=max(1, round(self._lease_duration)),
                acquire_time=acquired,
                renew_time=now,
                lease_transitions=transitions,
            ),
        )

    def _put(self, body: client.V1Lease, create: bool) -> client.V1Lease:
        assert body.metadata is not None
        if create:
            return self._api.create_namespaced_lease(self.namespace, body, _request_timeout=self._timeout)
        return self._api.replace_namespaced_lease(
            str(body.metadata.name), self.namespace, body, _request_timeout=self._timeout
        )

    def _renew_held(self) -> set[int]:
        """Renew every shard held, each stamped with the time it is sent: the shards renewed."""
        with self._lock:
            if self._stopping:
                return set()
            todo = {i: h.lease for i, h in self._held.items() if h.lease is not None}
        done = set()
        for index, lease in sorted(todo.items()):
            if lease is None or lease.spec is None:
                continue
            started = self._monotonic()
            lease.spec.renew_time = self._now()
            lease.spec.acquire_time = _micro(lease.spec.acquire_time)
            try:
                written = self._put(lease, create=False)
            except ApiException as error:  # 409: changed since (taken after expiry); the list tells
                log.info(
                    "shard lease renewal refused", shard=index, status=error.status, identity=self.identity
                )
                with self._lock:
                    if index in self._held:
                        self._held[index].lease = None
                continue
            except Exception as error:
                log.warning(
                    "shard lease renewal failed", shard=index, error=str(error), identity=self.identity
                )
                continue
            with self._lock:
                held = self._held.get(index)
                if held is not None:
                    held.renewed_at = started
                    held.lease = written
                    held.resource_version = written.metadata.resource_version if written.metadata else None
                    done.add(index)
        return done

    def _write_shard(self, index: int, lease: _Seen | None) -> None:
        """Acquire or renew shard ``index`` under the resourceVersion listed (create if absent)."""
        started = self._monotonic()
        now = self._now()
        name = shard_lease_name(self.name, index)
        ours = lease is not None and lease.holder == self.identity
        spec = lease.lease.spec if lease is not None else None
        transitions = (spec.lease_transitions or 0) if spec is not None else 0
        acquired = _aware(spec.acquire_time) if ours and spec is not None else None
        body = self._body(
            name,
            "shard",
            self.identity,
            now,
            acquired=_micro(acquired) or now,
            transitions=transitions if ours else transitions + (1 if lease is not None else 0),
            resource_version=lease.resource_version if lease is not None else None,
            annotations={SHARD_ANNOTATION: str(index)},
        )
        try:
            written = self._put(body, create=lease is None)
        except ApiException as error:
            # 409: written by somebody else since listed (taken, or renewed by its holder).
            log.info("shard lease write refused", shard=index, status=error.status, identity=self.identity)
            return
        except Exception as error:
            log.warning("shard lease write failed", shard=index, error=str(error), identity=self.identity)
            return
        version = written.metadata.resource_version if written.metadata else None
        with self._lock:
            held = self._held.get(index)
            if held is None:
                log.info(
                    "shard lease acquired",
                    shard=index,
                    identity=self.identity,
                    taken_from=lease.holder if lease else None,
                )
                self._held[index] = _Held(renewed_at=started, resource_version=version, lease=written)
            else:
                held.renewed_at = started
                held.resource_version = version
                held.lease = written

    def _release_shard(self, index: int, lease: _Seen) -> None:
        """Empty the holder (under the resourceVersion listed) so another replica takes it at once."""
        with self._lock:
            self._held.pop(index, None)  # no longer ours, whatever the answer: fence refuses from now
        if lease.holder != self.identity:
            return
        spec = lease.lease.spec
        body = self._body(
            lease.name,
            "shard",
            None,
            None,
            acquired=None,
            transitions=(spec.lease_transitions or 0) if spec is not None else 0,
            resource_version=lease.resource_version,
            annotations={SHARD_ANNOTATION: str(index)},
        )
        try:
            self._put(body, create=False)
            log.info("shard lease released", shard=index, identity=self.identity)
        except Exception as error:  # it expires by itself
            log.warning("shard lease release failed", shard=index, error=str(error), identity=self.identity)

    def _renew_member(self, now: datetime, started: float) -> bool:
        """Create or renew this replica's member Lease; False when the API refused the write (a 409:
        it exists from an earlier process of this identity, or was written since; the next list
        gives its resourceVersion)."""
        body = self._body(
            self.member_name,
            "member",
            self.identity,
            now,
            acquired=now,
            transitions=0,
            resource_version=self._member_version,
            annotations={SHARDS_ANNOTATION: str(self.shards)},
        )
        try:
            written = self._put(body, create=self._member_version is None)
        except ApiException as error:
            if error.status == 404:  # deleted meanwhile: create it again
                self._member_version = None
            log.info("member lease write failed", status=error.status, identity=self.identity)
            return bool(error.status != 409)
        except Exception as error:
            log.warning("member lease write failed", error=str(error), identity=self.identity)
            return True
        self._member_version = written.metadata.resource_version if written.metadata else None
        self._member_renewed_at = started
        return True

    def _collect_members(self, members: dict[str, _Seen], now: datetime) -> None:
        """Delete member Leases of replicas gone long ago (pods of earlier Deployments)."""
        for member in members.values():
            if member.name == self.member_name or member.renew_time is None:
                continue
            if now <= member.renew_time + timedelta(seconds=member.duration + self._member_gc_after):
                continue
            try:
                self._api.delete_namespaced_lease(
                    member.name,
                    self.namespace,
                    body=client.V1DeleteOptions(
                        preconditions=client.V1Preconditions(resource_version=member.resource_version)
                    ),
                    _request_timeout=self._timeout,
                )
                log.info("member lease of a replica long gone deleted", lease=member.name)
            except Exception as error:  # somebody else did, or it came back
                log.debug("member lease not deleted", lease=member.name, error=str(error))

    def _delete_member(self) -> None:
        if self._member_version is None:
            return
        try:
            self._api.delete_namespaced_lease(
                self.member_name,
                self.namespace,
                body=client.V1DeleteOptions(
                    preconditions=client.V1Preconditions(resource_version=self._member_version)
                ),
                _request_timeout=self._timeout,
            )
        except Exception as error:  # it expires by itself
            log.warning("member lease not deleted at shutdown", error=str(error), identity=self.identity)
        self._member_version = None

    def _report(self) -> None:
        held = self.held_shards()
        with self._lock:
            changed = held != self._reported
            self._reported = held
        if changed:
            log.info("shards changed", shards=sorted(held), identity=self.identity, live=self.live_members)
            if self._on_change is not None:
                self._on_change(held)


def _micro(value: datetime | None) -> datetime | None:
    """A MicroTime the client can send: it drops a zero fraction, which the apiserver refuses."""
    if value is None or value.microsecond:
        return value
    return value.replace(microsecond=1)


def _aware(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _seen(lease: client.V1Lease, default_duration: float) -> _Seen:
    spec = lease.spec or client.V1LeaseSpec()
    meta = lease.metadata or client.V1ObjectMeta()
    return _Seen(
        name=str(meta.name),
        holder=spec.holder_identity or None,
        renew_time=_aware(spec.renew_time),
        duration=float(spec.lease_duration_seconds or default_duration),
        resource_version=meta.resource_version,
        annotations=dict(meta.annotations or {}),
        lease=lease,
    )
