"""The real kubectl against the emulator: discovery (aggregated and legacy), get, patch, errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig, ManualClock

from tests.sandbox.emulator.support import NAMESPACE, isvc_manifest

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"


@dataclass
class Kubectl:
    """Runs the real kubectl against one emulator, with its own HOME and discovery cache."""

    emulator: Emulator
    environment: dict[str, str]
    cache: Path
    aggregated_discovery: bool

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        completed = subprocess.run(
            [KUBECTL, "--cache-dir", str(self.cache), *args],
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check:
            assert completed.returncode == 0, completed.stderr
        return completed


@pytest.fixture(params=[True, False], ids=["aggregated-discovery", "legacy-discovery"])
def kubectl(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Kubectl]:
    emulator = Emulator(KServeConfig(), ManualClock(), seed=3)
    emulator.create_namespace(NAMESPACE)
    emulator.create(isvc_manifest())
    emulator.advance(1.5)
    with EmulatorServer(emulator, aggregated_discovery=request.param) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        environment = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(tmp_path)}
        yield Kubectl(emulator, environment, tmp_path / "cache", request.param)


def test_kubectl_discovery_uses_what_the_server_offers(kubectl: Kubectl) -> None:
    kubectl("get", "isvc", "-n", NAMESPACE)
    per_group = [e.path for e in kubectl.emulator.requests.entries(method="GET") if e.path.count("/") == 3]
    if kubectl.aggregated_discovery:
        assert per_group == []  # /api and /apis answered everything
    else:
        assert "/apis/serving.kserve.io/v1beta1" in per_group


def test_kubectl_get_isvc_all_namespaces_prints_kserves_columns(kubectl: Kubectl) -> None:
    output = kubectl("get", "isvc", "-A").stdout.splitlines()
    assert output[0].split() == [
        "NAMESPACE", "NAME", "URL", "READY", "PREV", "LATEST", "PREVROLLEDOUTREVISION", "LATESTREADYREVISION", "AGE",
    ]  # fmt: skip
    assert output[1].split()[:6] == [
        "ml",
        "llama",
        "http://llama.ml.example.com",
        "True",
        "100",
        "llama-predictor-00001",
    ]


def test_kubectl_get_inferenceservice_by_name_as_json(kubectl: Kubectl) -> None:
    isvc = json.loads(kubectl("get", "inferenceservice", "llama", "-n", NAMESPACE, "-o", "json").stdout)
    assert isvc["kind"] == "InferenceService"
    assert isvc["status"]["components"]["predictor"]["latestReadyRevision"] == "llama-predictor-00001"


def test_kubectl_merge_patch_sets_the_canary_percentage(kubectl: Kubectl) -> None:
    patch = '{"spec":{"predictor":{"canaryTrafficPercent":10}}}'
    kubectl("patch", "isvc", "llama", "-n", NAMESPACE, "--type=merge", "-p", patch)
    jsonpath = "jsonpath={.spec.predictor.canaryTrafficPercent}"
    assert kubectl("get", "isvc", "llama", "-n", NAMESPACE, "-o", jsonpath).stdout == "10"
    emulator = kubectl.emulator
    (logged,) = emulator.requests.entries(method="PATCH")
    assert logged.content_type == "application/merge-patch+json"
    assert logged.changed_paths == ("spec.predictor.canaryTrafficPercent",)


def test_kubectl_get_pods_configmaps_and_events(kubectl: Kubectl) -> None:
    pods = kubectl("get", "pods", "-n", NAMESPACE).stdout.splitlines()
    assert pods[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert pods[1].split()[1:3] == ["2/2", "Running"]
    emulator = kubectl.emulator
    emulator.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kserve-canary-llama", "namespace": NAMESPACE},
         "data": {"state": "{}"}}
    )  # fmt: skip
    emulator.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "llama.1", "namespace": NAMESPACE},
            "involvedObject": {"kind": "InferenceService", "name": "llama", "namespace": NAMESPACE},
            "reason": "CanaryStarted",
            "message": "canary llama-predictor-00002 at 10%",
            "type": "Normal",
        }
    )
    assert kubectl("get", "configmaps", "-n", NAMESPACE).stdout.split()[:5] == [
        "NAME",
        "DATA",
        "AGE",
        "kserve-canary-llama",
        "1",
    ]
    events = kubectl("get", "events", "-n", NAMESPACE).stdout
    assert "CanaryStarted" in events
    assert "inferenceservice/llama" in events


def test_kubectl_reports_a_missing_inferenceservice_as_not_found(kubectl: Kubectl) -> None:
    completed = kubectl("get", "isvc", "nope", "-n", NAMESPACE, check=False)
    assert completed.returncode == 1
    assert (
        'Error from server (NotFound): inferenceservices.serving.kserve.io "nope" not found'
        in completed.stderr
    )
