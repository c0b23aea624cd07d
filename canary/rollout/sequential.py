"""Sequential tests on counts: always valid however often the controller looks, and always ending.

The judge (:mod:`canary.rollout.judge`) asks two questions of every check estimated from a sample of
requests (error rates, latency quantiles), each as its own one-sided test with its own share of the
rollout's error budget:

* **is the limit broken?** — the *fail test*: its null hypothesis is that the canary is good; it
  rejects (the check fails) only when the data make that implausible at its budget ``alpha``;
* **is the limit met?** — the *pass test*: its null hypothesis is that the canary is bad; it rejects
  (the check is met) only when the data make *that* implausible at its budget ``beta``.

Both are **mixture likelihood-ratio tests** of a binomial share (errors among requests; requests
slower than a bucket edge among requests): the statistic is the average, over a grid of alternatives
inside the zone the test is looking for, of the likelihood ratio of each alternative against the
null's boundary. Under any share on the null's side, every one of those ratios is a non-negative
supermartingale (its expected factor per request is below one), so is their average, and by Ville's
inequality the chance that it *ever* reaches ``1 / budget`` is at most ``budget`` — however many
times it is looked at, at whatever moments. This is the whole error guarantee; nothing is assumed
about the distribution of latencies, only that requests are exchangeable within an interval.

Real traffic is bursty: errors and slow requests come in clusters, so the per-interval counts vary
more than a binomial would. The likelihoods are *tempered* by the dispersion ``phi`` measured across
the intervals (Pearson's statistic over the per-interval counts divided by its degrees of freedom,
never below one) — the quasi-likelihood correction: with ``phi = 3`` every request counts as a third.

The grid of alternatives is geometric with the check's tolerance as its ratio (the resolution at
which the policy says it cares), at most :data:`GRID_POINTS` points, equally weighted.

A test in its indifference zone (the canary between "good" and "bad") may never reject either
null: the step's horizon (:mod:`canary.rollout.horizon`) bounds that wait, and the estimate decides
there, stating its own error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

__all__ = [
    "GRID_POINTS",
    "Direction",
    "MixtureTest",
    "chi_square_quantile",
    "dispersion",
    "paired_log_ratios",
]

# Equal weights over this many alternatives cost log(GRID_POINTS) of evidence: 24 points cover a
# factor of ten at a 10 % tolerance and cost about 3.2 nats, the price of not knowing the effect size.
GRID_POINTS = 24

_TINY = 1e-12


class Direction:
    """Which side of the null the alternatives lie on."""

    ABOVE = "above"  # the fail test of an upper limit: alternatives above the null's boundary
    BELOW = "below"  # the pass test of an upper limit: alternatives below it


def _log_mean_exp(values: Sequence[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return -math.inf
    return top + math.log(sum(math.exp(value - top) for value in values) / len(values))


@dataclass(frozen=True, slots=True)
class MixtureTest:
    """A one-sided sequential test of a binomial share ``p``.

    ``Direction.ABOVE``: null ``p <= boundary``, rejected when the data show ``p`` above it.
    ``Direction.BELOW``: null ``p >= boundary``, rejected when the data show ``p`` below it.
    ``start`` is where the alternatives begin (``boundary`` itself when the zones touch, as for
    quantiles; the tolerance's far edge for rates), ``ratio`` the grid's geometric step.
    """

    boundary: float
    direction: str
    budget: float
    start: float
    ratio: float

    def __post_init__(self) -> None:
        if not 0.0 < self.boundary < 1.0:
            raise ValueError(f"the boundary of a binomial test must lie in (0, 1), got {self.boundary}")
        if not 0.0 < self.budget < 1.0:
            raise ValueError(f"the error budget must lie in (0, 1), got {self.budget}")
        if self.ratio <= 1.0:
            raise ValueError(f"the grid ratio must be above 1, got {self.ratio}")

    @property
    def threshold(self) -> float:
        """The log-evidence at which the null is rejected: log(1 / budget)."""
        return math.log(1.0 / self.budget)

    @property
    def alternatives(self) -> tuple[float, ...]:
        points: list[float] = []
        value = self.start
        if math.isclose(value, self.boundary):
            value = value * self.ratio if self.direction == Direction.ABOVE else value / self.ratio
        for _ in range(GRID_POINTS):
            if self.direction == Direction.ABOVE:
                if value >= 1.0:
                    break
            elif value <= _TINY:
                break
            points.append(value)
            value = value * self.ratio if self.direction == Direction.ABOVE else value / self.ratio
        if not points:  # the zone is narrower than one grid step: its far end
            points.append(min(1.0 - _TINY, self.start) if self.direction == Direction.ABOVE else self.start)
        return tuple(points)

    def rejects(self, events: float, trials: float, phi: float = 1.0) -> bool:
        if trials <= 0:
            return False
        # The mean of the ratios lies between the largest over the grid's size and the largest:
        # most looks are decided by the largest alone, without the exponentials.
        tempered = max(phi, 1.0)
        misses = max(trials - events, 0.0)
        terms = [(events * hit + misses * miss) / tempered for hit, miss in _coefficients(self)]
        top = max(terms)
        threshold = self.threshold
        if top < threshold:
            return False
        if top - math.log(len(terms)) >= threshold:
            return True
        return _log_mean_exp(terms) >= threshold


@lru_cache(maxsize=8192)
def _coefficients(test: MixtureTest) -> tuple[tuple[float, float], ...]:
    """Per alternative, the log-likelihood ratio of one event and of one miss: computed once per test."""
    null = test.boundary
    return tuple((math.log(alt / null), math.log((1.0 - alt) / (1.0 - null))) for alt in test.alternatives)


def dispersion(intervals: Sequence[tuple[float, float]], confidence: float = 0.95) -> float:
    """How much more the per-interval counts vary than a binomial's, at least 1: an upper
    confidence bound on it, since an underestimate would make every test too bold.

    Pearson's chi-square over ``(events, trials)`` per interval is about ``phi`` times a chi-square
    with ``m - 1`` degrees of freedom; dividing it by that distribution's lower ``1 - confidence``
    quantile (Wilson–Hilferty) bounds ``phi`` from above at ``confidence``. Fewer than three
    intervals with trials, or no events at all, give 1: there is nothing to measure.
    """
    used = [(events, trials) for events, trials in intervals if trials > 0]
    if len(used) < 3:
        return 1.0
    events_total = sum(events for events, _ in used)
    trials_total = sum(trials for _, trials in used)
    share = events_total / trials_total
    if share <= 0.0 or share >= 1.0:
        return 1.0
    chi_square = sum(
        (events - trials * share) ** 2 / (trials * share * (1.0 - share)) for events, trials in used
    )
    return max(1.0, chi_square / chi_square_quantile(len(used) - 1, 1.0 - confidence))


def chi_square_quantile(degrees: int, probability: float) -> float:
    """The ``probability`` quantile of a chi-square with ``degrees`` degrees of freedom
    (Wilson–Hilferty's cube-root normal approximation; a small positive floor for tiny quantiles)."""
    z = NormalDist().inv_cdf(probability)
    ninth = 2.0 / (9.0 * degrees)
    return max(degrees * (1.0 - ninth + z * math.sqrt(ninth)) ** 3, 1e-3 * degrees)


def paired_log_ratios(
    intervals: Sequence[tuple[int, int, int, int]], alternatives: Sequence[float], null: float
) -> list[float]:
    """log likelihood ratios of error-rate ratios ``rho = canary rate / stable rate``: each
    alternative against ``null``, in one pass over the intervals.

    Per interval ``(canary errors, canary requests, stable errors, stable requests)``: given the
    errors both revisions had in it, the canary's share of them is binomial with
    ``pi = n_c rho / (n_c rho + n_s)``. Conditioning on each interval's errors cancels what both
    revisions share — a burst of upstream failures, a quiet night — so the test compares the canary
    with the stable revision *as they were at the same moment*.
    """
    totals = [0.0] * len(alternatives)
    for canary_errors, canary_requests, stable_errors, stable_requests in intervals:
        if canary_errors + stable_errors == 0 or canary_requests <= 0 or stable_requests <= 0:
            continue
        pi_null = canary_requests * null / (canary_requests * null + stable_requests)
        log_null, log_null_miss = math.log(pi_null), math.log(1.0 - pi_null)
        for index, alternative in enumerate(alternatives):
            pi_alt = canary_requests * alternative / (canary_requests * alternative + stable_requests)
            totals[index] += canary_errors * (math.log(pi_alt) - log_null) + stable_errors * (
                math.log(1.0 - pi_alt) - log_null_miss
            )
    return totals
