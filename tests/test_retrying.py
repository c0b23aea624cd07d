"""canary.retrying: the one retry idiom (Prometheus queries, notifications)."""

from __future__ import annotations

import random

import pytest

from canary.retrying import NOTIFICATION_RETRY, PROMETHEUS_RETRY, RetryPolicy, retrying


def _run(policy: RetryPolicy, results: list[str], **options: object) -> tuple[str, int, list[float]]:
    sleeps: list[float] = []
    answers = iter(results)
    result, tries = retrying(
        policy,
        lambda _: next(answers),
        again=lambda answer: answer == "again",
        sleep=sleeps.append,
        **options,  # type: ignore[arg-type]
    )
    return result, tries, sleeps


def test_retries_until_the_result_is_final() -> None:
    assert _run(PROMETHEUS_RETRY, ["again", "again", "done"]) == ("done", 3, [0.2, 0.4])


def test_a_final_result_is_never_retried() -> None:
    # e.g. a timed-out Prometheus query: its attempt says it is not worth another try
    assert _run(PROMETHEUS_RETRY, ["timeout", "done"]) == ("timeout", 1, [])


def test_attempts_bound_the_tries_and_the_backoff_is_capped() -> None:
    policy = RetryPolicy(attempts=5, backoff=0.1, max_backoff=0.3)
    result, tries, sleeps = _run(policy, ["again"] * 9)
    assert (result, tries) == ("again", 5)
    assert sleeps == pytest.approx([0.1, 0.2, 0.3, 0.3])


def test_jitter_keeps_half_the_pause_and_retry_after_is_honoured_up_to_its_cap() -> None:
    rng = random.Random(3)
    for attempt in range(2, 8):
        ceiling = min(8.0, 2.0 ** (attempt - 2))
        assert ceiling / 2 <= NOTIFICATION_RETRY.pause_before(attempt, rng) <= ceiling
    assert NOTIFICATION_RETRY.pause_before(2, rng, retry_after=20.0) == 20.0
    assert NOTIFICATION_RETRY.pause_before(2, rng, retry_after=3600.0) == 120.0


def test_the_budget_bounds_the_total_pause() -> None:
    policy = RetryPolicy(attempts=10, backoff=1.0, max_backoff=4.0, budget=5.0)
    result, tries, sleeps = _run(policy, ["again"] * 10)
    assert sleeps == [1.0, 2.0]  # the next pause (4 s) would exceed the 5 s budget
    assert (result, tries) == ("again", 3)


def test_before_pause_sees_each_retry() -> None:
    seen: list[tuple[str, int, float]] = []
    _run(PROMETHEUS_RETRY, ["again", "done"], before_pause=lambda r, n, s: seen.append((r, n, s)))
    assert seen == [("again", 1, 0.2)]


@pytest.mark.parametrize(
    ("options", "message"),
    [({"attempts": 0}, "at least 1"), ({"backoff": -1}, "negative"), ({"budget": -1}, "negative")],
)
def test_nonsense_is_refused(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**options)  # type: ignore[arg-type]
