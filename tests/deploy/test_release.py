"""The release artefacts' static checks (tests/deploy/release.py, which `make release-check` runs after
`make test`, building and installing the distributions too): each check passes on this tree and
fails on the mistake it is there for. Nothing is published here: the release workflow does that
with the release owner's credentials."""

from __future__ import annotations

import io
import json
import re
import tarfile
import zipfile
from pathlib import Path

import helm_python as helm
import pytest
import yaml

from tests.deploy.release import (
    CHART,
    CRD,
    DOCKERFILE,
    ROOT,
    WORKFLOWS,
    chart_findings,
    distribution_findings,
    dockerfile_findings,
    kustomize_findings,
    package_chart,
    package_kustomize,
    project_version,
    semver,
    version_findings,
    workflow_findings,
)

DIGEST = "sha256:" + "ab" * 32


# ---------------------------------------------------------------------------------------- Dockerfile


def test_dockerfile_builds_with_plain_docker_build_on_a_pinned_base() -> None:
    assert dockerfile_findings(DOCKERFILE.read_text()) == []
    pinned = re.search(r"^ARG PYTHON_DIGEST=(\S+)$", DOCKERFILE.read_text(), flags=re.MULTILINE)
    assert pinned and re.fullmatch(r"sha256:[0-9a-f]{64}", pinned[1])


@pytest.mark.parametrize(
    ("change", "finding"),
    [
        (("ARG PYTHON_DIGEST=sha256:", "ARG PYTHON_DIGEST_UNUSED=sha256:"), "not pinned by a sha256 digest"),
        (
            ("ARG PYTHON_IMAGE=python:3.11-slim-bookworm", "ARG PYTHON_IMAGE=python:latest"),
            "moving tag latest",
        ),
        (("ARG PYTHON_IMAGE=python:3.11-slim-bookworm", "ARG PYTHON_IMAGE=python"), "names no tag"),
        (("USER 65532:65532", "USER root"), "non-root USER"),
        (("USER 65532:65532", "USER 0:0"), "non-root USER"),
        (("USER 65532:65532\n", ""), "non-root USER"),
        (("--build-arg PYTHON_DIGEST=", "--build-arg PYTHON_BASE="), "how to override PYTHON_DIGEST"),
    ],
)
def test_the_dockerfile_check_catches(change: tuple[str, str], finding: str) -> None:
    text = DOCKERFILE.read_text()
    assert change[0] in text
    findings = dockerfile_findings(text.replace(*change))
    assert any(finding in f for f in findings), findings


def test_the_dockerfile_check_catches_an_unpinned_frontend_and_from_line() -> None:
    findings = dockerfile_findings("# syntax=docker/dockerfile:1\nFROM python:3.11-slim\nUSER 1000\n")
    assert any("frontend docker/dockerfile:1" in f for f in findings)
    assert any("'python:3.11-slim' is not pinned" in f for f in findings)
    stage = (
        "FROM python:3.11-slim@" + DIGEST + " AS build\nFROM build\nUSER 1000\n# --build-arg PYTHON_DIGEST=\n"
    )
    assert dockerfile_findings(stage) == [], "a stage built FROM an earlier stage pulls nothing"


def test_renovate_proposes_new_digests_of_the_pinned_tag() -> None:
    config = json.loads((ROOT / ".github" / "renovate.json").read_text())
    (manager,) = config["customManagers"]
    assert manager["datasourceTemplate"] == "docker"
    (pattern,) = manager["matchStrings"]
    # Renovate's named groups (?<name>...) are Python's (?P<name>...).
    match = re.search(pattern.replace("(?<", "(?P<"), DOCKERFILE.read_text())
    assert match, "the regex no longer finds the Dockerfile's base image: Renovate would stop updating it"
    assert (match["depName"], match["currentValue"]) == ("python", "3.11-slim-bookworm")
    assert f"ARG PYTHON_DIGEST={match['currentDigest']}\n" in DOCKERFILE.read_text()


# ---------------------------------------------------------------------------------------- versions


@pytest.mark.parametrize(
    ("pep440", "expected"),
    [
        ("0.1.0", "0.1.0"),
        ("0.1.0.dev0", "0.1.0-dev.0"),
        ("1.2", "1.2.0"),
        ("0.2.0rc1", "0.2.0-rc.1"),
        ("0.2.0b2", "0.2.0-beta.2"),
    ],
)
def test_semver_spelling_of_the_python_version(pep440: str, expected: str) -> None:
    assert semver(pep440) == expected


def test_chart_and_python_versions_agree() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == semver(project_version())


