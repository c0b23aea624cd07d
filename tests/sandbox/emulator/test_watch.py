"""Watch: the official client's ``Watch().stream`` against the emulator's chunked event streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig, ManualClock
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from tests.sandbox.emulator.support import GROUP, NAMESPACE, PLURAL, VERSION, Isvcs, isvc_manifest


def configmap(name: str, labels: dict[str, str] | None = None) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels), data={"k": "v"})


def collect(stream: Iterator[dict[str, Any]], count: int, stopper: watch.Watch) -> list[tuple[str, str]]:
    events = []
    for event in stream:
        events.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
        if len(events) == count:
            stopper.stop()
    return events


class Background:
    """Consume a watch in a thread while the test makes changes."""

    def __init__(self, start: Callable[[], list[tuple[str, str]]]) -> None:
        self.result: list[tuple[str, str]] = []
        self._thread = threading.Thread(target=lambda: self.result.extend(start()), daemon=True)
        self._thread.start()

    def join(self) -> list[tuple[str, str]]:
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the watch did not deliver the expected events"
        return self.result


def test_watch_replays_added_modified_deleted_after_a_resource_version(core: client.CoreV1Api) -> None:
    start = core.list_namespaced_config_map(NAMESPACE).metadata.resource_version
    created = core.create_namespaced_config_map(NAMESPACE, configmap("a"))
    created.data = {"k": "changed"}
    core.replace_namespaced_config_map("a", NAMESPACE, created)
    core.delete_namespaced_config_map("a", NAMESPACE)
    stopper = watch.Watch()
    stream = stopper.stream(
        core.list_namespaced_config_map, NAMESPACE, resource_version=start, timeout_seconds=5
    )
    assert collect(stream, 3, stopper) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


def test_watch_delivers_live_changes_and_resumes_from_the_last_version(core: client.CoreV1Api) -> None:
    start = core.list_namespaced_config_map(NAMESPACE).metadata.resource_version
    stopper = watch.Watch()
    consumer = Background(
        lambda: collect(
            stopper.stream(
                core.list_namespaced_config_map, NAMESPACE, resource_version=start, timeout_seconds=5
            ),
            2,
            stopper,
        )
    )
    time.sleep(0.1)
    core.create_namespaced_config_map(NAMESPACE, configmap("a"))
    core.create_namespaced_config_map(NAMESPACE, configmap("b"))
    assert consumer.join() == [("ADDED", "a"), ("ADDED", "b")]
    # The Watch object remembers the last resourceVersion: a new stream resumes after it.
    core.delete_namespaced_config_map("a", NAMESPACE)
    resumed = stopper.stream(
        core.list_namespaced_config_map,
        NAMESPACE,
        resource_version=stopper.resource_version,
        timeout_seconds=5,
    )
    assert collect(resumed, 1, stopper) == [("DELETED", "a")]


def test_watch_without_a_version_starts_with_the_current_objects_as_added(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(NAMESPACE, configmap("a"))
    stopper = watch.Watch()
    stream = stopper.stream(core.list_namespaced_config_map, NAMESPACE, timeout_seconds=5)
    assert collect(stream, 1, stopper) == [("ADDED", "a")]


def test_watch_from_a_compacted_version_is_410_expired(tmp_path: Any) -> None:
    emulator = Emulator(KServeConfig(), ManualClock(), history_size=5)
    with EmulatorServer(emulator) as server:
        api = config.new_client_from_config(config_file=str(server.write_kubeconfig(tmp_path / "kc.yaml")))
        core = client.CoreV1Api(api)
        first = core.create_namespaced_config_map("default", configmap("c0")).metadata.resource_version
        for index in range(1, 10):
            core.create_namespaced_config_map("default", configmap(f"c{index}"))
        with pytest.raises(ApiException) as expired:
            # timeout_seconds disables the client's one automatic retry after a 410.
            for _ in watch.Watch().stream(
                core.list_namespaced_config_map, "default", resource_version=first, timeout_seconds=2
            ):
                pass
        assert expired.value.status == 410
        assert "too old resource version" in str(expired.value.reason)
        api.close()


def test_watch_honours_timeout_seconds(core: client.CoreV1Api) -> None:
    began = time.monotonic()
    events = list(watch.Watch().stream(core.list_namespaced_config_map, NAMESPACE, timeout_seconds=1))
    assert (
        events == []
    )  # nothing happened, and no bookmarks were asked for (the server sends them every 0.2 s)
    assert 0.9 <= time.monotonic() - began < 3


def test_an_object_leaving_a_label_selection_is_deleted_for_that_watch(core: client.CoreV1Api) -> None:
    start = core.list_namespaced_config_map(NAMESPACE).metadata.resource_version
    core.create_namespaced_config_map(NAMESPACE, configmap("a", {"app": "canary"}))
    core.patch_namespaced_config_map(
        "a",
        NAMESPACE,
        {"metadata": {"labels": {"app": "other"}}},
        _content_type="application/merge-patch+json",
    )
    stopper = watch.Watch()
    stream = stopper.stream(
        core.list_namespaced_config_map, NAMESPACE, label_selector="app=canary", resource_version=start,
        timeout_seconds=5,
    )  # fmt: skip
    assert collect(stream, 2, stopper) == [("ADDED", "a"), ("DELETED", "a")]


def test_bookmarks_are_sent_when_asked_for(core: client.CoreV1Api) -> None:
    stopper = watch.Watch()
    kinds = []
    for event in stopper.stream(
        core.list_namespaced_config_map, NAMESPACE, allow_watch_bookmarks=True, resource_version="1",
        timeout_seconds=5,
    ):  # fmt: skip
        kinds.append(event["type"])
        if event["type"] == "BOOKMARK":
            stopper.stop()
    assert kinds[-1] == "BOOKMARK"
    assert int(stopper.resource_version) >= 1


def test_inferenceservice_watch_namespaced_and_cluster_wide_sees_kserve_status_updates(
    emulator: Emulator, custom: client.CustomObjectsApi, isvcs: Isvcs
) -> None:
    start = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["metadata"]["resourceVersion"]
    isvcs.create(isvc_manifest())
    emulator.advance(0.5)  # KServe reconciles and writes status
    namespaced = watch.Watch()
    events = collect(
        namespaced.stream(
            custom.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL, resource_version=start,
            timeout_seconds=5,
        ),
        2,
        namespaced,
    )  # fmt: skip
    assert events == [("ADDED", "llama"), ("MODIFIED", "llama")]
    cluster = watch.Watch()
    stream = cluster.stream(
        custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, resource_version=start, timeout_seconds=5
    )
    first = next(iter(stream))
    cluster.stop()
    assert first["type"] == "ADDED"
    assert first["object"]["metadata"]["namespace"] == NAMESPACE


def test_a_watch_the_client_stopped_is_closed_on_the_server(
    emulator: Emulator, core: client.CoreV1Api
) -> None:
    core.create_namespaced_config_map(NAMESPACE, configmap("a"))
    stopper = watch.Watch()
    for _ in stopper.stream(core.list_namespaced_config_map, NAMESPACE):
        stopper.stop()  # after the initial ADDED; nothing more will be written to this idle stream
    deadline = time.monotonic() + 3
    while emulator.store.open_watches and time.monotonic() < deadline:
        time.sleep(0.05)
    assert emulator.store.open_watches == 0
