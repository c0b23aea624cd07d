"""Reading latency histograms: counts slower than a point, where a test may look, and estimates.

Two kinds of reading, never mixed:

* **at an edge** — the count of requests slower than a bucket edge is exact. The sequential tests
  look only there (:func:`fail_edge`, :func:`pass_edge`), so their guarantees hold whatever the shape
  of the latencies inside a bucket;
* **inside a bucket** — an estimate. Above the median the density of latencies falls, so the count
  slower than ``x`` falls faster near a bucket's lower edge than linearly: linear interpolation (what
  ``histogram_quantile`` does) overstates the tail. Inside a bucket whose both edges have requests
  slower than them, the count is interpolated *geometrically* — the share slower than ``x`` follows
  ``S(a) · (S(b) / S(a)) ** ((x - a) / (b - a))``, exact for an exponential tail. That is the named
  assumption of every horizon decision (:mod:`canary.rollout.horizon`); a bucket below the median is
  interpolated linearly. A bucket with nothing slower than its upper edge counts half a request there
  (the Haldane–Anscombe correction for a zero count): the shape of the reading must not depend on
  whether a sample happened to catch a request in the far tail. Read linearly, a canary with none
  beyond 250 ms had its p90 at 190 ms and the stable revision, with two, at 125 ms — from the same
  latencies.

Beyond the last finite edge nothing is known but "slower than the last edge": a limit there can be
shown met (few enough requests are slower than the last edge) but never shown broken.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

from canary.evidence import Histogram
from canary.policy.units import Unit, format_value

__all__ = [
    "density",
    "estimate_quantile",
    "fail_edge",
    "pass_edge",
    "slower_estimate",
    "slower_exact",
]

_REL = 1e-9
_EMPTY_TAIL = 0.5  # requests counted beyond an upper edge nothing was seen beyond (Haldane–Anscombe)


def _ms(seconds: float) -> str:
    return format_value(seconds, Unit.SECONDS)


def fail_edge(edges: Sequence[float], good: float) -> int | None:
    """The index of the lowest edge at or above ``good`` (the limit / (1 + tolerance)).

    More than ``1 - q`` of the requests slower than that edge shows the quantile above it, so above
    "good": a failure there is never wrong by the policy's own definition. None: no such edge."""
    index = bisect.bisect_left(edges, good * (1 - _REL))
    return index if index < len(edges) else None


def pass_edge(edges: Sequence[float], limit: float) -> int | None:
    """The index of the highest edge at or below ``limit``: at most ``1 - q`` of the requests slower
    than it shows the quantile at or below the limit. None: no such edge."""
    index = bisect.bisect_right(edges, limit * (1 + _REL)) - 1
    return index if index >= 0 else None


def slower_exact(histogram: Histogram, index: int) -> int:
    return histogram.slower_than(index)


def slower_estimate(histogram: Histogram, point: float) -> tuple[float, str, bool]:
    """(requests slower than ``point``, how it was read, whether it can be judged).

    "how" is empty at an edge, else the bucket interpolated in. Beyond the last finite edge the count
    is only a lower bound: judgeable only when it already shows the point met (nothing beyond)."""
    edges = histogram.edges
    if not edges:
        return 0.0, "no buckets", False
    upper = bisect.bisect_left(edges, point * (1 - _REL))
    if upper < len(edges) and math.isclose(edges[upper], point, rel_tol=_REL):
        return float(histogram.slower_than(upper)), "", True
    if upper >= len(edges):
        beyond = float(histogram.slower_than(len(edges) - 1))
        return beyond, f"beyond the last bucket edge {_ms(edges[-1])}", beyond == 0
    low = edges[upper - 1] if upper > 0 else 0.0
    slow_low = float(histogram.slower_than(upper - 1)) if upper > 0 else float(histogram.total)
    slow_high = float(histogram.slower_than(upper))
    fraction = (point - low) / (edges[upper] - low)
    tail = _tail(slow_high, slow_low, histogram.total)
    if tail is not None:
        slower = slow_low * (tail / slow_low) ** fraction
        how = f"interpolated geometrically inside {_ms(low)}–{_ms(edges[upper])}"
    else:
        slower = slow_low + (slow_high - slow_low) * fraction
        how = f"interpolated inside {_ms(low)}–{_ms(edges[upper])}"
    return slower, how, True


def estimate_quantile(histogram: Histogram | None, quantile: float) -> float | None:
    """The quantile, read as :func:`slower_estimate` reads counts (the same assumption both ways);
    in the ``+Inf`` bucket, the highest finite edge (a lower bound)."""
    if histogram is None or histogram.total <= 0 or not histogram.edges:
        return None
    target = (1.0 - quantile) * histogram.total  # requests slower than the quantile
    edges = histogram.edges
    low, slow_low = 0.0, float(histogram.total)
    for index, edge in enumerate(edges):
        slow_high = float(histogram.slower_than(index))
        if slow_high <= target:
            if slow_low == slow_high:
                return edge
            tail = _tail(slow_high, slow_low, histogram.total)
            if tail is not None and target > 0:
                fraction = min(1.0, math.log(slow_low / target) / math.log(slow_low / tail))
            else:
                fraction = (slow_low - target) / (slow_low - slow_high)
            return low + (edge - low) * fraction
        low, slow_low = edge, slow_high
    return edges[-1]


def _tail(slow_high: float, slow_low: float, total: float) -> float | None:
    """The count slower than a bucket's upper edge for a geometric reading, or None to read the
    bucket linearly (below the median, or no fall inside it to follow)."""
    tail = max(slow_high, _EMPTY_TAIL)
    return tail if slow_low <= total / 2.0 and slow_low > tail else None


def density(histogram: Histogram, point: float) -> float:
    """The share of requests per second of latency in the bucket around ``point`` (0 beyond the last
    finite edge): how much a share slower than ``point`` moves when ``point`` does."""
    edges = histogram.edges
    if histogram.total <= 0 or not edges:
        return 0.0
    upper = bisect.bisect_left(edges, point)
    if upper >= len(edges):
        return 0.0
    low = edges[upper - 1] if upper > 0 else 0.0
    inside = (histogram.slower_than(upper - 1) if upper > 0 else histogram.total) - histogram.slower_than(
        upper
    )
    return inside / histogram.total / (edges[upper] - low)
