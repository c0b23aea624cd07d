"""An alarm: the shell saw the canary OOM-killed in the evidence pipeline's latest sample, and asks
the core for a look now instead of at the next interval (``decide(..., alarm=True)``).

What must hold: the look is an evaluation like any other — it rolls back on a critical failure at
once, it is recorded and the interval counts from it — and it never shortens a step's hold, skips
a step or lets a step be left before its window has passed."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from canary.rollout.decision import Action
from canary.rollout.state import Phase
from tests.rollout.helpers import HEALTHY_EVIDENCE, EvidenceMaker, make_policy, progressing

OOM_KILLED = EvidenceMaker().failing(oom=1.0)


def test_without_an_alarm_nothing_is_due_before_the_interval() -> None:
    harness = progressing()
    evaluated = harness.tick(60)
    assert evaluated.new_state.evaluation.at == harness.now
    asked = len(harness.requests)
    decision = harness.tick(10, evidence=OOM_KILLED)
    assert len(harness.requests) == asked, "no evaluation 10 s after the last one at a 1m interval"
    assert decision.action is Action.WAIT


def test_an_alarm_is_judged_now_and_a_critical_failure_rolls_back_at_once() -> None:
    harness = progressing()
    harness.tick(60)
    decision = harness.tick(10, evidence=OOM_KILLED, alarm=True)
    assert harness.requests[-1].at == harness.now
    assert decision.action is Action.ROLLBACK
    assert decision.weight == 0
    assert decision.new_state.phase is Phase.ROLLED_BACK
    assert any("oom" in reason.lower() for reason in decision.reasons), decision.reasons


def test_a_healthy_alarm_look_is_recorded_and_the_interval_counts_from_it() -> None:
    harness = progressing()
    harness.tick(60)
    looked = harness.tick(15, alarm=True)
    assert looked.action is Action.WAIT
    assert looked.new_state.evaluation.at == harness.now
    assert looked.new_state.step == harness.decisions[-2].new_state.step, "the step is not left"
    asked = len(harness.requests)
    harness.tick(50)
    assert len(harness.requests) == asked, "the next look is an interval after the alarm's"
    harness.tick(10)
    assert len(harness.requests) == asked + 1


def test_an_alarm_at_the_very_start_of_a_step_has_nothing_to_judge() -> None:
    harness = progressing()
    asked = len(harness.requests)
    harness.tick(0, alarm=True)
    assert len(harness.requests) == asked, "a window of no time is not evaluated"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 90), st.booleans()),  # seconds to the next tick, alarm or not
        min_size=20,
        max_size=80,
    )
)
def test_alarms_never_shorten_a_hold_nor_skip_a_step(ticks: list[tuple[int, bool]]) -> None:
    policy = make_policy(window="2m")
    harness = progressing(policy)
    window = timedelta(minutes=2)
    for after, alarm in ticks:
        harness.tick(after, evidence=HEALTHY_EVIDENCE, alarm=alarm)
    steps = [50, 100]  # after the first, 10 → 30 →; the policy's steps
    written = [weight for weight in harness.writes() if weight is not None]
    allowed = [10, 30, *steps]
    assert written == allowed[: len(written)], harness.timeline.render()
    # Every step left was held at least its window, whatever the alarms.
    started: dict[int, object] = {}
    for decision in harness.decisions:
        step = decision.new_state.step
        if step is not None and step.started_at is not None:
            started.setdefault(step.index, step.started_at)
    for index in range(1, max(started, default=0) + 1):
        if index in started and index - 1 in started:
            held = started[index] - started[index - 1]  # type: ignore[operator]
            assert held >= window, (index, held, harness.timeline.render())
