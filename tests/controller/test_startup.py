"""A controller that cannot start says so in one line: which input, what is wrong, what to do; exit 2.

Each case runs the real command, ``python -m canary run ...``, as a subprocess (about 2 s each: marked
``e2e``, like every test of the controller as a process; tests/controller/test_startup_checks.py checks
the same functions in-process for ``make test-fast``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: not-a-real-token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An empty home: no ~/.kube/config, and no in-cluster service account either."""
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(KUBECONFIG)
    return path


def run(home: Path, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("KUBECONFIG", "KUBERNETES_", "PROMETHEUS_", "METRICS_PORT"))
    }
    environment["HOME"] = str(home)
    command = [sys.executable, "-m", "canary", "run", "--policies", str(home), "--no-leader-elect", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=environment, check=False
    )


def assert_one_line(result: subprocess.CompletedProcess[str], *named: str) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for text in named:
        assert text in lines[0]
    return lines[0]


def test_missing_kubeconfig_names_the_file(home: Path, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "kubeconfig.yaml"
    line = assert_one_line(run(home, "--kubeconfig", str(missing), "--metrics-port=-1"), str(missing))
    assert "No configuration found" not in line
    assert "does not exist" in line


def test_missing_kubeconfig_from_the_environment_names_the_variable(home: Path, tmp_path: Path) -> None:
    missing = tmp_path / "gone.yaml"
    environment = {**os.environ, "KUBECONFIG": str(missing), "HOME": str(home)}
    result = subprocess.run(
        [sys.executable, "-m", "canary", "run", "--policies", str(home), "--metrics-port=-1"],
        capture_output=True, text=True, timeout=60, env=environment, check=False,
    )  # fmt: skip
    assert_one_line(result, str(missing), "KUBECONFIG")


def test_no_kubeconfig_at_all_says_where_it_looked(home: Path) -> None:
    line = assert_one_line(run(home, "--metrics-port=-1"), "--kubeconfig")
    assert str(home / ".kube" / "config") in line
    assert "in-cluster" in line


def test_empty_kubeconfig(home: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    line = assert_one_line(run(home, "--kubeconfig", str(empty), "--metrics-port=-1"), str(empty))
    assert "empty" in line


@pytest.mark.parametrize(
    "text", ["::: not yaml [\n", "\tkey: [unclosed\n", "just a string\n", "- a\n- list\n"]
)
def test_garbage_kubeconfig(home: Path, tmp_path: Path, text: str) -> None:
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text(text)
    line = assert_one_line(run(home, "--kubeconfig", str(garbage), "--metrics-port=-1"), str(garbage))
    assert "not a usable kubeconfig" in line


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("prometheus:9090", "http://"),
        ("localhost", "http://"),
        ("http://[::1", "IPv6"),
        ("http://", "no host"),
        ("http://prometheus:99999", "port"),
    ],
)
def test_bad_prometheus_urls(home: Path, kubeconfig: Path, url: str, hint: str) -> None:
    result = run(home, "--kubeconfig", str(kubeconfig), "--metrics-port=-1", "--prometheus-url", url)
    assert_one_line(result, "--prometheus-url", url, hint)


def test_a_prometheus_url_never_shows_its_password(home: Path, kubeconfig: Path) -> None:
    result = run(
        home,
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-port=-1",
        "--prometheus-url",
        "http://u:hunter2@[::1",
    )
    line = assert_one_line(result, "--prometheus-url")
    assert "hunter2" not in line


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_metrics_port_already_taken(home: Path, kubeconfig: Path, taken_port: int) -> None:
    result = run(home, "--kubeconfig", str(kubeconfig), "--metrics-port", str(taken_port))
    line = assert_one_line(result, "--metrics-port", str(taken_port))
    assert "in use" in line


def test_metrics_port_out_of_range(home: Path, kubeconfig: Path) -> None:
    result = run(home, "--kubeconfig", str(kubeconfig), "--metrics-port", "70000")
    assert_one_line(result, "--metrics-port", "70000")
