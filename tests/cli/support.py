"""A cluster for the CLI (the API emulator over HTTP), and the CLI run as the console script runs it.

``run`` calls the command in this process (Typer's runner: the same ``app`` the console script calls,
the same arguments, environment variables and exit code, stdout and stderr apart, neither a terminal):
a process per command would cost an interpreter and the Kubernetes client's import, about 1.5
CPU-seconds under coverage, for nothing the test checks. ``spawn`` runs the installed console script
as a real process, for the tests of the entry points themselves (the kubectl plugin, Ctrl-C, start-up).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import structlog
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from kubernetes import client, config

from canary.kserve.store import COMMAND_KEY, EXPLAIN_KEY, STATE_KEY, ConfigMapStateStore
from canary.rollout.state import HistoryEntry, Phase, RolloutState, StepProgress

BIN = Path(sys.executable).parent  # where the console scripts are installed beside the interpreter


@dataclass
class Cluster:
    emulator: Emulator
    server: EmulatorServer
    kubeconfig: Path
    api: client.ApiClient
    home: Path  # HOME of the CLI processes: no ~/.kube/config there

    @property
    def store(self) -> ConfigMapStateStore:
        return ConfigMapStateStore(self.api)

    def save(self, namespace: str, name: str, files: Mapping[str, str]) -> None:
        """Store a rollout's ConfigMap as the controller would have written it."""
        current = self.store.load(namespace, name)
        self.store.save_files(
            namespace, name, dict(files), resource_version=current.resource_version, owner_uid=None
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        for namespace in ("ml", "payments"):
            emulator.create_namespace(namespace)
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        home = tmp_path / "home"
        home.mkdir()
        yield Cluster(emulator, server, kubeconfig, api, home)


def progressing(revision: str, *, step: int = 0, weight: int = 10, minutes_ago: float = 3.2) -> RolloutState:
    started = datetime.now(UTC) - timedelta(minutes=minutes_ago)
    return RolloutState(
        phase=Phase.PROGRESSING,
        revision=revision,
        started_at=started,
        step=StepProgress(index=step, weight=weight, started_at=started),
        history=(
            HistoryEntry(started, "wait", weight, Phase.PROGRESSING, "CanaryWaiting", "holding step 1", "d1"),
        ),
    )


def state_files(state: RolloutState, **extra: str) -> dict[str, str]:
    files = {STATE_KEY: state.to_json()}
    if "command" in extra:
        files[COMMAND_KEY] = extra["command"]
    if "explain" in extra:
        files[EXPLAIN_KEY] = extra["explain"]
    return files


def environment(home: Path, **extra: str) -> dict[str, str]:
    """The CLI's environment: no KUBECONFIG and an empty HOME unless given, no colours."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"KUBECONFIG", "KSERVE_CANARY_DEBUG", "FORCE_COLOR", "PROMETHEUS_EXTERNAL_URL"}
        and not key.startswith("KUBERNETES_")
    }
    env.update({"HOME": str(home), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}, **extra)
    return env


_UNSET = ("KUBECONFIG", "KSERVE_CANARY_DEBUG", "FORCE_COLOR", "PROMETHEUS_EXTERNAL_URL")


def run(
    *arguments: str, home: Path, program: str = "kserve-canary", timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """``program ARGUMENTS`` as the person types it, in ``environment(home, **env)``: ``kserve-canary``
    in this process, anything else (``kubectl``) as a real process."""
    if program != "kserve-canary":
        return spawn(*arguments, home=home, program=program, timeout=timeout, **env)
    return invoke(*arguments, home=home, **env)


def invoke(*arguments: str, home: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``kserve-canary ARGUMENTS`` in this process, its environment as ``environment(home, **env)``
    gives it (without ``home``, this process's HOME), its result in ``subprocess.run``'s shape.

    An exception the command lets out is printed on stderr with exit code 1, as the interpreter of
    the console script would: the test sees the failure as a person would."""
    from typer.testing import CliRunner

    from canary.cli import app

    variables: dict[str, str | None] = {
        key: None for key in os.environ if key in _UNSET or key.startswith("KUBERNETES_")
    }
    if home is not None:
        variables["HOME"] = str(home)
    variables.update(env)
    with _own_logging():
        result = CliRunner().invoke(app, list(arguments), env=variables, prog_name="kserve-canary")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["kserve-canary", *arguments], result.exit_code, result.stdout, stderr)


@contextmanager
def _own_logging() -> Iterator[None]:
    """structlog's configuration as it was before the command: a command may configure it for its
    process (``backtest`` sends only errors to stderr), and here its process is the test's, its
    stderr the runner's, closed once the command has returned."""
    configured, saved = structlog.is_configured(), structlog.get_config()
    try:
        yield
    finally:
        if configured:
            structlog.configure(**saved)
        else:
            structlog.reset_defaults()


def spawn(
    *arguments: str, home: Path, program: str = "kserve-canary", timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """The installed console script (or ``kubectl``) as a real process, its stdout a pipe."""
    return subprocess.run(
        [str(BIN / program) if program != "kubectl" else "kubectl", *arguments],
        capture_output=True,
        text=True,
        env=environment(home, **env),
        timeout=timeout,
        check=False,
    )


def popen_with_ctrl_c(args: list[str], **options: Any) -> subprocess.Popen[str]:
    """``subprocess.Popen`` for a child that must stop on Ctrl-C, whatever this process inherited: a
    child inherits an *ignored* SIGINT (never a handler), and pytest-xdist's workers run with SIGINT
    ignored when started without a terminal (a background job, a CI runner) — the child's Python then
    leaves it ignored and Ctrl-C does nothing. Called from the main thread (as tests are)."""
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **options)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def interrupt_and_wait(process: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """Ctrl-C ``process`` and wait for it to exit, draining its pipes meanwhile (``wait()`` with an
    unread pipe can block the child on a write); its stderr. A child that has not exited by then is
    made to print every thread's stack (SIGABRT: start it with ``PYTHONFAULTHANDLER=1``) and the test
    fails with them: where it hung, not just that it did."""
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        _, err = process.communicate(timeout=10)
        pytest.fail(f"no exit within {timeout:g} s of Ctrl-C; its threads:\n{(err or '')[-8000:]}")
    return err or ""
