"""The watch caches against the API emulator over HTTP: listed, kept up to date by the watch, never
older than our own writes, and refreshed by a GET when a write meets 409."""

from __future__ import annotations

import functools
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.stack import inference_service
from kubernetes import client, config

from canary.controller.caches import LAST_APPLIED, CachedReads, WatchCache
from canary.kserve.admitted import ConfigMapLimits, list_our_configmaps
from canary.kserve.client import ConflictError, InferenceServiceClient, WatchEvent
from canary.kserve.store import (
    ConfigMapStateStore,
    read_configmap,
    watch_configmaps,
)
from canary.rollout.state import Phase, RolloutState

NS = "ml"


@dataclass
class World:
    emulator: Emulator
    api: client.ApiClient
    isvcs: WatchCache
    configmaps: WatchCache
    reads: CachedReads
    events: list[tuple[str, str]]
    stop: threading.Event

    def start(self) -> None:
        for cache in (self.isvcs, self.configmaps):
            threading.Thread(target=cache.run, args=(NS, self.stop), daemon=True).start()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0, revision_ready_delay=0.0))
    stop = threading.Event()
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace(NS)
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", NS, "inferenceservices", inference_service(NS, "llama", "s3://m/v1")
        )  # fmt: skip
        emulator.settle()
        isvcs = InferenceServiceClient(api)
        core = client.CoreV1Api(api)
        events: list[tuple[str, str]] = []
        isvc_cache = WatchCache(
            "InferenceService",
            lister=isvcs.list,
            watcher=lambda scope, version, seconds: isvcs.watch(scope, version, timeout_seconds=seconds),
            getter=isvcs.get,
            scopes=[NS],
            on_event=lambda kind, obj: events.append((kind, obj["metadata"]["name"])),
        )
        cm_cache = WatchCache(
            "ConfigMap",
            lister=lambda scope: list_our_configmaps(
                api, scope, limits=ConfigMapLimits(), ignored=lambda *_: None
            ),
            watcher=lambda scope, version, seconds: watch_configmaps(
                api, scope, version, timeout_seconds=seconds
            ),
            getter=lambda namespace, name: read_configmap(core, namespace, name, 10.0),
            scopes=[NS],
        )
        try:
            yield World(emulator, api, isvc_cache, cm_cache, CachedReads(isvc_cache, cm_cache), events, stop)
        finally:
            stop.set()


def _wait(predicate: Callable[[], bool], timeout: float = 10.0, what: Callable[[], str] = str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out {what()}"
        time.sleep(0.05)


def test_a_cache_is_not_synced_until_it_has_listed(world: World) -> None:
    assert not world.reads.synced(NS)
    assert world.reads.inference_service(NS, "llama") is None
    world.start()
    _wait(lambda: world.reads.synced(NS))
    found = world.reads.inference_service(NS, "llama")
    assert found is not None and found["metadata"]["resourceVersion"]


def test_watch_events_keep_the_cache_up_to_date_with_resource_versions(world: World) -> None:
    world.start()
    _wait(lambda: world.reads.synced(NS))
    before = world.reads.inference_service(NS, "llama")
    assert before is not None
    patched = client.CustomObjectsApi(world.api).patch_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", NS, "inferenceservices", "llama",
        {"spec": {"predictor": {"model": {"storageUri": "s3://m/v2"}}}},
    )  # fmt: skip
    version = patched["metadata"]["resourceVersion"]  # type: ignore[index]

    def caught_up() -> bool:
        cached = world.reads.inference_service(NS, "llama")
        return cached is not None and int(cached["metadata"]["resourceVersion"]) >= int(version)

    _wait(caught_up)
    assert ("MODIFIED", "llama") in world.events

    store = ConfigMapStateStore(world.api)
    store.save(NS, "llama", RolloutState(phase=Phase.IDLE), resource_version=None, owner_uid=None)
    _wait(lambda: world.reads.state(NS, "llama").state_json is not None)
    assert world.reads.state(NS, "llama").resource_version is not None
    client.CoreV1Api(world.api).delete_namespaced_config_map("kserve-canary-llama", NS)
    _wait(lambda: world.reads.state(NS, "llama").state_json is None)


def test_our_own_write_is_cached_at_once_and_an_older_event_never_replaces_it(world: World) -> None:
    world.start()
    _wait(lambda: world.reads.synced(NS))
    store = ConfigMapStateStore(world.api, on_written=world.configmaps.put)
    version = store.save(NS, "llama", RolloutState(), resource_version=None, owner_uid=None)
    assert world.reads.state(NS, "llama").resource_version == version, "no wait for the watch event"
    newer = store.save(
        NS, "llama", RolloutState(phase=Phase.PAUSED), resource_version=version, owner_uid=None
    )
    stale = {"metadata": {"namespace": NS, "name": "kserve-canary-llama", "resourceVersion": version}}
    world.configmaps._apply("MODIFIED", stale)  # an event delayed behind our write
    assert world.reads.state(NS, "llama").resource_version == newer


