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
  answers False for it at once (no new work starts), the work in flight (``in_flight``) finishes,
  and only then is the Lease released (holder emptied) for a newcomer to take — never two writers;
* **takeover**: a killed replica's shards expire ``leaseDurationSeconds`` after its last renewal, its
  member Lease with them, so the survivors' fair share grows and they take the shards over;
* **fencing**: :meth:`fence` refuses (:class:`~canary.controller.leader.NotLeader`) unless this
  replica renewed the shard's Lease within ``renew_deadline`` (< the lease duration, so it stops
  before the others may consider it expired) and the Lease, read afresh, names it as holder with a
  ``renewTime`` less than ``renew_deadline`` old: no write within ``lease_duration - renew_deadline``
  of expiry — the one fence of :class:`~canary.controller.leader.LeaseElector`, which
  :class:`~canary.controller.leader.LeaderElector` applies to its one Lease.

Two guards against configurations that would map a key to two shards: a replica that sees a live
member announcing another shard count, or the single Lease ``<name>`` (``--shards 1``) held, takes
no shard and drains what it holds until that is over.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Unpack

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.controller.leader import ElectorOptions, LeaseElector, SeenLease, log_failed, micro, reason

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


@dataclass
class _Held:
    renewed_at: float  # monotonic time at which the last successful renewal was sent
    draining_since: float | None = None
    lease: client.V1Lease | None = None  # as last written: renewed first in the next round


