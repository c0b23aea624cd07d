"""The real kubectl against CRDs and their objects: apply, get with printer columns, wait."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from canary_sandbox.emulator import Emulator, EmulatorServer
from kubernetes import client

from tests.sandbox.emulator.conftest import WIDGET_CRD_NAME, Widgets, widget, widget_crd
from tests.sandbox.emulator.support import NAMESPACE

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


@dataclass
class Kubectl:
    """Runs the real kubectl against the test's emulator, with its own HOME and discovery cache."""

    environment: dict[str, str]
    cache: Path
    directory: Path

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        completed = subprocess.run(
            [KUBECTL, "--cache-dir", str(self.cache), *args],
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check:
            assert completed.returncode == 0, completed.stderr
        return completed

    def write(self, name: str, *documents: dict[str, Any]) -> str:
        path = self.directory / name
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False), encoding="utf-8")
        return str(path)


@pytest.fixture
def kubectl(server: EmulatorServer, kubeconfig: Path, tmp_path: Path) -> Kubectl:
    environment = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}
    return Kubectl(environment, tmp_path / "cache", tmp_path)


def _rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


def test_kubectl_apply_creates_then_configures_a_crd_and_its_objects(
    kubectl: Kubectl, emulator: Emulator, custom: client.CustomObjectsApi
) -> None:
    crd_file = kubectl.write("crd.yaml", widget_crd())
    assert kubectl("apply", "-f", crd_file).stdout.strip() == (
        f"customresourcedefinition.apiextensions.k8s.io/{WIDGET_CRD_NAME} created"
    )
    kubectl("wait", "--for=condition=Established", f"crd/{WIDGET_CRD_NAME}", "--timeout=10s")
    object_file = kubectl.write("widget.yaml", widget(owner="ml"))
    assert kubectl("apply", "-f", object_file).stdout.strip() == "widget.test.emulator.dev/alpha created"

    changed = widget(window="30m")  # owner removed: client-side apply deletes it (last-applied annotation)
    kubectl.write("widget.yaml", changed)
    assert kubectl("apply", "-f", object_file).stdout.strip() == "widget.test.emulator.dev/alpha configured"
    live = Widgets(custom).get()
    assert live["spec"]["window"] == "30m"
    assert "owner" not in live["spec"]
    assert "kubectl.kubernetes.io/last-applied-configuration" in live["metadata"]["annotations"]
    assert live["metadata"]["generation"] == 2
    assert kubectl("apply", "-f", object_file).stdout.strip() == "widget.test.emulator.dev/alpha unchanged"
    patches = emulator.requests.entries(method="PATCH")
    assert {entry.content_type for entry in patches} == {"application/merge-patch+json"}

    crd = widget_crd()
    crd["spec"]["names"]["shortNames"] = ["wd", "wdg"]
    kubectl.write("crd.yaml", crd)
    assert "configured" in kubectl("apply", "-f", crd_file).stdout
    assert (
        kubectl("get", "wdg", "-n", NAMESPACE, "-o", "name").stdout.strip()
        == "widget.test.emulator.dev/alpha"
    )


def test_kubectl_apply_of_an_unknown_field_fails_strict_validation(
    kubectl: Kubectl, widgets: Widgets
) -> None:
    object_file = kubectl.write("widget.yaml", widget(typo="x"))
    failed = kubectl("apply", "-f", object_file, check=False)
    assert failed.returncode == 1
    assert 'strict decoding error: unknown field "spec.typo"' in failed.stderr
    # warn: kubectl shows the server's warning and the field is pruned
    warned = kubectl("apply", "--validate=warn", "-f", object_file)
    assert 'unknown field "spec.typo"' in warned.stderr
    assert "typo" not in widgets.get()["spec"]


def test_kubectl_apply_of_an_invalid_object_shows_the_servers_message(
    kubectl: Kubectl, widgets: Widgets
) -> None:
    object_file = kubectl.write("widget.yaml", widget(replicas="three"))
    failed = kubectl("apply", "-f", object_file, check=False)
    assert failed.returncode == 1
    assert (
        'spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string"'
        in (failed.stderr)
    )


def test_kubectl_get_shows_printer_columns(kubectl: Kubectl, widgets: Widgets) -> None:
    widgets.create(widget("alpha", replicas=3))
    widgets.patch_status({"status": {"conditions": [{"type": "Ready", "status": "True"}], "weight": 0.5}})
    widgets.create(widget("beta", window="1h"))
    assert _rows(kubectl("get", "widgets", "-n", NAMESPACE).stdout) == [
        ["NAME", "WINDOW", "REPLICAS", "READY", "AGE"],
        ["alpha", "5m", "3", "True", "0s"],
        ["beta", "1h", "1", "0s"],  # an empty READY cell
    ]


