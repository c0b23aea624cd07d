"""Where Prometheus and DNS run, as settings: the NetworkPolicies carry the configured namespaces,
pod selectors and ports (Helm values `networkPolicy.prometheus|dns`, the Kustomize component
deploy/components/network-settings with a NetworkSettings object in the overlay)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import (
    DEPLOY,
    KUBECTL,
    KUSTOMIZATIONS,
    Manifest,
    controller_container,
    kustomize,
    one,
    render_chart,
)

EXAMPLE = DEPLOY / "examples" / "network-settings"


def policies(manifests: list[Manifest]) -> tuple[Manifest, list[Manifest]]:
    """The ingress rule and the egress rules: DNS, the API server, Prometheus, notifications."""
    ingress = one(manifests, "NetworkPolicy", next(
        m["metadata"]["name"] for m in manifests if m["kind"] == "NetworkPolicy" and m["spec"]["policyTypes"] == ["Ingress"]
    ))  # fmt: skip
    egress = next(
        m for m in manifests if m["kind"] == "NetworkPolicy" and m["spec"]["policyTypes"] == ["Egress"]
    )
    (rule,) = ingress["spec"]["ingress"]
    return rule, egress["spec"]["egress"]


def selector(label: str, value: str) -> dict[str, Any]:
    return {"matchLabels": {label: value}}


THANOS = {
    "namespaceSelector": selector("kubernetes.io/metadata.name", "observability"),
    "podSelector": selector("app.kubernetes.io/name", "thanos-query"),
    "ports": [10902],
}
COREDNS = {
    "namespaceSelector": selector("kubernetes.io/metadata.name", "dns-system"),
    "podSelector": selector("k8s-app", "coredns"),
    "ports": [5353],
}


def test_helm_values_place_prometheus_and_dns() -> None:
    _, rules = policies(render_chart({"networkPolicy": {"prometheus": THANOS, "dns": COREDNS}}))
    dns, api_server, prometheus, notifications = rules
    assert dns == {
        "to": [{"namespaceSelector": COREDNS["namespaceSelector"], "podSelector": COREDNS["podSelector"]}],
        "ports": [{"protocol": "UDP", "port": 5353}, {"protocol": "TCP", "port": 5353}],
    }
    assert prometheus == {
        "to": [{"namespaceSelector": THANOS["namespaceSelector"], "podSelector": THANOS["podSelector"]}],
        "ports": [{"protocol": "TCP", "port": 10902}],
    }
    _, default_rules = policies(render_chart())
    assert [api_server, notifications] == [default_rules[1], default_rules[3]]


def test_helm_defaults_and_peers_that_replace_the_selectors() -> None:
    _, rules = policies(render_chart())
    assert rules[0]["to"] == [
        {"namespaceSelector": selector("kubernetes.io/metadata.name", "kube-system"),
         "podSelector": selector("k8s-app", "kube-dns")}
    ]  # fmt: skip
    # An empty podSelector is left out: every pod of the namespace.
    assert rules[2]["to"] == [{"namespaceSelector": selector("kubernetes.io/metadata.name", "monitoring")}]
    assert {p["port"] for p in rules[2]["ports"]} == {9090, 443}
    node_local = [{"ipBlock": {"cidr": "169.254.20.10/32"}}]
    outside = [{"ipBlock": {"cidr": "203.0.113.7/32"}}]
    _, rules = policies(
        render_chart({"networkPolicy": {"dns": {"to": node_local}, "prometheus": {"to": outside}}})
    )
    assert (rules[0]["to"], rules[2]["to"]) == (node_local, outside)


def test_helm_refuses_a_misspelt_selector() -> None:
    with pytest.raises(Exception, match="(?i)podselecter|additional"):
        render_chart({"networkPolicy": {"prometheus": {"podSelecter": {}}}})


def _settings() -> dict[str, Any]:
    settings: dict[str, Any] = yaml.safe_load((EXAMPLE / "network-settings.yaml").read_text())
    return settings


def test_the_kustomize_component_places_prometheus_and_dns() -> None:
    settings = _settings()
    manifests = kustomize(KUSTOMIZATIONS["network-settings"])
    ingress, rules = policies(manifests)
    dns, api_server, prometheus, notifications = rules
    for rule, knobs in ((dns, settings["dns"]), (prometheus, settings["prometheus"])):
        assert rule["to"] == [
            {"namespaceSelector": knobs["namespaceSelector"], "podSelector": knobs["podSelector"]}
        ]
        assert rule["ports"] == knobs["ports"]
    assert ingress["from"] == [settings["metricsFrom"]]
    _, default_rules = policies(kustomize(KUSTOMIZATIONS["cluster-wide"]))
    assert [api_server, notifications] == [default_rules[1], default_rules[3]]
    # The settings object is read, never applied; the example's URL is on the port it opens.
    assert not [m for m in manifests if m["kind"] == "NetworkSettings"]
    env = {e["name"]: e.get("value") for e in controller_container(manifests)["env"]}
    assert env["PROMETHEUS_URL"].endswith(":10902")
    assert {"protocol": "TCP", "port": 10902} in prometheus["ports"]


def test_a_settings_object_without_a_knob_fails_naming_it(tmp_path: Path) -> None:
    import subprocess

    settings = _settings()
    del settings["dns"]["podSelector"]
    (tmp_path / "network-settings.yaml").write_text(yaml.safe_dump(settings))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / "overlays" / "cluster-wide", tmp_path), "network-settings.yaml"],
            "components": [os.path.relpath(DEPLOY / "components" / "network-settings", tmp_path)],
        })
    )  # fmt: skip
    built = subprocess.run(
        [KUBECTL, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert built.returncode != 0
    assert "dns.podSelector" in built.stderr
