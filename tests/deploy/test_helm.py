"""The Helm chart, rendered by Helm's own Go SDK (helm-python-sdk): lint, values schema, every
values variant validated against Kubernetes' schemas, and the same install as the Kustomize one."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml

from canary.policy import load_paths
from tests.cli.support import invoke
from tests.deploy.manifests import (
    CHART,
    CHART_VARIANTS,
    KUSTOMIZATIONS,
    controller_container,
    kustomize,
    of_kind,
    one,
    render_chart,
    render_chart_text,
    render_notes,
)
from tests.deploy.test_manifests import check_monitoring_kinds, run_flags, validate_all


def test_chart_lints_clean_in_strict_mode() -> None:
    report = helm.lint(CHART, strict=True, namespace="kserve-canary", kube_version="v1.29.0")
    assert report["errors"] == []
    # Severity 2 = warning, 3 = error; "icon is recommended" (1, info) is all that may remain.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("variant", sorted(CHART_VARIANTS))
def test_chart_variants_render_and_validate(variant: str) -> None:
    manifests = render_chart(CHART_VARIANTS[variant])
    assert validate_all(manifests) == []
    assert check_monitoring_kinds(manifests) == []
    flags = run_flags()
    container = controller_container(manifests)
    for argument in container["args"]:
        option = argument.split("=", 1)[0]
        assert option in flags, f"{variant}: {argument!r} is not a flag of `kserve-canary run`"
        if "=" not in argument:
            assert flags[option].is_flag, argument


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"prometheus": {"url": "prometheus:9090"}}, "does not match pattern"),
        ({"replicas": 3}, "additional properties 'replicas' not allowed"),
        ({"watchNamespaces": ["Models"]}, "does not match pattern"),
        ({"gitSync": {"enabled": True}}, "gitSync.repo is required"),
        ({"policies": {"files": {"models": {"model.json": "{}"}}}}, "does not match pattern"),
        # The old shape (file name -> policy) names no namespace: refused, not silently mounted.
        ({"policies": {"files": {"model.yaml": "{}"}}}, "does not match pattern"),
        ({"policies": {"existingConfigMap": "team-policies"}}, "additional properties 'existingConfigMap'"),
        ({"gitSync": {"period": "1 minute"}}, "does not match pattern"),
    ],
)
def test_chart_refuses_wrong_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError) as refused:
        render_chart_text(values)
    assert message in str(refused.value)


def rule_set(manifests: list[dict[str, Any]], kind: str) -> dict[str, list[dict[str, Any]]]:
    return {r["metadata"]["name"]: r["rules"] for r in of_kind(manifests, kind)}


def test_chart_defaults_match_the_cluster_wide_kustomize_install() -> None:
    """Same permissions, same controller arguments, same probes, same alerts, same dashboard."""
    chart = render_chart({"prometheus": {"url": "http://prometheus-operated.monitoring.svc:9090"}})
    kustomized = kustomize(KUSTOMIZATIONS["cluster-wide"])
    assert rule_set(chart, "ClusterRole") == rule_set(kustomized, "ClusterRole")
    assert rule_set(chart, "Role") == rule_set(kustomized, "Role")
    chart_container, kustomize_container = controller_container(chart), controller_container(kustomized)
    for field in ("livenessProbe", "readinessProbe", "resources", "securityContext", "ports"):
        assert chart_container[field] == kustomize_container[field], field
    assert set(kustomize_container["args"]) <= set(chart_container["args"])
    chart_pod = one(chart, "Deployment")["spec"]["template"]["spec"]
    kustomize_pod = one(kustomized, "Deployment")["spec"]["template"]["spec"]
    assert chart_pod["securityContext"] == kustomize_pod["securityContext"]
    assert one(chart, "PrometheusRule")["spec"] == one(kustomized, "PrometheusRule")["spec"]
    dashboards = [
        m for m in chart if m["kind"] == "ConfigMap" and m["metadata"]["name"].endswith("-dashboard")
    ]
    assert dashboards[0]["data"] == one(kustomized, "ConfigMap", "kserve-canary-dashboard")["data"]
    assert dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_shared_files_are_identical_copies() -> None:
    """Kustomize and Helm may only read files under their own roots: two copies, kept equal."""
    base = KUSTOMIZATIONS["base"]
    assert (CHART / "dashboards" / "kserve-canary.json").read_bytes() == (
        base / "dashboards" / "kserve-canary.json"
    ).read_bytes()
    kustomize_rule = yaml.safe_load((base / "prometheusrule.yaml").read_text())
    assert yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text()) == kustomize_rule["spec"]


def test_watch_namespaces_become_roles_and_flags() -> None:
    manifests = render_chart(CHART_VARIANTS["namespaced"])
    roles = [
        r
        for r in of_kind(manifests, "Role")
        if not r["metadata"]["name"].endswith(("-leader-election", "-knative-config", "-file-status"))
    ]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["models", "vision"]
    # The file policies' status lives in the release namespace, which no watched namespace covers.
    (status,) = [r for r in of_kind(manifests, "Role") if r["metadata"]["name"].endswith("-file-status")]
    assert status["metadata"]["namespace"] == "kserve-canary"
    (knative,) = [r for r in of_kind(manifests, "Role") if r["metadata"]["name"].endswith("-knative-config")]
    assert knative["metadata"]["namespace"] == "knative-serving"
    assert knative["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["config-deployment"],
            "verbs": ["get"],
        }
    ]
    bindings = [
        b for b in of_kind(manifests, "RoleBinding") if b["metadata"]["namespace"] in {"models", "vision"}
    ]
    assert all(b["subjects"][0]["namespace"] == "kserve-canary" for b in bindings) and len(bindings) == 2
    assert not of_kind(manifests, "ClusterRoleBinding")
    args = controller_container(manifests)["args"]
    assert [a for a in args if a.startswith("--namespace=")] == ["--namespace=models", "--namespace=vision"]


def test_prometheus_auth_values_become_flags_and_a_mounted_secret() -> None:
    manifests = render_chart(CHART_VARIANTS["prometheus-auth"])
    container = controller_container(manifests)
    args = container["args"]
    assert "--prometheus-header=X-Scope-OrgID=ml-platform" in args
    assert "--prometheus-token-file=/var/run/secrets/kserve-canary/prometheus/token" in args
    assert "--prometheus-ca-file=/var/run/secrets/kserve-canary/prometheus/ca.crt" in args
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PROMETHEUS_URL"] == "https://mimir-gateway.monitoring.svc/prometheus"
    volumes = {v["name"]: v for v in one(manifests, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["prometheus-auth"]["secret"]["secretName"] == "kserve-canary-prometheus"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["prometheus-auth"]["readOnly"] is True
    # A token of the service account made for Prometheus alone (its audience), never the API token.
    audience = render_chart(CHART_VARIANTS["service-account-token"])
    container = controller_container(audience)
    assert (
        "--prometheus-token-file=/var/run/secrets/kserve-canary/prometheus-token/token" in container["args"]
    )
    assert not [a for a in container["args"] if "kubernetes.io/serviceaccount" in a]
    volumes = {v["name"]: v for v in one(audience, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    (source,) = volumes["prometheus-token"]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "prometheus.monitoring.svc"
    assert {"name": "prometheus-token", "mountPath": "/var/run/secrets/kserve-canary/prometheus-token",
            "readOnly": True} in container["volumeMounts"]  # fmt: skip


@pytest.mark.parametrize(
    "prometheus",
    [
        {"serviceAccountToken": {"enabled": True}},
        {"tokenFile": "/var/run/secrets/token"},
        {"auth": {"existingSecret": "prometheus-token"}},
    ],
)
def test_a_token_never_goes_to_plain_http(prometheus: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmError, match="only to an https:// prometheus.url"):
        render_chart_text({"prometheus": {"url": "http://prometheus.monitoring.svc:9090", **prometheus}})
    render_chart_text({"prometheus": {"url": "https://prometheus.monitoring.svc:9091", **prometheus}})
    allowed = {"url": "http://localhost:9090", "allowTokenOverHttp": True, **prometheus}
    render_chart_text({"prometheus": allowed})


def test_notification_secret_and_policy_files() -> None:
    manifests = render_chart(CHART_VARIANTS["notifications-and-policies"])
    secret = one(manifests, "Secret")
    assert secret["stringData"] == {"SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/XXXX"}
    container = controller_container(manifests)
    assert container["envFrom"] == [{"secretRef": {"name": secret["metadata"]["name"]}}]
    # The secret's value never appears anywhere but in the Secret.
    others = yaml.safe_dump([m for m in manifests if m["kind"] != "Secret"])
    assert "hooks.slack.com" not in others
    policies = one(manifests, "ConfigMap", "kserve-canary-policies-models")
    assert set(policies["data"]) == {"sklearn-iris.yaml"}
    assert policies["metadata"]["labels"]["kserve-canary.dev/policy-namespace"] == "models"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/etc/kserve-canary/policies/models"] == "policies-models"

    existing = render_chart(CHART_VARIANTS["existing-secrets-and-configmap"])
    assert not of_kind(existing, "Secret")
    assert controller_container(existing)["envFrom"] == [{"secretRef": {"name": "team-notifications"}}]
    volumes = one(existing, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "policies-models", "configMap": {"name": "team-policies"}} in volumes
    assert not [m for m in of_kind(existing, "ConfigMap") if "-policies" in m["metadata"]["name"]]


def test_policy_files_in_values_load_as_policies(tmp_path: Any) -> None:
    manifests = render_chart(CHART_VARIANTS["notifications-and-policies"])
    # As mounted: <policy root>/<namespace>/<file>.
    for mount in controller_container(manifests)["volumeMounts"]:
        if mount["mountPath"].startswith("/etc/kserve-canary/policies/"):
            namespace = mount["mountPath"].rsplit("/", 1)[1]
            configmap = one(manifests, "ConfigMap", f"kserve-canary-policies-{namespace}")
            (tmp_path / namespace).mkdir()
            for name, text in configmap["data"].items():
                (tmp_path / namespace / name).write_text(text)
    result = load_paths([tmp_path])
    assert result.ok and len(result.policies) == 1, [str(e) for e in result.errors]


@pytest.mark.parametrize("variant", ["git-sync-https", "git-sync-ssh"])
def test_git_sync_feeds_the_policy_directory(variant: str) -> None:
    values = CHART_VARIANTS[variant]
    manifests = render_chart(values)
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "git-sync")
    init = next(c for c in pod["initContainers"] if c["name"] == "git-sync-init")
    assert "--one-time" in init["args"] and "--one-time" not in sidecar["args"]
    assert any(a.startswith("--period=") for a in sidecar["args"])
    repo = values["gitSync"]["repo"]
    for container in (init, sidecar):
        assert f"--repo={repo}" in container["args"] and "--link=current" in container["args"]
        assert {"name": "git", "mountPath": "/git"} in container["volumeMounts"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
    controller = controller_container(manifests)
    path = values["gitSync"]["path"]
    expected = "/git/current" + (f"/{path}" if path else "")
    assert f"--policies={expected}" in controller["args"]
    assert {"name": "git", "mountPath": "/git", "readOnly": True} in controller["volumeMounts"]
    assert not [v for v in pod["volumes"] if v["name"].startswith("polic")]
    assert not [m for m in of_kind(manifests, "ConfigMap") if m["metadata"]["name"].endswith("-policies")]
    if values["gitSync"]["auth"].get("type") == "ssh":
        assert "--ssh-key-file=/etc/git-secret/ssh" in sidecar["args"]
        assert "GITSYNC_USERNAME" not in {e["name"] for e in sidecar["env"]}
    else:
        assert "--password-file=/etc/git-secret/password" in sidecar["args"]
        assert {
            "name": "GITSYNC_USERNAME",
            "valueFrom": {"secretKeyRef": {"name": "git-credentials", "key": "username"}},
        } in sidecar["env"]


def test_leader_election_off_means_no_lease_permissions() -> None:
    for variant in ("single-replica-without-election", "dry-run"):
        manifests = render_chart(CHART_VARIANTS[variant])
        args = controller_container(manifests)["args"]
        assert "--no-leader-elect" in args and "--leader-elect" not in args
        assert not [
            r for r in of_kind(manifests, "Role") if r["metadata"]["name"].endswith("-leader-election")
        ]
    assert "--dry-run" in controller_container(render_chart(CHART_VARIANTS["dry-run"]))["args"]


def test_release_name_prefixes_and_two_releases_do_not_share_a_lease() -> None:
    first = render_chart(name="canary-a")
    second = render_chart(name="canary-b")
    lease = {
        name: next(a for a in controller_container(m)["args"] if a.startswith("--lease-name="))
        for name, m in (("a", first), ("b", second))
    }
    assert lease["a"] != lease["b"]
    for manifests in (first, second):
        role = next(
            r for r in of_kind(manifests, "Role") if r["metadata"]["name"].endswith("-leader-election")
        )
        lease_name = next(a for a in controller_container(manifests)["args"] if a.startswith("--lease-name="))
        assert role["rules"][1]["resourceNames"] == [lease_name.split("=", 1)[1]]


def test_monitoring_can_be_switched_off() -> None:
    manifests = render_chart(CHART_VARIANTS["no-monitoring-operator"])
    assert not {"ServiceMonitor", "PrometheusRule"} & {m["kind"] for m in manifests}
    assert not [m for m in of_kind(manifests, "ConfigMap") if m["metadata"]["name"].endswith("-dashboard")]


def test_notes_tell_where_policies_come_from() -> None:
    assert "no policies yet" in render_notes()
    assert "namespace models: ConfigMap kserve-canary-policies-models" in render_notes(
        CHART_VARIANTS["notifications-and-policies"]
    )
    notes = render_notes(CHART_VARIANTS["git-sync-https"])
    assert "https://github.com/acme/ml-rollouts (main, policies/prod/<namespace>/)" in notes
    assert "every namespace" in render_notes() and "models, vision" in render_notes(
        CHART_VARIANTS["namespaced"]
    )


def test_secret_scope_values_become_flags_and_per_namespace_mounts(tmp_path: Any) -> None:
    """Which secrets each namespace's policies may name; the shipped examples load under it."""
    manifests = render_chart(CHART_VARIANTS["secret-scope"])
    container = controller_container(manifests)
    args = container["args"]
    assert [a for a in args if a.startswith("--secret-env-allow=")] == [
        "--secret-env-allow=ml=SLACK_WEBHOOK_URL",
        "--secret-env-allow=ml=DEPLOY_HOOK_URL",
        "--secret-env-allow=payments=DEPLOY_HOOK_URL",
    ]
    assert "--secret-file-root=/var/run/secrets/kserve-canary/policy-secrets" in args
    assert "--notify-allow-host=hooks.internal.example" in args
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    mount = mounts["/var/run/secrets/kserve-canary/policy-secrets/ml"]
    volumes = {v["name"]: v for v in one(manifests, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["secret"]["secretName"] == "kserve-canary-policy-secrets-ml"
    # The policies as mounted, validated with the scope the controller gets.
    for namespace in ("ml", "payments"):
        configmap = one(manifests, "ConfigMap", f"kserve-canary-policies-{namespace}")
        (tmp_path / namespace).mkdir()
        for name, text in configmap["data"].items():
            (tmp_path / namespace / name).write_text(text)
    scope = [a for a in args if a.startswith(("--secret-env-allow=", "--secret-file-root="))]
    completed = invoke("validate", *scope, str(tmp_path))
    assert completed.returncode == 0, completed.stdout
    # With a scope that opens less (only the file root), the same policies are refused, as the
    # controller would refuse them; without any scope, validate leaves the decision to the controller.
    narrower = invoke("validate", "--secret-file-root=/nonexistent", str(tmp_path))
    assert narrower.returncode == 1, "with a narrower scope the same policies are refused"
