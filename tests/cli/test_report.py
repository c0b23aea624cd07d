"""`kserve-canary report` as the real process against the API emulator: the rollout under way from the
state, a past one from the record, bad stored input named with its file and reason, usage errors."""

from __future__ import annotations

from pathlib import Path

from canary.kserve.store import ROLLOUTS_KEY
from canary.rollout.past import PastRollouts
from tests.cli.support import Cluster, progressing, run, state_files
from tests.rollout.test_past_rollouts import _entry


def _report(cluster: Cluster, out: Path, *args: str) -> tuple[int, str, str, str]:
    done = run(
        "report",
        "ml/llama",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "-o",
        str(out),
        *args,
        home=cluster.home,
    )
    return done.returncode, done.stdout, done.stderr, out.read_text() if out.exists() else ""


def test_the_rollout_under_way_is_reported_from_the_state(cluster: Cluster, tmp_path: Path) -> None:
    state = progressing("llama-predictor-00002", minutes_ago=4)
    record = PastRollouts().with_rollout(_entry(1))
    cluster.save("ml", "llama", {**state_files(state), ROLLOUTS_KEY: record.to_json()})
    code, out, err, page = _report(cluster, tmp_path / "now.html", "--no-charts")
    assert code == 0, err
    assert (
        "rollout of llama-predictor-00002 (under way: Progressing), 0 steps, 1 decision, no check charts"
        in out
    )
    assert "<th>phase</th><td>Progressing</td>" in page
    assert "<th>ended</th><td>under way</td>" in page
    assert "holding step 1" in page  # the state's decision, with its reason
    assert "read from</th><td>the rollout state (state.json, explain.json)" in page

    code, out, err, page = _report(cluster, tmp_path / "past.html", "--no-charts", "--rollout", "1")
    assert code == 0, err
    assert "m-predictor-00001 (finished: promoted)" in out
    assert "rollouts.json), rollout 1" in page


def test_an_unreadable_record_is_named_and_the_rollout_under_way_still_reported(
    cluster: Cluster, tmp_path: Path
) -> None:
    state = progressing("llama-predictor-00002")
    cluster.save("ml", "llama", {**state_files(state), ROLLOUTS_KEY: '{"schemaVersion": 1, "rollouts": 7}'})
    unreadable = (
        "ml/llama: the record of past rollouts (rollouts.json) is invalid at rollouts: Input should be a "
        "valid tuple"
    )
    code, out, err, page = _report(cluster, tmp_path / "r.html", "--no-charts")
    assert code == 0, err
    assert err.splitlines() == [f"warning: {unreadable}; reported without it"]
    assert "rollout of llama-predictor-00002 (under way: Progressing)" in out
    assert "<th>phase</th><td>Progressing</td>" in page
    # A past rollout needs the record: refused, with the reason, and nothing written.
    code, _, err, page = _report(cluster, tmp_path / "past.html", "--no-charts", "--rollout", "1")
    assert code == 1
    assert err.strip() == f"{unreadable}; rollout '1' is not the one in the state either", err
    assert page == ""


def test_usage_errors_exit_2(cluster: Cluster, tmp_path: Path) -> None:
    cluster.save("ml", "llama", state_files(progressing("llama-predictor-00002")))
    code, _, err, _ = _report(cluster, tmp_path / "r.html")
    assert code == 2 and "--prometheus-url" in err and "--no-charts" in err
    code, _, err, _ = _report(cluster, tmp_path / "r.html", "--no-charts", "--policy", str(tmp_path / "nope"))
    assert code == 2 and "no such file or directory" in err


def test_a_model_never_seen_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    code, _, err, _ = _report(cluster, tmp_path / "r.html", "--no-charts")
    assert code == 1
    assert err.strip() == "no rollout state for ml/llama: kserve-canary has not seen it"


def test_an_unreadable_evaluation_leaves_the_rollout_reported_from_its_state(
    cluster: Cluster, tmp_path: Path
) -> None:
    state = progressing("llama-predictor-00002")
    cluster.save("ml", "llama", state_files(state, explain='{"at": "yesterday", "decisionId": "d"}'))
    code, _, err, page = _report(cluster, tmp_path / "r.html", "--no-charts")
    assert code == 0, err
    (warning,) = err.splitlines()
    assert warning.startswith("warning: ml/llama: the latest evaluation (explain.json) is invalid at at: ")
    assert warning.endswith("; reported without it")
    assert "holding step 1" in page  # the decisions come from the state
