"""The ConfigMap cache keeps only what the controller wrote (issue #34, finding 3), against the API
emulator over HTTP: lists read in pages (``limit``/``continue``), foreign, oversized and surplus
ConfigMaps ignored with the reason told, in the list and in watch events alike."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from kubernetes import client, config

from canary.controller.caches import WatchCache, our_configmaps
from canary.kserve.admitted import ConfigMapLimits, list_our_configmaps
from canary.kserve.ledger_store import ConfigMapLedgerStore
from canary.kserve.outbox import ConfigMapOutboxStore
from canary.kserve.store import ConfigMapStateStore, read_configmap, watch_configmaps
from canary.rollout.ledger import RollbackLedger
from canary.rollout.state import RolloutState

NS, OTHER = "team-a", "team-b"
MANAGED = {"app.kubernetes.io/managed-by": "kserve-canary"}
LIMITS = ConfigMapLimits(max_bytes=64 * 1024, per_namespace=4, page=2)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[client.ApiClient]:
    emulator = Emulator(KServeConfig())
    with EmulatorServer(emulator) as server:
        emulator.create_namespace(NS)
        emulator.create_namespace(OTHER)
        yield config.new_client_from_config(config_file=str(server.write_kubeconfig(tmp_path / "kubeconfig")))


def _hostile(core: client.CoreV1Api, name: str, model: str = "m", **parts: object) -> None:
    labels = {**MANAGED, "kserve-canary.dev/inference-service": model}
    core.create_namespaced_config_map(NS, {"metadata": {"name": name, "labels": labels}, **parts})


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_only_the_controllers_own_configmaps_are_kept(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    states, ledgers, outboxes = ConfigMapStateStore(api), ConfigMapLedgerStore(api), ConfigMapOutboxStore(api)
    states.save(NS, "m", RolloutState(), resource_version=None, owner_uid=None)
    ledgers.save(NS, "m", RollbackLedger(), resource_version=None)
    outboxes.write_outbox(NS, "m", '{"entries": []}', resource_version=None, owner_uid=None)
    _hostile(core, "junk", data={"x": "y"})
    _hostile(core, "kserve-canary-n", "n", data={"command.json": "{}", "command-issuer": "alice"})
    _hostile(core, "kserve-canary-o", "o", data={"state.json": "{}", "extra": "z"})
    _hostile(core, "kserve-canary-p", "p", data={"state.json": "{" + "x" * LIMITS.max_bytes})
    _hostile(core, "kserve-canary-q", "q", binaryData={"b": "eHh4"})
    _hostile(core, "kserve-canary-z.ledger", "z", data={"ledger.json": "{}"})  # the label names no ledger

    ignored: list[tuple[str, str, str]] = []
    kept, version = list_our_configmaps(api, None, limits=LIMITS, ignored=lambda *told: ignored.append(told))
    assert sorted(item["metadata"]["name"] for item in kept) == [
        "kserve-canary-m",
        "kserve-canary-m.ledger",
        "m-kserve-canary-outbox",
    ]
    assert version
    reasons = {name: reason for _, name, reason in ignored}
    assert set(reasons) == {
        "junk",
        "kserve-canary-n",
        "kserve-canary-o",
        "kserve-canary-p",
        "kserve-canary-q",
        "kserve-canary-z.ledger",
    }
    assert reasons["junk"].startswith("its name is not the state, ledger or outbox name")
    assert reasons["kserve-canary-n"] == "it has no state.json document"
    assert reasons["kserve-canary-o"] == "it has keys kserve-canary never writes: extra"
    assert "over the 65536 kept per ConfigMap" in reasons["kserve-canary-p"]
    assert reasons["kserve-canary-q"] == "it has binaryData, which kserve-canary never writes"


def test_a_namespace_keeps_at_most_its_count_in_lists_and_watch_events(api: client.ApiClient) -> None:
    states = ConfigMapStateStore(api)
    for index in range(6):
        states.save(NS, f"m{index}", RolloutState(), resource_version=None, owner_uid=None)
    states.save(OTHER, "b", RolloutState(), resource_version=None, owner_uid=None)
    ignored: list[tuple[str, str, str]] = []

    def told(namespace: str, name: str, reason: str) -> None:
        ignored.append((namespace, name, reason))

    core = client.CoreV1Api(api)
    cache = WatchCache(
        "ConfigMap",
        lister=lambda scope: list_our_configmaps(api, scope, limits=LIMITS, ignored=told),
        watcher=lambda scope, version, seconds: watch_configmaps(
            api, scope, version, timeout_seconds=seconds
        ),
        getter=lambda namespace, name: read_configmap(core, namespace, name, 10.0),
        scopes=[None],
        admit=our_configmaps(LIMITS, told),
    )
    stop = threading.Event()
    threading.Thread(target=cache.run, args=(None, stop), daemon=True).start()
    try:
        _wait(lambda: cache.all_synced)
        assert sorted(name for namespace, name in (_key(o) for o in cache.values()) if namespace == NS) == [
            f"kserve-canary-m{index}" for index in range(4)
        ]
        assert cache.get(OTHER, "kserve-canary-b") is not None  # team B is not held by team A's count
        assert [(namespace, name) for namespace, name, _ in ignored] == [
            (NS, "kserve-canary-m4"),
            (NS, "kserve-canary-m5"),
        ]
        assert ignored[0][2] == "its namespace already has the 4 ConfigMaps kept per namespace"
        # A watch event: one more in a full namespace, and one grown over the size limit.
        states.save(NS, "m6", RolloutState(), resource_version=None, owner_uid=None)
        _hostile(core, "kserve-canary-big", "big", data={"state.json": "{" + "x" * LIMITS.max_bytes})
        _wait(lambda: len(ignored) == 4)
        assert cache.get(NS, "kserve-canary-m6") is None
        assert cache.get(NS, "kserve-canary-big") is None
        assert len([key for key in map(_key, cache.values()) if key[0] == NS]) == 4
    finally:
        stop.set()


def _key(obj: dict[str, object]) -> tuple[str, str]:
    meta = obj["metadata"]
    assert isinstance(meta, dict)
    return str(meta["namespace"]), str(meta["name"])


def test_a_page_of_large_configmaps_holds_what_fits_its_bytes(tmp_path: Path) -> None:
    """Pages are sized by the largest item of the page before and grow by doubling: after a small
    state, 1 MB hostile objects come at most two at a time (a page of ten cost about 30 MiB of the
    controller's memory while it was parsed), and pages of small ones grow back to ``page`` items."""
    emulator = Emulator(KServeConfig())
    with EmulatorServer(emulator) as server:
        emulator.create_namespace(NS)
        emulator.create_namespace("a-first")
        api = config.new_client_from_config(config_file=str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        core = client.CoreV1Api(api)
        states = ConfigMapStateStore(api)
        states.save("a-first", "small", RolloutState(), resource_version=None, owner_uid=None)
        for index in range(6):
            _hostile(core, f"a-junk-{index}", data={"blob": "x" * 1_000_000})
        for index in range(24):
            states.save(NS, f"m{index:02}", RolloutState(), resource_version=None, owner_uid=None)
        limits = ConfigMapLimits()
        since = emulator.requests.entries()[-1].sequence
        kept, _ = list_our_configmaps(api, None, limits=limits, ignored=lambda *told: None)
        asked = [
            int(parse_qs(entry.query)["limit"][0])
            for entry in emulator.requests.entries(method="GET", path_contains="/configmaps", since=since)
        ]
    assert len(kept) == 25, asked
    fits = limits.page_bytes // 1_000_000
    assert asked[0] == 1, asked  # the first page: nothing known yet
    # After the small state, the six hostile objects: never more at a time than fit page_bytes.
    assert max(asked[1:7]) <= fits, asked
    assert asked[-1] == limits.page, asked  # small states: full pages again
