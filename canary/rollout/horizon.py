"""A step's time horizon, and the rule that decides a counted check there.

The sequential tests (:mod:`canary.rollout.sequential`) decide early and soundly, but a canary inside
its tolerance zone — or beside a limit that no bucket edge resolves — may never make either test
reject. The horizon bounds that wait: every held step has one (``spec.horizon`` or the step's own,
by default the step's window and one more window), and it is measured in **evidence time**: the time
covered by tallies in which the canary served requests. Time without data, on Prometheus errors or
while a gate or an approval holds a passed step does not move it; those follow their own rules
(``onNoData``, gate deadlines).

Once evidence covers the step's window (it reaches the canary's newest sample as Prometheus holds
it, :func:`evidence_until`, not the clock), a check the tests left undecided is decided **on its
estimate** as soon as the estimate is *resolved* — on the wrong side of the limit with a chance of at
most ``1 - confidence`` (normal approximation; for relative limits the stable revision's own sampling
error is included) — and at the horizon whatever that chance, as a person reading the dashboard
would: the step's own estimate against the limit (never one pooled over the steps, which could hide a
regression that appears only at this step's share); relative limits against the stable revision's
estimate pooled over the rollout (the stable revision does not change; more of it is less noise).
The estimate must rest on enough requests to say anything: :func:`events_needed` expected events
at the allowed share, the number at which a share half the allowed and one twice the allowed both
land on their right side with the policy's confidence (normal approximation: the distance ``s/2``
or ``s`` over the standard error ``sqrt(s'/n)`` is ``sqrt(k/2)`` in both cases, so ``k = 2 z²``).
Until then the check says how many more requests it needs and by when, at the current rate.

Every horizon decision states its own error: the chance that a share estimated at this value from
this many requests lies on the other side of the limit (a normal approximation at the estimate,
widened by the measured dispersion). ``spec.atHorizon: pause`` pauses the rollout with the numbers
instead of deciding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from statistics import NormalDist

from canary.evidence import CountSeries, EvidenceStatus, Tally
from canary.policy.model import HorizonAction
from canary.policy.units import format_duration

__all__ = [
    "Horizon",
    "HorizonAction",
    "HorizonOutcome",
    "chance_text",
    "events_needed",
    "evidence_time",
    "evidence_until",
    "requests_needed",
    "share_variance",
    "wrong_side",
]

_NORMAL = NormalDist()
_NOTED_AGE = timedelta(seconds=1)  # an evidence age below this is not worth a word


class HorizonOutcome(StrEnum):
    """How a counted check's verdict relates to the horizon."""

    NONE = ""  # decided by a test, or still before the horizon
    ESTIMATE = "estimate"  # decided on the estimate at the horizon
    UNJUDGEABLE = "unjudgeable"  # at the horizon, the estimate cannot be judged (beyond the buckets)


@dataclass(frozen=True, slots=True)
class Horizon:
    """Where a step stands against its horizon: computed by the core, read by the judge."""

    length: timedelta  # the evidence time after which the estimate decides
    covered: timedelta  # the evidence time the step has had so far
    now: datetime
    action: HorizonAction = HorizonAction.DECIDE
    window_ended: bool = False  # evidence covers the step's window: a resolved estimate may decide
    evidence_until: datetime | None = None  # how far the canary's evidence reaches (None: ``now``)

    @property
    def reached(self) -> bool:
        return self.covered >= self.length

    @property
    def evidence_age(self) -> timedelta:
        """How far behind the evaluation the canary's evidence reaches."""
        return self.now - self.evidence_until if self.evidence_until is not None else timedelta(0)

    @property
    def behind(self) -> str:
        """``evidence 32s behind`` when the evidence reaches a second or more behind the
        evaluation (scrape intervals, ingestion lag); ``""`` otherwise."""
        age = self.evidence_age
        return f"evidence {format_duration(age.total_seconds())} behind" if age >= _NOTED_AGE else ""

    @property
    def by(self) -> datetime:
        """When it is reached if evidence keeps flowing."""
        return self.now + max(self.length - self.covered, timedelta(0))


def evidence_until(series: CountSeries | None, at: datetime) -> datetime:
    """How far the canary's evidence reaches at ``at``: the time of its newest counter sample as
    Prometheus holds it (behind scrape intervals and ingestion lag), never after ``at``; ``at`` when
    the evidence does not say (a source without counts, or counts without that time)."""
    if series is None or series.status is not EvidenceStatus.OK or series.newest is None:
        return at
    return min(series.newest, at)


def evidence_time(series: CountSeries | None, since: datetime) -> timedelta:
    """The time since ``since`` covered by the canary's tallies in which it served requests."""
    if series is None or series.status is not EvidenceStatus.OK:
        return timedelta(0)
    return _covered([tally for tally in series.tallies if tally.start >= since])


def _covered(tallies: Sequence[Tally]) -> timedelta:
    return sum((tally.end - tally.start for tally in tallies if tally.requests > 0), timedelta(0))


def events_needed(confidence: float) -> int:
    """Expected events at the allowed share a horizon estimate rests on (see the module docstring)."""
    z = _NORMAL.inv_cdf(confidence)
    return max(1, math.ceil(2.0 * z * z))


def requests_needed(allowed: float, confidence: float, phi: float = 1.0) -> int:
    """Requests a horizon estimate of a share judged against ``allowed`` rests on."""
    return math.ceil(max(phi, 1.0) * events_needed(confidence) / max(allowed, 1e-12))


def share_variance(share: float, requests: float, phi: float = 1.0) -> float:
    """The variance of a share estimated from ``requests`` (at least half an event's worth)."""
    if requests <= 0:
        return math.inf
    bounded = min(max(share, 0.5 / requests), 1.0 - 1e-12)
    return bounded * (1.0 - bounded) * max(phi, 1.0) / requests


def wrong_side(estimate: float, allowed: float, variance: float) -> float:
    """The chance that an estimate with this variance lies on the other side of ``allowed`` from the
    truth (normal approximation at the estimate)."""
    if not math.isfinite(variance) or variance <= 0:
        return 0.5 if not math.isfinite(variance) else 0.0
    return _NORMAL.cdf(-abs(estimate - allowed) / math.sqrt(variance))


def chance_text(probability: float) -> str:
    """``about 3%``, ``below 0.1%``: the error of a horizon decision in words."""
    if probability < 0.001:
        return "below 0.1%"
    if probability < 0.01:
        return f"about {probability:.1%}"
    return f"about {probability:.0%}"
