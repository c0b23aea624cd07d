"""The docs say what the code and the manifests do.

* The README's "Install on a cluster" section and docs/install.md: every command either runs here,
  exactly as written (with no cluster reachable: ``KUBECONFIG`` points nowhere), or is marked
  ``# needs a cluster`` / ``# needs a container engine``. ``helm template`` and ``helm lint`` run
  through Helm's Go SDK; any other helm command must be marked.
* docs/policy-reference.md is what docs/tools/policy_reference.py generates from the schema now.
* docs/install.md covers what issue 5 asked of the install guide; the README points at it.
* Links between the docs resolve (files and headings); every alert has its troubleshooting entry;
  every Helm value and every metric profile is documented; the overlay example renders.
* The README stays a front page (at most 12 KB: the rest lives in docs/); every test that
  docs/failure-modes.md names exists.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python as helm
import pytest
import yaml

from canary.metrics.catalog import REQUESTS_PROFILES
from tests.cli.support import invoke
from tests.deploy.manifests import (
    CHART,
    DEPLOY,
    KUSTOMIZATIONS,
    ROOT,
    controller_container,
    kustomize,
    one,
    parse,
)
from tests.deploy.test_manifests import run_flags

README = ROOT / "README.md"
DOCS = ROOT / "docs"
OWN_DOCS = [
    "install.md",
    "policy-reference.md",
    "metric-profiles.md",
    "gitops.md",
    "troubleshooting.md",
    "security.md",
]
# Pages whose links must resolve besides OWN_DOCS (their flags are not all ``run``'s, so the flag check
# covers OWN_DOCS only).
LINKED_DOCS = [
    "cli.md",
    "backtest.md",
    "gates.md",
    "failure-modes.md",
    "performance.md",
    "demo.md",
    "dashboard.md",
    "notifications.md",
    "ha.md",
]
README_MAX_BYTES = 12 * 1024
# `pip install .` is run by `make release-check`, into a clean virtualenv; published artefacts are
# built and checked there too, and exist only after the first release.
MARKERS = (
    "# needs a cluster",
    "# needs a container engine",
    "# installs into your environment",
    "# after the first release",
)
SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}


def install_section() -> str:
    text = README.read_text()
    start = text.index("## Install on a cluster")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    return re.findall(r"```(\w*)\n(.*?)```", markdown, flags=re.DOTALL)


def commands(markdown: str) -> list[str]:
    """Command lines of the shell blocks, continuation lines joined, prompts and comments dropped."""
    found = []
    for language, body in code_blocks(markdown):
        if language not in SHELL_LANGUAGES:
            continue
        joined = re.sub(r"\\\n\s*", " ", body)
        for line in joined.splitlines():
            line = line.strip()
            if language == "console":
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            if line and not line.startswith("#"):
                found.append(line)
    return found


def marked(command: str) -> bool:
    return any(marker in command for marker in MARKERS)


def _helm(argv: list[str], workdir: Path) -> None:
    """`helm template|lint`, run by Helm's Go SDK as the helm CLI would."""
    action, rest = argv[1], argv[2:]
    positional, values, namespace = [], {}, "default"
    index = 0
    while index < len(rest):
        token = rest[index]
        if token in {"-n", "--namespace"}:
            namespace, index = rest[index + 1], index + 2
        elif token == "--set":
            values = _merge(values, helm.parse_set_string(rest[index + 1]))
            index += 2
        elif token in {"-f", "--values"}:
            values = _merge(values, yaml.safe_load((workdir / rest[index + 1]).read_text()) or {})
            index += 2
        elif token.startswith("-"):
            raise AssertionError(f"helm flag {token} is not emulated here: mark the command")
        else:
            positional.append(token)
            index += 1
    if action == "template":
        name, chart = positional
        with helm.Chart.load(workdir / chart) as loaded:
            rendered = loaded.render(values, name=name, namespace=namespace, is_install=True)
        assert any(parse(text) for path, text in rendered.items() if not path.endswith("NOTES.txt"))
    elif action == "lint":
        (chart,) = positional
        report = helm.lint(workdir / chart, values or None, strict=True, namespace=namespace)
        assert report["errors"] == [] and all(m["severity"] < 2 for m in report["messages"]), report
    else:
        raise AssertionError(f"helm {action} needs a cluster: mark it")


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = (
            _merge(merged[key], value)
            if isinstance(value, dict) and isinstance(merged.get(key), dict)
            else value
        )
    return merged


