"""The Kustomize base, overlays and example render, validate against Kubernetes' own schemas, and
keep the promises the docs make: restricted pod security, probes on the controller's real
endpoints, the flags the controller really has, policies generated from the directory."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.main import get_command

from canary.cli import app
from canary.policy import load_paths
from tests.deploy.manifests import (
    DEPLOY,
    INSTALLABLE,
    KUBECTL,
    KUSTOMIZATIONS,
    Manifest,
    controller_container,
    kustomize,
    of_kind,
    one,
)

# The oldest Kubernetes the manifests promise to work on (policy/v1 PDB, restricted PSA labels,
# seccompProfile fields) and the newest schema kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.25.0", kubernetes_validate.latest_version())
# Kinds that exist only from a later version: validated from that version on (and at the newest).
# ValidatingAdmissionPolicy is admissionregistration.k8s.io/v1 from 1.30; the Kustomize component
# and the Helm value (auto: >= 1.30) ship them, an older cluster leaves them out.
SINCE_VERSION = {"ValidatingAdmissionPolicy": "1.30.0", "ValidatingAdmissionPolicyBinding": "1.30.0"}
# No schema for these in kubernetes-validate: their required fields are checked below.
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}


def validate_all(manifests: list[Manifest]) -> list[str]:
    """Strict validation of every core kind (unknown fields are errors), for each version."""
    problems = []
    for manifest in manifests:
        if manifest["kind"] in CUSTOM_KINDS:
            continue
        since = SINCE_VERSION.get(manifest["kind"])
        versions = (
            KUBERNETES_VERSIONS
            if since is None
            else (since, *(v for v in KUBERNETES_VERSIONS if _version(v) > _version(since)))
        )
        for version in versions:
            try:
                kubernetes_validate.validate(manifest, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                where = ".".join(str(part) for part in error.path)
                problems.append(
                    f"{manifest['kind']}/{manifest['metadata']['name']} @ {version}: {where}: {error.message}"
                )
            except kubernetes_validate.SchemaNotFoundError as error:
                problems.append(f"{manifest['kind']}: no schema ({error.message})")
    return problems


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def without_newer_kinds(manifests: list[Manifest]) -> list[Manifest]:
    """What an install on the oldest supported version applies (the optional newer kinds left out)."""
    return [m for m in manifests if m["kind"] not in SINCE_VERSION]


def check_monitoring_kinds(manifests: list[Manifest]) -> list[str]:
    """The fields prometheus-operator requires of the two CRDs kubernetes-validate lacks."""
    problems = []
    for monitor in of_kind(manifests, "ServiceMonitor"):
        if monitor.get("apiVersion") != "monitoring.coreos.com/v1":
            problems.append("ServiceMonitor apiVersion")
        spec = monitor.get("spec") or {}
        if not (spec.get("selector") or {}).get("matchLabels"):
            problems.append("ServiceMonitor.spec.selector.matchLabels is required")
        endpoints = spec.get("endpoints") or []
        if not endpoints or not all(e.get("port") and e.get("path") == "/metrics" for e in endpoints):
            problems.append("ServiceMonitor endpoints need a named port and path /metrics")
        services = [
            s
            for s in of_kind(manifests, "Service")
            if s["metadata"].get("namespace") == monitor["metadata"].get("namespace")
            and spec["selector"]["matchLabels"].items() <= (s["metadata"].get("labels") or {}).items()
        ]
        if len(services) != 1:
            problems.append(f"ServiceMonitor selects {len(services)} Services, expected exactly 1")
        elif {e["port"] for e in endpoints} - {p["name"] for p in services[0]["spec"]["ports"]}:
            problems.append("ServiceMonitor endpoint port is not a port name of the Service")
        job_label = spec.get("jobLabel")
        if services and (services[0]["metadata"].get("labels") or {}).get(job_label) != "kserve-canary":
            problems.append("the Service's jobLabel value must be kserve-canary (the alerts select it)")
    for rule in of_kind(manifests, "PrometheusRule"):
        if rule.get("apiVersion") != "monitoring.coreos.com/v1":
            problems.append("PrometheusRule apiVersion")
        groups = (rule.get("spec") or {}).get("groups") or []
        if not groups:
            problems.append("PrometheusRule.spec.groups is required")
        for group in groups:
            if not group.get("name") or not group.get("rules"):
                problems.append("every rule group needs a name and rules")
            for entry in group.get("rules") or []:
                if not entry.get("expr") or not (entry.get("alert") or entry.get("record")):
                    problems.append(f"rule without expr or alert/record: {entry}")
                if entry.get("alert") and not (entry.get("labels") or {}).get("severity"):
                    problems.append(f"alert {entry['alert']} without a severity label")
                if entry.get("alert") and not (entry.get("annotations") or {}).get("summary"):
                    problems.append(f"alert {entry['alert']} without a summary")
    return problems


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_kustomizations_render_and_validate(name: str) -> None:
    manifests = kustomize(KUSTOMIZATIONS[name])
    assert manifests, f"{name} rendered nothing"
    assert validate_all(manifests) == []
    assert check_monitoring_kinds(manifests) == []


def test_the_monitoring_checks_catch_broken_objects() -> None:
    manifests = kustomize(KUSTOMIZATIONS["cluster-wide"])
    broken = yaml.safe_load(yaml.safe_dump(manifests))
    one(broken, "ServiceMonitor")["spec"]["endpoints"][0]["port"] = "metrics"
    one(broken, "PrometheusRule")["spec"]["groups"][0]["rules"][0].pop("labels")
    problems = check_monitoring_kinds(broken)
    assert any("port name" in p for p in problems)
    assert any("severity" in p for p in problems)
    one(broken, "Deployment")["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnly"] = (
        True
    )
    assert any("readOnly" in p for p in validate_all(broken))


@pytest.mark.parametrize("name", INSTALLABLE)
def test_installs_have_every_piece(name: str) -> None:
    manifests = kustomize(KUSTOMIZATIONS[name])
    kinds = {m["kind"] for m in manifests}
    assert {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
    } <= kinds
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    namespaced = [m for m in manifests if m["kind"] not in cluster_scoped]
    # Everything lands in kserve-canary, except the watched namespace's Role in single-namespace
    # and the Role that reads Knative's config-deployment, in knative-serving.
    for manifest in namespaced:
        role = manifest["kind"] in {"Role", "RoleBinding"}
        expected = (
            "models"
            if manifest["metadata"]["name"] == "kserve-canary" and role
            else "knative-serving"
            if manifest["metadata"]["name"] == "kserve-canary-knative-config" and role
            else "kserve-canary"
        )
        assert manifest["metadata"].get("namespace") == expected, manifest["metadata"]


@pytest.mark.parametrize("name", INSTALLABLE)
def test_deployment_runs_restricted_and_read_only(name: str) -> None:
    manifests = kustomize(KUSTOMIZATIONS[name])
    deployment = one(manifests, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532  # the image's USER
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    for container in pod["containers"] + pod.get("initContainers", []):
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    namespace = one(manifests, "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # The read-only root has a writable /tmp (kubeconfig certificates, library temp files).
    mounts = {m["mountPath"]: m for m in controller_container(manifests)["volumeMounts"]}
    assert "/tmp" in mounts and mounts["/etc/kserve-canary/policies/models"]["readOnly"] is True


def run_flags() -> dict[str, Any]:
    """Every option of ``kserve-canary run`` as click sees it (names and whether it takes a value)."""
    command = get_command(app).commands["run"]  # type: ignore[attr-defined]
    flags: dict[str, Any] = {}
    for param in command.params:
        for option in [*param.opts, *param.secondary_opts]:
            flags[option] = param
    return flags


@pytest.mark.parametrize("name", INSTALLABLE)
def test_controller_arguments_are_real_run_flags(name: str) -> None:
    """A typo'd flag would crash-loop the pod: every argument must be an option of ``run``."""
    flags = run_flags()
    container = controller_container(kustomize(KUSTOMIZATIONS[name]))
    assert "command" not in container, "the image's ENTRYPOINT is `kserve-canary run`"
    for argument in container["args"]:
        option = argument.split("=", 1)[0]
        assert option in flags, f"{argument!r} is not a flag of `kserve-canary run`"
        if "=" not in argument:
            assert flags[option].is_flag, f"{argument!r} needs a value"
    env_names = {e["name"] for e in container["env"]}
    known_env = {param.envvar for param in flags.values() if param.envvar}
    assert {"PROMETHEUS_URL"} <= env_names & known_env
    # The Lease lives where the leader-election Role grants it.
    assert "--lease-namespace=$(POD_NAMESPACE)" in container["args"]
    assert "--leader-elect" in container["args"]


