"""`kserve-canary status` reads like `kubectl get`: full names in a pipe, -o wide|json|yaml, --watch,
"No rollouts found", human durations — the real process against the API emulator."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
import yaml

from canary.cli.output import human_duration
from canary.rollout.state import Phase, RolloutState
from tests.cli.support import (
    BIN,
    Cluster,
    environment,
    interrupt_and_wait,
    popen_with_ctrl_c,
    progressing,
    run,
    state_files,
)

LONG = "llm-chat-assistant-long-enough-to-be-cut-at-80-columns"  # labels: at most 63


def status(cluster: Cluster, *arguments: str) -> subprocess.CompletedProcess[str]:
    return run("status", *arguments, home=cluster.home, KUBECONFIG=str(cluster.kubeconfig), COLUMNS="80")


def test_in_a_pipe_every_name_is_whole_and_every_rollout_one_line(cluster: Cluster) -> None:
    cluster.save("ml", LONG, state_files(progressing(f"{LONG}-predictor-00002")))
    cluster.save(
        "payments", "fraud", state_files(RolloutState(phase=Phase.SUCCEEDED, revision="fraud-00007"))
    )
    completed = status(cluster)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert len(lines) == 3, completed.stdout  # a header and one line per rollout: nothing wrapped
    assert lines[0].split() == [
        "NAMESPACE",
        "NAME",
        "REVISION",
        "PHASE",
        "WEIGHT",
        "STEP",
        "SINCE",
        "LAST",
        "DECISION",
    ]
    chat = next(line for line in lines if "llm-chat" in line)  # what `| grep llm-chat` finds
    fields = chat.split()
    assert fields[:4] == ["ml", LONG, f"{LONG}-predictor-00002", "Progressing"]
    assert fields[5:7] == ["1", "(10%)"]
    assert re.fullmatch(r"3m1[0-9]s", fields[7]), fields[7]  # a human duration, as kubectl's AGE
    assert chat.endswith("holding step 1")
    fraud = next(line for line in lines if "fraud" in line).split()
    assert fraud[:4] == ["payments", "fraud", "fraud-00007", "Succeeded"]
    assert fraud[4:7] == ["<none>", "<none>", "<none>"], "no step, no time: <none>, never 'never'"
    assert "never" not in completed.stdout
    # The columns line up: every value starts where its header does.
    start = lines[0].index("PHASE")
    assert all(line[start:].split()[0] in {"PHASE", "Progressing", "Succeeded"} for line in lines)


def test_output_json_yaml_and_wide(cluster: Cluster) -> None:
    cluster.save(
        "ml",
        "llama",
        state_files(
            progressing("llama-predictor-00002"), command=json.dumps({"command": "pause", "by": "alice"})
        ),
    )
    as_json = status(cluster, "-o", "json").stdout
    rows = json.loads(as_json)
    assert rows == [
        {
            "model": "ml/llama",
            "namespace": "ml",
            "name": "llama",
            "revision": "llama-predictor-00002",
            "phase": "Progressing",
            "weight": None,
            "step": 1,
            "stepWeight": 10,
            "since": rows[0]["since"],
            "reason": "holding step 1",
            "pendingCommand": "pause",
            "evidenceBehindSeconds": None,
            "stableRevision": None,
            "canaryArtefact": None,
            "stableArtefact": None,
        }
    ]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+\+00:00", rows[0]["since"])
    assert yaml.safe_load(status(cluster, "-o", "yaml").stdout) == rows
    wide = status(cluster, "-o", "wide").stdout.splitlines()
    assert "COMMAND" in wide[0].split()
    assert wide[1].split()[7:9] == [wide[1].split()[7], "pause"]
    assert status(cluster, "--format", "json").stdout == as_json


def test_no_rollouts_found(cluster: Cluster) -> None:
    completed = status(cluster)
    assert (completed.returncode, completed.stdout, completed.stderr) == (0, "", "No rollouts found.\n")
    scoped = status(cluster, "-n", "payments")
    assert scoped.stderr == "No rollouts found in namespace payments.\n"
    assert json.loads(status(cluster, "-o", "json").stdout) == []


def test_watch_reprints_on_change_and_ctrl_c_exits_0(cluster: Cluster) -> None:
    cluster.save("ml", "llama", state_files(progressing("llama-predictor-00002")))
    process = popen_with_ctrl_c(
        [str(BIN / "kserve-canary"), "status", "--watch"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(cluster.home, KUBECONFIG=str(cluster.kubeconfig), PYTHONFAULTHANDLER="1"),
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("NAMESPACE")
        assert "llama-predictor-00002" in process.stdout.readline()
        time.sleep(0.5)  # the watch is open by now; a change before it would be in the list anyway
        cluster.save("ml", "llama", state_files(progressing("llama-predictor-00003")))
        deadline = time.monotonic() + 20
        seen = ""
        while "llama-predictor-00003" not in seen and time.monotonic() < deadline:
            seen += process.stdout.readline()
        assert "llama-predictor-00003" in seen, seen
        stderr = interrupt_and_wait(process)
        assert process.returncode == 0
        assert "Traceback" not in stderr
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0, "0s"),
        (59, "59s"),
        (119, "119s"),
        (192, "3m12s"),
        (600, "10m"),
        (47 * 60, "47m"),
        (5 * 3600 + 3 * 60, "5h3m"),
        (26 * 3600, "26h"),
        (5 * 86400, "5d"),
        (5 * 86400 + 3 * 3600, "5d3h"),
        (12 * 86400, "12d"),
        (3 * 365 * 86400 + 45 * 86400, "3y45d"),
        (-5, "0s"),
    ],
)
def test_human_durations_are_kubectls(seconds: float, shown: str) -> None:
    assert human_duration(seconds) == shown
