"""The PromotionPolicy API as shipped: the CRD files, the tenancy roles, the Argo CD health check.

* deploy/crds/promotionpolicies.yaml and charts/kserve-canary/crds/promotionpolicies.yaml are what
  ``kserve-canary schema --crd`` prints now (``make schema`` writes both), render through Kustomize
  and validate strictly against Kubernetes' own schemas for the oldest and newest supported versions.
* The aggregated ClusterRoles give the built-in view/edit/admin roles PromotionPolicies, the same in
  Kustomize and Helm, and nobody but the controller's service account may write their status.
* The Argo CD health check (deploy/argocd) is well-formed, its argocd-cm snippet carries the script
  unchanged, and the script, run in Lua 5.1 (Argo CD's dialect), gives every answer of
  deploy/argocd/health-cases.yaml.
* The real kubectl against the API emulator (which serves CRDs): the CRD installs with
  ``kubectl apply -k deploy/crds``, every example policy is created as an object, ``kubectl get ppol``
  shows the printer columns, a typo is refused (or pruned), a fractional number of seconds is refused, and the
  two-step wait of docs/gitops.md does not return on the previous revision's Promoted condition.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from canary.cli import app
from canary.policy.crd import CRD_NAME, crd_manifest, crd_yaml
from tests.deploy.manifests import (
    CHART,
    CHART_VARIANTS,
    DEPLOY,
    KUSTOMIZATIONS,
    Manifest,
    kustomize,
    of_kind,
    render_chart,
)
from tests.deploy.rbac import Attributes, Authorizer, Rule
from tests.deploy.test_manifests import validate_all

CRD_FILES = (DEPLOY / "crds" / "promotionpolicies.yaml", CHART / "crds" / "promotionpolicies.yaml")
ARGOCD = DEPLOY / "argocd"
HEALTH_KEY = "resource.customizations.health.kserve-canary.dev_PromotionPolicy"
GROUP = "kserve-canary.dev"
PEOPLE_VERBS = {
    "view": {"get", "list", "watch"},
    "edit": {"get", "list", "watch", "create", "update", "patch", "delete"},
}


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: str(p.relative_to(DEPLOY.parent)))
def test_the_checked_in_crd_is_the_generator_output(path: Path) -> None:
    assert path.read_text() == crd_yaml(), "run `make schema` and commit the CRD files"


def test_schema_crd_prints_the_same_file() -> None:
    printed = CliRunner().invoke(app, ["schema", "--crd"])
    assert printed.exit_code == 0
    assert printed.output == CRD_FILES[0].read_text()
    assert json.loads(CliRunner().invoke(app, ["schema"]).output)["$id"].endswith("promotionpolicy.json")


def test_the_crd_renders_through_kustomize_and_validates() -> None:
    (rendered,) = kustomize(DEPLOY / "crds")
    assert rendered == crd_manifest()
    assert rendered["metadata"]["name"] == CRD_NAME
    assert validate_all([rendered]) == []
    version = rendered["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}} and version["served"] and version["storage"]
    assert rendered["spec"]["scope"] == "Namespaced"


def test_the_crd_is_installed_separately_from_the_controller() -> None:
    """Not in an overlay: a CRD is cluster-wide and outlives an install (deleting it deletes every
    policy), and the docs apply it first (docs/gitops.md)."""
    for name, path in KUSTOMIZATIONS.items():
        assert not of_kind(kustomize(path), "CustomResourceDefinition"), name
    assert "kubectl apply --server-side -k deploy/crds" in (DEPLOY.parent / "docs" / "gitops.md").read_text()


# ---------------------------------------------------------------------------------------------
# Tenancy roles


def aggregated(manifests: Iterable[Manifest], role: str) -> list[Rule]:
    """The rules a built-in role (view, edit, admin) aggregates from these manifests."""
    label = f"rbac.authorization.k8s.io/aggregate-to-{role}"
    return [
        Rule.parse(rule)
        for manifest in of_kind(manifests, "ClusterRole")
        if (manifest["metadata"].get("labels") or {}).get(label) == "true"
        for rule in manifest.get("rules") or []
    ]


def grants(rules: Iterable[Rule]) -> set[tuple[str, str, str]]:
    return set().union(*(rule.grants() for rule in rules))


RENDERS = {
    "kustomize cluster-wide": lambda: kustomize(KUSTOMIZATIONS["cluster-wide"]),
    "kustomize single-namespace": lambda: kustomize(KUSTOMIZATIONS["single-namespace"]),
    "helm defaults": lambda: render_chart(),
    "helm namespaced": lambda: render_chart(CHART_VARIANTS["namespaced"]),
}


@pytest.mark.parametrize("render", sorted(RENDERS))
def test_view_edit_and_admin_include_promotion_policies(render: str) -> None:
    manifests = RENDERS[render]()
    view = grants(aggregated(manifests, "view"))
    edit = grants(aggregated(manifests, "edit"))
    admin = grants(aggregated(manifests, "admin"))
    assert view == {(GROUP, "promotionpolicies", verb) for verb in PEOPLE_VERBS["view"]}
    assert edit == {(GROUP, "promotionpolicies", verb) for verb in PEOPLE_VERBS["edit"]}
    assert admin == edit
    # The roles are only aggregated, never bound to anybody by the install.
    names = {
        m["metadata"]["name"]
        for m in of_kind(manifests, "ClusterRole")
        if "promotionpolicies" in m["metadata"]["name"]
    }
    for binding in (m for m in manifests if m["kind"] in {"RoleBinding", "ClusterRoleBinding"}):
        assert binding["roleRef"]["name"] not in names


@pytest.mark.parametrize("render", sorted(RENDERS))
def test_only_the_controller_may_write_promotion_policy_status(render: str) -> None:
    manifests = RENDERS[render]()
    for role in (m for m in manifests if m["kind"] in {"Role", "ClusterRole"}):
        for rule in (Rule.parse(r) for r in role.get("rules") or []):
            if not ({"promotionpolicies/status", "*"} & rule.resources and {GROUP, "*"} & rule.api_groups):
                continue
            # Only roles the controller's service account is bound to.
            bound = Authorizer.for_service_account(manifests, "kserve-canary", "kserve-canary")
            assert any(grant.rule == rule for grant in bound.grants), role["metadata"]["name"]
    people = aggregated(manifests, "admin") + aggregated(manifests, "edit") + aggregated(manifests, "view")
    write = Attributes(GROUP, "promotionpolicies/status", "update", "models", "llama")
    assert not any(rule.allows(write) for rule in people)


def test_helm_and_kustomize_render_the_same_tenancy_roles() -> None:
    def roles(manifests: list[Manifest]) -> dict[str, Any]:
        return {
            m["metadata"]["name"]: (
                m["rules"],
                {
                    k: v
                    for k, v in m["metadata"]["labels"].items()
                    if k.startswith("rbac.authorization.k8s.io/")
                },
            )
            for m in of_kind(manifests, "ClusterRole")
            if "promotionpolicies" in m["metadata"]["name"]
        }

    kustomized = roles(kustomize(KUSTOMIZATIONS["cluster-wide"]))
    assert kustomized == roles(render_chart())
    assert sorted(kustomized) == [
        "kserve-canary-promotionpolicies-edit",
        "kserve-canary-promotionpolicies-view",
    ]
    assert not [
        m for m in render_chart({"rbac": {"create": False}}) if "promotionpolicies" in m["metadata"]["name"]
    ]


# ---------------------------------------------------------------------------------------------
# Argo CD


def health_cases() -> list[dict[str, Any]]:
    cases = yaml.safe_load((ARGOCD / "health-cases.yaml").read_text())
    assert isinstance(cases, list) and cases
    return cases


def test_the_argocd_snippet_carries_the_script_unchanged() -> None:
    snippet = yaml.safe_load((ARGOCD / "argocd-cm-health.yaml").read_text())
    assert snippet["kind"] == "ConfigMap" and snippet["metadata"]["name"] == "argocd-cm"
    assert list(snippet["data"]) == [HEALTH_KEY]
    assert snippet["data"][HEALTH_KEY] == (ARGOCD / "promotionpolicy-health.lua").read_text()
    assert validate_all([snippet]) == []


def test_the_cases_cover_every_health_argo_cd_shows() -> None:
    assert {case["health"] for case in health_cases()} == {"Healthy", "Progressing", "Degraded", "Suspended"}


def _lua_runner() -> Any:
    """A function running the script on one object in Lua 5.1: Argo CD runs health scripts in
    gopher-lua, a Lua 5.1 (lupa, a dev dependency, bundles the reference 5.1 interpreter)."""
    from lupa.lua51 import LuaRuntime  # type: ignore[import-untyped,unused-ignore]

    script = (ARGOCD / "promotionpolicy-health.lua").read_text()

    def run(obj: dict[str, Any]) -> tuple[str, str]:
        runtime = LuaRuntime()

        def table(value: Any) -> Any:
            if isinstance(value, dict):
                return runtime.table_from({key: table(item) for key, item in value.items()})
            if isinstance(value, list):
                return runtime.table_from([table(item) for item in value])
            return value

        runtime.globals().obj = table(obj)
        health = runtime.execute(script)
        return str(health["status"]), str(health["message"])

    return run


@pytest.mark.parametrize("case", health_cases(), ids=lambda case: case["name"])
def test_the_health_script_maps_status_to_argo_cd_health(case: dict[str, Any]) -> None:
    run = _lua_runner()
    health, message = run(case["object"])
    assert health == case["health"], message
    assert case.get("message", "") in message


# ---------------------------------------------------------------------------------------------
# The real kubectl against the API emulator (canary_sandbox.emulator serves CRDs): install, short
# name, printer columns, refused typos, and the two-step revision-safe wait of docs/gitops.md.

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z
KUBECTL_BINARY = shutil.which("kubectl") or "/usr/bin/kubectl"


class Cluster:
    """An emulator with the CRD applied by kubectl, and kubectl with its own HOME and cache."""

    def __init__(self, kubeconfig: Path, home: Path, custom: Any) -> None:
        self.environment = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig), "HOME": str(home)}
        self.home = home
        self.custom = custom

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        completed = subprocess.run(
            [KUBECTL_BINARY, "--cache-dir", str(self.home / "cache"), *args],
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check:
            assert completed.returncode == 0, completed.stderr
        return completed

    def apply(self, name: str, *documents: dict[str, Any]) -> str:
        path = self.home / name
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        return self.kubectl("apply", "-f", str(path)).stdout.strip()

    def write_status(self, name: str, status: dict[str, Any], namespace: str = "ml") -> None:
        live = self.custom.get_namespaced_custom_object(
            GROUP, "v1alpha1", namespace, "promotionpolicies", name
        )
        self.custom.replace_namespaced_custom_object_status(
            GROUP, "v1alpha1", namespace, "promotionpolicies", name, {**live, "status": status}
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig, ManualClock
    from kubernetes import client, config

    emulator = Emulator(KServeConfig(), ManualClock(START), seed=7)
    for namespace in ("ml", "payments", "vision", "models", "demo"):
        emulator.create_namespace(namespace)
    with EmulatorServer(emulator, bookmark_interval=0.2) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig.yaml")
        api = config.new_client_from_config(config_file=str(kubeconfig))
        try:
            running = Cluster(kubeconfig, tmp_path, client.CustomObjectsApi(api))
            # The docs say --server-side; the emulator has no server-side apply, and a client-side
            # apply of the CRD works too (its last-applied annotation is far below the size limit).
            applied = running.kubectl("apply", "-k", str(DEPLOY / "crds")).stdout
            assert applied.strip() == f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME} created"
            running.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=20s")
            yield running
        finally:
            api.close()


def _rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


def _example(name: str = "llama-chat", **spec: Any) -> dict[str, Any]:
    document = yaml.safe_load((DEPLOY.parent / "policies" / "examples" / "ml" / "llm-vllm.yaml").read_text())
    document["metadata"]["name"] = name
    document["spec"].update(spec)
    return document


def test_kubectl_creates_every_example_policy_as_an_object(cluster: Cluster) -> None:
    from tests.policy.test_crd_schema import EXAMPLES

    created = 0
    for index, (label, document) in enumerate(EXAMPLES):
        document = copy.deepcopy(document)
        document["metadata"]["name"] = f"example-{index}"
        if document["metadata"]["namespace"] not in {"ml", "payments", "vision", "models", "demo"}:
            document["metadata"]["namespace"] = "ml"  # an example in docs/: any namespace will do
        assert cluster.apply(f"example-{index}.yaml", document).endswith("created"), label
        created += 1
    listed = _rows(cluster.kubectl("get", "kserve-canary", "-A").stdout)  # the category
    assert len(listed) == created + 1


def test_kubectl_get_ppol_shows_the_printer_columns(cluster: Cluster) -> None:
    from tests.policy.test_crd_schema import full_status

    cluster.apply("policy.yaml", _example())
    assert _rows(cluster.kubectl("get", "ppol", "-n", "ml").stdout) == [
        ["NAME", "TARGET", "PHASE", "WEIGHT", "STEP", "VERDICT", "AGE"],
        ["llama-chat", "llama-chat", "0s"],
    ]
    cluster.write_status("llama-chat", full_status().to_api())
    assert _rows(cluster.kubectl("get", "ppol", "-n", "ml").stdout)[1] == [
        "llama-chat", "llama-chat", "Progressing", "30", "2/3", "pass", "0s",
    ]  # fmt: skip
    assert _rows(cluster.kubectl("get", "promotionpolicies", "-n", "ml", "-o", "wide").stdout) == [
        ["NAME", "TARGET", "PHASE", "WEIGHT", "STEP", "VERDICT", "CANARY", "AGE"],
        ["llama-chat", "llama-chat", "Progressing", "30", "2/3", "pass", "llama-predictor-00002", "0s"],
    ]


def test_a_typo_is_refused_by_kubectl_and_pruned_for_other_clients(cluster: Cluster) -> None:
    """The CRD keeps no unknown field (issue #34): kubectl's server-side field validation (Strict, its
    default) refuses a typo; a client that asks for none gets it pruned, never stored."""
    document = _example()
    document["spec"]["checks"][0]["maxIncrase"] = document["spec"]["checks"][0].pop("maxIncrease")
    path = cluster.home / "typo.yaml"
    path.write_text(yaml.safe_dump(document))
    refused = cluster.kubectl("apply", "-f", str(path), check=False)
    assert refused.returncode != 0
    assert 'unknown field "spec.checks[0].maxIncrase"' in refused.stderr
    cluster.custom.create_namespaced_custom_object(GROUP, "v1alpha1", "ml", "promotionpolicies", document)
    stored = cluster.custom.get_namespaced_custom_object(
        GROUP, "v1alpha1", "ml", "promotionpolicies", "llama-chat"
    )
    assert "maxIncrase" not in stored["spec"]["checks"][0]


def test_a_fractional_number_of_seconds_is_refused_as_documented(cluster: Cluster) -> None:
    path = cluster.home / "fraction.yaml"
    path.write_text(yaml.safe_dump(_example(interval=1.5)))
    refused = cluster.kubectl("apply", "-f", str(path), check=False)
    assert refused.returncode != 0 and "interval" in refused.stderr


def test_the_revision_safe_wait_of_the_docs(cluster: Cluster) -> None:
    """docs/gitops.md: wait for targetGeneration (the controller has seen the change), then Promoted."""
    import threading
    import time

    from tests.policy.test_crd_schema import full_status

    cluster.apply("policy.yaml", _example())
    old = full_status().to_api()
    for condition in old["conditions"]:
        if condition["type"] == "Promoted":  # the previous revision's promotion, still in the status
            condition.update(
                status="True", reason="Succeeded", message="revision llama-predictor-00001 was promoted"
            )
    old.update(targetGeneration=6, canaryRevision="llama-predictor-00001", observedGeneration=1)
    cluster.write_status("llama-chat", old)

    def controller() -> None:
        time.sleep(
            1.0
        )  # sees the new revision: Promoted=False first, with canaryRevision and targetGeneration
        seen = full_status().to_api() | {"observedGeneration": 1}
        for condition in seen["conditions"]:
            condition["observedGeneration"] = 1
        cluster.write_status("llama-chat", seen)
        time.sleep(1.0)  # and promotes it
        done = copy.deepcopy(seen)
        for condition in done["conditions"]:
            if condition["type"] == "Promoted":
                condition.update(
                    status="True", reason="Succeeded", message="revision llama-predictor-00002 was promoted"
                )
        cluster.write_status("llama-chat", done)

    target = "ppol/llama-chat"
    # Why the first step: before the controller has seen the change, Promoted is the old revision's.
    stale = cluster.kubectl("wait", "-n", "ml", target, "--for=condition=Promoted", "--timeout=1s")
    assert stale.stdout.strip().endswith("condition met")
    writer = threading.Thread(target=controller, daemon=True)
    started = time.monotonic()
    writer.start()
    cluster.kubectl(
        "wait", "-n", "ml", target, "--for=jsonpath={.status.targetGeneration}=7", "--timeout=20s"
    )
    assert time.monotonic() - started >= 0.9  # the old Promoted=True did not end the wait
    promoted = cluster.kubectl("wait", "-n", "ml", target, "--for=condition=Promoted", "--timeout=20s")
    assert promoted.stdout.strip() == f"promotionpolicy.{GROUP}/llama-chat condition met"
    revision = cluster.kubectl("get", "-n", "ml", target, "-o", "jsonpath={.status.canaryRevision}").stdout
    assert revision == "llama-predictor-00002"
    writer.join(10)


def test_the_emulator_evaluates_the_crd_s_cel_rules(cluster: Cluster) -> None:
    """The emulator's CEL subset covers every rule of the CRD; each refuses what its model refuses."""
    checks = [{"name": "p99", "metric": "latency", "promql": "up", "max": "1s"}]
    path = cluster.home / "both.yaml"
    path.write_text(yaml.safe_dump(_example(checks=checks)))
    refused = cluster.kubectl("apply", "-f", str(path), check=False)
    assert refused.returncode != 0
    assert "a check needs exactly one of 'metric' (a builtin metric) or 'promql'" in refused.stderr
    notify = [{"slack": {"webhookUrlFrom": {"env": "A", "file": "a"}}}]
    path.write_text(yaml.safe_dump(_example(notify=notify)))
    refused = cluster.kubectl("apply", "-f", str(path), check=False)
    assert "give exactly one of 'env' or 'file'" in refused.stderr
    path.write_text(yaml.safe_dump(_example()))
    created = cluster.kubectl("apply", "-f", str(path))
    assert "does not evaluate" not in created.stderr  # every rule is within the emulator's subset