def test_a_409_refreshes_the_cached_object_with_a_get(world: World) -> None:
    store = ConfigMapStateStore(world.api, on_written=world.configmaps.put)
    store.save(NS, "llama", RolloutState(), resource_version=None, owner_uid=None)
    # No watch running: somebody else writes and the cache does not see it.
    world.configmaps.refresh(NS, "kserve-canary-llama")
    seen = world.reads.state(NS, "llama")
    ConfigMapStateStore(world.api).save(
        NS, "llama", RolloutState(phase=Phase.PAUSED), resource_version=seen.resource_version, owner_uid=None
    )
    with pytest.raises(ConflictError):
        store.save(NS, "llama", RolloutState(), resource_version=seen.resource_version, owner_uid=None)
    world.reads.refresh_state(NS, "llama")
    fresh = world.reads.state(NS, "llama")
    assert fresh.resource_version != seen.resource_version
    assert fresh.state().phase is Phase.PAUSED


def test_a_write_answered_before_a_deletion_never_brings_the_deleted_state_back(world: World) -> None:
    """The reconcile thread caches the answer to its write after the watch thread has already
    applied the deletion that followed it: the cache must not hold the deleted state again."""
    world.start()
    _wait(lambda: world.reads.synced(NS))
    answered: list[dict[str, object]] = []
    store = ConfigMapStateStore(world.api, on_written=answered.append)  # cached late, by hand
    store.save(NS, "llama", RolloutState(phase=Phase.ROLLED_BACK), resource_version=None, owner_uid=None)
    _wait(lambda: world.reads.state(NS, "llama").state_json is not None)
    client.CoreV1Api(world.api).delete_namespaced_config_map("kserve-canary-llama", NS)
    _wait(lambda: world.reads.state(NS, "llama").state_json is None)

    world.configmaps.put(answered[-1])
    assert world.reads.state(NS, "llama").state_json is None, "the deleted state is not read again"

    recreated = store.save(NS, "llama", RolloutState(), resource_version=None, owner_uid=None)
    world.configmaps.put(answered[-1])
    assert world.reads.state(NS, "llama").resource_version == recreated, "a newer object is cached"


def test_a_list_that_no_longer_has_an_object_buries_it_at_the_list_version(world: World) -> None:
    store = ConfigMapStateStore(world.api)
    first = store.save(NS, "llama", RolloutState(), resource_version=None, owner_uid=None)
    world.configmaps.refresh(NS, "kserve-canary-llama")  # cached, then deleted unseen (no watch)
    stale = world.configmaps.get(NS, "kserve-canary-llama")
    assert stale is not None and stale["metadata"]["resourceVersion"] == first
    client.CoreV1Api(world.api).delete_namespaced_config_map("kserve-canary-llama", NS)
    world.start()
    _wait(lambda: world.reads.synced(NS))
    assert world.reads.state(NS, "llama").state_json is None
    world.configmaps.put(stale)  # a late answer from before the list
    assert world.reads.state(NS, "llama").state_json is None


def test_tombstones_last_one_list_not_the_process(world: World) -> None:
    """A late answer to our write arrives within moments; a tombstone older than the previous list
    is dropped, so deleted objects do not pile up for as long as the controller runs."""
    lister = functools.partial(
        list_our_configmaps, world.api, limits=ConfigMapLimits(), ignored=lambda *_: None
    )
    cache = world.configmaps
    store = ConfigMapStateStore(world.api)
    store.save(NS, "llama", RolloutState(), resource_version=None, owner_uid=None)
    cache._replace(NS, *lister(NS))
    client.CoreV1Api(world.api).delete_namespaced_config_map("kserve-canary-llama", NS)
    cache._replace(NS, *lister(NS))  # gone from this list: buried at its version
    assert (NS, "kserve-canary-llama") in cache._tombstones
    store.save(NS, "other", RolloutState(), resource_version=None, owner_uid=None)  # time passes
    cache._replace(NS, *lister(NS))
    assert (NS, "kserve-canary-llama") in cache._tombstones, "kept through the next list"
    store.save(NS, "third", RolloutState(), resource_version=None, owner_uid=None)
    cache._replace(NS, *lister(NS))
    assert (NS, "kserve-canary-llama") not in cache._tombstones, "dropped once older than the list before"