def test_a_tag_must_name_a_released_version() -> None:
    version = project_version()
    assert any("development version" in f for f in version_findings(f"v{version}")) == ("dev" in version)
    assert any("is not v" in f for f in version_findings("v9.9.9"))


# ---------------------------------------------------------------------------------------- chart


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return package_chart(tmp_path_factory.mktemp("chart"))


def test_chart_package_holds_chart_yaml_and_the_crd_and_lints(package: Path) -> None:
    with tarfile.open(package) as archive:
        names = archive.getnames()
    assert "kserve-canary/Chart.yaml" in names and f"kserve-canary/{CRD}" in names
    assert package.name == f"kserve-canary-{semver(project_version())}.tgz"
    assert chart_findings(package, project_version()) == []


def test_the_chart_check_catches_a_version_that_disagrees(package: Path) -> None:
    findings = chart_findings(package, "0.3.0")
    assert any("Chart.yaml version" in f and "0.3.0" in f for f in findings)


def test_the_chart_check_catches_a_stale_crd(package: Path, tmp_path: Path) -> None:
    stale = tmp_path / package.name
    with tarfile.open(package) as source, tarfile.open(stale, "w:gz") as target:
        for member in source.getmembers():
            data = source.extractfile(member)
            content = data.read() if data else b""
            if member.name.endswith(CRD):
                content = content.replace(b"PromotionPolicy", b"PromotionPolicyOld", 1)
                member.size = len(content)
            target.addfile(member, io.BytesIO(content))
    assert any("differs from deploy/" in f for f in chart_findings(stale, project_version()))


def test_released_chart_pins_the_image_digest(tmp_path: Path) -> None:
    released = package_chart(tmp_path, image_digest=DIGEST, version="0.1.0")
    assert chart_findings(released, "0.1.0", image_digest=DIGEST) == []
    assert any(
        "image.digest" in f for f in chart_findings(released, "0.1.0", image_digest="sha256:" + "cd" * 32)
    )


def test_released_kustomize_manifests_pin_the_image_digest(tmp_path: Path) -> None:
    """The digest is known only after the push: the repository's base leaves it empty (the tag is used,
    for a git ref and development), the release's deploy/ archive carries it in the base's images entry,
    and every installable overlay of the archive renders the image by it."""
    base = yaml.safe_load((ROOT / "deploy" / "base" / "kustomization.yaml").read_text())
    (entry,) = base["images"]
    assert (entry["name"], entry["digest"]) == ("ghcr.io/kserve-canary/kserve-canary", "")
    released = package_kustomize(tmp_path, image_digest=DIGEST, version="0.1.0")
    assert released.name == "kserve-canary-deploy-0.1.0.tar.gz"
    assert kustomize_findings(released, DIGEST) == []
    other = "sha256:" + "cd" * 32
    assert len(kustomize_findings(released, other)) == 2  # both overlays, each named
    with tarfile.open(released) as archive:
        member = archive.extractfile("kserve-canary-deploy-0.1.0/base/kustomization.yaml")
        assert member is not None
        (pinned,) = yaml.safe_load(member.read())["images"]
    assert pinned["digest"] == DIGEST
    with pytest.raises(SystemExit, match="expected sha256"):
        package_kustomize(tmp_path, image_digest="latest")


def notes(package: Path, *, upgrade: bool = False) -> str:
    with helm.Chart.load_archive(package.read_bytes()) as chart:
        rendered = chart.render(
            {}, name="kserve-canary", namespace="kserve-canary", is_install=not upgrade, is_upgrade=upgrade
        )
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def test_notes_promise_pypi_only_for_a_released_chart(package: Path, tmp_path: Path) -> None:
    development = notes(package)
    assert "pip install kserve-canary" not in development and "pipx install kserve-canary" not in development
    assert "pip install ./kserve-canary" in development
    released = notes(package_chart(tmp_path, version="0.1.0"))
    assert "pipx install kserve-canary==0.1.0" in released and "git clone" not in released


def test_notes_on_upgrade_say_the_crd_is_not_upgraded(package: Path, tmp_path: Path) -> None:
    assert "kubectl apply --server-side" not in notes(package)
    assert "kubectl apply --server-side --force-conflicts -f charts/kserve-canary/crds/" in notes(
        package, upgrade=True
    )
    released = notes(package_chart(tmp_path, version="0.1.0"), upgrade=True)
    assert "releases/download/v0.1.0/promotionpolicies.yaml" in released


# ---------------------------------------------------------------------------------------- Python


