"""``kserve-canary demo``: the story, its report, its clean-up — and the pieces it is built from.

The slow tests run the real command in a subprocess (emulator, fleet, Debian's Prometheus, the
controller as its own process) and are marked ``e2e``; the fast ones check the demo's policies, the
story's judgements and the chart drawing without starting anything.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from canary_sandbox.demo.monitor import ModelView
from canary_sandbox.demo.policies import DEMO_NAMESPACE, DemoTiming, parse_policy, render_policies
from canary_sandbox.demo.story import Outcome, stories
from canary_sandbox.demo.ui import weight_bar
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic, SimulatedFleet
from canary_sandbox.stack import inference_service, wait_until
from kubernetes import client, config
from rich.console import Console

from canary.policy import load_paths
from canary.report.charts import Chart, Marker, Series, svg_chart

REPO = Path(__file__).resolve().parents[2]
SPEED = "2"  # windows of 5s: the whole story in well under a minute


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "canary", "demo", "--no-ui", *args]


# -- the whole story --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    report = tmp_path_factory.mktemp("demo") / "report.html"
    started = time.monotonic()
    completed = subprocess.run(
        demo_command("--speed", SPEED, "--report", str(report)),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=REPO,
    )
    print(f"demo at speed {SPEED}: {time.monotonic() - started:.1f}s")  # the measured figure, with -s
    return completed, report


# Model B's traffic paths: at 50% as a rule (p99 grows with the share: 30% may still pass); at 30%
# when that step's few hundred requests already show the regression.
LLM_CHAT_PATHS = ("10 → 30 → 50 → 0", "10 → 30 → 0")


def test_the_readme_tells_the_paths_the_demo_takes() -> None:
    """The README's and docs/demo.md's row for llm-chat name the path the demo takes as a rule, and
    the other one it may take; no step the demo never rolls back at."""
    for page in (REPO / "README.md", REPO / "docs" / "demo.md"):
        row = next(line for line in page.read_text().splitlines() if "`llm-chat`" in line and "|" in line)
        assert LLM_CHAT_PATHS[0] in row, (page.name, row)
        assert re.search(r"at 30 ?%", row), (page.name, row)  # the other path, in words
        assert not re.search(r"at 10 ?%.*rolled back", row), (page.name, row)


def test_the_demo_tells_the_story_and_exits_0(
    demo_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    completed, _ = demo_run
    output = completed.stdout
    assert completed.returncode == 0, output[-6000:] + completed.stderr[-3000:]
    assert "The story happened as expected" in output
    # The summary: one row per model with its traffic path and verdict.
    rows = {name: next(line for line in output.splitlines() if f" {name} " in line and "│" in line)
            for name in ("A sentiment", "B llm-chat", "C image-classifier")}  # fmt: skip
    assert "Succeeded — as expected" in rows["A sentiment"]
    assert "10 → 30 → 50 → promoted" in rows["A sentiment"]
    assert "RolledBack — as expected" in rows["B llm-chat"]
    # The paths the README tells (test_the_readme_tells_the_paths_the_demo_takes).
    assert any(f"{path} " in rows["B llm-chat"] for path in LLM_CHAT_PATHS), rows["B llm-chat"]
    assert "RolledBack — as expected" in rows["C image-classifier"]
    assert "10 → 0" in rows["C image-classifier"]
    assert "✗" not in output
    # The plain log shows the GitOps start: the first step written before v2 became Ready.
    started = output.index("sentiment started — → 10%")
    ready = output.index("sentiment: revision sentiment-predictor-00002 Ready")
    assert started < ready
    # The rollbacks carry their reasons and numbers: the sequential test's statement, counts and all.
    assert re.search(
        r"llm-chat rolled-back [35]0% → 0%: .*p99 ≤ (500ms|\+50% vs stable \(≤ \d+ms(; stable's p99 ≤ \d+ms)?\)) broken at 95%: "
        r"\d+ of [\d,]+ requests \([\d.]+%\) slower than \d+ms this step",
        output,
    ), output
    assert "did not become Ready within progressDeadline 10s" in output


def test_the_report_has_charts_and_decision_markers_per_model(
    demo_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    completed, report = demo_run
    assert f"Report: {report}" in completed.stdout.replace("\n", "")
    page = report.read_text()
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', ""), "self-contained"
    assert "<script" not in page
    sections = dict(re.findall(r"<h2 id='([a-z-]+)'>(.*?)(?=<h2 |\Z)", page, flags=re.DOTALL))
    assert set(sections) == {"sentiment", "llm-chat", "image-classifier"}
    for name, section in sections.items():
        titles = re.findall(r'<svg class="chart"[^>]*aria-label="([^"]+)"', section)
        assert titles == [
            "Traffic to the new version",
            "p99 latency",
            "5xx error rate",
            "GPU memory used (DCGM framebuffer)",
        ], name
    # Real series, both revisions where both served: the p99 chart of B has v1 and v2 lines.
    b_p99 = sections["llm-chat"].split('aria-label="p99 latency"')[1].split("</svg>")[0]
    assert "<title>v1 · llm-chat-predictor-00001</title>" in b_p99
    assert "<title>v2 · llm-chat-predictor-00002</title>" in b_p99
    assert 'class="limit"' in b_p99
    # Decision markers: A's three moves and promotion, B's rollback, C's rollback.
    assert sections["sentiment"].count('class="marker advanced"') == 4 * 2  # two advances x four charts
    assert 'class="marker promoted"' in sections["sentiment"]
    assert 'class="marker rolled-back"' in sections["llm-chat"]
    assert 'class="marker rolled-back"' in sections["image-classifier"]
    assert 'class="marker rolled-back"' not in sections["sentiment"]
    # Never-Ready C never served a request as v2: no v2 latency line.
    c_p99 = sections["image-classifier"].split('aria-label="p99 latency"')[1].split("</svg>")[0]
    assert "v2 · " not in c_p99


def test_the_evidence_is_saved_beside_the_report(
    demo_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, report = demo_run
    payloads: list[dict[str, Any]] = json.loads(report.with_name("notifications.json").read_text())
    rollback = next(
        p for p in payloads if p["action"] == "rolled-back" and p["inferenceService"]["name"] == "llm-chat"
    )
    p99 = next(check for check in rollback["checks"] if check["name"] == "p99")
    assert p99["verdict"] == "fail"
    assert p99["measured"]["canary"] > 1.5 * p99["measured"]["stable"]
    assert '"inferenceService": "sentiment"' in report.with_name("controller.log").read_text()


def test_ctrl_c_stops_every_process_the_demo_started(tmp_path: Path) -> None:
    process = subprocess.Popen(
        demo_command("--report", str(tmp_path / "report.html")),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
    )
    assert process.stdout is not None
    seen = []
    prometheus_port = controller_pid = None
    for line in process.stdout:
        seen.append(line)
        if match := re.search(r"Prometheus http://127\.0\.0\.1:(\d+)", line):
            prometheus_port = int(match.group(1))
        if match := re.search(r"controller ready \(pid (\d+)\)", line):
            controller_pid = int(match.group(1))
        if "v2 applied" in line:
            break
    assert prometheus_port and controller_pid, "".join(seen)
    assert port_open(prometheus_port)
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=60)
    # A person ending the demo is not a failure: 0 after the clean-up (`make demo` prints no error).
    assert process.returncode == 0, "".join(seen) + rest
    assert "every process the demo started has been stopped" in rest
    assert not port_open(prometheus_port), "Prometheus is still listening"
    assert not alive(controller_pid), "the controller is still running"


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited; only its parent's bookkeeping is left


# -- fast: policies, timing, judgements, charts ---------------------------------------------------


def test_the_policies_in_the_repository_are_the_ones_the_demo_runs() -> None:
    # A policy root holds one directory per namespace: the demo's policies live in policies/demo/demo/.
    committed = {path.name: path.read_text() for path in sorted((REPO / "policies" / "demo").rglob("*.yaml"))}
    assert committed == render_policies(), (
        "run `python -m canary_sandbox.demo.policies` and commit policies/demo/"
    )
    assert {path.parent.name for path in (REPO / "policies" / "demo").rglob("*.yaml")} == {DEMO_NAMESPACE}
    result = load_paths([REPO / "policies" / "demo"])
    assert result.ok, result.errors
    assert {loaded.policy.key for loaded in result.policies} == {
        "demo/sentiment",
        "demo/llm-chat",
        "demo/image-classifier",
    }


def test_speed_scales_the_policy_timing_with_floors() -> None:
    policy = parse_policy(render_policies(DemoTiming(2))["sentiment.yaml"], "sentiment.yaml")
    assert (policy.spec.window, policy.spec.interval, policy.spec.progress_deadline) == (5, 1, 10)
    assert policy.spec.min_requests == 50
    fastest = DemoTiming(10)
    assert (fastest.window, fastest.interval, fastest.progress_deadline, fastest.min_requests) == (
        2,
        1,
        6,
        20,
    )
    slow = parse_policy(render_policies(DemoTiming(0.5))["llm-chat.yaml"], "llm-chat.yaml")
    assert (slow.spec.window, slow.spec.interval, slow.spec.min_requests) == (20, 4, 200)
    with pytest.raises(ValueError, match="speed"):
        DemoTiming(0)


def outcome(
    name: str, phase: str, notifications: list[dict[str, Any]], *, before_ready: bool = True
) -> Outcome:
    return Outcome(name, phase, (), notifications, before_ready)


def decision(action: str, to: int | None, *, failing: str = "", text: str = "") -> dict[str, Any]:
    checks = [{"name": failing, "verdict": "fail"}] if failing else []
    return {"action": action, "traffic": {"to": to}, "checks": checks, "summary": text, "reasons": []}


def test_the_story_judges_what_the_controller_did() -> None:
    judge = {story.name: story.judge for story in stories(DemoTiming())}
    promoted = [
        decision("started", 10),
        decision("advanced", 30),
        decision("advanced", 50),
        decision("promoted", None),
    ]
    assert judge["sentiment"](outcome("sentiment", "Succeeded", promoted)) == []
    assert judge["sentiment"](outcome("sentiment", "Succeeded", promoted, before_ready=False)) == [
        "the first step was not in place before v2 became Ready"
    ]
    skipped = [decision("started", 10), decision("advanced", 50), decision("promoted", None)]
    assert "saw [10, 50, None]" in judge["sentiment"](outcome("sentiment", "Succeeded", skipped))[0]

    by_p99 = [decision("started", 10), decision("advanced", 30), decision("rolled-back", 0, failing="p99")]
    assert judge["llm-chat"](outcome("llm-chat", "RolledBack", by_p99)) == []
    by_errors = [decision("started", 10), decision("rolled-back", 0, failing="errors")]
    assert (
        "failing checks were ['errors']" in judge["llm-chat"](outcome("llm-chat", "RolledBack", by_errors))[0]
    )
    assert judge["llm-chat"](outcome("llm-chat", "Progressing", by_p99[:2])) == [
        "expected RolledBack, ended Progressing",
        "no rolled-back notification was received",
    ]

    deadline = [
        decision("started", 10),
        decision("rolled-back", 0, text="not Ready within progressDeadline 20s"),
    ]
    assert judge["image-classifier"](outcome("image-classifier", "RolledBack", deadline)) == []
    aborted = [decision("started", 10), decision("rolled-back", 0, text="aborted by a person")]
    assert (
        "progress deadline"
        in judge["image-classifier"](outcome("image-classifier", "RolledBack", aborted))[0]
    )


def model_view(phase: str, share: float, *, step_weight: int | None = None, step: str = "") -> ModelView:
    return ModelView(
        name="llm-chat",
        at=0.0,
        phase=phase,
        stable_revision="llm-chat-predictor-00001",
        canary_revision="llm-chat-predictor-00002",
        canary_ready=True,
        spec_weight=step_weight,
        canary_share=share,
        step=step,
        timer=None,
        timer_kind="",
        checks=(),
        evaluated_requests=None,
        latest="",
        history=(),
        step_weight=step_weight,
    )


def test_the_traffic_shown_belongs_to_the_phase_beside_it() -> None:
    # KServe still routes 30% to v2 while the state already says RolledBack: the bar says 0%, and
    # KServe's figure is labelled as what it is.
    lagging = weight_bar(model_view("RolledBack", 30.0)).plain
    assert lagging.splitlines()[0].endswith("  0%")
    assert "KServe status: 30%, rolling back" in lagging
    # Step 3 of 3 at 50% while KServe still has 30%: 50%, and where it is going.
    advancing = weight_bar(model_view("Progressing", 30.0, step_weight=50, step="3/3 · 50%")).plain
    assert advancing.splitlines()[0].endswith(" 50%")
    assert "KServe status: 30%, moving up to 50%" in advancing
    # When they agree there is nothing to explain.
    assert weight_bar(model_view("RolledBack", 0.0)).plain.strip().endswith("0%")
    assert "KServe" not in weight_bar(model_view("Progressing", 30.0, step_weight=30)).plain
    assert weight_bar(model_view("Succeeded", 100.0)).plain.endswith("100%")


def test_the_summary_says_a_rollback_was_the_expected_outcome() -> None:
    from canary_sandbox.demo.run import DemoOptions, _Story, _summary_table

    story = _Story(DemoOptions(), Console())
    outcomes = {name: outcome(name, "RolledBack", []) for name in story.stories}
    outcomes["sentiment"] = outcome("sentiment", "Succeeded", [])
    problems: dict[str, list[str]] = {name: [] for name in story.stories}
    problems["image-classifier"] = ["expected RolledBack at the deadline"]
    console = Console(record=True, width=200, color_system="truecolor")
    console.print(_summary_table(story, outcomes, problems))
    text = console.export_text(clear=False)
    assert "RolledBack — as expected" in text
    assert "Succeeded — as expected" in text
    assert "✗ RolledBack — not as expected" in text
    assert "✓" not in text  # no tick that reads as "the rollback went fine"
    # The expected rollback is not drawn in green.
    rollback = next(
        row
        for row in console.export_text(styles=True).splitlines()
        if "llm-chat" in row and "as expected" in row
    )
    assert "\x1b[32m" not in rollback


def test_keep_running_prints_a_cli_that_works_as_typed() -> None:
    from canary_sandbox.demo.run import cli_command

    command = cli_command()
    executable = command.split(" ", 1)[0]
    assert Path(executable).is_absolute()
    assert (
        subprocess.run(
            [*command.split(" "), "--help"], capture_output=True, check=False, timeout=60
        ).returncode
        == 0
    )


def test_a_chart_draws_series_with_gaps_limits_and_markers() -> None:
    chart = Chart(
        "p99 latency",
        "ms",
        [Series("v1", "#111111", [(0, 100), (1, 110), (2, 105), (9, 120), (10, 125)])],
        limits=[("max 500 ms", 500)],
    )
    svg = svg_chart(
        chart,
        [Marker(5, "30%", "advanced", "Advancing"), Marker(99, "after-the-end", "promoted", "")],
        (0, 10),
    )
    assert svg.startswith('<svg class="chart"') and svg.endswith("</svg>")
    assert svg.count("<polyline") == 2, "a 7s hole in the samples is drawn as a gap"
    assert 'class="limit"' in svg and "max 500 ms" in svg
    assert 'class="marker advanced"' in svg
    assert "after-the-end" not in svg, "a marker outside the time range is not drawn"


def test_a_step_series_keeps_its_corners() -> None:
    traffic = Chart(
        "Traffic", "%", [Series("v2", "#e07b24", [(0, 10), (1, 10), (2, 30)], step=True)], y_max=100
    )
    points = re.search(r'<polyline points="([^"]+)"', svg_chart(traffic, [], (0, 2)))
    assert points is not None
    assert len(points.group(1).split()) == 4, "10% holds until the moment it becomes 30%"


def test_every_revision_serves_with_its_own_behaviour_even_when_its_pods_come_first(tmp_path: Path) -> None:
    """The fleet learns a revision's behaviour when KServe's status names it, and lists pods in a
    second request: a reconcile in between shows v2's pod before its behaviour is known. That pod
    must not serve with a default behaviour for good (one demo run in four once promoted the
    regression and rolled back the healthy model that way)."""
    emulator = Emulator(KServeConfig(reconcile_delay=0.3, revision_ready_delay=0.5), seed=7)  # real time
    emulator.create_namespace("ns")
    v1 = RevisionBehaviour(gpu_base_mib=11111)
    v2 = RevisionBehaviour(gpu_base_mib=22222)
    with EmulatorServer(emulator) as server:
        api = config.new_client_from_config(config_file=str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        fleet = SimulatedFleet(api, [ModelTraffic("ns", "m", 10, {"s3://m/v1": v1, "s3://m/v2": v2})])
        custom = client.CustomObjectsApi(api)
        isvcs = ("serving.kserve.io", "v1beta1", "ns", "inferenceservices")
        custom.create_namespaced_custom_object(*isvcs, inference_service("ns", "m", "s3://m/v1"))

        def ticked_until(revision: str) -> bool:
            fleet.tick(0.1)
            return f'pod="{revision}-deployment' in fleet.render()

        assert wait_until(lambda: ticked_until("m-predictor-00001"), 10)
        custom.patch_namespaced_custom_object(
            *isvcs, "m", {"spec": {"predictor": {"model": {"storageUri": "s3://m/v2"}}}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        # The fleet reads the InferenceService (v1 still named), then its pod list answers only after
        # KServe and Knative have reconciled the new spec: v2's pod, unnamed in what the fleet read.
        emulator.faults.add(r"/namespaces/ns/pods$", method="GET", delay_seconds=1.0, count=1)
        fleet.tick(0.1)
        pods = [pod.metadata.name for pod in client.CoreV1Api(api).list_namespaced_pod("ns").items]
        assert any(name.startswith("m-predictor-00002") for name in pods), pods
        assert wait_until(lambda: ticked_until("m-predictor-00002"), 10)
        api.close()
    gpu_used = dict(
        re.findall(
            r'DCGM_FI_DEV_FB_USED\{[^}]*pod="(m-predictor-0000\d)-deployment[^"]*"[^}]*\} (\d+)',
            fleet.render(),
        )
    )
    assert gpu_used == {"m-predictor-00001": "11111", "m-predictor-00002": "22222"}
