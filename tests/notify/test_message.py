from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from canary.notify.message import CheckLine, CheckVerdict, NotificationAction, Severity, traffic_text
from canary.rollout.vocabulary import DEFAULT_REASONS, EventReason, decision_id
from tests.notify.support import make_notification


def test_time_is_normalised_to_utc_and_naive_times_are_refused() -> None:
    in_seoul = datetime(2025, 3, 14, 18, 26, 53, tzinfo=timezone(timedelta(hours=9)))
    assert make_notification(time=in_seoul).time == datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)
    with pytest.raises(ValueError, match="timezone-aware"):
        make_notification(time=datetime(2025, 3, 14, 9, 26, 53))


def test_reason_defaults_from_the_action_and_must_be_camel_case() -> None:
    assert make_notification(action=NotificationAction.ROLLED_BACK).reason == "CanaryRolledBack"
    assert make_notification(action=NotificationAction.UNGUARDED_ROLLOUT).reason == "UnguardedRollout"
    assert make_notification(reason="PrometheusUnavailable").reason == "PrometheusUnavailable"
    with pytest.raises(ValueError, match="UpperCamelCase"):
        make_notification(reason="canary advanced")


def test_every_action_has_a_default_reason() -> None:
    assert set(DEFAULT_REASONS) == set(NotificationAction)
    assert {reason.value for reason in EventReason} >= {
        "CanaryStarted",
        "CanaryAdvanced",
        "CanaryPromoted",
        "CanaryRolledBack",
        "CanaryPaused",
        "CanaryInconclusive",
        "UnguardedRollout",
        "PrometheusUnavailable",
    }


@pytest.mark.parametrize("weight", [-1, 101])
def test_weights_outside_0_to_100_are_refused(weight: int) -> None:
    with pytest.raises(ValueError, match="within 0..100"):
        make_notification(to_weight=weight)


def test_lists_are_stored_as_tuples_so_the_value_stays_immutable() -> None:
    notification = make_notification(
        reasons=["a reason"], checks=[CheckLine("p99", CheckVerdict.PASS, "1s", "≤ 2s")]
    )
    assert notification.reasons == ("a reason",)
    assert isinstance(notification.checks, tuple)


@pytest.mark.parametrize(
    ("line", "text"),
    [
        (CheckLine("p99", CheckVerdict.PASS, "612ms", "≤ 800ms", "540ms"), "612ms ≤ 800ms (stable 540ms)"),
        (
            CheckLine("p99", CheckVerdict.FAIL, "950ms", "≤ 800ms", "540ms"),
            "950ms, not ≤ 800ms (stable 540ms)",
        ),
        (
            CheckLine("p99", CheckVerdict.NO_DATA, limit="≤ 800ms", detail="12 requests < minRequests 100"),
            "no data: 12 requests < minRequests 100 (limit ≤ 800ms)",
        ),
        (
            CheckLine("p99", CheckVerdict.ERROR, limit="≤ 800ms", detail="HTTP 422"),
            "query failed: HTTP 422 (limit ≤ 800ms)",
        ),
        (CheckLine("oom", CheckVerdict.PASS, "0", "≤ 0", samples="4 pods"), "0 ≤ 0, 4 pods"),
    ],
)
def test_a_check_line_reads_true_for_its_verdict(line: CheckLine, text: str) -> None:
    assert line.describe() == text


def test_traffic_text() -> None:
    assert traffic_text(10, 30, NotificationAction.ADVANCED) == "10% → 30%"
    assert traffic_text(50, None, NotificationAction.PROMOTED) == "50% → 100% (promoted)"
    assert traffic_text(None, 10, NotificationAction.STARTED) == "unset → 10%"
    assert traffic_text(30, 0, NotificationAction.ROLLED_BACK) == "30% → 0%"
    assert traffic_text(30, 30, NotificationAction.PAUSED) == "30% (unchanged)"
    assert traffic_text(None, None, NotificationAction.WAITING) == ""


def test_decision_ids_are_deterministic_and_distinct() -> None:
    first = decision_id("ml", "llama", "rev-2", "advanced", 30)
    assert first == decision_id("ml", "llama", "rev-2", "advanced", 30)
    assert first != decision_id("ml", "llama", "rev-2", "advanced", 50)
    # Parts are separated, so shifting text between them changes the id.
    assert decision_id("ab", "c") != decision_id("a", "bc")


def test_severity_order() -> None:
    assert Severity.WARNING.at_least(Severity.INFO)
    assert not Severity.INFO.at_least(Severity.WARNING)
