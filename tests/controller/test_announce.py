"""Which decisions reach people: every write, and a worrying condition once per step — no flapping."""

from __future__ import annotations

from dataclasses import replace

from canary.controller.announce import is_announced, to_notification
from canary.rollout import Action
from canary.rollout.decision import EventReason
from tests.rollout.helpers import HEALTHY_EVIDENCE, make_policy, no_data, progressing


def test_writes_are_always_announced_and_carry_their_numbers() -> None:
    harness = progressing()
    decision = harness.run(lambda d: d.action is Action.ADVANCE)
    told: set[tuple[str, int | None]] = set()
    assert is_announced(decision, told)
    assert is_announced(decision, told), "a write is announced even if an equal one was"
    notification = to_notification(decision, make_policy(), harness.now)
    assert (notification.from_weight, notification.to_weight) == (10, 30)
    assert {line.name for line in notification.checks} >= {"p99", "errors"}
    p99 = next(line for line in notification.checks if line.name == "p99")
    assert p99.value and p99.stable and p99.limit.startswith("≤")


def test_inconclusive_evidence_is_announced_once_per_step() -> None:
    harness = progressing()
    starved = HEALTHY_EVIDENCE.failing(p99=no_data())
    first = harness.tick(60, evidence=starved)
    second = harness.tick(60, evidence=starved)
    assert first.event_reason is EventReason.CANARY_INCONCLUSIVE
    assert second.event_reason is EventReason.CANARY_INCONCLUSIVE
    told: set[tuple[str, int | None]] = set()
    assert is_announced(first, told)
    assert not is_announced(second, told)
    healthy = harness.tick(60)
    assert not is_announced(healthy, told), "a routine wait is never announced"
    # The same condition on the next step is news again.
    assert first.new_state.step is not None
    next_step = replace(
        first, new_state=replace(first.new_state, step=replace(first.new_state.step, index=1))
    )
    assert is_announced(next_step, told)
