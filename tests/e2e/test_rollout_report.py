"""End to end: two consecutive rollouts of one model leave two entries in the record of past rollouts,
and ``kserve-canary report`` draws each from that record and a real Prometheus.

The controller runs as its own process against the API emulator; Debian's Prometheus scrapes the
simulated pods. v2 is healthy and is promoted; v3 answers a third of its requests with 5xx and is
rolled back by its error-rate check. Every assertion on the report is derived from what the controller
recorded (revisions, reasons, the checks' numbers) or what Prometheus holds (points on the charts).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.prometheus import free_port
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until

from canary.kserve.store import ROLLOUTS_KEY, STATE_KEY, ConfigMapStateStore
from canary.policy.units import format_value
from canary.rollout.past import PastRollouts, RolloutOutcome

NS = "report"
NAME = "twice"
V1, V2, V3 = "s3://models/v1", "s3://models/v2", "s3://models/v3"
BIN = Path(sys.executable).parent

POLICY = f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {NAME}, namespace: {NS}}}
spec:
  target: {{inferenceService: {NAME}}}
  steps: [10, 30, 50, 100]
  window: 4s
  interval: 1s
  minRequests: 10
  progressDeadline: 12s
  failureLimit: 2
  checks:
    - {{name: p90, metric: latency, quantile: 0.9, max: 2s, maxIncrease: 50%}}
    - {{name: errors, metric: error-rate, max: 5%}}
    - {{name: oom, metric: oom-kills, max: 0, critical: true}}
"""


def phase(stack: Stack) -> str | None:
    state = stack.state(NS, NAME)
    return None if state is None else str(state.get("phase"))


def record(stack: Stack) -> PastRollouts:
    stored = ConfigMapStateStore(stack.api).load(NS, NAME)  # type: ignore[arg-type]
    return stored.past_rollouts()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    behaviours = {
        V1: RevisionBehaviour(median_ms=80, ready_after_s=1.0),
        V2: RevisionBehaviour(median_ms=80, ready_after_s=1.0),
        V3: RevisionBehaviour(median_ms=80, ready_after_s=1.0, error_rate=0.3),
    }
    with Stack([ModelTraffic(NS, NAME, 60.0, behaviours)], {f"{NAME}.yaml": POLICY}) as started:
        started.apply(inference_service(NS, NAME, V1))
        assert wait_until(lambda: started.predictor_status(NS, NAME).get("latestRolledoutRevision"), 30)
        yield started


@pytest.fixture(scope="module")
def rolled_out_twice(stack: Stack) -> ControllerProcess:
    controller = stack.start_controller("report")
    time.sleep(3)  # Prometheus sees the stable revision before anything changes
    stack.set_storage_uri(NS, NAME, V2)
    assert wait_until(lambda: phase(stack) == "Succeeded", 90), stack.state(NS, NAME)
    stack.set_storage_uri(NS, NAME, V3)
    assert wait_until(lambda: phase(stack) == "RolledBack", 90), stack.state(NS, NAME)
    assert wait_until(lambda: len(record(stack).rollouts) == 2, 10), record(stack)
    return controller