def test_kubectl_get_wide_adds_the_priority_columns(kubectl: Kubectl, widgets: Widgets) -> None:
    widgets.create(widget())
    widgets.patch_status({"status": {"weight": 0.25, "promoted": True}})
    assert _rows(kubectl("get", "wd", "-n", NAMESPACE, "-o", "wide").stdout) == [
        ["NAME", "WINDOW", "REPLICAS", "READY", "WEIGHT", "PROMOTED", "AGE"],
        ["alpha", "5m", "1", "0.25", "true", "0s"],
    ]


def test_kubectl_get_all_namespaces_and_age(
    kubectl: Kubectl, widgets: Widgets, core: client.CoreV1Api, emulator: Emulator
) -> None:
    core.create_namespace({"metadata": {"name": "other"}})
    widgets.create(widget("alpha"))
    widgets.create(widget("beta", namespace="other"))
    emulator.advance(300)
    assert _rows(kubectl("get", "widget", "-A").stdout) == [
        ["NAMESPACE", "NAME", "WINDOW", "REPLICAS", "READY", "AGE"],
        [NAMESPACE, "alpha", "5m", "1", "5m"],
        ["other", "beta", "5m", "1", "5m"],
    ]


def test_kubectl_get_crd_lists_it(kubectl: Kubectl, widgets: Widgets) -> None:
    assert _rows(kubectl("get", "crd").stdout) == [
        ["NAME", "CREATED", "AT"],
        [WIDGET_CRD_NAME, "2026-01-01T00:00:00Z"],
    ]


def test_kubectl_wait_for_condition_on_a_custom_object(kubectl: Kubectl, widgets: Widgets) -> None:
    widgets.create(widget())

    def become_ready() -> None:
        time.sleep(1.0)
        widgets.patch_status({"status": {"conditions": [{"type": "Progressing", "status": "True"}]}})
        time.sleep(0.5)
        widgets.patch_status({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})

    writer = threading.Thread(target=become_ready, daemon=True)
    started = time.monotonic()
    writer.start()
    waited = kubectl("wait", "--for=condition=Ready", "widget/alpha", "-n", NAMESPACE, "--timeout=20s")
    assert waited.stdout.strip() == "widget.test.emulator.dev/alpha condition met"
    assert time.monotonic() - started >= 1.4  # it really waited for the second status write
    writer.join(5)


def test_kubectl_wait_times_out_when_the_condition_never_comes(kubectl: Kubectl, widgets: Widgets) -> None:
    widgets.create(widget())
    widgets.patch_status({"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    waited = kubectl(
        "wait", "--for=condition=Ready", "widget/alpha", "-n", NAMESPACE, "--timeout=2s", check=False
    )
    assert waited.returncode == 1
    assert "timed out" in waited.stderr


def test_kubectl_delete_crd_waits_until_its_objects_are_gone(
    kubectl: Kubectl, widgets: Widgets, apiextensions: client.ApiextensionsV1Api
) -> None:
    widgets.create(widget())
    deleted = kubectl("delete", "crd", WIDGET_CRD_NAME, "--timeout=20s")
    assert (
        deleted.stdout.strip() == f'customresourcedefinition.apiextensions.k8s.io "{WIDGET_CRD_NAME}" deleted'
    )
    assert kubectl("get", "widgets", "-A", check=False).returncode == 1
    assert [crd.metadata.name for crd in apiextensions.list_custom_resource_definition().items] == []


def test_kubectl_get_without_printer_columns_shows_name_and_age(
    kubectl: Kubectl,
    apiextensions: client.ApiextensionsV1Api,
    custom: client.CustomObjectsApi,
    emulator: Emulator,
) -> None:
    crd = widget_crd()
    del crd["spec"]["versions"][0]["additionalPrinterColumns"]
    apiextensions.create_custom_resource_definition(crd)
    Widgets(custom).create(widget())
    emulator.advance(90)
    assert _rows(kubectl("get", "widgets", "-n", NAMESPACE).stdout) == [["NAME", "AGE"], ["alpha", "90s"]]


def test_kubectl_get_watch_prints_rows_as_objects_change(kubectl: Kubectl, widgets: Widgets) -> None:
    widgets.create(widget("alpha"))
    process = subprocess.Popen(
        [KUBECTL, "--cache-dir", str(kubectl.cache), "get", "widgets", "-n", NAMESPACE, "-w"],
        env=kubectl.environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = threading.Timer(20, process.kill)  # a missing line must fail the test, not hang it
    deadline.start()
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline().split(), process.stdout.readline().split()]
        widgets.patch({"spec": {"window": "45m"}})
        lines.append(process.stdout.readline().split())
    finally:
        deadline.cancel()
        process.terminate()
        process.wait(10)
    assert lines == [
        ["NAME", "WINDOW", "REPLICAS", "READY", "AGE"],
        ["alpha", "5m", "1", "0s"],
        ["alpha", "45m", "1", "0s"],
    ]


def test_kubectl_explain_reads_the_crd_schema_from_openapi_v3(kubectl: Kubectl, widgets: Widgets) -> None:
    explained = kubectl("explain", "widgets.spec").stdout
    assert "KIND:       Widget" in explained
    assert "replicas\t<integer>" in explained
    assert "enum: Fast, Slow" in explained
