"""The release artefacts, checked without publishing them: ``make release-check`` (CI runs it after
``make test``) and the release workflow run this module.

* ``check``: builds the sdist and, from it, the wheel of kserve-canary; installs each into a clean
  virtualenv (dependencies from a wheelhouse of the hashed lock, downloaded once) and runs
  ``kserve-canary --help`` and ``kserve-canary validate policies/examples/`` there, without the
  sandbox; checks the Dockerfile statically (no container engine here); packages the chart with
  Helm's Go SDK and checks, lints and renders the archive; checks the release workflows.
* ``package-chart --image-digest sha256:...``: the chart archive with the image digest in its values
  (the release workflow pushes it).
* ``package-kustomize --image-digest sha256:...``: ``deploy/`` as an archive whose base pins the
  controller image by that digest, every installable overlay rendered and checked (the release
  workflow attaches it to the GitHub release).
* ``version --tag vX.Y.Z``: fails unless the tag, pyproject.toml and Chart.yaml name one version.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CHART = ROOT / "charts" / "kserve-canary"
CRD = "crds/promotionpolicies.yaml"
WORKFLOWS = ROOT / ".github" / "workflows"
LOCKS = (ROOT / "requirements" / "controller.txt", ROOT / "requirements" / "build.txt")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def project_version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def semver(pep440: str) -> str:
    """The SemVer 2 spelling Helm wants of a PEP 440 version: 0.1.0 → 0.1.0, 0.1.0.dev0 → 0.1.0-dev.0,
    0.2.0rc1 → 0.2.0-rc.1, 0.2.0b1 → 0.2.0-beta.1."""
    version = Version(pep440)
    core = ".".join(str(part) for part in (*version.release, 0, 0)[:3])
    if version.pre:
        label = {"a": "alpha", "b": "beta", "rc": "rc"}[version.pre[0]]
        return f"{core}-{label}.{version.pre[1]}"
    if version.dev is not None:
        return f"{core}-dev.{version.dev}"
    return core


# ---------------------------------------------------------------------------------------- Dockerfile


def _instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n", " ", text)
    found = []
    for line in joined.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def _arg_defaults(steps: list[tuple[str, str]]) -> dict[str, str]:
    defaults = {}
    for keyword, args in steps:
        if keyword == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name.strip()] = value.strip().strip('"')
    return defaults


def _base_images(steps: list[tuple[str, str]]) -> list[str]:
    """Every FROM's image with the ARG defaults substituted (what plain `docker build .` pulls);
    stages that start from an earlier stage are left out."""
    defaults, stages, images = _arg_defaults(steps), set(), []
    for keyword, args in steps:
        if keyword != "FROM":
            continue
        words = [w for w in args.split() if not w.startswith("--")]
        image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: defaults.get(m[1] or m[2], ""), words[0])
        if len(words) == 3 and words[1].upper() == "AS":
            stages.add(words[2].lower())
        if image.lower() not in stages:
            images.append(image)
    return images


def dockerfile_findings(text: str) -> list[str]:
    """What makes `docker build .` unreproducible or the image unsafe; empty when none."""
    steps, findings = _instructions(text), []
    for image in _base_images(steps):
        name, _, digest = image.partition("@")
        if not DIGEST.fullmatch(digest):
            findings.append(f"base image {image!r} is not pinned by a sha256 digest by default")
        if not name or name.endswith(":latest") or ":" not in name.rsplit("/", 1)[-1]:
            findings.append(f"base image {image!r} names no tag or the moving tag latest")
    syntax = re.match(r"#\s*syntax\s*=\s*(\S+)", text)
    if syntax and "@sha256:" not in syntax[1]:
        findings.append(f"the frontend {syntax[1]} is pulled by tag: pin it by digest or drop the line")
    final = steps[max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM") :]
    users = [args for keyword, args in final if keyword == "USER"]
    if not users or users[-1].split(":")[0] in {"root", "0"}:
        findings.append("the final stage does not end as a non-root USER")
    for name in ("PYTHON_DIGEST",):
        if f"--build-arg {name}=" not in text:
            findings.append(f"the comments do not say how to override {name} (--build-arg {name}=...)")
    return findings


# ---------------------------------------------------------------------------------------- Python


def _run(argv: Sequence[str | Path], **kwargs: Any) -> str:
    completed = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=300, check=False, **kwargs
    )
    if completed.returncode != 0:
        raise SystemExit(
            f"{' '.join(map(str, argv))} failed:\n{completed.stdout[-3000:]}{completed.stderr[-3000:]}"
        )
    return completed.stdout


def wheelhouse(directory: Path) -> Path:
    """The locked dependencies' wheels (controller.txt and build.txt, hashes required), downloaded
    once per change of the locks: later runs install from it without an index."""
    digest = hashlib.sha256(b"".join(lock.read_bytes() for lock in LOCKS)).hexdigest()
    stamp = directory / ".locks.sha256"
    if stamp.is_file() and stamp.read_text() == digest:
        return directory
    locks = [arg for lock in LOCKS for arg in ("-r", lock)]
    _run([sys.executable, "-m", "pip", "download", "--quiet", "--require-hashes", "--only-binary=:all:",
          "--dest", directory, *locks])  # fmt: skip
    stamp.write_text(digest)
    return directory


def _offline(wheels: Path) -> dict[str, str]:
    """pip (and the build isolation it sets up) from the wheelhouse only."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    return {
        **environment,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def build_distributions(out: Path, wheels: Path) -> tuple[Path, Path]:
    """The sdist, and the wheel built from it (so the sdist is known to be complete)."""
    shutil.rmtree(out, ignore_errors=True)
    _run([sys.executable, "-m", "build", "--outdir", out, ROOT], env=_offline(wheels))
    (sdist,) = out.glob("kserve_canary-*.tar.gz")
    (wheel,) = out.glob("kserve_canary-*.whl")
    return sdist, wheel


