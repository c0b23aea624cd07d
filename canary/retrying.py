"""One way to try again, for every outbound call the controller makes (Prometheus, notifications).

A :class:`RetryPolicy` says how often and how patiently; :func:`retrying` runs an attempt until its
result is final. *What* is worth another try is the caller's: the attempt returns a value (never
raises for an expected failure) and ``again(result)`` decides. That keeps the one rule that differs
between callers where it belongs:

* Prometheus re-tries only what certainly never ran (connection refused, 502/503 *unavailable*, 429);
  a query that timed out is never re-run — it would cost Prometheus the same again, and the next
  evaluation tick asks anyway. No jitter: the pauses are short and bounded.
* notifications re-try what may succeed later (connection errors, timeouts, 408/425/429, 5xx) with
  exponential backoff and "equal jitter", and honour ``Retry-After`` (bounded).

``budget`` bounds the pauses of one call in total (seconds), on top of ``attempts``; it is counted
from the pauses themselves, not the wall clock, so an injected ``sleep`` keeps it exact.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["NOTIFICATION_RETRY", "PROMETHEUS_RETRY", "RetryPolicy", "retrying"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often, and after which pauses, a call is tried again. The defaults are Prometheus'."""

    attempts: int = 3  # tries in total, the first included
    backoff: float = 0.2  # seconds before the second try; doubled for each further try
    max_backoff: float = 1.0  # no pause (before jitter) is longer
    jitter: bool = False  # "equal jitter": half the pause fixed, half random — never zero, never lockstep
    max_retry_after: float = 120.0  # a longer Retry-After is shortened to this
    budget: float | None = None  # seconds of pauses one call may spend in total; None: attempts alone

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.backoff < 0 or self.max_backoff < 0 or self.max_retry_after < 0:
            raise ValueError("backoff must not be negative")
        if self.budget is not None and self.budget < 0:
            raise ValueError("budget must not be negative")

    def pause_before(
        self, attempt: int, rng: random.Random | None = None, retry_after: float | None = None
    ) -> float:
        """Seconds to wait before try number ``attempt`` (2, 3, ...).

        ``retry_after`` is what the other side asked for (``Retry-After``): the pause is at least that
        long, up to ``max_retry_after`` (so a bogus header cannot park a caller for an hour).
        """
        ceiling = float(min(self.max_backoff, self.backoff * 2.0 ** (attempt - 2)))
        pause = ceiling
        if self.jitter:
            pause = ceiling / 2 + (rng or random).uniform(0, ceiling / 2)
        if retry_after is not None:
            pause = max(pause, min(retry_after, self.max_retry_after))
        return pause


# Prometheus: a few quick tries of what never reached it (see canary.metrics.client).
PROMETHEUS_RETRY = RetryPolicy()
# Notifications: patient, jittered, Retry-After honoured (see canary.notify.dispatcher). A pause is
# at most 8 s (4-8 s with jitter), so a receiver back from an outage is tried again within 8 s and
# its team is told within 10 s of it answering (docs/security.md, "Fairness between namespaces");
# one down receiver costs its lane an attempt every 4-8 s, for the notification's retry horizon.
NOTIFICATION_RETRY = RetryPolicy(attempts=5, backoff=1.0, max_backoff=8.0, jitter=True)


def retrying(
    policy: RetryPolicy,
    attempt: Callable[[int], T],
    *,
    again: Callable[[T], bool],
    retry_after: Callable[[T], float | None] | None = None,
    before_pause: Callable[[T, int, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> tuple[T, int]:
    """Call ``attempt(n)`` for n = 1, 2, ... until ``again(result)`` is false, the attempts are used
    up or the next pause would exceed the budget; return the last result and the number of tries.

    ``before_pause(result, n, seconds)`` runs before each pause (log it, count it).
    """
    spent = 0.0
    tries = 0
    while True:
        tries += 1
        result = attempt(tries)
        if tries >= policy.attempts or not again(result):
            return result, tries
        asked = retry_after(result) if retry_after is not None else None
        pause = policy.pause_before(tries + 1, rng, asked)
        if policy.budget is not None and spent + pause > policy.budget:
            return result, tries
        if before_pause is not None:
            before_pause(result, tries, pause)
        sleep(pause)
        spent += pause
