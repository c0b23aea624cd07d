"""Server-side apply (``kubectl apply --server-side``) of CRDs and custom objects: the emulator's subset."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from canary_sandbox.emulator import EmulatorServer
from kubernetes import client

from tests.sandbox.emulator.conftest import (
    WIDGET_CRD_NAME,
    WIDGET_GROUP,
    WIDGET_PLURAL,
    WIDGET_VERSION,
    Widgets,
    widget,
    widget_crd,
)
from tests.sandbox.emulator.support import NAMESPACE

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


class Kubectl:
    def __init__(self, kubeconfig: Path, home: Path) -> None:
        self.environment = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(home)}
        self.home = home

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        completed = subprocess.run(
            [KUBECTL, "--cache-dir", str(self.home / "cache"), *args],
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert completed.returncode == 0, completed.stderr
        return completed

    def apply(
        self, document: dict[str, Any], *flags: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        path = self.home / "applied.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        return self("apply", "--server-side", *flags, "-f", str(path), check=check)


@pytest.fixture
def kubectl(server: EmulatorServer, kubeconfig: Path, tmp_path: Path) -> Kubectl:
    return Kubectl(kubeconfig, tmp_path)


def _apply_request(server: EmulatorServer, path: str, document: Any, query: str = "") -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{server.url}{path}{query}", data=yaml.safe_dump(document).encode(), method="PATCH"
    )
    request.add_header("Content-Type", "application/apply-patch+yaml")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_server_side_apply_installs_a_crd_and_records_its_manager(
    kubectl: Kubectl, apiextensions: client.ApiextensionsV1Api
) -> None:
    applied = kubectl.apply(widget_crd())
    assert (
        applied.stdout.strip()
        == f"customresourcedefinition.apiextensions.k8s.io/{WIDGET_CRD_NAME} serverside-applied"
    )
    crd = apiextensions.read_custom_resource_definition(WIDGET_CRD_NAME)
    assert [(m.manager, m.operation) for m in crd.metadata.managed_fields] == [("kubectl", "Apply")]
    kubectl("wait", "--for=condition=Established", f"crd/{WIDGET_CRD_NAME}", "--timeout=10s")


def test_server_side_apply_creates_updates_and_removes_what_is_no_longer_applied(
    kubectl: Kubectl, widgets: Widgets
) -> None:
    kubectl.apply(widget(owner="ml", selector={"a": "1", "b": "2"}))
    created = widgets.get()
    assert created["spec"]["owner"] == "ml"
    (entry,) = created["metadata"]["managedFields"]
    assert entry["manager"] == "kubectl" and entry["fieldsType"] == "FieldsV1"
    assert entry["fieldsV1"]["f:spec"]["f:selector"] == {"f:a": {}, "f:b": {}}

    kubectl.apply(widget(window="1h", selector={"a": "1"}))
    updated = widgets.get()
    assert updated["spec"]["window"] == "1h"
    assert "owner" not in updated["spec"]  # applied before, not now, owned by no one else: removed
    assert updated["spec"]["selector"] == {"a": "1"}
    assert updated["spec"]["replicas"] == 1  # defaults are the server's, never the applier's to remove
    assert updated["metadata"]["generation"] == 2


def test_server_side_apply_conflicts_with_another_managers_field_unless_forced(
    kubectl: Kubectl, widgets: Widgets
) -> None:
    kubectl.apply(widget(owner="ml"))
    conflicted = kubectl.apply(widget(owner="ops"), "--field-manager=ops-team", check=False)
    assert conflicted.returncode == 1
    assert 'conflict with "kubectl": .spec.owner' in conflicted.stderr
    assert widgets.get()["spec"]["owner"] == "ml"

    same_value = kubectl.apply(widget(owner="ml"), "--field-manager=ops-team")  # shared ownership
    assert same_value.returncode == 0

    kubectl.apply(widget(owner="ops"), "--field-manager=ops-team", "--force-conflicts")
    forced = widgets.get()
    assert forced["spec"]["owner"] == "ops"
    owners = {m["manager"]: m["fieldsV1"] for m in forced["metadata"]["managedFields"]}
    assert "f:owner" in owners["ops-team"]["f:spec"]
    assert "f:owner" not in owners["kubectl"].get("f:spec", {})


def test_server_side_apply_without_a_field_manager_is_invalid(
    widgets: Widgets, server: EmulatorServer
) -> None:
    path = f"/apis/{WIDGET_GROUP}/{WIDGET_VERSION}/namespaces/{NAMESPACE}/{WIDGET_PLURAL}/alpha"
    status, body = _apply_request(server, path, widget())
    assert status == 422
    assert body["details"]["causes"][0]["field"] == "fieldManager"
    status, body = _apply_request(server, path, widget(), "?fieldManager=tests")
    assert status == 201
    assert body["metadata"]["managedFields"][0]["manager"] == "tests"


def test_server_side_apply_is_validated_and_strict_about_unknown_fields(
    widgets: Widgets, server: EmulatorServer
) -> None:
    path = (
        f"/apis/{WIDGET_GROUP}/{WIDGET_VERSION}/namespaces/{NAMESPACE}/{WIDGET_PLURAL}/alpha?fieldManager=t"
    )
    status, body = _apply_request(server, path, widget(replicas=99))
    assert (status, body["reason"]) == (422, "Invalid")
    status, body = _apply_request(server, path, widget(typo=1))
    assert status == 400
    assert 'unknown field "spec.typo"' in body["message"]