class ShardedElector(LeaseElector[frozenset[int]]):
    """Holds a fair share of ``shards`` shard Leases; see the module docstring.

    ``on_change(held)`` is called (from the renewing thread) with the shards this replica owns
    whenever that set changes; a shard being drained is no longer owned. A drained shard's Lease is
    released once no work for it is in flight: none of the keys ``in_flight()`` names (the runtime
    tracks its own, from read to write).
    """

    _reported: frozenset[int] = frozenset()

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        shards: int,
        member_gc_after: float | None = None,
        on_change: Callable[[frozenset[int]], None] | None = None,
        in_flight: Callable[[], Collection[str]] = tuple,
        **options: Unpack[ElectorOptions],
    ):
        if shards < 1:
            raise ValueError("shards must be at least 1")
        super().__init__(api_client, on_change=on_change, **options)
        self.shards = shards
        self.member_name = member_lease_name(self.name, self.identity)
        self._group = _label_value(self.name)
        # A member Lease of a replica gone for this long is deleted by whoever sees it.
        self._member_gc_after = (
            member_gc_after if member_gc_after is not None else max(300.0, 10 * self._lease_duration)
        )
        self._in_flight = in_flight
        self._held: dict[int, _Held] = {}
        self._member_version: str | None = None
        self._stopping = False
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

    def held_shards(self) -> frozenset[int]:
        """The shards this replica owns now (held, fresh, not draining)."""
        with self._lock:
            return frozenset(index for index in self._held if self._owns_locked(index))

    @property
    def is_leader(self) -> bool:
        """Holds at least one shard (for the readiness text and the leader gauge)."""
        return bool(self.held_shards())

    def fence(self, key: str) -> None:
        """A fresh check, from the API, just before a write for ``key``: raises
        :class:`~canary.controller.leader.NotLeader` unless this replica holds the key's shard Lease
        safely now (a shard being drained still counts: its work in flight finishes before the Lease
        is released)."""
        index = self.shard_of(key)
        with self._lock:
            held = self._held.get(index)
            renewed = held.renewed_at if held is not None else None
        self._fence(shard_lease_name(self.name, index), renewed)

    # -- the renew loop --------------------------------------------------------------------------

    def tick(self) -> None:
        """One round: renew the shards held (first, each under the resourceVersion it was last
        written with), renew the member Lease, list the group, then drain, release, acquire."""
        renewed = self._renew_held()
        started = self._monotonic()
        now = self._now()
        member_written = self._renew_member(now)
        try:
            seen = self._list(f"{LABEL_GROUP}={self._group}")
        except Exception as error:
            log.info("shard leases unreadable; trying again", error=str(error), identity=self.identity)
            self._announce(self.held_shards())
            return
        self._observe(seen, started)
        shards, members = self._split(seen)
        if not member_written:  # refused on a stale or missing resourceVersion: retry on the one listed
            listed = members.get(self.member_name)
            self._member_version = listed.resource_version if listed is not None else None
            self._renew_member(now)
        share = self._count_live(members, now)
        self.blocked = self._blocked(members, now)
        self._collect_members(members, now)
        self._drain(shards, 0 if self.blocked else share, started)
        self._release_or_renew(shards, renewed)
        self._take_free(shards, share, now, started)
        self._announce(self.held_shards())

    def release(self, timeout: float | None = None) -> None:
        """Shutdown: stop owning at once, wait (up to ``timeout``, default the renew deadline) for the
        work in flight, release every shard Lease and delete the member Lease."""
        with self._lock:
            self._stopping = True
        self._wait_idle(self._renew_deadline if timeout is None else timeout)
        with self._lock:
            held = sorted(self._held)
        self._announce(self.held_shards())
        if held:
            try:
                shards, _ = self._split(self._list(f"{LABEL_GROUP}={self._group}"))
            except Exception as error:
                log.warning("shard leases unreadable at shutdown", error=str(error))
                shards = {}
            for index in held:
                if index in shards:
                    self._release_shard(index, shards[index])
        with self._lock:
            self._held.clear()
        self._delete_member()
        self._announce(self.held_shards())

    # -- one round's steps -----------------------------------------------------------------------

    def _renew_held(self) -> set[int]:
        """Renew every shard held, each stamped with the time it is sent: the shards renewed."""
        with self._lock:
            todo = (
                {} if self._stopping else {i: h.lease for i, h in self._held.items() if h.lease is not None}
            )
        return {index for index, lease in sorted(todo.items()) if self._renew_written(index, lease)}

    def _renew_written(self, index: int, lease: client.V1Lease) -> bool:
        """Renew shard ``index`` by writing ``lease`` (as last written) again, under its version."""
        started = self._monotonic()
        assert lease.spec is not None  # as this replica wrote it
        lease.spec.renew_time = self._now()
        lease.spec.acquire_time = micro(lease.spec.acquire_time)
        try:
            written = self._put(lease, create=False)
        except Exception as error:  # 409: changed since (taken after expiry); the list tells
            log_failed("shard lease renewal failed", error, shard=index, identity=self.identity)
            with self._lock:
                if isinstance(error, ApiException) and index in self._held:
                    self._held[index].lease = None
            return False
        with self._lock:
            held = self._held.get(index)
            if held is not None:
                held.renewed_at, held.lease = started, written
        return held is not None

    def _renew_member(self, now: datetime) -> bool:
        """Create or renew this replica's member Lease; False when the API refused the write (a 409:
        it exists from an earlier process of this identity, or was written since; the next list
        gives its resourceVersion)."""
        body = self._body(
            self.member_name,
            now,
            acquired=now,
            transitions=0,
            resource_version=self._member_version,
            labels=self._labels("member"),
            annotations={SHARDS_ANNOTATION: str(self.shards)},
        )
        try:
            written = self._put(body, create=self._member_version is None)
        except Exception as error:
            log_failed("member lease write failed", error, identity=self.identity)
            status = error.status if isinstance(error, ApiException) else None
            if status == 404:  # deleted meanwhile: create it again
                self._member_version = None
            return bool(status != 409)
        self._member_version = written.metadata.resource_version if written.metadata else None
        return True

    def _split(self, seen: list[SeenLease]) -> tuple[dict[int, SeenLease], dict[str, SeenLease]]:
        names = {shard_lease_name(self.name, index): index for index in range(self.shards)}
        shards: dict[int, SeenLease] = {}
        members: dict[str, SeenLease] = {}
        for lease in seen:
            role = ((lease.lease.metadata.labels or {}) if lease.lease.metadata else {}).get(LABEL_ROLE)
            if role == "member":
                members[lease.name] = lease
            elif role == "shard" and lease.name in names:
                shards[names[lease.name]] = lease
        return shards, members

    def _observe(self, seen: list[SeenLease], at: float) -> None:
        """Remember when (monotonic) each Lease version was first seen."""
        with self._lock:
            for lease in seen:
                known = self._observed.get(lease.name)
                if known is None or known[0] != lease.resource_version:
                    self._observed[lease.name] = (lease.resource_version, at)

    def _count_live(self, members: dict[str, SeenLease], now: datetime) -> int:
        """Count the live replicas (this one always among them); their fair share."""
        live = {self.identity} | {m.holder for m in members.values() if m.holder and not m.expired(now)}
        self.live_members = len(live)
        return fair_share(self.shards, len(live))

    def _blocked(self, members: dict[str, SeenLease], now: datetime) -> str | None:
        for member in members.values():
            if member.holder in (None, self.identity) or member.expired(now):
                continue
            announced = member.annotations.get(SHARDS_ANNOTATION)
            if announced != str(self.shards):
                return f"live replica {member.holder} uses {announced} shards, this one {self.shards}"
        try:
            single = self._read(self.name)
        except Exception as error:
            return f"single lease {self.name} unreadable ({reason(error)})"
        if single is None:
            return None
        self._observe([single], self._monotonic())
        if not self._free(single, now, self._monotonic()):
            return f"single lease {self.name} (--shards 1) held by {single.holder}"
        return None

    def _collect_members(self, members: dict[str, SeenLease], now: datetime) -> None:
        """Delete member Leases of replicas gone long ago (pods of earlier Deployments)."""
        for member in members.values():
            if member.name == self.member_name or member.renew_time is None:
                continue
            if now <= member.renew_time + timedelta(seconds=member.duration + self._member_gc_after):
                continue
            try:
                self._delete(member.name, member.resource_version)
                log.info("member lease of a replica long gone deleted", lease=member.name)
            except Exception as error:  # somebody else did, or it came back
                log.debug("member lease not deleted", lease=member.name, error=str(error))

    def _drain(self, shards: dict[int, SeenLease], keep: int, started: float) -> None:
        """Forget the shards the API says are not ours (taken after expiry), note those it says are,
        and drain all but ``keep`` of the rest: the last in rendezvous order first."""
        mine = {i for i, s in shards.items() if s.holder == self.identity}
        with self._lock:
            for index in [i for i in self._held if i not in mine]:
                log.warning("shard lease lost", shard=index, identity=self.identity)
                del self._held[index]
            for index in mine:
                self._held.setdefault(index, _Held(renewed_at=-math.inf))
            active = sorted(
                (i for i, h in self._held.items() if h.draining_since is None), key=self._preference
            )
            for index in active[keep:]:
                self._held[index].draining_since = started
                log.info(
                    "shard lease draining",
                    shard=index,
                    keep=keep,
                    live=self.live_members,
                    blocked=self.blocked,
                    identity=self.identity,
                )

    def _release_or_renew(self, shards: dict[int, SeenLease], renewed: set[int]) -> None:
        """Release each drained shard with no work in flight; renew the others not renewed yet."""
        # Work the runtime has under way (asked after the drain began: what starts later is refused).
        busy = {self.shard_of(key) for key in self._in_flight()}
        with self._lock:
            plan = {i: (h.draining_since is not None and i not in busy) for i, h in self._held.items()}
        for index, release in sorted(plan.items()):
            seen = shards.get(index)
            if seen is None:
                continue
            if release:
                self._release_shard(index, seen)
            elif index not in renewed:
                self._write_shard(index, seen)

    def _take_free(self, shards: dict[int, SeenLease], share: int, now: datetime, started: float) -> None:
        """Take free or expired shards, in rendezvous order, while below ``share``."""
        with self._lock:
            room = 0 if self.blocked or self._stopping else share - len(self._held)
        if room <= 0:
            return
        free = [
            i
            for i in range(self.shards)
            if i not in shards or (shards[i].holder != self.identity and self._free(shards[i], now, started))
        ]
        for index in sorted(free, key=self._preference)[:room]:
            self._write_shard(index, shards.get(index))

    # -- helpers -----------------------------------------------------------------------------------

    def _owns_locked(self, index: int) -> bool:
        held = self._held.get(index)
        return (
            not self._stopping
            and held is not None
            and held.draining_since is None
            and self._fresh(held.renewed_at)
        )

    def _preference(self, index: int) -> bytes:
        """Rendezvous order: replicas taking shards at the same moment prefer different ones."""
        return hashlib.sha256(f"{self.identity}\x00{index}".encode()).digest()

    def _labels(self, role: str) -> dict[str, str]:
        return {LABEL_GROUP: self._group, LABEL_ROLE: role, "app.kubernetes.io/managed-by": "kserve-canary"}

    def _free(self, lease: SeenLease, now: datetime, at: float) -> bool:
        """May be taken: no holder, or not renewed for a whole lease duration — by its renewTime on
        this replica's wall clock *and* by this replica's monotonic clock since it first saw this
        version of it (as client-go judges), so a holder whose clock runs behind is not taken over
        while it still renews."""
        if not lease.holder:
            return True
        if not lease.expired(now):
            return False
        with self._lock:
            known = self._observed.get(lease.name)
        return known is not None and known[0] == lease.resource_version and at - known[1] >= lease.duration

    def _write_shard(self, index: int, seen: SeenLease | None) -> None:
        """Acquire or renew shard ``index`` under the resourceVersion listed (create if absent)."""
        started = self._monotonic()
        try:
            written = self._claim(
                shard_lease_name(self.name, index),
                seen,
                labels=self._labels("shard"),
                annotations={SHARD_ANNOTATION: str(index)},
            )
        except Exception as error:  # 409: written by somebody else since listed (taken, or renewed)
            log_failed("shard lease write failed", error, shard=index, identity=self.identity)
            return
        with self._lock:
            held = self._held.get(index)
            if held is None:
                taken_from = seen.holder if seen is not None else None
                log.info("shard lease acquired", shard=index, identity=self.identity, taken_from=taken_from)
                self._held[index] = _Held(renewed_at=started, lease=written)
            else:
                held.renewed_at, held.lease = started, written

    def _release_shard(self, index: int, seen: SeenLease) -> None:
        with self._lock:
            self._held.pop(index, None)  # no longer ours, whatever the answer: fence refuses from now
        self._give_up(seen)

    def _wait_idle(self, timeout: float) -> None:
        """Wait up to ``timeout`` (real time) for the work in flight to end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._in_flight():
                return
            time.sleep(0.05)

    def _delete_member(self) -> None:
        if self._member_version is None:
            return
        try:
            self._delete(self.member_name, self._member_version)
        except Exception as error:  # it expires by itself
            log.warning("member lease not deleted at shutdown", error=str(error), identity=self.identity)
        self._member_version = None
