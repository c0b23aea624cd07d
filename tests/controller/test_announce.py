"""Which decisions reach people: every write, and a worrying condition once per step — no flapping."""

from __future__ import annotations

from dataclasses import replace

from canary.controller.announce import Announcements, is_announced, to_notification
from canary.rollout import Action
from canary.rollout.decision import EventReason
from canary.rollout.vocabulary import notification_action
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


def test_what_happened_maps_from_the_decision_in_the_payloads_words() -> None:
    # Writes and pauses by their action, waits by their reason; the values are the public payload's.
    table = [
        (Action.START, EventReason.UNGUARDED_ROLLOUT, "started"),
        (Action.ADVANCE, EventReason.CANARY_ADVANCED, "advanced"),
        (Action.PROMOTE, EventReason.CANARY_PROMOTED, "promoted"),
        (Action.ROLLBACK, EventReason.CANARY_ROLLED_BACK, "rolled-back"),
        (Action.PAUSE, EventReason.CANARY_INCONCLUSIVE, "paused"),
        (Action.PAUSE, EventReason.EXTERNAL_TRAFFIC_CHANGE, "paused"),
        (Action.WAIT, EventReason.CANARY_AWAITING_APPROVAL, "paused"),
        (Action.WAIT, EventReason.CANARY_SUCCEEDED, "succeeded"),
        (Action.WAIT, EventReason.CANARY_RESUMED, "resumed"),
        (Action.WAIT, EventReason.CANARY_INCONCLUSIVE, "inconclusive"),
        (Action.WAIT, EventReason.PROMETHEUS_UNAVAILABLE, "prometheus-unavailable"),
        (Action.WAIT, EventReason.UNGUARDED_ROLLOUT, "unguarded-rollout"),
        (Action.WAIT, EventReason.CANARY_EVALUATED, "waiting"),
        (Action.WAIT, EventReason.CANARY_BAKING, "waiting"),
    ]
    assert [notification_action(action, reason).value for action, reason, _ in table] == [
        expected for _, _, expected in table
    ]


def test_the_announcements_tell_each_condition_once_per_step_and_revision() -> None:
    harness = progressing()
    starved = HEALTHY_EVIDENCE.failing(p99=no_data())
    first = harness.tick(60, evidence=starved)
    again = harness.tick(60, evidence=starved)
    announcements = Announcements()
    assert announcements.tell("ml/llama", first)
    assert not announcements.tell("ml/llama", again)
    assert announcements.tell("ml/other", again), "told per rollout"
    renamed = replace(again, revision="llama-predictor-00009")
    assert announcements.tell("ml/llama", renamed), "a new revision is news again"


def test_an_unreadable_state_is_told_once_until_a_decision_is_made_again() -> None:
    announcements = Announcements()
    assert announcements.tell_unreadable("ml/llama")
    assert not announcements.tell_unreadable("ml/llama")
    assert announcements.tell_unreadable("ml/other")
    harness = progressing()
    announcements.tell("ml/llama", harness.tick(60))  # the state could be read and decided on
    assert announcements.tell_unreadable("ml/llama"), "broken again after a recovery: told again"
