"""The pod's own least privilege (issue 17, item 5): the API token only where it is used, network
reach only where it is needed, the probes and metrics only on the pod's IP.

Every installable Kustomize overlay and the chart's variants are checked; the Helm values that
configure NetworkPolicies are checked to reach the rendered objects.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.config import incluster_config

from tests.deploy.manifests import (
    CHART_VARIANTS,
    INSTALLABLE,
    KUSTOMIZATIONS,
    Manifest,
    controller_container,
    kustomize,
    of_kind,
    one,
    render_chart,
)

API_ACCESS = str(Path(incluster_config.SERVICE_TOKEN_FILENAME).parent)

INSTALLS: dict[str, Callable[[], list[Manifest]]] = {
    **{f"kustomize {name}": (lambda name=name: kustomize(KUSTOMIZATIONS[name])) for name in INSTALLABLE},  # type: ignore[misc]
    **{
        f"helm {name}": (lambda name=name: render_chart(CHART_VARIANTS[name]))
        for name in sorted(CHART_VARIANTS)
    },  # type: ignore[misc]
}


@pytest.fixture(params=sorted(INSTALLS))
def install(request: pytest.FixtureRequest) -> list[Manifest]:
    return INSTALLS[request.param]()


def pod_spec(manifests: list[Manifest]) -> Manifest:
    return one(manifests, "Deployment")["spec"]["template"]["spec"]


def test_the_api_token_is_mounted_into_the_controller_alone(install: list[Manifest]) -> None:
    pod = pod_spec(install)
    assert pod["automountServiceAccountToken"] is False
    for account in of_kind(install, "ServiceAccount"):
        assert account["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    sources = volumes["kube-api-access"]["projected"]["sources"]
    token = next(s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s)
    assert token["path"] == "token" and "audience" not in token  # the API server's own audience
    assert {
        "configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    } in sources
    (downward,) = [s["downwardAPI"] for s in sources if "downwardAPI" in s]
    assert downward["items"] == [
        {"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}
    ]
    for container in pod["containers"] + pod.get("initContainers", []):
        mounted = {m["name"]: m for m in container.get("volumeMounts", [])}
        if container["name"] == "controller":
            assert mounted["kube-api-access"] == {
                "name": "kube-api-access",
                "mountPath": API_ACCESS,
                "readOnly": True,
            }
        else:  # git-sync: code that talks to the outside world holds no cluster credentials
            assert "kube-api-access" not in mounted, container["name"]
            assert not [m for m in mounted.values() if m["mountPath"].startswith("/var/run/secrets")]


def test_the_kubernetes_client_finds_the_projected_files(tmp_path: Path) -> None:
    """The in-cluster loader reads exactly the file names the projected volume writes."""
    volumes = {v["name"]: v for v in pod_spec(kustomize(KUSTOMIZATIONS["cluster-wide"]))["volumes"]}
    written = set()
    for source in volumes["kube-api-access"]["projected"]["sources"]:
        if "serviceAccountToken" in source:
            written.add(source["serviceAccountToken"]["path"])
        for kind in ("configMap", "downwardAPI"):
            written.update(item["path"] for item in source.get(kind, {}).get("items", []))
    assert written == {"token", "ca.crt", "namespace"}
    assert Path(incluster_config.SERVICE_TOKEN_FILENAME).name in written
    assert Path(incluster_config.SERVICE_CERT_FILENAME).name in written
    (tmp_path / "token").write_text("projected-token")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    loader = incluster_config.InClusterConfigLoader(
        token_filename=str(tmp_path / "token"),
        cert_filename=str(tmp_path / "ca.crt"),
        environ={"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"},
    )
    configuration = client.Configuration()
    loader.load_and_set(configuration)  # this object only, not the process-wide default
    assert configuration.api_key["BearerToken"].lower() == "bearer projected-token"
    assert configuration.host == "https://10.96.0.1:443"
    assert configuration.ssl_ca_cert == str(tmp_path / "ca.crt")


def test_probes_and_metrics_listen_on_the_pod_ip(install: list[Manifest]) -> None:
    container = controller_container(install)
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"] == {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert not [
        a for a in container["args"] if a.startswith("--metrics-bind-address")
    ]  # POD_IP is the default


def network_policies(manifests: list[Manifest]) -> tuple[Manifest, Manifest]:
    ingress = next(p for p in of_kind(manifests, "NetworkPolicy") if p["spec"]["policyTypes"] == ["Ingress"])
    egress = next(p for p in of_kind(manifests, "NetworkPolicy") if p["spec"]["policyTypes"] == ["Egress"])
    return ingress, egress


@pytest.mark.parametrize(
    "render",
    [lambda: kustomize(KUSTOMIZATIONS["cluster-wide"]), lambda: kustomize(KUSTOMIZATIONS["single-namespace"]), render_chart],
    ids=["kustomize cluster-wide", "kustomize single-namespace", "helm"],
)  # fmt: skip
def test_network_policies_allow_only_what_the_controller_needs(render: Callable[[], list[Manifest]]) -> None:
    manifests = render()
    ingress, egress = network_policies(manifests)
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for found in (ingress, egress):
        assert found["metadata"]["namespace"] == one(manifests, "Deployment")["metadata"]["namespace"]
        assert found["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    # Ingress: one rule, the metrics port only, from Prometheus' namespace.
    (rule,) = ingress["spec"]["ingress"]
    metrics_port = controller_container(manifests)["ports"][0]["containerPort"]
    assert rule["ports"] == [{"protocol": "TCP", "port": metrics_port}]
    assert rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    # Egress: every rule names its ports (no "anything anywhere"), DNS first, no link-local.
    rules = egress["spec"]["egress"]
    assert all(r.get("ports") and r.get("to") for r in rules)
    assert {(p["protocol"], p["port"]) for p in rules[0]["ports"]} == {("UDP", 53), ("TCP", 53)}
    ports = {p["port"] for r in rules for p in r["ports"]}
    assert ports == {53, 443, 6443, 9090}
    for peer in (peer for r in rules for peer in r["to"]):
        if "ipBlock" in peer:
            assert "169.254.0.0/16" in peer["ipBlock"].get("except", []), (
                "the cloud metadata endpoint stays closed"
            )


def test_network_policy_values_reach_the_objects() -> None:
    values = {
        "networkPolicy": {
            "metricsFrom": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
            "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [6443]},
            "notifications": {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [8443]},
        },
        "gitSync": {**CHART_VARIANTS["git-sync-https"]["gitSync"]},
    }
    ingress, egress = network_policies(render_chart(values))
    assert ingress["spec"]["ingress"][0]["from"] == values["networkPolicy"]["metricsFrom"]
    rules = egress["spec"]["egress"]
    assert {
        "to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}],
        "ports": [{"protocol": "TCP", "port": 6443}],
    } in rules
    assert {
        "to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}],
        "ports": [{"protocol": "TCP", "port": 8443}],
    } in rules
    # git-sync's repository only when git-sync runs.
    assert {p["port"] for r in rules for p in r["ports"]} >= {22}
    _, without_git = network_policies(render_chart())
    assert 22 not in {p["port"] for r in without_git["spec"]["egress"] for p in r["ports"]}
    assert not of_kind(render_chart({"networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_the_prometheus_token_component_sends_an_audience_bound_token(tmp_path: Path) -> None:
    import os

    import yaml

    from tests.deploy.manifests import DEPLOY

    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "overlays" / "cluster-wide", overlay)],
                "components": [os.path.relpath(DEPLOY / "components" / "prometheus-audience-token", overlay)],
            }
        )
    )
    manifests = kustomize(overlay)
    container = controller_container(manifests)
    assert (
        "--prometheus-token-file=/var/run/secrets/kserve-canary/prometheus-token/token" in container["args"]
    )
    volumes = {v["name"]: v for v in pod_spec(manifests)["volumes"]}
    (source,) = volumes["prometheus-token"]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "prometheus"
    # Never the API server's token.
    assert not [a for a in container["args"] if API_ACCESS in a]
