"""Sharded leader election against the API emulator over HTTP (issue #12 part 5).

The replicas are :class:`ShardedElector` objects driven round by round (``tick()``) with clocks the
test moves, talking to the emulator through the official kubernetes client: the hash, the fair
share, takeover of a dead replica's shards only after its Leases expire, the surplus released only
after the work in flight for it, and fencing that refuses once a Lease is lost or close to expiry.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from canary_sandbox.emulator import LEASES, Emulator, EmulatorServer
from canary_sandbox.emulator.store import Change
from kubernetes import client, config

from canary.controller.leader import NotLeader
from canary.controller.shards import (
    LABEL_GROUP,
    LABEL_ROLE,
    SHARDS_ANNOTATION,
    ShardedElector,
    fair_share,
    member_lease_name,
    shard_lease_name,
    shard_of,
)

NS = "kube-system"
LEASE = "kserve-canary"
SHARDS = 4
DURATION, DEADLINE, RETRY = 3.0, 2.0, 0.5
T0 = datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC)


@dataclass
class Clocks:
    """One wall clock and one monotonic clock for every replica of a test (one machine)."""

    wall: datetime = T0
    mono: float = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds


@dataclass
class World:
    api: client.ApiClient
    emulator: Emulator
    clocks: Clocks
    history: list[tuple[str, str | None]] = field(default_factory=list)  # (lease, holder) as applied

    def replica(self, identity: str, shards: int = SHARDS, **kwargs: Any) -> ShardedElector:
        changes: list[frozenset[int]] = []
        elector = ShardedElector(
            self.api,
            name=LEASE,
            namespace=NS,
            identity=identity,
            shards=shards,
            lease_duration=DURATION,
            renew_deadline=DEADLINE,
            retry_period=RETRY,
            wall_clock=lambda: self.clocks.wall,
            monotonic=lambda: self.clocks.mono,
            on_change=changes.append,
            **kwargs,
        )
        elector.changes = changes  # type: ignore[attr-defined]
        return elector

    def lease(self, name: str) -> client.V1Lease:
        return client.CoordinationV1Api(self.api).read_namespaced_lease(name, NS)

    def holder(self, index: int) -> str | None:
        try:
            spec = self.lease(shard_lease_name(LEASE, index)).spec
        except client.ApiException:
            return None
        return spec.holder_identity if spec else None

    def holders(self) -> dict[int, str | None]:
        return {index: self.holder(index) for index in range(SHARDS)}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    emulator = Emulator()
    with EmulatorServer(emulator) as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        api = config.new_client_from_config(config_file=str(tmp_path / "kubeconfig"))  # type: ignore[no-untyped-call]
        found = World(api, emulator, Clocks())

        def record(change: Change) -> None:
            if change.resource is LEASES:
                spec = change.new.get("spec") or {}
                holder = None if change.type == "DELETED" else spec.get("holderIdentity")
                found.history.append((change.new["metadata"]["name"], holder))

        with emulator.lock:
            emulator.store.add_listener(record)
        yield found


def keys_by_shard(shards: int = SHARDS, per_shard: int = 3) -> dict[int, list[str]]:
    found: dict[int, list[str]] = collections.defaultdict(list)
    number = 0
    while any(len(found[i]) < per_shard for i in range(shards)):
        key = f"ml/model-{number}"
        index = shard_of(key, shards)
        if len(found[index]) < per_shard:
            found[index].append(key)
        number += 1
    return found


def round_(*replicas: ShardedElector) -> None:
    for replica in replicas:
        replica.tick()


def owned(replica: ShardedElector) -> set[int]:
    return set(replica.held_shards())


def assert_no_double_owner(*replicas: ShardedElector) -> None:
    for index, keys in keys_by_shard(per_shard=1).items():
        owners = [r.identity for r in replicas if r.owns(keys[0])]
        assert len(owners) <= 1, f"shard {index} owned by {owners}"


# -- the hash and the share ------------------------------------------------------------------------


def test_the_shard_of_a_key_is_sha256_and_the_same_under_every_hash_seed() -> None:
    keys = [f"ns-{n % 7}/model-{n}" for n in range(200)]
    here = [shard_of(key, 6) for key in keys]
    program = (
        "import sys; from canary.controller.shards import shard_of; "
        f"print(','.join(str(shard_of(k, 6)) for k in {keys!r}))"
    )
    for seed in ("0", "1", "12345", "random"):
        out = subprocess.run(
            [sys.executable, "-c", program],
            env={"PYTHONHASHSEED": seed, "PATH": ""},
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert [int(v) for v in out.stdout.strip().split(",")] == here, seed
    assert shard_of("ml/llama", 1) == 0
    counts = collections.Counter(shard_of(f"team-{n}/m-{n}", 6) for n in range(3000))
    assert set(counts) == set(range(6)) and min(counts.values()) > 400  # about 500 each


def test_pinned_shards_of_known_keys() -> None:
    # sha256("ml/llama")[:8] as a big-endian integer modulo the shard count.
    import hashlib

    for key in ("ml/llama", "default/iris", "a/b"):
        expected = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
        for shards in (1, 2, 6, 16):
            assert shard_of(key, shards) == expected % shards
    with pytest.raises(ValueError, match="at least 1"):
        shard_of("a/b", 0)


def test_fair_share_is_the_ceiling() -> None:
    assert [fair_share(6, live) for live in (0, 1, 2, 3, 4, 5, 6, 7)] == [6, 6, 3, 2, 2, 2, 1, 1]
    assert fair_share(1, 3) == 1


def test_member_lease_names_are_valid_and_distinct() -> None:
    assert member_lease_name("kserve-canary", "kserve-canary-7d9f-abcde") == (
        "kserve-canary-member-kserve-canary-7d9f-abcde"
    )
    odd = {member_lease_name("kc", identity) for identity in ("Pod_A", "pod-a", "pod a", "x" * 300)}
    assert len(odd) == 4
    assert all(len(name) <= 253 and name == name.lower() and " " not in name for name in odd)


# -- against the emulator ---------------------------------------------------------------------------


def test_one_replica_takes_every_shard_and_fences_them(world: World) -> None:
    a = world.replica("a")
    a.tick()
    assert owned(a) == set(range(SHARDS))
    for keys in keys_by_shard().values():
        for key in keys:
            assert a.owns(key)
            a.fence(key)
    assert a.changes == [frozenset(range(SHARDS))]  # type: ignore[attr-defined]
    member = world.lease(member_lease_name(LEASE, "a"))
    assert member.spec.holder_identity == "a"
    assert member.metadata.labels[LABEL_ROLE] == "member"
    assert member.metadata.labels[LABEL_GROUP] == LEASE
    assert member.metadata.annotations[SHARDS_ANNOTATION] == str(SHARDS)
    assert world.lease(shard_lease_name(LEASE, 0)).spec.lease_duration_seconds == 3


def test_a_newcomer_gets_its_fair_share_and_nobody_owns_a_shard_twice(world: World) -> None:
    a, b, c = world.replica("a"), world.replica("b"), world.replica("c")
    a.tick()
    b.tick()  # b sees a's unexpired shards: it takes none, but a now counts two replicas
    assert owned(b) == set()
    assert_no_double_owner(a, b)
    a.tick()  # a drains and releases its surplus (nothing in flight)
    assert len(owned(a)) == 2
    assert_no_double_owner(a, b)
    b.tick()
    assert len(owned(b)) == 2 and owned(a).isdisjoint(owned(b))
    for _ in range(3):
        world.clocks.advance(RETRY)
        round_(c, a, b)
        assert_no_double_owner(a, b, c)
    # Three replicas, four shards: ceil(4/3) = 2 each at most, every shard held.
    counts = sorted(len(owned(r)) for r in (a, b, c))
    assert sum(counts) == SHARDS and max(counts) <= 2, counts
    assert set(world.holders().values()) <= {"a", "b", "c"}


def test_the_surplus_waits_for_the_keys_the_runtime_names_in_flight(world: World) -> None:
    keys = keys_by_shard(per_shard=1)
    busy = {keys[i][0] for i in range(SHARDS)}  # e.g. a tick runner's rollouts from read to write
    a, b = world.replica("a", in_flight=lambda: set(busy)), world.replica("b")
    round_(a, b, a)
    draining = [i for i in range(SHARDS) if not a.owns(keys[i][0])]
    assert len(draining) == 2 and all(world.holder(i) == "a" for i in draining)
    for index in draining:
        a.fence(keys[index][0])  # the work in flight may still write
    busy.discard(keys[draining[0]][0])
    round_(a, b)
    assert world.holder(draining[0]) == "b" and world.holder(draining[1]) == "a"
    with pytest.raises(NotLeader):
        a.fence(keys[draining[0]][0])  # released: a write now is refused
    busy.clear()
    round_(a, b)
    assert owned(b) == set(draining)
    assert_no_double_owner(a, b)


def test_a_dead_replicas_shards_are_taken_over_only_after_its_leases_expire(world: World) -> None:
    a, b = world.replica("a"), world.replica("b")
    round_(a, b, a, b)
    theirs, mine = owned(a), owned(b)
    assert len(theirs) == len(mine) == 2
    # a dies (no more rounds). Until its Leases expire, b takes nothing of it.
    waited = 0.0
    while waited < DURATION:
        world.clocks.advance(RETRY)
        waited += RETRY
        b.tick()
        if owned(b) != mine:
            break
    assert waited >= DURATION, f"taken over after {waited}s, before the lease duration"
    world.clocks.advance(RETRY)
    b.tick()
    assert owned(b) == set(range(SHARDS)), f"not taken over {waited + RETRY}s after the last renewal"
    assert b.live_members == 1
    # The ex-holder, paused all that time, cannot write: its renewals are too old.
    key = keys_by_shard(per_shard=1)[sorted(theirs)[0]][0]
    assert not a.owns(key)
    with pytest.raises(NotLeader):
        a.fence(key)


def test_a_replica_whose_clock_runs_ahead_does_not_take_shards_still_renewed(world: World) -> None:
    a = world.replica("a")
    ahead = ShardedElector(
        world.api,
        name=LEASE,
        namespace=NS,
        identity="ahead",
        shards=SHARDS,
        lease_duration=DURATION,
        renew_deadline=DEADLINE,
        retry_period=RETRY,
        wall_clock=lambda: world.clocks.wall + timedelta(seconds=10),  # a's renewTimes look expired
        monotonic=lambda: world.clocks.mono,
    )
    a.tick()
    for _ in range(12):
        world.clocks.advance(RETRY)
        round_(ahead, a)
        assert_no_double_owner(a, ahead)
        assert len(owned(a)) == 2, "a keeps its share: it renews, whatever the other's clock says"
    assert len(owned(ahead)) == 2  # what a released for it
    # a stops renewing: taken over once a's Leases did not change for a lease duration on ahead's
    # own monotonic clock.
    for _ in range(int(DURATION / RETRY) - 1):
        world.clocks.advance(RETRY)
        ahead.tick()
        assert len(owned(ahead)) == 2
    world.clocks.advance(2 * RETRY)
    ahead.tick()
    assert owned(ahead) == set(range(SHARDS))


def test_fence_refuses_a_lease_lost_in_the_api_even_when_the_local_view_is_fresh(world: World) -> None:
    a = world.replica("a")
    a.tick()
    key = keys_by_shard(per_shard=1)[1][0]
    lease = world.lease(shard_lease_name(LEASE, 1))
    lease.spec.holder_identity = "intruder"
    client.CoordinationV1Api(world.api).replace_namespaced_lease(lease.metadata.name, NS, lease)
    assert a.owns(key)  # the cheap local view has not seen it yet
    with pytest.raises(NotLeader, match="held by 'intruder'"):
        a.fence(key)
    a.tick()  # the next round notices
    assert not a.owns(key)


def test_fence_refuses_within_the_safety_margin_of_expiry(world: World) -> None:
    a = world.replica("a")
    a.tick()
    key = keys_by_shard(per_shard=1)[0][0]
    a.fence(key)
    # No renewal for just under the renew deadline: still safe.
    world.clocks.advance(DEADLINE - 0.1)
    a.fence(key)
    # At the renew deadline (lease_duration - renew_deadline = 1 s before others may take it): refused.
    world.clocks.advance(0.1)
    with pytest.raises(NotLeader):
        a.fence(key)
    assert not a.owns(key)
    # The wall clock alone ahead (a renewal stuck in flight, the local view fresh): the Lease's
    # renewTime read from the API is too old, refused as well.
    a.tick()
    a.fence(key)
    world.clocks.wall += timedelta(seconds=DEADLINE)
    with pytest.raises(NotLeader, match="about to expire"):
        a.fence(key)


def test_a_failing_renewal_stops_owning_before_the_lease_expires(world: World) -> None:
    a = world.replica("a")
    a.tick()
    key = keys_by_shard(per_shard=1)[2][0]
    fault = world.emulator.faults.add(r"/leases", status=503, count=None)
    try:
        for _ in range(int(DEADLINE / RETRY)):
            world.clocks.advance(RETRY)
            a.tick()
        assert not a.owns(key)
        with pytest.raises(NotLeader):
            a.fence(key)
    finally:
        world.emulator.faults.remove(fault.id)
    a.tick()
    assert a.owns(key)


def test_shutdown_releases_everything_and_a_standby_takes_over_at_once(world: World) -> None:
    a, b = world.replica("a"), world.replica("b")
    round_(a, b, a, b)
    a.release()
    assert owned(a) == set()
    assert set(world.holders().values()) == {None, "b"}
    with pytest.raises(client.ApiException):
        world.lease(member_lease_name(LEASE, "a"))  # its member Lease is deleted
    b.tick()  # no expiry to wait for
    assert owned(b) == set(range(SHARDS))


def test_a_replica_with_another_shard_count_blocks_everyone_until_it_is_gone(world: World) -> None:
    a = world.replica("a")
    a.tick()
    odd = world.replica("odd", shards=SHARDS + 2)
    odd.tick()
    assert owned(odd) == set() and odd.blocked is not None
    a.tick()
    assert owned(a) == set() and "6 shards" in (a.blocked or "")
    assert all(holder is None for holder in world.holders().values())
    odd.release()
    a.tick()
    assert owned(a) == set(range(SHARDS))


def test_the_single_lease_of_shards_1_held_means_no_shard_is_taken(world: World) -> None:
    legacy = client.V1Lease(
        metadata=client.V1ObjectMeta(name=LEASE, namespace=NS),
        spec=client.V1LeaseSpec(
            holder_identity="old-leader", lease_duration_seconds=3, renew_time=world.clocks.wall
        ),
    )
    client.CoordinationV1Api(world.api).create_namespaced_lease(NS, legacy)
    a = world.replica("a")
    a.tick()
    assert owned(a) == set() and "old-leader" in (a.blocked or "")
    world.clocks.advance(DURATION + RETRY)  # the old leader is gone: its Lease expired
    a.tick()
    assert owned(a) == set(range(SHARDS))


def test_a_process_restarted_under_the_same_identity_renews_its_member_lease(world: World) -> None:
    first = world.replica("a")
    first.tick()
    again = world.replica("a")  # killed and restarted within the lease duration (a StatefulSet pod)
    again.tick()
    renewed = world.lease(member_lease_name(LEASE, "a")).spec.renew_time
    world.clocks.advance(RETRY)
    again.tick()
    assert world.lease(member_lease_name(LEASE, "a")).spec.renew_time > renewed
    assert owned(again) == set(range(SHARDS))


def test_member_leases_of_replicas_long_gone_are_deleted(world: World) -> None:
    gone = world.replica("gone")
    gone.tick()
    gone.release(timeout=0)  # keeps nothing, but a killed replica leaves its member Lease:
    gone.tick = None  # type: ignore[assignment,method-assign]
    ghost = world.replica("ghost")
    ghost._renew_member(world.clocks.wall)  # a member, then killed
    a = world.replica("a", member_gc_after=10.0)
    a.tick()
    assert world.lease(member_lease_name(LEASE, "ghost"))
    world.clocks.advance(DURATION + 10.5)
    a.tick()
    with pytest.raises(client.ApiException):
        world.lease(member_lease_name(LEASE, "ghost"))


def test_replicas_renewing_concurrently_in_real_time_never_share_a_shard(tmp_path: Path) -> None:
    """Four replicas in threads with real clocks, one killed and one added: every change of a shard
    Lease's holder happened after the previous holder released it or after it expired."""
    emulator = Emulator()
    applied: list[tuple[float, str, str | None, str | None, int]] = []

    def record(change: Change) -> None:
        if change.resource is LEASES and "-shard-" in change.new["metadata"]["name"]:
            spec = change.new.get("spec") or {}
            applied.append(
                (
                    time.time(),
                    change.new["metadata"]["name"],
                    spec.get("holderIdentity"),
                    spec.get("renewTime"),
                    int(spec.get("leaseDurationSeconds") or 0),
                )
            )

    with emulator.lock:
        emulator.store.add_listener(record)
    with EmulatorServer(emulator) as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        electors: dict[str, tuple[ShardedElector, threading.Event, threading.Thread]] = {}

        def start(identity: str) -> None:
            api = config.new_client_from_config(config_file=str(tmp_path / "kubeconfig"))  # type: ignore[no-untyped-call]
            elector = ShardedElector(
                api,
                name=LEASE,
                namespace=NS,
                identity=identity,
                shards=6,
                lease_duration=2.0,
                renew_deadline=1.2,
                retry_period=0.2,
            )
            stop = threading.Event()
            thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
            thread.start()
            electors[identity] = (elector, stop, thread)

        def owners_ok() -> bool:
            held = [e.held_shards() for e, stop, _ in electors.values() if not stop.is_set()]
            return sum(len(h) for h in held) == 6 and len(frozenset().union(*held)) == 6

        def balanced(size: int) -> bool:
            return owners_ok() and all(len(e.held_shards()) == size for e, _, _ in electors.values())

        for identity in ("a", "b", "c"):
            start(identity)
        assert wait(lambda: balanced(2), 10)
        elector, stop, thread = electors.pop("a")
        killed = {index for index in elector.held_shards()}
        # "SIGKILL": no more rounds, nothing released.
        elector.tick = lambda: None  # type: ignore[method-assign]
        elector.release = lambda timeout=None: None  # type: ignore[method-assign]
        stop.set()
        killed_at = time.monotonic()
        assert wait(owners_ok, 10)
        taken_after = time.monotonic() - killed_at
        assert taken_after <= 2.0 + 3 * 0.2 + 0.5, taken_after
        assert killed
        start("d")
        assert wait(lambda: balanced(2), 10)
        for _elector, stop, thread in electors.values():
            stop.set()
            thread.join(timeout=5)
    # The holder history: a new holder only after a release (holder None) or after the expiry.
    last: dict[str, tuple[float, str | None, str | None, int]] = {}
    for at, name, holder, renewed, duration in applied:
        before = last.get(name)
        if before is not None and holder is not None and before[1] not in (None, holder):
            expiry = datetime.fromisoformat(str(before[2]).replace("Z", "+00:00")).timestamp() + before[3]
            assert at > expiry, f"{name}: {before[1]} -> {holder} at {at}, lease valid until {expiry}"
        last[name] = (at, holder, renewed, duration)


def wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


# -- what the deployment grants --------------------------------------------------------------------


def lease_grant_problems(manifests: list[dict[str, Any]], requests: list[Any]) -> list[str]:
    from tests.deploy.rbac import Authorizer

    authorizer = Authorizer.for_service_account(manifests, "kserve-canary", "kserve-canary")
    found = [f"denied: {r}" for r in sorted(set(requests)) if not authorizer.allows(r)]
    for grant in authorizer.grants:
        for group, resource, verb in sorted(grant.rule.grants()):
            if resource != "leases":
                continue
            if not any(r.triple == (group, resource, verb) and grant.allows(r) for r in requests):
                found.append(f"unused: {verb} {resource} ({grant})")
    return found


def test_the_chart_and_the_kustomize_component_grant_exactly_the_lease_requests_of_shards(
    tmp_path: Path,
) -> None:
    """Every Lease request of sharded replicas (acquire, renew, fence, drain, release, take over,
    collect a dead member, shut down) is allowed by the Role rendered with shards, and every Lease
    verb the Role grants is used."""
    from tests.deploy.manifests import DEPLOY, kustomize, render_chart
    from tests.deploy.rbac import attributes

    emulator = Emulator()
    emulator.create_namespace("kserve-canary")
    clocks = Clocks()
    with EmulatorServer(emulator) as server:
        server.write_kubeconfig(tmp_path / "kubeconfig")
        api = config.new_client_from_config(config_file=str(tmp_path / "kubeconfig"))  # type: ignore[no-untyped-call]

        def replica(identity: str, **kwargs: Any) -> ShardedElector:
            return ShardedElector(
                api,
                name="kserve-canary",
                namespace="kserve-canary",
                identity=identity,
                shards=4,
                lease_duration=DURATION,
                renew_deadline=DEADLINE,
                retry_period=RETRY,
                wall_clock=lambda: clocks.wall,
                monotonic=lambda: clocks.mono,
                **kwargs,
            )

        a, b, dead = replica("pod-a", member_gc_after=1.0), replica("pod-b"), replica("pod-dead")
        round_(dead, a, b, a, b)
        for index in range(4):
            key = keys_by_shard(4, per_shard=1)[index][0]
            owner = next((r for r in (a, b, dead) if r.owns(key)), None)
            if owner is not None:
                owner.fence(key)
        clocks.advance(DURATION + 1.5)  # dead stops: its shards expire, its member Lease is collected
        round_(a, b, a, b)
        a.release()
        b.tick()
        b.release()
        requests = [
            attributes(entry.method, entry.path, entry.query)
            for entry in emulator.requests.entries()
            if "/leases" in entry.path
        ]
    assert {r.verb for r in requests if r is not None} == {"create", "get", "list", "update", "delete"}
    chart = render_chart({"leaderElection": {"shards": 4}, "replicaCount": 3})
    assert not lease_grant_problems(chart, requests)
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{os.path.relpath(DEPLOY / 'overlays' / 'cluster-wide', overlay)}]\n"
        f"components: [{os.path.relpath(DEPLOY / 'components' / 'shards', overlay)}]\n"
    )
    assert not lease_grant_problems(kustomize(overlay), requests)
    deployment = next(m for m in kustomize(overlay) if m["kind"] == "Deployment")
    assert "--shards=4" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
