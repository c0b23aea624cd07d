"""Every failure is one or two lines — what failed, what to do — with its documented exit code
(0 ok, 1 refused or invalid, 2 usage, 3 cluster or Prometheus unreachable); --debug adds the
traceback. The real process, as a person runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig

from tests.cli.support import Cluster, run

CLUSTER_COMMANDS = [
    ["status"],
    ["explain", "ml/llama"],
    ["pause", "ml/llama", "--no-wait"],
    ["approve", "ml/llama"],
]


def assert_short(stderr: str) -> list[str]:
    lines = stderr.strip().splitlines()
    assert 1 <= len(lines) <= 2, stderr
    assert "Traceback" not in stderr
    return lines


@pytest.mark.parametrize("arguments", CLUSTER_COMMANDS, ids=lambda a: a[0])
def test_no_kubeconfig_is_one_line_and_exit_3(tmp_path: Path, arguments: list[str]) -> None:
    completed = run(*arguments, home=tmp_path)
    assert completed.returncode == 3, completed.stderr
    lines = assert_short(completed.stderr)
    assert lines[0] == (
        "error: no usable kubeconfig: KUBECONFIG is not set, ~/.kube/config does not exist and this is "
        "not a pod"
    )
    assert completed.stdout == ""
    missing = run(*arguments, "--kubeconfig", str(tmp_path / "nope"), home=tmp_path)
    assert missing.returncode == 3
    assert (
        assert_short(missing.stderr)[0] == f"error: no usable kubeconfig: {tmp_path / 'nope'} does not exist"
    )


@pytest.fixture
def closed_port_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig of an API server that has gone: its port is closed."""
    with EmulatorServer(Emulator(KServeConfig())) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        url = server.url
    assert url in kubeconfig.read_text()
    return kubeconfig


@pytest.mark.parametrize("arguments", CLUSTER_COMMANDS, ids=lambda a: a[0])
def test_an_unreachable_api_server_is_two_lines_and_exit_3(
    closed_port_kubeconfig: Path, tmp_path: Path, arguments: list[str]
) -> None:
    completed = run(*arguments, home=tmp_path, KUBECONFIG=str(closed_port_kubeconfig))
    assert completed.returncode == 3, completed.stderr
    first, hint = assert_short(completed.stderr)
    assert first.startswith("error: cannot reach the Kubernetes API server at http"), first
    assert first.endswith("Connection refused"), first
    assert "--debug" in hint
    debug = run("--debug", *arguments, home=tmp_path, KUBECONFIG=str(closed_port_kubeconfig))
    assert debug.returncode == 3
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-2].startswith("error: cannot reach the Kubernetes API server")


def test_usage_errors_exit_2(cluster: Cluster) -> None:
    for arguments in (
        ["status", "-o", "xml"],
        ["explain", "ml/llama/x"],
        ["explain", "-n", "web", "ml/llama"],
        ["pause"],
        ["no-such-command"],
    ):
        completed = run(*arguments, home=cluster.home, KUBECONFIG=str(cluster.kubeconfig))
        assert completed.returncode == 2, (arguments, completed.stderr)
        assert "Traceback" not in completed.stderr
        assert "Error:" in completed.stderr


def test_forbidden_is_refused_with_the_servers_words(cluster: Cluster) -> None:
    cluster.emulator.faults.add_from_json({"method": "GET", "path": "/api/v1/configmaps", "status": 403})
    completed = run("status", home=cluster.home, KUBECONFIG=str(cluster.kubeconfig))
    assert completed.returncode == 1, completed.stderr
    first, hint = assert_short(completed.stderr)
    assert first.startswith("error: forbidden:")
    assert "kserve-canary-viewer" in hint
