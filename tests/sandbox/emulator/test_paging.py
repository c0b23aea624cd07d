"""Lists with ``limit``/``continue``, through the official client over HTTP, as the apiserver pages them.

Upstream, kubernetes ``staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go`` ``GetList``: at most
``limit`` items; ``if hasMore { next, err := storage.EncodeContinue(string(lastKey)+"\\x00", keyPrefix,
withRev) ...}`` so the next page starts after the last key, at the same revision; ``remainingItemCount``
only ``if opts.Predicate.Empty()``. ``storage/continue.go``: the token is ``base64.RawURLEncoding`` of
``{"v":"meta.k8s.io/v1","rv":N,"start":KEY}`` (``EncodeContinue``); ``DecodeContinue`` refuses anything
else with "continue key is not valid". ``storage/etcd3/errors.go``: ``continueExpired`` "The provided
continue parameter is too old to display a consistent list result. …" (410 Expired).
"""

from __future__ import annotations

import base64
import json

import pytest
from canary_sandbox.emulator import Emulator
from canary_sandbox.emulator.paging import KEPT_LISTS
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.sandbox.emulator.support import NAMESPACE


def _configmap(core: client.CoreV1Api, name: str, **labels: str) -> None:
    body = {"metadata": {"name": name, "labels": labels}, "data": {"k": name}}
    core.create_namespaced_config_map(NAMESPACE, body)


def _names(listed: client.V1ConfigMapList) -> list[str]:
    return [item.metadata.name for item in listed.items]


def test_pages_are_consistent_snapshots_with_the_apiservers_continue_token(core: client.CoreV1Api) -> None:
    for index in range(7):
        _configmap(core, f"cm-{index}", app="paged")
    first = core.list_namespaced_config_map(NAMESPACE, limit=3)
    assert _names(first) == ["cm-0", "cm-1", "cm-2"]
    assert first.metadata.remaining_item_count == 4  # no selector: the count is told
    token = json.loads(base64.urlsafe_b64decode(first.metadata._continue + "=="))
    assert token == {
        "v": "meta.k8s.io/v1",
        "rv": int(first.metadata.resource_version),
        "start": f"{NAMESPACE}/cm-2\x00",
    }

    # Changes between pages are not in the list: it is the snapshot of the first page's revision.
    core.delete_namespaced_config_map("cm-4", NAMESPACE)
    _configmap(core, "cm-5a", app="paged")
    second = core.list_namespaced_config_map(NAMESPACE, limit=3, _continue=first.metadata._continue)
    assert _names(second) == ["cm-3", "cm-4", "cm-5"]
    assert second.metadata.resource_version == first.metadata.resource_version
    last = core.list_namespaced_config_map(NAMESPACE, limit=3, _continue=second.metadata._continue)
    assert _names(last) == ["cm-6"]
    assert last.metadata._continue is None
    assert last.metadata.remaining_item_count is None


def test_a_selected_list_fills_its_pages_and_tells_no_count(core: client.CoreV1Api) -> None:
    for index in range(6):
        _configmap(core, f"cm-{index}", **({"app": "mine"} if index % 2 == 0 else {"app": "other"}))
    first = core.list_namespaced_config_map(NAMESPACE, label_selector="app=mine", limit=2)
    assert _names(first) == ["cm-0", "cm-2"]
    assert first.metadata.remaining_item_count is None
    rest = core.list_namespaced_config_map(
        NAMESPACE, label_selector="app=mine", limit=2, _continue=first.metadata._continue
    )
    assert _names(rest) == ["cm-4"]


def test_bad_and_expired_tokens_are_refused_as_the_apiserver_does(
    emulator: Emulator, core: client.CoreV1Api
) -> None:
    for index in range(3):
        _configmap(core, f"cm-{index}")
    with pytest.raises(ApiException) as bad:
        core.list_namespaced_config_map(NAMESPACE, limit=1, _continue="not-a-token")
    assert bad.value.status == 400
    assert "continue key is not valid" in json.loads(bad.value.body)["message"]

    first = core.list_namespaced_config_map(NAMESPACE, limit=1)
    with pytest.raises(ApiException) as with_version:
        core.list_namespaced_config_map(
            NAMESPACE, limit=1, _continue=first.metadata._continue, resource_version="1"
        )
    assert with_version.value.status == 400
    assert json.loads(with_version.value.body)["message"] == (
        "specifying resource version is not allowed when using continue"
    )

    for index in range(KEPT_LISTS):  # lists at later revisions: the first one's snapshot is compacted
        _configmap(core, f"later-{index}")
        core.list_namespaced_config_map(NAMESPACE, limit=1)
    with pytest.raises(ApiException) as expired:
        core.list_namespaced_config_map(NAMESPACE, limit=1, _continue=first.metadata._continue)
    assert expired.value.status == 410
    status = json.loads(expired.value.body)
    assert status["reason"] == "Expired"
    assert status["message"].startswith("The provided continue parameter is too old")
