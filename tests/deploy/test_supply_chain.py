"""Supply chain (issue 17, item 7): hashed locks the image installs from, images pinned by digest.

* requirements/controller.txt locks pyproject.toml's runtime dependencies, every file by sha256;
  requirements/build.txt locks the build backend. The Dockerfile installs both with
  ``--require-hashes`` and the project itself with ``--no-deps``.
* The base image's digest is a required build argument; the chart's images (controller, git-sync)
  render as ``image@sha256:...`` whenever a digest is given, and git-sync cannot be enabled without
  one. No digest is invented here: none can be resolved on this machine.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from tests.deploy.image import ROOT, canonical, closure
from tests.deploy.manifests import (
    CHART_VARIANTS,
    DEPLOY,
    INSTALLABLE,
    KUSTOMIZATIONS,
    controller_container,
    kustomize,
    one,
    render_chart,
    render_chart_text,
    render_notes,
)
from tests.deploy.test_dockerfile import instructions

RUNTIME_LOCK = ROOT / "requirements" / "controller.txt"
BUILD_LOCK = ROOT / "requirements" / "build.txt"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DIGEST = "sha256:" + "ab" * 32  # a well-formed digest for rendering tests, not a real image
DIGEST_REFERENCE = re.compile(r"[a-z0-9./-]+(:[\w.-]+)?@sha256:[a-f0-9]{64}")


@dataclass(frozen=True)
class Locked:
    name: str
    version: str
    hashes: tuple[str, ...]
    marker: str


def parse_lock(text: str) -> dict[str, Locked]:
    """pip-compile's output: ``name==version [; marker] \\`` then ``--hash=sha256:...`` lines."""
    entries: dict[str, Locked] = {}
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        requirement, *options = line.split(" --")
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;]+)\s*(?:;\s*(.+))?", requirement.strip())
        assert match, f"not an exact pin: {line!r}"
        hashes = tuple(o.strip().removeprefix("hash=") for o in options if o.startswith("hash="))
        name = canonical(match.group(1))
        entries[name] = Locked(name, match.group(2), hashes, match.group(3) or "")
    return entries


def lock_problems(lock_text: str, requirements: list[str]) -> list[str]:
    """Where a lock and the declared requirements disagree (empty: they agree)."""
    lock = parse_lock(lock_text)
    found = []
    for text in requirements:
        requirement = Requirement(text)
        locked = lock.get(canonical(requirement.name))
        if locked is None:
            found.append(f"{requirement.name} is not in the lock")
        elif not requirement.specifier.contains(Version(locked.version), prereleases=True):
            found.append(f"{requirement.name}=={locked.version} does not satisfy {requirement.specifier}")
    for entry in lock.values():
        if not entry.hashes:
            found.append(f"{entry.name} has no hash")
        for digest in entry.hashes:
            if not re.fullmatch(r"sha256:[a-f0-9]{64}", digest):
                found.append(f"{entry.name}: not a sha256 hash: {digest}")
    return found


def test_runtime_lock_agrees_with_pyproject() -> None:
    assert lock_problems(RUNTIME_LOCK.read_text(), PYPROJECT["project"]["dependencies"]) == []


def test_runtime_lock_holds_exactly_the_runtime_closure() -> None:
    """Nothing missing (``--require-hashes`` would refuse the build) and nothing extra: the same
    distributions the installed project needs (the prune list is computed from the same graph)."""
    assert set(parse_lock(RUNTIME_LOCK.read_text())) == closure() - {"kserve-canary"}
    # No test or sandbox tool leaks into the image's lock.
    dev = {canonical(Requirement(r).name) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    assert not dev & set(parse_lock(RUNTIME_LOCK.read_text())) - closure()


def test_build_lock_agrees_with_the_build_system() -> None:
    assert lock_problems(BUILD_LOCK.read_text(), PYPROJECT["build-system"]["requires"]) == []
    assert set(parse_lock(BUILD_LOCK.read_text())) == {"setuptools"}


def test_lock_headers_name_the_command_that_regenerates_them() -> None:
    for lock, source in ((RUNTIME_LOCK, "pyproject.toml"), (BUILD_LOCK, "requirements/build.in")):
        header = lock.read_text().split("\n\n", 1)[0]
        assert "pip-compile" in header and "--generate-hashes" in header and source in header, lock


def test_the_agreement_check_fails_on_drift() -> None:
    text = RUNTIME_LOCK.read_text()
    declared = PYPROJECT["project"]["dependencies"]
    # A dependency added to pyproject.toml without relocking.
    assert "left-pad is not in the lock" in lock_problems(text, [*declared, "left-pad>=1"])
    # A range raised past the locked version.
    version = parse_lock(text)["kubernetes"].version
    raised = [r if not r.startswith("kubernetes") else "kubernetes>=99" for r in declared]
    assert f"kubernetes=={version} does not satisfy >=99" in lock_problems(text, raised)
    # An entry whose hashes were deleted.
    unhashed = re.sub(r"(pyyaml==[^\s]+) \\\n(\s+--hash=[^\n]+\n)+", r"\1\n", text)
    assert "pyyaml has no hash" in lock_problems(unhashed, declared)
    with pytest.raises(AssertionError, match="not an exact pin"):
        parse_lock("requests>=2\n")


def test_dockerfile_installs_only_from_the_locks() -> None:
    steps = instructions()
    copies = [args for keyword, args in steps if keyword == "COPY" and not args.startswith("--from")]
    assert "requirements/controller.txt requirements/build.txt ./requirements/" in copies
    installs = [
        part.strip()
        for keyword, args in steps
        if keyword == "RUN"
        for part in args.split("&&")
        if re.search(r"\bpip\b.* install ", part)
    ]
    assert installs, "the Dockerfile installs nothing?"
    for install in installs:
        if " -r " in install:
            assert "--require-hashes" in install and "--only-binary=:all:" in install, install
            assert re.search(r"-r requirements/(controller|build)\.txt$", install), install
        else:
            # The project's own wheel: its dependencies came from the lock.
            assert "--no-deps" in install and install.endswith("/tmp/dist/kserve_canary-*.whl"), install
    assert any(
        "-r requirements/controller.txt" in i and "/opt/kserve-canary/bin/python" in i for i in installs
    )
    wheel = next(args for keyword, args in steps if keyword == "RUN" and "pip wheel" in args)
    assert "--no-deps --no-build-isolation" in wheel, "the build backend comes from requirements/build.txt"


def test_base_image_is_pinned_by_a_default_digest_a_build_can_override() -> None:
    steps = instructions()
    arguments = [args for keyword, args in steps if keyword == "ARG"]
    assert any(re.fullmatch(r"PYTHON_DIGEST=sha256:[0-9a-f]{64}", a) for a in arguments), (
        "a default digest: plain `docker build .` builds on pinned bytes"
    )
    for keyword, args in steps:
        if keyword == "FROM":
            assert args.split()[0] == "${PYTHON_IMAGE}@${PYTHON_DIGEST}", args
    text = (ROOT / "Dockerfile").read_text()
    assert "--build-arg PYTHON_DIGEST=sha256:" in text and "imagetools inspect" in text


def chart_images(manifests: list[dict[str, object]]) -> list[str]:
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]  # type: ignore[index]
    return [c["image"] for c in [*pod["containers"], *pod.get("initContainers", [])]]  # type: ignore[index]