def report(stack: Stack, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``kserve-canary report`` as the real process a person runs; the page it wrote."""
    out = tmp_path / f"report-{len(list(tmp_path.iterdir()))}.html"
    done = subprocess.run(
        [str(BIN / "kserve-canary"), "report", f"{NS}/{NAME}", "--kubeconfig", str(stack.kubeconfig),
         "-o", str(out), *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return done, out.read_text(encoding="utf-8") if out.exists() else ""


def chart(page: str, title: str) -> str:
    """The <svg> of the chart whose title starts with ``title``."""
    for svg in re.findall(r"<svg class=\"chart\".*?</svg>", page, flags=re.S):
        if re.search(rf'aria-label="{re.escape(title)}', svg):
            return str(svg)
    raise AssertionError(f"no chart {title!r} in the report")


def polyline_points(svg: str, label: str) -> int:
    """How many points the polylines of the series ``label`` have (dots count one each)."""
    count = 0
    for points, title in re.findall(r'<polyline points="([^"]*)"[^>]*><title>([^<]*)</title>', svg):
        if title == label:
            count += len(points.split())
    count += sum(1 for title in re.findall(r"<circle [^>]*><title>([^<]*)</title>", svg) if title == label)
    return count


def test_two_consecutive_rollouts_of_one_model_leave_two_entries(
    stack: Stack, rolled_out_twice: ControllerProcess
) -> None:
    first, second = record(stack).rollouts
    assert (first.revision, first.outcome) == (f"{NAME}-predictor-00002", RolloutOutcome.PROMOTED)
    assert first.stable_revision == f"{NAME}-predictor-00001"
    assert [step.weight for step in first.steps] == [10, 30, 50]
    assert (second.revision, second.outcome) == (f"{NAME}-predictor-00003", RolloutOutcome.ROLLED_BACK)
    assert second.stable_revision == first.revision
    assert first.ended_at <= second.started_at  # type: ignore[operator]
    errors = next(check for check in second.checks if check.name == "errors")
    assert errors.verdict == "fail" and errors.value is not None and errors.value > 0.05
    # Written with the decisions that ended them, in the same write: the two writes that changed
    # rollouts.json changed state.json too, and no other write touched it.
    writes = [
        entry
        for entry in stack.emulator.requests.entries(path_contains=f"/configmaps/kserve-canary-{NAME}")
        if entry.method in {"PUT", "POST"} and entry.status in {200, 201}
    ]
    adding = [entry for entry in writes if entry.touched(f"data.{ROLLOUTS_KEY}")]
    assert len(adding) == 2, [entry.changed_paths for entry in writes]
    assert all(entry.touched(f"data.{STATE_KEY}") for entry in adding), [e.changed_paths for e in adding]


def test_a_restarted_controller_neither_loses_nor_duplicates_an_entry(
    stack: Stack, rolled_out_twice: ControllerProcess
) -> None:
    before = record(stack)
    rolled_out_twice.terminate()
    restarted = stack.start_controller("report-restarted")
    try:
        time.sleep(4)  # several ticks of the restarted controller
        assert record(stack) == before
    finally:
        restarted.terminate()


def test_the_report_of_a_past_rollout_shows_its_revisions_decisions_and_charts(
    stack: Stack, rolled_out_twice: ControllerProcess, tmp_path: Path
) -> None:
    assert stack.prometheus is not None
    promoted = record(stack).rollouts[0]
    done, page = report(
        stack, tmp_path, "--rollout", "2", "--prometheus-url", stack.prometheus.url, "--policy",
        str(stack.policy_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"{NAME}-predictor-00002" in done.stdout and "promoted" in done.stdout
    assert "3 of 3 check charts with data" in done.stdout, done.stdout
    assert f"{NS}/{NAME} · {promoted.revision}" in page
    assert f"<th>stable revision</th><td>{promoted.stable_revision}</td>" in page
    assert "<th>outcome</th><td>promoted</td>" in page
    for decision in promoted.decisions:  # every recorded decision, with its reason and numbers
        assert decision.reason.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in page
    for check in promoted.checks:
        if check.value is not None:
            assert format_value(check.value, check.unit) in page
    p90 = chart(page, "p90")
    # Both revisions drawn from Prometheus' samples, with the bound the judge used dashed (or named in
    # the title when far above the curves): the tighter of max 2s and +50% vs the stable's bound.
    assert polyline_points(p90, f"canary · {promoted.revision}") >= 5
    assert polyline_points(p90, f"stable · {promoted.stable_revision}") >= 5
    judged = next(check for check in promoted.checks if check.name == "p90")
    assert judged.max_allowed is not None and judged.max_allowed <= 2.0
    assert f"judged bound ≤ {format_value(judged.max_allowed, judged.unit)}" in p90
    traffic = chart(page, "Traffic to the canary")
    assert [m for m in re.findall(r'class="marker-label"[^>]*>([^<]*)<', traffic)] == [
        "start 10%", "30%", "50%", "promoted",
    ]  # fmt: skip
    assert "<script" not in page and "http://" not in page.split("<th>Prometheus</th>")[0]


def test_the_default_report_is_the_latest_rollout_with_the_numbers_that_rolled_it_back(
    stack: Stack, rolled_out_twice: ControllerProcess, tmp_path: Path
) -> None:
    assert stack.prometheus is not None
    rolled_back = record(stack).rollouts[-1]
    done, page = report(
        stack, tmp_path, "--prometheus-url", stack.prometheus.url, "--policy", str(stack.policy_dir)
    )
    assert done.returncode == 0, done.stderr
    assert "<th>outcome</th><td>rolled-back</td>" in page
    assert rolled_back.reason.split(":")[0] in page  # "Rolling back twice-predictor-00003"
    errors = next(check for check in rolled_back.checks if check.name == "errors")
    assert errors.value is not None
    assert format_value(errors.value, errors.unit) in page
    errors_chart = chart(page, "errors")
    assert polyline_points(errors_chart, f"canary · {rolled_back.revision}") >= 3
    assert "≤ 5%" in errors_chart or "≤ 5.00%" in errors_chart


def test_by_revision_without_prometheus_and_with_an_unreachable_one(
    stack: Stack, rolled_out_twice: ControllerProcess, tmp_path: Path
) -> None:
    revision = f"{NAME}-predictor-00002"
    done, page = report(stack, tmp_path, "--rollout", revision, "--no-charts")
    assert done.returncode == 0, done.stderr
    assert "no check charts" in done.stdout
    assert page.count('<svg class="chart"') == 1  # the traffic, from the record alone
    assert "not asked (--no-charts)" in page

    closed = f"http://127.0.0.1:{free_port()}"
    done, page = report(stack, tmp_path, "--prometheus-url", closed)
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert lines[0] == f"error: cannot reach Prometheus: {closed}: connection refused (unreachable)", (
        done.stderr
    )
    assert len(lines) == 2 and "--no-charts" in lines[1]
    assert page == ""

    done, _ = report(stack, tmp_path, "--rollout", "7", "--no-charts")
    assert done.returncode == 1
    assert "no rollout '7'" in done.stderr and f"2 {revision} (promoted)" in done.stderr
