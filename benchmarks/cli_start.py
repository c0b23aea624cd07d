"""``python -m benchmarks.cli_start``: how long the ``kserve-canary`` process takes per command.

Each command runs as the real console script (a new process, as a person's shell starts it), N
times; the median wall time is printed beside two baselines measured in the same run on the same
machine: ``python -c pass`` (the interpreter alone) and ``python -c "import kubernetes"`` (what
any Kubernetes tool in Python pays). ``status`` and ``explain`` read a rollout from the API emulator
over HTTP. Targets (issue 15): ``--help`` and ``validate`` at most 0.5 s, ``status`` at most 1 s.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from kubernetes import config

from canary.kserve.store import EXPLAIN_KEY, STATE_KEY, ConfigMapStateStore
from canary.rollout.records import ExplainDocument
from canary.rollout.state import Phase, RolloutState

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
RUNS = int(os.environ.get("CLI_START_RUNS", "7"))
TARGETS = {"--help": 0.5, "validate": 0.5, "status": 1.0}


def wall(argv: list[str], env: dict[str, str], runs: int = RUNS) -> float:
    """The median wall time of ``argv`` over ``runs`` runs (one unmeasured run first: disk caches)."""
    subprocess.run(argv, env=env, capture_output=True, check=False)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        completed = subprocess.run(argv, env=env, capture_output=True, check=False)
        times.append(time.perf_counter() - started)
        if completed.returncode not in (0, 1):
            raise RuntimeError(f"{argv} exited {completed.returncode}: {completed.stderr[-500:]}")
    return statistics.median(times)


def main() -> int:
    cli = str(BIN / "kserve-canary")
    with tempfile.TemporaryDirectory() as home, EmulatorServer(Emulator(KServeConfig())) as server:
        kubeconfig = server.write_kubeconfig(Path(home) / "kubeconfig")
        server.emulator.create_namespace("ml")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        state = RolloutState(phase=Phase.PROGRESSING, revision="llama-predictor-00002")
        explain = ExplainDocument(at=datetime.now(UTC), decision_id="d-1", revision="llama-predictor-00002")
        ConfigMapStateStore(api).save_files(
            "ml",
            "llama",
            {STATE_KEY: state.to_json(), EXPLAIN_KEY: explain.to_json()},
            resource_version=None,
            owner_uid=None,
        )
        env = {**os.environ, "HOME": home, "KUBECONFIG": str(kubeconfig)}
        baselines = {
            "python -c pass": wall([sys.executable, "-c", "pass"], env),
            "python -c 'import kubernetes'": wall([sys.executable, "-c", "import kubernetes"], env),
        }
        commands = {
            "--help": [cli, "--help"],
            "--version": [cli, "--version"],
            "validate": [cli, "validate", str(ROOT / "deploy" / "base" / "policies")],
            "status": [cli, "status"],
            "status -o json": [cli, "status", "-o", "json"],
            "explain": [cli, "explain", "ml/llama"],
        }
        measured = {name: wall(argv, env) for name, argv in commands.items()}
    python, kube = baselines.values()
    print(f"median of {RUNS} runs of the real process; baselines measured in the same run")
    for name, seconds in baselines.items():
        print(f"  {name:32} {seconds:6.3f} s")
    failed = False
    for name, seconds in measured.items():
        target = TARGETS.get(name)
        verdict = (
            "" if target is None else ("  ok" if seconds <= target else f"  OVER the {target:g} s target")
        )
        failed |= target is not None and seconds > target
        print(
            f"  kserve-canary {name:18} {seconds:6.3f} s  = {seconds / python:5.1f} x python -c pass, "
            f"{seconds / kube:4.2f} x import kubernetes{verdict}"
        )
    # A measurement, not a gate: a loaded machine is slower; the ratios say how much is ours.
    return 0 if not failed or os.environ.get("CLI_START_STRICT") != "1" else 1


if __name__ == "__main__":
    raise SystemExit(main())
