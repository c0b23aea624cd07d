"""Objects of a CRD created through the API: CRUD, cluster-wide lists, the status subresource,
metadata.generation and watches, through the official client over HTTP."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from canary_sandbox.emulator import EmulatorServer
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.sandbox.emulator.conftest import (
    WIDGET_GROUP,
    WIDGET_PLURAL,
    WIDGET_VERSION,
    Widgets,
    widget,
    widget_crd,
)
from tests.sandbox.emulator.support import NAMESPACE, raw_request


def test_custom_object_crud_through_custom_objects_api(widgets: Widgets) -> None:
    created = widgets.create(widget(owner="team"))
    assert created["metadata"]["uid"]
    assert created["spec"]["owner"] == "team"
    assert widgets.get()["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]

    patched = widgets.patch({"spec": {"window": "10m"}})
    assert patched["spec"]["window"] == "10m"
    assert int(patched["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])

    replaced = widgets.replace({**patched, "spec": {"window": "1h", "owner": "ops"}})
    assert replaced["spec"]["window"] == "1h" and replaced["spec"]["owner"] == "ops"

    widgets.delete()
    with pytest.raises(ApiException) as missing:
        widgets.get()
    assert missing.value.status == 404
    assert f'{WIDGET_PLURAL}.{WIDGET_GROUP} \\"alpha\\" not found' in str(missing.value.body)


def test_cluster_wide_list_of_namespaced_custom_objects(
    widgets: Widgets, custom: client.CustomObjectsApi, core: client.CoreV1Api
) -> None:
    core.create_namespace({"metadata": {"name": "other"}})
    widgets.create(widget("alpha"))
    widgets.create(widget("beta", namespace="other"))
    listed = custom.list_cluster_custom_object(WIDGET_GROUP, WIDGET_VERSION, WIDGET_PLURAL)
    assert listed["kind"] == "WidgetList"
    assert sorted((i["metadata"]["namespace"], i["metadata"]["name"]) for i in listed["items"]) == [
        (NAMESPACE, "alpha"),
        ("other", "beta"),
    ]
    in_namespace = custom.list_namespaced_custom_object(WIDGET_GROUP, WIDGET_VERSION, "other", WIDGET_PLURAL)
    assert [i["metadata"]["name"] for i in in_namespace["items"]] == ["beta"]


def test_create_in_a_missing_namespace_is_404(widgets: Widgets) -> None:
    with pytest.raises(ApiException) as error:
        widgets.create(widget(namespace="nowhere"))
    assert error.value.status == 404


def test_spec_write_ignores_status_when_status_subresource_declared(widgets: Widgets) -> None:
    created = widgets.create({**widget(), "status": {"phase": "Injected"}})
    assert "status" not in created  # dropped on create
    widgets.patch_status({"status": {"phase": "Running"}})
    patched = widgets.patch({"spec": {"window": "7m"}, "status": {"phase": "Hacked"}})
    assert patched["spec"]["window"] == "7m"
    assert patched["status"] == {"phase": "Running"}
    replaced = widgets.replace({**patched, "status": {"phase": "Replaced"}})
    assert replaced["status"] == {"phase": "Running"}


def test_status_write_ignores_everything_but_status(widgets: Widgets) -> None:
    widgets.create(widget())
    written = widgets.patch_status(
        {"metadata": {"labels": {"sneaky": "yes"}}, "spec": {"window": "9h"}, "status": {"phase": "Ready"}}
    )
    assert written["status"]["phase"] == "Ready"
    assert written["spec"]["window"] == "5m"
    assert "labels" not in written["metadata"]


def test_generation_bumps_on_spec_change_not_on_status_change(widgets: Widgets) -> None:
    assert widgets.create(widget())["metadata"]["generation"] == 1
    status_written = widgets.patch_status({"status": {"phase": "Running", "observedGeneration": 1}})
    assert status_written["metadata"]["generation"] == 1
    labelled = widgets.patch({"metadata": {"labels": {"team": "ml"}}})
    assert labelled["metadata"]["generation"] == 1
    changed = widgets.patch({"spec": {"replicas": 3}})
    assert changed["metadata"]["generation"] == 2
    # observedGeneration is whatever the client writes: the server never touches it
    assert changed["status"]["observedGeneration"] == 1
    assert widgets.patch_status({"status": {"observedGeneration": 2}})["status"]["observedGeneration"] == 2


def test_without_status_subresource_status_is_an_ordinary_field(
    apiextensions: client.ApiextensionsV1Api, custom: client.CustomObjectsApi, server: EmulatorServer
) -> None:
    apiextensions.create_custom_resource_definition(widget_crd(status_subresource=False))
    widgets = Widgets(custom)
    created = widgets.create({**widget(), "status": {"phase": "Given"}})
    assert created["status"] == {"phase": "Given"}
    patched = widgets.patch({"status": {"phase": "Changed"}})
    assert patched["status"] == {"phase": "Changed"}
    # status is part of what generation tracks when it is not a subresource
    assert patched["metadata"]["generation"] == 2
    status, _ = raw_request(
        server.url,
        "PATCH",
        f"/apis/{WIDGET_GROUP}/{WIDGET_VERSION}/namespaces/{NAMESPACE}/{WIDGET_PLURAL}/alpha/status",
        {"status": {"phase": "X"}},
        "application/merge-patch+json",
    )
    assert status == 404


def test_update_without_resource_version_or_with_a_stale_one_is_refused(widgets: Widgets) -> None:
    created = widgets.create(widget())
    widgets.patch({"spec": {"window": "6m"}})
    with pytest.raises(ApiException) as stale:
        widgets.replace(created)
    assert stale.value.status == 409
    unconditional = {**created, "metadata": {"name": "alpha", "namespace": NAMESPACE}}
    with pytest.raises(ApiException) as missing:
        widgets.replace(unconditional)
    assert missing.value.status == 422
    assert "metadata.resourceVersion" in str(missing.value.body)


def test_strategic_merge_patch_of_a_custom_object_is_415(widgets: Widgets, server: EmulatorServer) -> None:
    widgets.create(widget())
    status, body = raw_request(
        server.url,
        "PATCH",
        f"/apis/{WIDGET_GROUP}/{WIDGET_VERSION}/namespaces/{NAMESPACE}/{WIDGET_PLURAL}/alpha",
        {"spec": {"window": "1m"}},
        "application/strategic-merge-patch+json",
    )
    assert status == 415
    assert body["reason"] == "UnsupportedMediaType"


def test_json_patch_of_a_custom_object(widgets: Widgets, custom: client.CustomObjectsApi) -> None:
    widgets.create(widget())
    patched: dict[str, Any] = custom.patch_namespaced_custom_object(
        WIDGET_GROUP,
        WIDGET_VERSION,
        NAMESPACE,
        WIDGET_PLURAL,
        "alpha",
        [{"op": "replace", "path": "/spec/window", "value": "2h"}],
        _content_type="application/json-patch+json",
    )
    assert patched["spec"]["window"] == "2h"


def test_watch_reports_added_modified_deleted_custom_objects(
    widgets: Widgets, custom: client.CustomObjectsApi
) -> None:
    listed = custom.list_namespaced_custom_object(WIDGET_GROUP, WIDGET_VERSION, NAMESPACE, WIDGET_PLURAL)
    assert listed["items"] == []
    events: list[tuple[str, str, str]] = []
    done = threading.Event()

    def follow() -> None:
        stream = watch.Watch()
        # From the list's version: the events come in order however late this thread starts.
        for event in stream.stream(
            custom.list_namespaced_custom_object,
            WIDGET_GROUP,
            WIDGET_VERSION,
            NAMESPACE,
            WIDGET_PLURAL,
            resource_version=listed["metadata"]["resourceVersion"],
            timeout_seconds=10,
        ):
            obj = event["object"]
            events.append((event["type"], obj["metadata"]["name"], obj["spec"]["window"]))
            if event["type"] == "DELETED":
                stream.stop()
        done.set()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    widgets.create(widget())
    widgets.patch({"spec": {"window": "8m"}})
    widgets.delete()
    assert done.wait(10)
    assert events == [("ADDED", "alpha", "5m"), ("MODIFIED", "alpha", "8m"), ("DELETED", "alpha", "8m")]


def test_watch_from_a_resource_version_replays_later_events(
    widgets: Widgets, custom: client.CustomObjectsApi
) -> None:
    created = widgets.create(widget())
    widgets.patch({"spec": {"window": "3m"}})
    stream = watch.Watch()
    seen = []
    for event in stream.stream(
        custom.list_namespaced_custom_object,
        WIDGET_GROUP,
        WIDGET_VERSION,
        NAMESPACE,
        WIDGET_PLURAL,
        resource_version=created["metadata"]["resourceVersion"],
        timeout_seconds=2,
    ):
        seen.append((event["type"], event["object"]["spec"]["window"]))
        stream.stop()
    assert seen == [("MODIFIED", "3m")]


def test_a_seed_file_may_hold_objects_before_their_crd(tmp_path: Path) -> None:
    from canary_sandbox.emulator import Emulator, ManualClock

    emulator = Emulator(clock=ManualClock())
    seed = tmp_path / "seed.yaml"
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    seed.write_text(yaml.safe_dump_all([widget(), widget_crd(), namespace]), encoding="utf-8")
    created = emulator.load_seed_file(seed)
    assert [obj["kind"] for obj in created] == ["Namespace", "CustomResourceDefinition", "Widget"]
    resource = emulator.store.registry.by_kind(f"{WIDGET_GROUP}/{WIDGET_VERSION}", "Widget")
    assert resource is not None
    assert emulator.get(resource, NAMESPACE, "alpha")["spec"]["replicas"] == 1  # defaulted
