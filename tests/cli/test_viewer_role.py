"""`kserve-canary status` with the viewer role, which reads no ConfigMap of a team's namespace (#35
item 11): PromotionPolicy statuses for objects, the one ConfigMap kserve-canary-file-policies (written
by the controller's own code) for policy files.

The emulator does not enforce RBAC. So every request the viewer role does not grant (listing or
getting ConfigMaps other than kserve-canary-file-policies) is answered 403 as the apiserver would,
and every request `status` made, as recorded from real HTTP by the emulator, is checked against the
viewer role's rules as Kustomize and Helm render them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from kubernetes import client, config

from canary.kserve.file_status import FileStatusPublisher, summary_row
from canary.rollout.artefact import Artefact
from canary.rollout.state import Phase
from tests.cli.support import progressing, run
from tests.deploy.manifests import KUSTOMIZATIONS, kustomize, render_chart

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "deploy" / "crds" / "promotionpolicies.yaml"
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def viewer(tmp_path: Path) -> Iterator[tuple[Emulator, Path, Path]]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        for namespace in ("ml", "team-b", "kserve-canary"):
            emulator.create_namespace(namespace)
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        client.ApiextensionsV1Api(api).create_custom_resource_definition(yaml.safe_load(CRD.read_text()))
        _policy_object(api)
        # The controller's own writer, as runtime.py calls it for the rollouts policy files govern.
        state = replace(
            progressing("fraud-predictor-00004"),
            stable_revision="fraud-predictor-00003",
            artefact=Artefact("s3://models/fraud/v4", model_format="xgboost"),
            stable_artefact=Artefact("s3://models/fraud/v3", model_format="xgboost"),
        )
        row = summary_row("team-b", "fraud", "/etc/kserve-canary/policies/team-b/fraud.yaml:1", state)
        assert FileStatusPublisher(api, "kserve-canary").publish([row]) == "written"
        # Answered as the apiserver answers the viewer role: no ConfigMap of a namespace but ours.
        emulator.faults.add(r"/configmaps$", method="GET", status=403, count=None)
        emulator.faults.add(r"/configmaps/(?!kserve-canary-file-policies$)[^/]+$", status=403, count=None)
        emulator.requests.clear()
        home = tmp_path / "home"
        home.mkdir()
        yield emulator, kubeconfig, home


def _policy_object(api: client.ApiClient) -> None:
    objects = client.CustomObjectsApi(api)
    body = {
        "apiVersion": "kserve-canary.dev/v1alpha1",
        "kind": "PromotionPolicy",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {
            "target": {"inferenceService": "llama"},
            "steps": [{"weight": 10}, {"weight": 50}],
            "checks": [{"name": "errors", "metric": "error-rate", "max": "2%"}],
        },
    }
    created = objects.create_namespaced_custom_object(
        "kserve-canary.dev", "v1alpha1", "ml", "promotionpolicies", body
    )
    created["status"] = {
        "phase": "Progressing",
        "canaryRevision": "llama-predictor-00002",
        "stableRevision": "llama-predictor-00001",
        # As the controller projects them (canary/controller/projection.py); the CRD must keep them.
        "canaryArtefact": {"storageUri": "s3://models/llama/v2", "runtime": "kserve-vllm"},
        "stableArtefact": {"storageUri": "s3://models/llama/v1", "runtime": "kserve-vllm"},
        "weight": 10,
        "step": "1/2",
        "lastDecision": {
            "action": "wait",
            "reason": "CanaryWaiting",
            "message": "holding step 1",
            "at": NOW.isoformat().replace("+00:00", "Z"),
        },
    }
    objects.replace_namespaced_custom_object_status(
        "kserve-canary.dev", "v1alpha1", "ml", "promotionpolicies", "llama", created
    )


def _status(kubeconfig: Path, home: Path, *arguments: str) -> str:
    done = run("status", *arguments, home=home, KUBECONFIG=str(kubeconfig), COLUMNS="400")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_status_works_with_the_viewer_role(viewer: tuple[Emulator, Path, Path]) -> None:
    emulator, kubeconfig, home = viewer
    table = _status(kubeconfig, home).splitlines()
    assert [line.split()[:4] for line in table[1:]] == [
        ["ml", "llama", "llama-predictor-00002", "Progressing"],
        ["team-b", "fraud", "fraud-predictor-00004", "Progressing"],
    ]
    assert "holding step 1" in table[1]
    wide = _status(kubeconfig, home, "-n", "team-b", "-o", "wide")
    assert "s3://models/fraud/v4 (format xgboost)" in wide and "s3://models/fraud/v3 (format xgboost)" in wide
    assert "llama" not in wide
    objects = _status(kubeconfig, home, "-n", "ml", "-o", "wide")
    assert "s3://models/llama/v2 (runtime kserve-vllm)" in objects
    assert "s3://models/llama/v1 (runtime kserve-vllm)" in objects
    (one,) = json.loads(_status(kubeconfig, home, "ml/llama", "-o", "json"))
    assert (one["phase"], one["revision"], one["stableRevision"], one["weight"], one["step"]) == (
        "Progressing",
        "llama-predictor-00002",
        "llama-predictor-00001",
        10,
        1,
    )
    (fraud,) = json.loads(_status(kubeconfig, home, "team-b/fraud", "-o", "json"))
    assert fraud["canaryArtefact"]["storageUri"] == "s3://models/fraud/v4"
    assert fraud["phase"] == str(Phase.PROGRESSING)
    _every_request_is_granted(emulator)


# --- RBAC, as the apiserver's authorizer matches a request against a role's rules ------------------

_PATH = re.compile(
    r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?$"
)


def _attributes(method: str, path: str) -> tuple[str, str, str, str | None]:
    """(verb, apiGroup, resource, name) of a resource request, as the apiserver's RequestInfo reads it."""
    found = _PATH.match(path)
    assert found, path
    name = found["name"]
    verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return verb, found["group"] or "", found["resource"], name


