"""kubectl habits: NAME in the namespace of -n or of the kubeconfig's context, -A, a did-you-mean for a
name nobody knows, and `status NAME --watch` that blocks until the rollout ends and exits with its
outcome (docs/cli.md: 0 promoted, 4 rolled back, 5 paused, 6 still under way at --timeout) — the real
process against the API emulator."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from canary.rollout.state import HistoryEntry, Pause, PauseKind, Phase, RolloutState
from tests.cli.support import BIN, Cluster, environment, progressing, run, state_files


def cli(cluster: Cluster, *arguments: str, kubeconfig: str | None = None) -> subprocess.CompletedProcess[str]:
    return run(*arguments, home=cluster.home, KUBECONFIG=kubeconfig or str(cluster.kubeconfig))


def test_a_name_resolves_in_the_namespace_of_n_or_of_the_context(cluster: Cluster) -> None:
    cluster.save("ml", "llama", state_files(progressing("llama-predictor-00002")))
    for arguments in (["ml/llama"], ["-n", "ml", "llama"], ["llama", "-n", "ml"]):
        completed = cli(cluster, "explain", *arguments)
        assert completed.returncode == 0, (arguments, completed.stderr)
        assert completed.stdout.startswith("ml/llama: no evaluation recorded yet"), completed.stdout
    # The emulator's kubeconfig names namespace default in its context; one that names ml decides.
    assert cli(cluster, "explain", "llama").returncode == 1
    in_ml = cluster.server.write_kubeconfig(cluster.home / "ml-kubeconfig", namespace="ml")
    completed = cli(cluster, "explain", "llama", kubeconfig=str(in_ml))
    assert completed.returncode == 0, completed.stderr
    assert cli(cluster, "status", "llama", kubeconfig=str(in_ml)).stdout.splitlines()[1].split()[:2] == [
        "ml",
        "llama",
    ]


def test_status_all_namespaces_is_accepted_and_contradictions_are_usage_errors(cluster: Cluster) -> None:
    cluster.save("ml", "llama", state_files(progressing("llama-predictor-00002")))
    cluster.save("payments", "fraud", state_files(RolloutState(phase=Phase.SUCCEEDED, revision="fraud-1")))
    listed = cli(cluster, "status", "-A")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["ml", "payments"]
    assert cli(cluster, "status", "-A", "-n", "ml").returncode == 2
    contradiction = cli(cluster, "explain", "-n", "payments", "ml/llama")
    assert contradiction.returncode == 2
    assert "names namespace ml, but -n says payments" in contradiction.stderr


def test_an_unknown_name_gets_the_names_it_may_have_meant(cluster: Cluster) -> None:
    cluster.save("ml", "llama-chat", state_files(progressing("llama-chat-predictor-00002")))
    typo = cli(cluster, "explain", "ml/llama-caht")
    assert typo.returncode == 1
    assert (
        "no rollout state for ml/llama-caht: kserve-canary has not seen it; did you mean ml/llama-chat?"
        in (typo.stderr)
    )
    elsewhere = cli(cluster, "pause", "payments/llama-chat", "--no-wait")
    assert elsewhere.returncode == 1
    assert "did you mean ml/llama-chat?" in elsewhere.stderr
    unrelated = cli(cluster, "explain", "ml/fraud")
    assert "did you mean" not in unrelated.stderr


def _ended(phase: Phase, reason: str, **fields: object) -> RolloutState:
    at = datetime.now(UTC)
    entry = HistoryEntry(at, "end", 0, phase, "Ended", reason, "d2")
    return RolloutState(phase=phase, revision="llama-predictor-00002", history=(entry,), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (_ended(Phase.SUCCEEDED, "Promoted llama-predictor-00002"), 0),
        (_ended(Phase.ROLLED_BACK, "Rolled back: error-rate 7.1% > 1%"), 4),
        (
            _ended(
                Phase.PAUSED,
                "paused by alice",
                pause=Pause(PauseKind.MANUAL, "paused by alice", datetime.now(UTC), Phase.PROGRESSING),
            ),
            5,
        ),
    ],
    ids=["promoted", "rolled-back", "paused"],
)
def test_status_name_watch_exits_with_the_outcome(cluster: Cluster, state: RolloutState, code: int) -> None:
    cluster.save("ml", "llama", state_files(state))
    completed = cli(cluster, "status", "ml/llama", "--watch")
    assert completed.returncode == code, completed.stderr
    assert completed.stdout.startswith(f"ml/llama: {state.phase} llama-predictor-00002"), completed.stdout


def test_status_name_watch_follows_the_rollout_to_its_rollback(cluster: Cluster) -> None:
    running = progressing("llama-predictor-00002")
    cluster.save("ml", "llama", state_files(running))
    follower = subprocess.Popen(
        [str(BIN / "kserve-canary"), "status", "llama", "-n", "ml", "-w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(cluster.home, KUBECONFIG=str(cluster.kubeconfig)),
    )
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()
        assert first == "ml/llama: Progressing llama-predictor-00002 step 1 (10%) — holding step 1\n", first
        assert follower.poll() is None, "an unfinished rollout is followed"
        rolled_back = replace(
            _ended(Phase.ROLLED_BACK, "Rolled back: error-rate 7.1% > 1%"), started_at=running.started_at
        )
        cluster.save("ml", "llama", state_files(rolled_back))
        rest, errors = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 4, errors
    assert rest.splitlines() == [
        "ml/llama: RolledBack llama-predictor-00002 — Rolled back: error-rate 7.1% > 1%"
    ]


def test_status_name_watch_gives_up_at_the_timeout_as_stalled(cluster: Cluster) -> None:
    cluster.save("ml", "llama", state_files(progressing("llama-predictor-00002")))
    completed = cli(cluster, "status", "ml/llama", "--watch", "--timeout", "1.5")
    assert completed.returncode == 6
    assert "ml/llama is still Progressing after 1.5s (--timeout): stalled" in completed.stderr