def test_cached_objects_keep_no_field_owners_or_last_applied_copy_and_share_their_keys(
    world: World,
) -> None:
    """An InferenceService applied server-side by a GitOps tool carries its field owners
    (``managedFields``) and, applied by ``kubectl apply``, a whole copy of itself in an annotation:
    the cache keeps neither; and the keys of an object that came by a watch event (decoded on its
    own) are the strings the listed ones hold."""
    world.start()
    _wait(lambda: world.reads.synced(NS))
    document = inference_service(NS, "mistral", "s3://m/v1")
    document["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(document), "team": "search"}
    request = urllib.request.Request(
        f"{world.api.configuration.host}/apis/serving.kserve.io/v1beta1/namespaces/{NS}"
        "/inferenceservices/mistral?fieldManager=gitops",
        data=yaml.safe_dump(document).encode(),
        method="PATCH",
    )
    request.add_header("Content-Type", "application/apply-patch+yaml")
    with urllib.request.urlopen(request, timeout=10) as response:
        applied = json.loads(response.read())
    assert applied["metadata"]["managedFields"] and LAST_APPLIED in applied["metadata"]["annotations"]
    _wait(lambda: world.reads.inference_service(NS, "mistral") is not None)
    cached = world.reads.inference_service(NS, "mistral")
    listed = world.reads.inference_service(NS, "llama")
    assert cached is not None and listed is not None
    assert "managedFields" not in cached["metadata"]
    assert cached["metadata"]["annotations"] == {"team": "search"}
    assert cached["spec"] == applied["spec"]
    shared = [
        (mine, theirs) for mine in cached["metadata"] for theirs in listed["metadata"] if mine == theirs
    ]
    assert shared and all(mine is theirs for mine, theirs in shared)


def _configmap_cache(
    api: client.ApiClient, *, timeout: int, before_watch: Callable[[], None] = lambda: None
) -> WatchCache:
    core = client.CoreV1Api(api)

    def watcher(scope: str | None, version: str, seconds: int) -> Iterator[WatchEvent]:
        before_watch()
        return watch_configmaps(api, scope, version, timeout_seconds=seconds)

    return WatchCache(
        "ConfigMap",
        lister=lambda scope: list_our_configmaps(
            api, scope, limits=ConfigMapLimits(), ignored=lambda *_: None
        ),
        watcher=watcher,
        getter=lambda namespace, name: read_configmap(core, namespace, name, 10.0),
        scopes=[NS],
        watch_timeout=timeout,
    )


def test_a_watch_that_times_out_is_resumed_from_its_last_version_without_a_list(world: World) -> None:
    # Listing every watch period re-read (and re-allocated) every state of every model; a resumed
    # watch misses nothing: what changes between two watches comes with the next one.
    cache = _configmap_cache(world.api, timeout=1)
    threading.Thread(target=cache.run, args=(NS, world.stop), daemon=True).start()
    _wait(lambda: cache.synced(NS))
    store = ConfigMapStateStore(world.api)
    written: list[str] = []

    def cached_version() -> str | None:
        cached = cache.get(NS, "kserve-canary-llama")
        return None if cached is None else str(cached["metadata"]["resourceVersion"])

    for revision in ("r1", "r2", "r3", "r4"):
        written.append(
            store.save(
                NS,
                "llama",
                RolloutState(revision=revision),
                resource_version=written[-1] if written else None,
                owner_uid=None,
            )
        )
        _wait(lambda: cached_version() == written[-1])
        time.sleep(1.1)  # past a watch period: the next change comes by the resumed watch
    assert cache.resumes >= 3
    assert cache.lists == 1
    cached = cache.get(NS, "kserve-canary-llama")
    assert cached is not None and '"revision":"r4"' in cached["data"]["state.json"].replace(" ", "")


def test_a_watch_resumed_from_a_version_the_api_no_longer_keeps_lists_again(tmp_path: Path) -> None:
    # The API keeps one event: changes made while the cache is between two watches compact its
    # version away, the resumed watch meets 410 Gone, and the cache lists what it missed.
    emulator = Emulator(KServeConfig(reconcile_delay=0.0, revision_ready_delay=0.0), history_size=1)
    stop = threading.Event()
    with EmulatorServer(emulator) as server:
        emulator.create_namespace(NS)
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        store = ConfigMapStateStore(api)
        store.save(NS, "llama", RolloutState(), resource_version=None, owner_uid=None)
        watches = 0
        lists_then: list[int] = []

        def meanwhile() -> None:
            nonlocal watches
            watches += 1
            if watches == 2:
                lists_then.append(cache.lists)  # the cluster moves on while the cache is away
                # Another client (a pooled connection of this one may have been closed meanwhile).
                other = ConfigMapStateStore(config.new_client_from_config(config_file=str(kubeconfig)))  # type: ignore[no-untyped-call]
                for name in ("mistral", "gemma", "phi"):
                    other.save(NS, name, RolloutState(), resource_version=None, owner_uid=None)

        cache = _configmap_cache(api, timeout=1, before_watch=meanwhile)
        try:
            threading.Thread(target=cache.run, args=(NS, stop), daemon=True).start()
            _wait(
                lambda: cache.get(NS, "kserve-canary-phi") is not None,
                timeout=20,
                what=lambda: f"lists {cache.lists}, resumes {cache.resumes}, watches {watches}",
            )
            assert cache.lists == lists_then[0] + 1  # one list, after the 410
            assert cache.get(NS, "kserve-canary-mistral") is not None
        finally:
            stop.set()