def distribution_findings(sdist: Path, wheel: Path) -> list[str]:
    with tarfile.open(sdist) as archive:
        in_sdist = [name.split("/", 1)[-1] for name in archive.getnames()]
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = archive.namelist()
    findings = []
    for kind, names in (("sdist", in_sdist), ("wheel", in_wheel)):
        strays = [n for n in names if n.startswith(("sandbox/", "canary_sandbox/", "tests/", "benchmarks/"))]
        if strays:
            findings.append(f"the {kind} carries files that are not kserve-canary's: {strays[:5]}")
    for needed in ("canary/py.typed", "canary/dashboard/static/index.html", "canary/cli/__init__.py"):
        if needed not in in_wheel:
            findings.append(f"the wheel misses {needed}")
    return findings


def install_and_run(distribution: Path, venv: Path, wheels: Path, *, deps: bool) -> None:
    """Install into a clean virtualenv (no pip in it: the running pip installs, bytecode not compiled)
    and run the CLI there, outside the source tree, without the sandbox."""
    if deps:
        shutil.rmtree(venv, ignore_errors=True)
        _run([sys.executable, "-m", "venv", "--without-pip", venv])
    pip = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "--quiet",
        "--no-compile",
    ]
    _run([*pip, *([] if deps else ["--force-reinstall", "--no-deps"]), distribution], env=_offline(wheels))
    clean = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(venv)}
    with tempfile.TemporaryDirectory() as elsewhere:
        _run([venv / "bin" / "kserve-canary", "--help"], cwd=elsewhere, env=clean)
        _run([venv / "bin" / "kubectl-canary", "--help"], cwd=elsewhere, env=clean)
        _run(
            [venv / "bin" / "kserve-canary", "validate", ROOT / "policies" / "examples"],
            cwd=elsewhere,
            env=clean,
        )
        probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('canary_sandbox') is not None)"
        _run([venv / "bin" / "python", "-c", probe], cwd=elsewhere, env=clean)