def _allows(rules: list[dict[str, Any]], verb: str, group: str, resource: str, name: str | None) -> bool:
    return any(
        group in rule.get("apiGroups", ())
        and resource in rule.get("resources", ())
        and verb in rule.get("verbs", ())
        and (not rule.get("resourceNames") or name in rule["resourceNames"])
        for rule in rules
    )


def _viewer_roles() -> dict[str, list[dict[str, Any]]]:
    kustomized = kustomize(KUSTOMIZATIONS["cluster-wide"])
    charted = render_chart()
    found = {
        "kustomize": [
            m for m in kustomized if m["kind"] == "ClusterRole" and m["metadata"]["name"].endswith("-viewer")
        ],
        "helm": [
            m for m in charted if m["kind"] == "ClusterRole" and m["metadata"]["name"].endswith("-viewer")
        ],
    }
    return {source: roles[0]["rules"] for source, roles in found.items() if len(roles) == 1} | {
        source: [] for source, roles in found.items() if len(roles) != 1
    }


def _every_request_is_granted(emulator: Emulator) -> None:
    entries = [
        entry for entry in emulator.requests.entries(None, None, 0) if not entry.path.startswith("/emulator/")
    ]
    asked = {
        (entry.method, entry.path, entry.status) for entry in entries if not entry.path.startswith("/version")
    }
    assert asked
    for source, rules in _viewer_roles().items():
        assert rules, f"no viewer ClusterRole rendered by {source}"
        assert not _allows(rules, "list", "", "configmaps", None), source
        assert not _allows(rules, "get", "", "configmaps", "kserve-canary-llama"), source
        for method, path, status in asked:
            granted = _allows(rules, *_attributes(method, path))
            # Refused (403) exactly where the role grants nothing; everything else status needs is granted.
            assert granted == (status != 403), (source, method, path, status)