def test_single_namespace_overlay_watches_only_its_namespace() -> None:
    manifests = kustomize(KUSTOMIZATIONS["single-namespace"])
    args = controller_container(manifests)["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=models"]
    roles = {(r["kind"], r["metadata"].get("namespace")) for r in manifests if r["kind"].endswith("Role")}
    assert ("Role", "models") in roles
    # No cluster-wide grant of the controller's rules (only the unbound people's roles remain).
    assert not of_kind(manifests, "ClusterRoleBinding")


def test_probes_use_the_ports_and_paths_the_controller_serves() -> None:
    container = controller_container(kustomize(KUSTOMIZATIONS["cluster-wide"]))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] in ports
    assert f"--metrics-port={ports['http-metrics']}" in container["args"]
    # test_rbac.py runs the controller and asks these very paths on the very port.


POLICY_ROOT = DEPLOY / "base" / "policies"
POLICY_MOUNT = "/etc/kserve-canary/policies"


def policy_namespaces() -> list[str]:
    return sorted(p.name for p in POLICY_ROOT.iterdir() if p.is_dir())


def policy_files(namespace: str | None = None) -> list[Path]:
    """The example policies: POLICY_ROOT/<namespace>/*.yaml (no file directly under the root)."""
    assert not [p for p in POLICY_ROOT.iterdir() if p.is_file()], (
        "a policy file lives in its namespace's directory"
    )
    found = [namespace] if namespace else policy_namespaces()
    return sorted(p for ns in found for p in (POLICY_ROOT / ns).iterdir() if p.is_file())


