"""The report's pure parts: which rollout a selector names, limits as numbers, and charts that show
missing data as missing (a gap, a dot, a sentence), never as zero."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from canary.policy.units import Unit
from canary.report.charts import Chart, Series, svg_chart
from canary.report.rollout import (
    CheckSeries,
    ReportedRollout,
    choose_rollout,
    limit_values,
    render_report,
    traffic_points,
)
from canary.rollout.past import PastRollout, PastRollouts, RolloutOutcome, StepRecord, rollout_id
from canary.rollout.records import ExplainCheck
from canary.rollout.state import HistoryEntry, Phase, RolloutState, StepProgress

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _past(number: int, outcome: RolloutOutcome = RolloutOutcome.PROMOTED) -> PastRollout:
    start = T0 + timedelta(hours=number)
    revision = f"m-predictor-{number + 1:05d}"
    return PastRollout(
        id=rollout_id(revision, start),
        revision=revision,
        stable_revision=f"m-predictor-{number:05d}",
        outcome=outcome,
        started_at=start,
        ended_at=start + timedelta(minutes=30),
        reason=f"reason {number}",
        steps=(StepRecord(0, 10, start, start + timedelta(minutes=10)),),
        decisions=(
            HistoryEntry(start, "start", 10, Phase.PENDING, "CanaryStarted", "Starting", f"d{number}"),
        ),
    )


RECORD = PastRollouts((_past(1), _past(2, RolloutOutcome.ROLLED_BACK)))


def _active(revision: str = "m-predictor-00004") -> RolloutState:
    start = T0 + timedelta(hours=5)
    return RolloutState(
        phase=Phase.PROGRESSING,
        revision=revision,
        stable_revision="m-predictor-00002",
        started_at=start,
        step=StepProgress(0, 10, start),
        history=(
            HistoryEntry(T0, "promote", None, Phase.PROMOTING, "CanaryPromoted", "an older rollout", "old"),
            HistoryEntry(start, "start", 10, Phase.PENDING, "CanaryStarted", "Starting 00004", "s"),
        ),
    )


def test_without_a_selector_the_rollout_under_way_else_the_latest_finished() -> None:
    current = choose_rollout("ml", "m", _active(), None, RECORD, None)
    assert (current.revision, current.finished, current.outcome) == (
        "m-predictor-00004",
        False,
        "Progressing",
    )
    assert [d.reason for d in current.decisions] == ["Starting 00004"]  # not the older rollout's
    idle = RolloutState(phase=Phase.SUCCEEDED, revision="m-predictor-00003", started_at=T0)
    latest = choose_rollout("ml", "m", idle, None, RECORD, None)
    assert (latest.revision, latest.number, latest.outcome) == ("m-predictor-00003", 1, "rolled-back")


def test_a_number_a_revision_or_an_id_names_a_recorded_rollout() -> None:
    assert choose_rollout("ml", "m", None, None, RECORD, "2").revision == "m-predictor-00002"
    assert choose_rollout("ml", "m", None, None, RECORD, "m-predictor-00003").number == 1
    assert choose_rollout("ml", "m", None, None, RECORD, RECORD.rollouts[0].id).number == 2
    assert choose_rollout("ml", "m", _active(), None, RECORD, "m-predictor-00004").finished is False


def test_an_unknown_selector_says_what_there_is() -> None:
    with pytest.raises(LookupError) as raised:
        choose_rollout("ml", "m", _active(), None, RECORD, "9")
    message = str(raised.value)
    assert "ml/m has no rollout '9'" in message
    assert "2 m-predictor-00002 (promoted), 1 m-predictor-00003 (rolled-back)" in message
    assert "under way: m-predictor-00004" in message
    with pytest.raises(LookupError, match="has had no rollout yet"):
        choose_rollout("ml", "m", RolloutState(), None, PastRollouts(), None)


def test_limits_become_numbers_absolute_and_relative_to_the_stable_value() -> None:
    assert limit_values("≤ 800ms and ≤ +20% vs stable", Unit.SECONDS, 0.5) == [
        ("≤ 800ms", pytest.approx(0.8)),
        ("1.2 × stable 500ms", pytest.approx(0.6)),
    ]
    assert limit_values("≤ 5%", Unit.RATIO, None) == [("≤ 5%", pytest.approx(0.05))]
    assert limit_values("≤ +20% vs stable", Unit.SECONDS, None) == []  # no stable value: nothing to draw
    assert limit_values("≤ 90% of GPU memory", Unit.BYTES, None) == []


def _polylines(svg: str) -> list[int]:
    return [len(points.split()) for points in re.findall(r'<polyline points="([^"]*)"', svg)]


def test_a_gap_in_the_samples_is_drawn_as_a_gap_and_a_lone_sample_as_a_dot() -> None:
    points = [(0.0, 1.0), (5.0, 1.0), (10.0, 1.0), (40.0, 2.0), (80.0, 3.0), (85.0, 3.0)]
    svg = svg_chart(Chart("p99", "ms", [Series("canary", "#e07b24", points, gap=12.5)]), [], (0.0, 90.0))
    assert _polylines(svg) == [3, 2]  # 0-10 s, then 80-85 s; nothing drawn across the missing minutes
    assert svg.count("<circle") == 1  # the sample at 40 s alone
    # Never drawn as zero: no vertex sits on the chart's zero line.
    zero_y = re.search(r'<text x="52" y="([\d.]+)" class="tick" text-anchor="end">0</text>', svg)
    assert zero_y is not None
    baseline = float(zero_y.group(1)) - 4
    vertices = [
        float(pair.split(",")[1]) for run in re.findall(r'points="([^"]*)"', svg) for pair in run.split()
    ]
    assert all(abs(v - baseline) > 1 for v in vertices)


def test_a_chart_without_any_sample_says_so() -> None:
    svg = svg_chart(
        Chart("errors", "%", [], empty_text="the range query failed: Connection refused"), [], (0, 60)
    )
    assert "the range query failed: Connection refused" in svg
    assert "<polyline" not in svg


def test_the_page_draws_prometheus_samples_per_revision_and_says_which_check_had_none() -> None:
    rollout = ReportedRollout.of_record("ml", "m", RECORD.rollouts[0], 2)
    rollout = ReportedRollout(
        **{
            **rollout.__dict__,
            "checks": (ExplainCheck("p99", "pass", 0.12, Unit.SECONDS, "≤ 800ms", 0.1, 300.0),),
        }
    )
    start = rollout.started_at.timestamp()  # type: ignore[union-attr]
    samples = [(start + t, 0.1 + t / 100_000) for t in range(0, 1800, 60)]
    page = render_report(
        rollout,
        [
            CheckSeries("p99", Unit.SECONDS, "p99 (latency p99)", {rollout.revision: samples}, step=60),
            CheckSeries("errors", Unit.RATIO, "errors (error-rate)", {}, step=60),
        ],
        start=start - 60,
        end=start + 1860,
        generated_at=T0 + timedelta(days=1),
        prometheus_url="http://prometheus:9090",
    )
    assert page.count('<svg class="chart"') == 3
    assert "Prometheus has no samples of this check for either revision over the rollout" in page
    assert "<td>120ms</td><td>100ms</td>" in page  # the last evaluation's numbers, rounded, with units
    assert "≤ 800ms" in page
    assert "m-predictor-00002" in page and "promoted" in page


def test_traffic_is_a_step_function_of_the_written_weights_ending_at_the_outcome() -> None:
    rollout = ReportedRollout.of_record("ml", "m", RECORD.rollouts[0], 2)
    start = rollout.started_at.timestamp()  # type: ignore[union-attr]
    points = traffic_points(rollout, start - 10, start + 3600)
    assert points[0] == (start - 10, 0.0)
    assert (start, 10.0) in points
    assert points[-1] == (start + 3600, 10.0)


def test_a_limit_far_above_the_curves_is_named_instead_of_flattening_them() -> None:
    rollout = ReportedRollout(
        **{
            **ReportedRollout.of_record("ml", "m", RECORD.rollouts[0], 2).__dict__,
            "checks": (
                ExplainCheck("p99", "pass", 0.14, Unit.SECONDS, "≤ 2.00s and ≤ +50% vs stable", 0.13),
            ),
        }
    )
    start = rollout.started_at.timestamp()  # type: ignore[union-attr]
    samples = [(start + t, 0.14) for t in range(0, 600, 10)]
    page = render_report(
        rollout,
        [CheckSeries("p99", Unit.SECONDS, "p99", {rollout.revision: samples}, step=10)],
        start=start,
        end=start + 600,
        generated_at=T0 + timedelta(days=1),
        prometheus_url=None,
    )
    svg = page.split('aria-label="p99')[1]
    assert "p99 — ≤ 2.00s far above the curves" in page
    assert "1.5 × stable 130ms" in svg  # 195ms: close to the curve, drawn
    assert 'class="limit-label" text-anchor="end" fill="#c0392b">≤ 2.00s' not in svg
