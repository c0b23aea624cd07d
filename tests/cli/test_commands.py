"""Operator commands refuse at once what the CLI can already tell, with the reason and exit 1, and
write nothing (a command accepted by a running controller: tests/controller/test_command_binding.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from canary.rollout.state import Phase, RolloutState
from tests.cli.support import Cluster, progressing, run, state_files


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("approve", "no step waits for approval (phase Succeeded)"),
        ("pause", "no rollout in progress (phase Succeeded)"),
        ("abort", "no rollout in progress (phase Succeeded)"),
        ("promote", "no rollout in progress (phase Succeeded)"),
        ("resume", "the rollout is not paused (phase Succeeded)"),
    ],
)
def test_a_finished_rollout_refuses_every_command_at_once(
    cluster: Cluster, command: str, reason: str
) -> None:
    cluster.save(
        "ml", "llama", state_files(RolloutState(phase=Phase.SUCCEEDED, revision="llama-predictor-00002"))
    )
    before = cluster.store.load("ml", "llama").resource_version
    completed = run(
        command, "ml/llama", "--wait", "30", home=cluster.home, KUBECONFIG=str(cluster.kubeconfig)
    )
    assert completed.returncode == 1, completed.stderr
    assert completed.stderr == f"{command} of ml/llama refused: {reason}\n"
    assert completed.stdout == ""
    stored = cluster.store.load("ml", "llama")
    assert stored.command_json is None and stored.resource_version == before, "nothing was written"


def test_approve_when_the_step_is_already_approved_is_refused(cluster: Cluster) -> None:
    state = progressing("llama-predictor-00002")
    cluster.save("ml", "llama", state_files(replace(state, approvals=(10,))))
    completed = run("approve", "ml/llama", home=cluster.home, KUBECONFIG=str(cluster.kubeconfig))
    assert completed.returncode == 1
    assert completed.stderr == "approve of ml/llama refused: step 10% is already approved\n"


def test_no_wait_issues_and_exits_0_and_a_silent_controller_is_exit_3(cluster: Cluster) -> None:
    cluster.save("ml", "llama", state_files(progressing("llama-predictor-00002")))
    issued = run("pause", "ml/llama", "--no-wait", home=cluster.home, KUBECONFIG=str(cluster.kubeconfig))
    assert issued.returncode == 0, issued.stderr
    assert (
        "pause of ml/llama (llama-predictor-00002, step 1 (10%)) by kubernetes-admin issued" in issued.stdout
    )
    assert cluster.store.load("ml", "llama").command() is not None
    cluster.save("ml", "llama", state_files(progressing("llama-predictor-00002")))
    waited = run("pause", "ml/llama", "--timeout", "1", home=cluster.home, KUBECONFIG=str(cluster.kubeconfig))
    assert waited.returncode == 3
    assert waited.stderr.startswith("no answer from the controller within 1s: the command waits in ConfigMap")