def test_one_policies_configmap_per_namespace_mounted_in_its_directory() -> None:
    manifests = kustomize(KUSTOMIZATIONS["cluster-wide"])
    assert policy_namespaces() == ["models"]
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in controller_container(manifests)["volumeMounts"]}
    assert f"--policies={POLICY_MOUNT}" in controller_container(manifests)["args"]
    assert "emptyDir" in volumes[mounts[POLICY_MOUNT]["name"]] and mounts[POLICY_MOUNT]["readOnly"] is True
    for namespace in policy_namespaces():
        configmap = one(manifests, "ConfigMap", f"kserve-canary-policies-{namespace}")
        files = policy_files(namespace)
        assert files, f"the example policy directory of {namespace} is empty"
        assert sorted(configmap["data"]) == [p.name for p in files], (
            "list every policy file of the namespace in base/kustomization.yaml"
        )
        for path in files:
            assert configmap["data"][path.name] == path.read_text()
        assert configmap["metadata"]["labels"]["kserve-canary.dev/policy-namespace"] == namespace
        # The controller mounts it where the directory names the namespace.
        mount = mounts[f"{POLICY_MOUNT}/{namespace}"]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["configMap"]["name"] == configmap["metadata"]["name"]


def test_example_policies_are_valid() -> None:
    result = load_paths([POLICY_ROOT])  # a root: each directory decides its policies' namespace
    assert result.ok, [str(e) for e in result.errors]
    assert len(result.policies) == len(policy_files())
    assert {loaded.policy.metadata.namespace for loaded in result.policies} == set(policy_namespaces())


def test_kubectl_generates_the_same_configmap_from_the_directory() -> None:
    """The docs' way for a directory of many files: `kubectl create configmap --from-file=DIR`."""
    completed = subprocess.run(
        [KUBECTL, "create", "configmap", "kserve-canary-policies-models", "-n", "kserve-canary",
         f"--from-file={POLICY_ROOT / 'models'}", "--dry-run=client", "-o", "yaml"],
        capture_output=True, text=True, timeout=60, check=True, env={"KUBECONFIG": "/nonexistent", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    generated = yaml.safe_load(completed.stdout)
    kustomized = one(kustomize(KUSTOMIZATIONS["cluster-wide"]), "ConfigMap", "kserve-canary-policies-models")
    assert generated["data"] == kustomized["data"]


def test_component_without_prometheus_operator(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                # kustomize refuses absolute paths to other kustomizations
                "resources": [os.path.relpath(DEPLOY / "overlays" / "cluster-wide", overlay)],
                "components": [
                    os.path.relpath(DEPLOY / "components" / "without-prometheus-operator", overlay)
                ],
            }
        )
    )
    manifests = kustomize(overlay)
    kinds = {m["kind"] for m in manifests}
    assert not kinds & CUSTOM_KINDS
    assert validate_all(manifests) == []
    annotations = one(manifests, "Service")["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(
        controller_container(manifests)["ports"][0]["containerPort"]
    )


def test_image_reference_is_pinned_to_a_version() -> None:
    for name in INSTALLABLE:
        image = controller_container(kustomize(KUSTOMIZATIONS[name]))["image"]
        assert re.fullmatch(r"ghcr\.io/kserve-canary/kserve-canary:\d+\.\d+\.\d+", image), image
