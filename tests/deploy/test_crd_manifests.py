"""The PromotionPolicy API as shipped: the CRD files, the tenancy roles, the Argo CD health check.

* deploy/crds/promotionpolicies.yaml and charts/kserve-canary/crds/promotionpolicies.yaml are what
  ``kserve-canary schema --crd`` prints now (``make schema`` writes both), render through Kustomize
  and validate strictly against Kubernetes' own schemas for the oldest and newest supported versions.
* The aggregated ClusterRoles give the built-in view/edit/admin roles PromotionPolicies, the same in
  Kustomize and Helm, and nobody but the controller's service account may write their status.
* The Argo CD health check (deploy/argocd) is well-formed, its argocd-cm snippet carries the script
  unchanged, and — where a Lua runtime is available (the ``lupa`` package, or a ``lua`` binary) — the
  script gives every answer of deploy/argocd/health-cases.yaml.
"""

from __future__ import annotations

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
    """A function running the script on one object, or None when no Lua runtime is installed."""
    script = (ARGOCD / "promotionpolicy-health.lua").read_text()
    try:
        from lupa import LuaRuntime  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        binary = (
            shutil.which("lua5.1") or shutil.which("lua") or shutil.which("lua5.4") or shutil.which("lua5.3")
        )
        if binary is None:
            return None
        return lambda obj: _run_binary(binary, script, obj)

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


def _run_binary(binary: str, script: str, obj: dict[str, Any]) -> tuple[str, str]:
    # The object as a Lua table constructor (JSON -> Lua literal), the script wrapped as a function.
    def literal(value: Any) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"[{json.dumps(k)}] = {literal(v)}" for k, v in value.items()) + "}"
        if isinstance(value, list):
            return "{" + ", ".join(literal(v) for v in value) + "}"
        if isinstance(value, bool):
            return "true" if value else "false"
        if value is None:
            return "nil"
        return json.dumps(value)

    program = f"obj = {literal(obj)}\nlocal hs = (function()\n{script}\nend)()\nio.write(hs.status, '\\n', hs.message)"
    completed = subprocess.run(
        [binary, "-"], input=program, capture_output=True, text=True, check=True, timeout=30
    )
    status, _, message = completed.stdout.partition("\n")
    return status, message


@pytest.mark.parametrize("case", health_cases(), ids=lambda case: case["name"])
def test_the_health_script_maps_status_to_argo_cd_health(case: dict[str, Any]) -> None:
    run = _lua_runner()
    if run is None:
        pytest.skip("no Lua runtime here (pip install lupa, or a lua binary): the script is not run")
    health, message = run(case["object"])
    assert health == case["health"], message
    assert case.get("message", "") in message