def _sdist(path: Path, names: list[str]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name in names:
            info = tarfile.TarInfo(f"kserve_canary-0/{name}")
            archive.addfile(info, io.BytesIO(b""))
    return path


def _wheel(path: Path, names: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            archive.writestr(name, "")
    return path


def test_the_distribution_check_catches_the_sandbox_and_missing_files(tmp_path: Path) -> None:
    complete = ["canary/py.typed", "canary/dashboard/static/index.html", "canary/cli/__init__.py"]
    sdist = _sdist(tmp_path / "s.tar.gz", ["pyproject.toml", *complete])
    assert distribution_findings(sdist, _wheel(tmp_path / "ok.whl", complete)) == []
    stray = _wheel(tmp_path / "stray.whl", [*complete, "canary_sandbox/emulator.py"])
    assert any("canary_sandbox/emulator.py" in f for f in distribution_findings(sdist, stray))
    bare = _wheel(tmp_path / "bare.whl", complete[1:])
    assert any("misses canary/py.typed" in f for f in distribution_findings(sdist, bare))
    with_tests = _sdist(tmp_path / "t.tar.gz", [*complete, "tests/test_retrying.py"])
    assert distribution_findings(with_tests, _wheel(tmp_path / "ok.whl", complete)) != []


# ---------------------------------------------------------------------------------------- workflows


def test_release_workflow_publishes_by_digest_signed_and_trusted() -> None:
    assert workflow_findings() == []


@pytest.mark.parametrize(
    ("change", "finding"),
    [
        (
            ('cosign sign --yes "${IMAGE}@${DIGEST}"', 'cosign sign --yes "${IMAGE}:${GITHUB_REF_NAME}"'),
            "signs the image",
        ),
        (('--image-digest "${DIGEST}"', "--image-digest sha256:0"), "packages the chart"),
        (
            ('package-kustomize --image-digest "${DIGEST}"', "package-kustomize --image-digest sha256:0"),
            "packages the Kustomize manifests",
        ),
        ((" artefacts/kustomize/*.tar.gz", ""), "attaches the digest-pinned Kustomize manifests"),
        (("sbom: true", "sbom: false"), "SBOM"),
        (("run: .ci/run", "run: make test"), "release-check"),
        (("@76f52bc884231f62b9a034ebfe128415bbaabdfc # v1.12.4", "@release/v1"), "pins every action"),
        (
            (
                "      - uses: pypa/gh-action-pypi-publish@76f52bc884231f62b9a034ebfe128415bbaabdfc # v1.12.4\n",
                "      - uses: pypa/gh-action-pypi-publish@76f52bc884231f62b9a034ebfe128415bbaabdfc # v1.12.4\n"
                "        with:\n          password: ${{ secrets.PYPI_TOKEN }}\n",
            ),
            "trusted publishing",
        ),
    ],
)
def test_the_workflow_check_catches(change: tuple[str, str], finding: str, tmp_path: Path) -> None:
    text = (WORKFLOWS / "release.yml").read_text()
    assert change[0] in text
    (tmp_path / "release.yml").write_text(text.replace(*change))
    findings = workflow_findings(tmp_path)
    assert any(finding in f for f in findings), findings


def test_ci_runs_release_check_after_make_test() -> None:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert lines.index("make test") < lines.index("make release-check")
    ci = yaml.safe_load((WORKFLOWS / "ci.yml").read_text())
    assert [s["run"] for s in ci["jobs"]["test"]["steps"] if "run" in s] == [".ci/run"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(
        r"^release-check: .*\n\t\$\(PY\) -m tests\.deploy\.release check ", makefile, flags=re.MULTILINE
    )


# ---------------------------------------------------------------------------------------- docs


def test_readme_says_which_install_commands_work_before_the_first_release() -> None:
    from tests.deploy.test_docs import install_section

    section = install_section()
    before, _, after = section.partition("**After the first release**")
    assert "**Before the first release**" in before and after
    for needle in ("pip install .", "docker build -t", "--set image.repository=", "--set image.digest="):
        assert needle in before, needle
    for pypi in ("pip install kserve-canary", "pipx install kserve-canary", "uv tool install kserve-canary"):
        assert pypi not in before, "nothing named kserve-canary is on PyPI before the release"
    assert "--build-arg PYTHON_DIGEST" not in section, "plain docker build works"
    assert (
        "oci://ghcr.io/kserve-canary/charts/kserve-canary" in after
        and "pipx install kserve-canary==" in after
    )


def test_install_guide_documents_the_crd_upgrade_and_the_plugin_choice() -> None:
    guide = (ROOT / "docs" / "install.md").read_text()
    assert f"kubectl apply --server-side --force-conflicts -f charts/kserve-canary/{CRD}" in guide
    assert "releases/download/v" in guide and "pre-upgrade hook" in guide
    assert (
        "krew" in guide and "pipx install kserve-canary" in guide and "uv tool install kserve-canary" in guide
    )