def run_documented(command: str, home: Path) -> None:
    argv = shlex.split(command)
    assert not {"|", ">", "&&", ";", "||"} & set(argv), f"pipelines need a cluster or a shell: {command}"
    if argv[0] == "helm":
        _helm(argv, ROOT)
        return
    environment = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
        "HOME": str(home),
        "KUBECONFIG": str(home / "no-cluster-here"),
    }
    completed = subprocess.run(
        argv, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, f"{command}\n{completed.stdout[-2000:]}\n{completed.stderr[-2000:]}"


@pytest.mark.parametrize("source", ["README.md#install-on-a-cluster", "docs/install.md"])
def test_every_install_command_runs_or_needs_a_cluster(source: str, tmp_path: Path) -> None:
    text = install_section() if source.startswith("README") else (DOCS / "install.md").read_text()
    found = commands(text)
    runnable = [c for c in found if not marked(c)]
    assert len(found) >= 5 and runnable, source
    for command in runnable:
        run_documented(command, tmp_path)


def test_the_runner_refuses_unmarked_cluster_commands(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="needs a cluster"):
        run_documented("helm install kserve-canary charts/kserve-canary", tmp_path)
    with pytest.raises(AssertionError):
        run_documented("kubectl -n kserve-canary get pods", tmp_path)
    with pytest.raises(AssertionError):
        run_documented("kserve-canary status", tmp_path)


def test_the_install_guide_covers_what_issue_5_asks() -> None:
    assert "](docs/install.md)" in install_section(), "the README's install section points at the guide"
    guide = (DOCS / "install.md").read_text()
    for needle in (
        "--kubeconfig",
        "--prometheus-url",
        "--prometheus-header",
        "X-Scope-OrgID",
        "--prometheus-token-file",
        "--prometheus-ca-file",
        "kserve-canary-operator",
        "Knative ≥ 1.19",
        "RespectIgnoreDifferences=true",
        "Flux",
        "](gitops.md)",
    ):
        assert needle in guide, needle


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("policy_reference", DOCS / "tools" / "policy_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_policy_reference_is_generated_from_the_current_schema(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    generator = load_generator()
    assert generator.main(["--check"]) == 0, "run: python docs/tools/policy_reference.py"
    stale = tmp_path / "policy-reference.md"
    stale.write_text((DOCS / "policy-reference.md").read_text().replace("`maxIncrease`", "`maxIncrase`"))
    monkeypatch.setattr(generator, "TARGET", stale)
    assert generator.main(["--check"]) == 1


def test_policy_reference_documents_every_field_of_the_schema() -> None:
    from canary.policy.schema import policy_json_schema

    reference = (DOCS / "policy-reference.md").read_text()
    schema = policy_json_schema()
    definitions = [schema, *schema["$defs"].values()]
    for definition in definitions:
        for field in definition.get("properties", {}):
            assert f"| `{field}` |" in reference, field
        for value in definition.get("enum", []):
            assert f"`{value}`" in reference, value


def github_anchor(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return {github_anchor(match) for match in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


@pytest.mark.parametrize(
    "document",
    [
        "README.md",
        "CONTRIBUTING.md",
        "benchmarks/RESULTS.md",
        *[f"docs/{name}" for name in [*OWN_DOCS, *LINKED_DOCS]],
    ],
)
def test_links_resolve(document: str) -> None:
    path = ROOT / document
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"https?://", target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        assert resolved.exists(), f"{document}: {target}"
        if anchor:
            assert resolved.suffix == ".md" and anchor in headings(resolved), (
                f"{document}: no heading for {target}"
            )


def test_the_readme_is_a_front_page() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move the detail to a page under docs/"
    text = README.read_text()
    for heading in ("## Quick start", "## How it decides", "## What happens when…", "## Documentation"):
        assert heading in text, heading
    assert "make demo" in text and "make test" in text
    documentation = text.split("## Documentation", 1)[1]
    # docs/design.md only maps the design's section numbers to its pages: the index links the pages.
    pages = [f"docs/{page.name}" for page in sorted(DOCS.glob("*.md")) if page.name != "design.md"]
    for page in [*pages, "docs/design/README.md", "CONTRIBUTING.md", "benchmarks/RESULTS.md"]:
        assert f"]({page})" in documentation, f"the README's index misses {page}"


def failure_mode_tests() -> list[tuple[str, str]]:
    """(test file, test function or "") named in docs/failure-modes.md."""
    text = (DOCS / "failure-modes.md").read_text()
    return re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)


def test_the_failure_modes_name_tests_that_exist() -> None:
    """Each row of "What happens when…" points at the test that checks it: those tests must exist."""
    named = failure_mode_tests()
    assert len(named) >= 15
    missing = []
    for file, name in named:
        path = ROOT / file
        if not path.exists() or (
            name and not re.search(rf"^def {name}\(", path.read_text(), flags=re.MULTILINE)
        ):
            missing.append(f"{file}::{name}" if name else file)
    assert missing == []
    for line in (DOCS / "failure-modes.md").read_text().splitlines():
        if line.startswith("| ") and not line.startswith(("| when ", "|---")):
            assert "`tests/" in line, f"a row without its test: {line}"


def test_every_alert_has_a_troubleshooting_entry() -> None:
    rules = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    entries = set(
        re.findall(r"^### (KServeCanary\w+)$", (DOCS / "troubleshooting.md").read_text(), flags=re.MULTILINE)
    )
    assert alerts == entries


def test_troubleshooting_maps_the_operator_lessons_to_checks() -> None:
    text = (DOCS / "troubleshooting.md").read_text()
    for heading in (
        "Which 503 is it?",
        "Container OOMKilled vs CUDA out of memory",
        "Cold starts",
        "Warm-up: slow first requests",
    ):
        assert f"### {heading}" in text
    for setting in (
        "oom-kills",
        "restarts",
        "kv-cache-usage",
        "gpu-memory-peak",
        "warmup-time",
        "progressDeadline",
        "minRequests",
        "failureLimit",
        "minStable",
        "critical: true",
    ):
        assert setting in text, setting


def test_every_helm_value_is_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    table = (DOCS / "install.md").read_text().split("### Helm", 1)[1].split("## 2.", 1)[0]
    for key in values:
        assert f"`{key}`" in table, key


def test_documented_flags_exist() -> None:
    flags = set(run_flags())
    texts = [install_section(), *((DOCS / name).read_text() for name in OWN_DOCS)]
    for text in texts:
        for line in text.splitlines():
            if "kserve-canary run --" in line or line.startswith("| `--"):
                for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", line):
                    assert flag in flags, f"{flag} in: {line}"
        for flag in re.findall(r"(--prometheus-[a-z-]+|--lease-[a-z-]+)", text):
            assert flag in flags, flag


def test_metric_profiles_doc_names_the_catalogs_metrics() -> None:
    text = (DOCS / "metric-profiles.md").read_text()
    for profile, metrics in REQUESTS_PROFILES.items():
        for needle in (profile.value, metrics.count_metric, metrics.bucket_metric, metrics.namespace_label):
            assert needle in text, needle
    assert "request-metrics-protocol: prometheus" in text


def test_the_own_overlay_example_renders(tmp_path: Path) -> None:
    """docs/install.md's overlay, with the remote base swapped for this checkout's."""
    text = (DOCS / "install.md").read_text()
    example = next(
        body for language, body in code_blocks(text) if language == "yaml" and "configMapGenerator" in body
    )
    overlay = yaml.safe_load(example)
    overlay["resources"] = [os.path.relpath(DEPLOY / "overlays" / "cluster-wide", tmp_path)]
    # policies/<namespace>/<file>: the examples' own namespaces.
    for source, target in (
        ("ml/llm-vllm.yaml", "ml/llama-chat.yaml"),
        ("payments/sklearn-fraud.yaml", "payments/fraud-xgb.yaml"),
    ):
        (tmp_path / "policies" / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "policies" / "examples" / source, tmp_path / "policies" / target)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    manifests = kustomize(tmp_path)
    mounts = {m["mountPath"]: m["name"] for m in controller_container(manifests)["volumeMounts"]}
    volumes = {v["name"]: v for v in one(manifests, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    for namespace, file in (("ml", "llama-chat.yaml"), ("payments", "fraud-xgb.yaml")):
        policies = one(manifests, "ConfigMap", f"kserve-canary-policies-{namespace}")
        assert sorted(policies["data"]) == [file]
        volume = volumes[mounts[f"/etc/kserve-canary/policies/{namespace}"]]
        assert volume["configMap"]["name"] == policies["metadata"]["name"]
    container = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ghcr.io/your-org/kserve-canary:0.1.0"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PROMETHEUS_URL"] == "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
    # The patch addresses env/2 by position: the base keeps PROMETHEUS_URL there.
    base = one(kustomize(KUSTOMIZATIONS["base"]), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert base["env"][2]["name"] == "PROMETHEUS_URL"
    # Validated as the controller reads them: with the secret scope its arguments grant.
    scope = [a for a in container["args"] if a.startswith(("--secret-env-allow=", "--secret-file-root="))]
    assert scope, "the example shows how to grant secrets per namespace"
    completed = invoke("validate", *scope, str(tmp_path / "policies"))
    assert completed.returncode == 0, completed.stdout


def security_doc_tests() -> list[tuple[str, str]]:
    """(test file, test function) named in docs/security.md; ``::name`` continues the last file."""
    text = (DOCS / "security.md").read_text()
    found, current = [], ""
    for match in re.finditer(r"`(tests/[\w/]+\.py)?::(\w+)`|`(tests/[\w/]+\.py)`", text):
        file, name, bare = match.groups()
        if bare:
            current = bare
            continue
        current = file or current
        assert current, f"::{name} before any test file"
        found.append((current, name))
    return found


def test_the_security_doc_names_tests_that_exist() -> None:
    """Every threat in docs/security.md points at the test that shows it: those tests must exist."""
    named = security_doc_tests()
    assert len(named) > 40
    missing = []
    for file, name in named:
        path = ROOT / file
        if not path.exists() or not re.search(rf"^def {name}\(", path.read_text(), flags=re.MULTILINE):
            missing.append(f"{file}::{name}")
    assert missing == []
    for person in (
        "A policy author",
        "A namespace editor",
        "controller's service-account token",
        "A network neighbour",
    ):
        assert person in (DOCS / "security.md").read_text()
    assert "Not yet closed" in (DOCS / "security.md").read_text()