# ---------------------------------------------------------------------------------------- chart


def package_chart(destination: Path, *, image_digest: str | None = None, version: str | None = None) -> Path:
    """`helm package charts/kserve-canary [--version V --app-version V]` (Helm's Go SDK), with
    image.digest set when given."""
    if image_digest is not None and not DIGEST.fullmatch(image_digest):
        raise SystemExit(f"--image-digest {image_digest!r}: expected sha256:<64 hex>")
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / CHART.name
        shutil.copytree(CHART, copy)
        if image_digest:
            values = copy / "values.yaml"
            text, count = re.subn(
                r'(?m)^(image:\n(?:  .*\n|\s*\n)*?  digest: )""',
                rf'\g<1>"{image_digest}"',
                values.read_text(),
            )
            assert count == 1, "values.yaml: image.digest not found"
            values.write_text(text)
        return Path(helm.package(copy, destination=destination, version=version, app_version=version))


def _chart_member(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(f"{CHART.name}/{name}")
    assert member is not None
    return member.read()


def chart_findings(package: Path, version: str, *, image_digest: str | None = None) -> list[str]:
    findings, wanted = [], semver(version)
    with tarfile.open(package) as archive:
        names = set(archive.getnames())
        for name in ("Chart.yaml", "values.yaml", "values.schema.json", CRD, "templates/NOTES.txt"):
            if f"{CHART.name}/{name}" not in names:
                findings.append(f"{package.name} misses {CHART.name}/{name}")
        if findings:
            return findings
        chart = yaml.safe_load(_chart_member(archive, "Chart.yaml"))
        crd = _chart_member(archive, CRD)
        values = yaml.safe_load(_chart_member(archive, "values.yaml"))
    for field in ("version", "appVersion"):
        if str(chart[field]) != wanted:
            findings.append(f"Chart.yaml {field} {chart[field]} is not pyproject.toml's {version} ({wanted})")
    if crd != (ROOT / "deploy" / CRD).read_bytes():
        findings.append(f"the packaged {CRD} differs from deploy/{CRD}: run make schema")
    if image_digest and values["image"]["digest"] != image_digest:
        findings.append(f"values.yaml image.digest is {values['image']['digest']!r}, not {image_digest}")
    return findings + _lint_and_render(package, image_digest)


def _lint_and_render(package: Path, image_digest: str | None) -> list[str]:
    report = helm.lint(package, strict=True, namespace="kserve-canary", kube_version="v1.29.0")
    findings = [f"helm lint: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
    findings += [f"helm lint: {e}" for e in report["errors"]]
    with helm.Chart.load_archive(package.read_bytes()) as chart:
        rendered = chart.render({}, name="kserve-canary", namespace="kserve-canary", is_install=True)
    deployment = next(
        d
        for path, text in rendered.items()
        if path.endswith("/deployment.yaml")
        for d in yaml.safe_load_all(text)
        if d and d.get("kind") == "Deployment"
    )
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    if image_digest and not image.endswith(f"@{image_digest}"):
        findings.append(f"the packaged chart renders image {image}, not pinned to {image_digest}")
    return findings


# ---------------------------------------------------------------------------------------- kustomize

DEPLOY = ROOT / "deploy"
KUSTOMIZE_OVERLAYS = ("overlays/cluster-wide", "overlays/single-namespace")
# The base's images entry: its digest is empty in the repository and filled by package_kustomize.
_KUSTOMIZE_DIGEST = re.compile(r'(?m)^(images:\n  - name: \S+\n(?:    .*\n)*?    digest: )""')
# A well-formed digest for `release-check`, where no image has been pushed; never shipped.
STAND_IN_DIGEST = "sha256:" + "0" * 64


def package_kustomize(destination: Path, *, image_digest: str, version: str | None = None) -> Path:
    """``deploy/`` as ``kserve-canary-deploy-<version>.tar.gz``, its base's image pinned by
    ``image_digest`` (the release fills the digest it pushed)."""
    if not DIGEST.fullmatch(image_digest):
        raise SystemExit(f"--image-digest {image_digest!r}: expected sha256:<64 hex>")
    name = f"kserve-canary-deploy-{version or semver(project_version())}"
    destination.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / name
        shutil.copytree(DEPLOY, copy)
        base = copy / "base" / "kustomization.yaml"
        text, count = _KUSTOMIZE_DIGEST.subn(rf'\g<1>"{image_digest}"', base.read_text())
        assert count == 1, 'deploy/base/kustomization.yaml: the image entry\'s digest: "" not found'
        base.write_text(text)
        archive = destination / f"{name}.tar.gz"
        with tarfile.open(archive, "w:gz") as packed:
            packed.add(copy, arcname=name)
    return archive


def kustomize_findings(archive: Path, image_digest: str) -> list[str]:
    """Every installable overlay of the archive renders the controller image by ``image_digest``."""
    findings = []
    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(archive) as packed:
            packed.extractall(scratch, filter="data")
        (root,) = Path(scratch).iterdir()
        for overlay in KUSTOMIZE_OVERLAYS:
            rendered = _run(["kubectl", "kustomize", root / overlay])
            images = [
                container["image"]
                for document in yaml.safe_load_all(rendered)
                if document and document.get("kind") == "Deployment"
                for container in document["spec"]["template"]["spec"]["containers"]
            ]
            if not images or not all(image.endswith(f"@{image_digest}") for image in images):
                findings.append(f"{archive.name} {overlay} renders {images}, not pinned to {image_digest}")
    return findings


# ---------------------------------------------------------------------------------------- workflows


def _steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow.get("jobs", {}).values() for step in job.get("steps", [])]


def _step(steps: list[dict[str, Any]], uses: str) -> dict[str, Any]:
    return next((step for step in steps if str(step.get("uses", "")).startswith(uses)), {})


def _script(step: dict[str, Any]) -> str:
    """A step's run script with its env's ${NAME} spelled out (what the shell will see)."""
    script = str(step.get("run", ""))
    for name, value in (step.get("env") or {}).items():
        script = script.replace(f"${{{name}}}", str(value)).replace(f"${name}", str(value))
    return script


def _runs_release_check(runs: str) -> bool:
    if "make release-check" in runs:
        return True
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    return (
        ".ci/run" in runs
        and "make release-check" in ci
        and ci.index("make test") < ci.index("make release-check")
    )


def workflow_findings(directory: Path = WORKFLOWS) -> list[str]:
    """What the release workflow must do that a reader could not see was left out."""
    path = directory / "release.yml"
    if not path.is_file():
        return [f"{path.relative_to(ROOT)} is missing"]
    text = path.read_text()
    steps = _steps(yaml.safe_load(text))
    runs = "\n".join(_script(step) for step in steps)
    uses = [str(step["uses"]) for step in steps if "uses" in step]
    build = _step(steps, "docker/build-push-action@")
    publish = _step(steps, "pypa/gh-action-pypi-publish@")
    expectations = {
        "runs make release-check (after make test) before publishing": _runs_release_check(runs),
        "checks the tag against the versions": "tests.deploy.release version --tag" in runs,
        "resolves the base image digest": "imagetools inspect" in runs,
        "builds the image with the Dockerfile's default base digest": "build-args"
        not in build.get("with", {}),
        "attaches an SBOM and provenance": build.get("with", {}).get("sbom") is True
        and build.get("with", {}).get("provenance") == "mode=max",
        "signs the image by the pushed digest with cosign": re.search(
            r"cosign sign --yes \S*@\$\{\{ steps\.build\.outputs\.digest \}\}", runs
        )
        is not None,
        "packages the chart with the pushed image digest": re.search(
            r"package-chart --image-digest \S*\$\{\{ needs\.image\.outputs\.digest \}\}", runs
        )
        is not None,
        "pushes the chart as an OCI artefact": re.search(r"helm push .+ oci://ghcr\.io/", runs) is not None,
        "packages the Kustomize manifests with the pushed image digest": re.search(
            r"package-kustomize --image-digest \S*\$\{\{ needs\.image\.outputs\.digest \}\}", runs
        )
        is not None,
        "attaches the digest-pinned Kustomize manifests to the GitHub release": re.search(
            r"gh release create .*artefacts/kustomize/\S*\.tar\.gz", runs, flags=re.DOTALL
        )
        is not None,
        "publishes to PyPI with trusted publishing (no token)": bool(publish)
        and "password" not in publish.get("with", {})
        and "id-token: write" in text,
        "pins every action by commit": all(re.search(r"@[0-9a-f]{40}$", u) for u in uses),
    }
    return [f"release.yml {what}: not found" for what, done in expectations.items() if not done]


# ---------------------------------------------------------------------------------------- commands


@contextmanager
def _timed(label: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"{label}: {time.monotonic() - started:.1f} s", flush=True)


def check(out: Path, wheels: Path) -> list[str]:
    findings = dockerfile_findings(DOCKERFILE.read_text()) + workflow_findings()
    with _timed("chart packaged, checked, linted and rendered"):
        findings += chart_findings(package_chart(out / "chart"), project_version())
    with _timed("deploy/ packaged with a stand-in image digest, every overlay rendered"):
        findings += kustomize_findings(
            package_kustomize(out / "kustomize", image_digest=STAND_IN_DIGEST), STAND_IN_DIGEST
        )
    with _timed("wheelhouse of the locked dependencies"):
        wheelhouse(wheels)
    with _timed("sdist, then the wheel from it"):
        sdist, wheel = build_distributions(out / "dist", wheels)
        findings += distribution_findings(sdist, wheel)
    with _timed("wheel installed into a clean virtualenv and run"):
        install_and_run(wheel, out / "venv", wheels, deps=True)
    with _timed("sdist installed over it and run"):
        install_and_run(sdist, out / "venv", wheels, deps=False)
    return findings


def version_findings(tag: str) -> list[str]:
    version = project_version()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    findings = [] if tag == f"v{version}" else [f"tag {tag} is not v{version} (pyproject.toml)"]
    if Version(version).is_devrelease:
        findings.append(f"pyproject.toml's {version} is a development version: bump it before tagging")
    findings += [
        f"Chart.yaml {f} is {chart[f]}" for f in ("version", "appVersion") if chart[f] != semver(version)
    ]
    return findings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.deploy.release", description=__doc__.split("\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    checking = commands.add_parser("check")
    checking.add_argument("--out", type=Path, default=ROOT / "build" / "release")
    checking.add_argument("--wheelhouse", type=Path, default=ROOT / ".venv" / "wheelhouse")
    packaging = commands.add_parser("package-chart")
    packaging.add_argument("--image-digest", required=True)
    packaging.add_argument("--destination", type=Path, default=ROOT / "build" / "release" / "chart")
    kustomizing = commands.add_parser("package-kustomize")
    kustomizing.add_argument("--image-digest", required=True)
    kustomizing.add_argument("--destination", type=Path, default=ROOT / "build" / "release" / "kustomize")
    tagging = commands.add_parser("version")
    tagging.add_argument("--tag", required=True)
    options = parser.parse_args(argv)
    if options.command == "check":
        started = time.monotonic()
        findings = check(options.out.resolve(), options.wheelhouse.resolve())
        print(f"release-check: {time.monotonic() - started:.0f} s")
    elif options.command == "package-chart":
        package = package_chart(options.destination, image_digest=options.image_digest)
        findings = chart_findings(package, project_version(), image_digest=options.image_digest)
        print(package)
    elif options.command == "package-kustomize":
        archive = package_kustomize(options.destination, image_digest=options.image_digest)
        findings = kustomize_findings(archive, options.image_digest)
        print(archive)
    else:
        findings = version_findings(options.tag)
    for finding in findings:
        print(f"error: {finding}", file=sys.stderr)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