GIT_SYNC = CHART_VARIANTS["git-sync-https"]["gitSync"]


def test_chart_renders_every_image_by_digest_when_given() -> None:
    values = {"image": {"digest": DIGEST}, "gitSync": {**GIT_SYNC, "image": {"digest": DIGEST}}}
    images = chart_images(render_chart(values))
    assert len(images) == 3  # controller, git-sync sidecar, git-sync init container
    for image in images:
        assert DIGEST_REFERENCE.fullmatch(image), image
        assert image.endswith("@" + DIGEST)


def test_the_notes_warn_when_the_controller_image_is_not_pinned_by_digest() -> None:
    """Issue #34, finding 11: an install by tag is told, once, that a tag can be moved."""
    unpinned = render_notes()
    assert "WARNING: the controller image is not pinned by digest" in unpinned
    assert "ghcr.io/kserve-canary/kserve-canary:" in unpinned and "image.digest" in unpinned
    assert "crane digest" in unpinned
    assert "not pinned by digest" not in render_notes({"image": {"digest": DIGEST}})


def test_the_chart_refuses_an_image_without_digest_only_when_asked_to() -> None:
    """A warning by default (the NOTES above); with image.requireDigest a render without a digest
    fails, naming the value and how to find the digest."""
    with pytest.raises(helm.HelmError, match=r"image\.digest is required \(image\.requireDigest\)"):
        render_chart({"image": {"requireDigest": True}})
    pinned = render_chart({"image": {"requireDigest": True, "digest": DIGEST}})
    assert controller_container(pinned)["image"].endswith(f"@{DIGEST}")
    assert controller_container(render_chart())["image"].startswith("ghcr.io/kserve-canary/kserve-canary:")


def test_git_sync_needs_a_digest() -> None:
    without = {"gitSync": {**GIT_SYNC, "image": {"digest": ""}}}
    with pytest.raises(helm.HelmError, match=r"gitSync\.image\.digest is required"):
        render_chart_text(without)
    with pytest.raises(helm.HelmError, match="does not match pattern"):
        render_chart_text({"gitSync": {**GIT_SYNC, "image": {"digest": "v4.4.0"}}})


def test_defaults_document_how_to_pin() -> None:
    values = yaml.safe_load((ROOT / "charts" / "kserve-canary" / "values.yaml").read_text())
    text = (ROOT / "charts" / "kserve-canary" / "values.yaml").read_text()
    assert values["image"]["digest"] == "" and values["gitSync"]["image"]["digest"] == ""
    assert "crane digest" in text or "imagetools inspect" in text
    kustomization = (DEPLOY / "base" / "kustomization.yaml").read_text()
    assert "kustomize edit set image" in kustomization and "@sha256:" in kustomization


def test_a_kustomize_digest_pins_the_controller_image(tmp_path: Path) -> None:
    for name in INSTALLABLE:
        image = controller_container(kustomize(KUSTOMIZATIONS[name]))["image"]
        assert image.startswith("ghcr.io/kserve-canary/kserve-canary"), image
    overlay = tmp_path / "pinned"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(DEPLOY / "overlays" / "cluster-wide", overlay)],
                "images": [{"name": "ghcr.io/kserve-canary/kserve-canary", "digest": DIGEST}],
            }
        )
    )
    image = controller_container(kustomize(overlay))["image"]
    assert DIGEST_REFERENCE.fullmatch(image) and image.endswith("@" + DIGEST), image
