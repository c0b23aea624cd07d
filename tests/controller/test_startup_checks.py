"""canary.controller.startup in-process: each bad input is a StartupError naming it (the subprocess
tests in test_startup.py check the one line and exit code 2 of the real command)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from canary.controller.startup import (
    StartupError,
    check_metrics_port,
    check_prometheus_url,
    load_kubernetes,
)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("prometheus:9090", "write it as http://prometheus:9090"),
        ("http://[::1", "IPv6"),
        ("http://", "no host"),
        ("http://p:99999", "invalid port"),
        ("ftp://p:21", "no http:// or https:// scheme"),
    ],
)
def test_bad_prometheus_urls_are_named(url: str, expected: str) -> None:
    with pytest.raises(StartupError, match="--prometheus-url") as raised:
        check_prometheus_url(url)
    assert expected in str(raised.value)


@pytest.mark.parametrize("url", ["http://localhost:9090", "https://[::1]:9090/prometheus", "http://p"])
def test_good_prometheus_urls_pass(url: str) -> None:
    check_prometheus_url(url)


def test_credentials_in_a_url_are_masked() -> None:
    with pytest.raises(StartupError) as raised:
        check_prometheus_url("http://me:hunter2@[::1")
    assert "hunter2" not in str(raised.value)
    assert "//***@" in str(raised.value)


def test_a_taken_port_is_named() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(
            StartupError, match=f"--metrics-port \\(METRICS_PORT\\) {port} on 127.0.0.1 is already"
        ):
            check_metrics_port(port, "127.0.0.1")


def test_a_negative_port_turns_the_server_off_and_is_not_checked() -> None:
    check_metrics_port(-1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, "does not exist"), ("", "is empty"), ("a: [", "not YAML"), ("- a", "expected a mapping")],
)
def test_bad_kubeconfigs_are_named(tmp_path: Path, text: str | None, expected: str) -> None:
    path = tmp_path / "kubeconfig"
    if text is not None:
        path.write_text(text)
    with pytest.raises(StartupError) as raised:
        load_kubernetes(str(path))
    assert str(path) in str(raised.value)
    assert expected in str(raised.value)
