"""Rendering the install manifests the way users do: ``kubectl kustomize`` and Helm's own Go SDK.

No helm binary is installable here; ``helm-python-sdk`` bundles Helm v4's Go SDK as a shared
library (``libhelm_c``), so charts are rendered, schema-checked and linted by Helm itself.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native as helm_native

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = ROOT / "charts" / "kserve-canary"
KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"

Manifest = dict[str, Any]

# A well-formed digest for rendering (git-sync needs one); not a real image.
TEST_DIGEST = "sha256:" + "0123456789abcdef" * 4

# Every kustomization a user can apply, and what it must contain besides the base.
KUSTOMIZATIONS = {
    "base": DEPLOY / "base",
    "cluster-wide": DEPLOY / "overlays" / "cluster-wide",
    "single-namespace": DEPLOY / "overlays" / "single-namespace",
    "prometheus-auth": DEPLOY / "examples" / "prometheus-auth",
    "network-settings": DEPLOY / "examples" / "network-settings",
    "custom-promql": DEPLOY / "examples" / "custom-promql",
}
INSTALLABLE = ("cluster-wide", "single-namespace", "prometheus-auth", "network-settings", "custom-promql")

# Helm values an install would use; each must render, validate and pass the RBAC comparison.
CHART_VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watchNamespaces": ["models", "vision"]},
    "git-sync-https": {
        "gitSync": {
            "enabled": True,
            "repo": "https://github.com/acme/ml-rollouts",
            "image": {"digest": TEST_DIGEST},
            "path": "policies/prod",
            "auth": {"existingSecret": "git-credentials"},
        },
    },
    "git-sync-ssh": {
        "gitSync": {
            "enabled": True,
            "repo": "git@github.com:acme/ml-rollouts.git",
            "image": {"digest": TEST_DIGEST},
            "path": "",
            "auth": {"existingSecret": "git-ssh", "type": "ssh"},
        },
    },
    "prometheus-auth": {
        "prometheus": {
            "url": "https://mimir-gateway.monitoring.svc/prometheus",
            "headers": {"X-Scope-OrgID": "ml-platform"},
            "auth": {"existingSecret": "kserve-canary-prometheus", "tokenKey": "token", "caKey": "ca.crt"},
        },
    },
    "service-account-token": {
        "prometheus": {
            "url": "https://prometheus.monitoring.svc:9091",
            "serviceAccountToken": {"enabled": True, "audience": "prometheus.monitoring.svc"},
        },
    },
    "without-admission-and-network-policies": {
        "admissionPolicies": {"enabled": False},
        "networkPolicy": {"enabled": False},
    },
    "notifications-and-policies": {
        "notifications": {"env": {"SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T0/B0/XXXX"}},
        "policies": {
            "files": {
                "models": {
                    "sklearn-iris.yaml": (
                        DEPLOY / "base" / "policies" / "models" / "sklearn-iris.yaml"
                    ).read_text(),
                },
            }
        },
    },
    "secret-scope": {
        "notifications": {
            "existingSecret": "team-notifications",
            "allowEnv": {"ml": ["SLACK_WEBHOOK_URL", "DEPLOY_HOOK_URL"], "payments": ["DEPLOY_HOOK_URL"]},
            "fileSecrets": {"ml": "kserve-canary-policy-secrets-ml"},
            "allowHosts": ["hooks.internal.example"],
        },
        "policies": {
            "files": {
                "ml": {
                    "llama-chat.yaml": (ROOT / "policies" / "examples" / "ml" / "llm-vllm.yaml").read_text()
                },
                "payments": {
                    "fraud-xgb.yaml": (
                        ROOT / "policies" / "examples" / "payments" / "sklearn-fraud.yaml"
                    ).read_text()
                },
            }
        },
    },
    "existing-secrets-and-configmap": {
        "notifications": {"existingSecret": "team-notifications"},
        "policies": {"existingConfigMaps": {"models": "team-policies"}},
    },
    "no-monitoring-operator": {
        "serviceMonitor": {"enabled": False},
        "prometheusRule": {"enabled": False},
        "grafanaDashboard": {"enabled": False},
    },
    "single-replica-without-election": {"replicaCount": 1, "leaderElection": {"enabled": False}},
    "dry-run": {"dryRun": True},
    "custom-promql": {
        "customPromql": {
            "fromCrds": True,
            "allowMetrics": ["kube_node_status_allocatable", "ml=gateway_*"],
            "tenancyLabels": ["job:*=tenant", "kn_*=k8s_namespace_name"],
            "namespaceQueryBudget": 1.5,
        },
    },
}


def parse(text: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


@functools.cache
def _kustomize_text(path: str) -> str:
    completed = subprocess.run(
        [KUBECTL, "kustomize", path], capture_output=True, text=True, timeout=60, check=False
    )
    if completed.returncode != 0:
        raise AssertionError(f"kubectl kustomize {path} failed:\n{completed.stderr}")
    return completed.stdout


def kustomize(path: Path | str) -> list[Manifest]:
    """``kubectl kustomize PATH`` (cached per path: the files do not change during a test run)."""
    return parse(_kustomize_text(str(path)))


# What a cluster with the prometheus-operator serves beyond Kubernetes' own APIs: the chart renders its
# ServiceMonitor and PrometheusRule only where .Capabilities.APIVersions has it.
MONITORING_API = "monitoring.coreos.com/v1"


def render_chart(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "kserve-canary",
    namespace: str = "kserve-canary",
    api_versions: Sequence[str] = (MONITORING_API,),
) -> list[Manifest]:
    """``helm template NAME charts/kserve-canary -n NAMESPACE --api-versions ...`` with ``values``
    (schema-checked); by default for a cluster that runs the prometheus-operator."""
    return parse(render_chart_text(values, name=name, namespace=namespace, api_versions=api_versions))


def _render(
    values: Mapping[str, Any] | None,
    *,
    name: str,
    namespace: str,
    api_versions: Sequence[str],
    chart: Path = CHART,
) -> dict[str, str]:
    # helm-python's Chart.render has no api_versions argument, but the helm-c-sdk call under it
    # takes them (helm template --api-versions): the options are passed to it directly.
    options = {"name": name, "namespace": namespace, "is_install": True, "api_versions": list(api_versions)}
    with helm.Chart.load(chart) as loaded:
        rendered = helm_native.call_string(
            "helm_render", loaded._raw(), json.dumps(values or {}), json.dumps(options)
        )
    result: dict[str, str] = json.loads(rendered)
    return result


def render_chart_text(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "kserve-canary",
    namespace: str = "kserve-canary",
    api_versions: Sequence[str] = (MONITORING_API,),
) -> str:
    rendered = _render(values, name=name, namespace=namespace, api_versions=api_versions)
    # NOTES.txt is shown to the user, not applied.
    documents = [text for path, text in sorted(rendered.items()) if not path.endswith("NOTES.txt")]
    return "\n---\n".join(documents)


def render_notes(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = "kserve-canary",
    api_versions: Sequence[str] = (MONITORING_API,),
    chart: Path = CHART,
) -> str:
    """The NOTES of ``charts/kserve-canary``, or of ``chart`` (a directory or a packaged .tgz)."""
    rendered = _render(values, name=name, namespace="kserve-canary", api_versions=api_versions, chart=chart)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def of_kind(manifests: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m.get("kind") == kind]


def one(manifests: Iterable[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = [m for m in of_kind(manifests, kind) if name is None or m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def controller_container(manifests: Iterable[Manifest]) -> Manifest:
    deployment = one(manifests, "Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "controller")
