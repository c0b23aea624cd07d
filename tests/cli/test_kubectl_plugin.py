"""`kubectl canary status` works: kubectl runs the kubectl-canary console script from PATH."""

from __future__ import annotations

from tests.cli.support import BIN, Cluster, progressing, run, state_files


# Never skipped: kubectl is part of the machine the tests run on (tests/deploy and the emulator's
# tests drive it too); without it this fails, as it should.
def test_kubectl_canary_status(cluster: Cluster) -> None:
    assert (BIN / "kubectl-canary").exists(), "pyproject.toml declares the kubectl-canary console script"
    cluster.save("ml", "llama", state_files(progressing("llama-predictor-00002")))
    completed = run(
        "canary", "status", "--kubeconfig", str(cluster.kubeconfig), program="kubectl", home=cluster.home
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[1].split()[:4] == [
        "ml",
        "llama",
        "llama-predictor-00002",
        "Progressing",
    ]
    usage = run("canary", "pause", program="kubectl", home=cluster.home)
    assert usage.returncode == 2
    assert "Usage: kubectl canary pause [OPTIONS] NAME" in usage.stderr
