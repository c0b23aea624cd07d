"""The timeline recorder: a rollout's story as (time, action, weight, reasons)."""

from __future__ import annotations

from datetime import timedelta

from canary.kserve.status_model import KServeSim
from canary.rollout import Action, Phase, Timeline

from .helpers import HEALTHY_EVIDENCE, Harness, make_policy, progressing


def test_a_full_rollout_reads_as_a_timeline() -> None:
    harness = progressing()
    harness.run(lambda d: d.new_state.phase is Phase.SUCCEEDED)
    timeline = harness.timeline
    assert timeline.written_weights() == [10, 30, 50, None]
    assert timeline.actions() == [Action.START, Action.ADVANCE, Action.ADVANCE, Action.PROMOTE]
    assert timeline.phases() == [
        Phase.IDLE,
        Phase.PENDING,
        Phase.PROGRESSING,
        Phase.PROMOTING,
        Phase.SUCCEEDED,
    ]
    writes = timeline.writes()
    # Each step: one tick until status shows the weight, then its 10-minute window.
    assert [entry.at - writes[0].at for entry in writes] == [timedelta(minutes=m) for m in (0, 11, 22, 33)]
    lines = timeline.render().splitlines()
    assert len(lines) == len(timeline)
    assert lines[0].startswith("+      0s wait")
    assert any(" advance     30% Progressing CanaryAdvanced " in line for line in lines)
    assert any(" promote  remove Promoting   CanaryPromoted " in line for line in lines)
    dicts = timeline.to_dicts()
    assert dicts[-1]["phase"] == "Succeeded"
    assert {
        "at",
        "action",
        "weight",
        "specWeight",
        "phase",
        "event",
        "severity",
        "verdict",
        "reasons",
        "id",
    } == set(dicts[0])


def test_a_timeline_without_waits_keeps_writes_pauses_and_phase_changes() -> None:
    harness = Harness(make_policy(), KServeSim.serving())
    harness.timeline = Timeline(record_waits=False)
    harness.start_rollout()
    harness.sim.make_ready()
    harness.sim.reconcile()
    harness.run(lambda d: d.action is Action.ROLLBACK, evidence=HEALTHY_EVIDENCE.failing(p99=3.0))
    assert [(entry.action, entry.phase) for entry in harness.timeline.entries] == [
        (Action.WAIT, Phase.IDLE),
        (Action.START, Phase.PENDING),
        (Action.WAIT, Phase.PROGRESSING),
        (Action.ROLLBACK, Phase.ROLLED_BACK),
    ]
    assert harness.timeline.entries[-1].headline.startswith(
        "Rolling back llama-predictor-00002: 2 consecutive"
    )


def test_an_empty_timeline_renders() -> None:
    assert Timeline().render() == "(no decisions)"
    assert Timeline().written_weights() == []
