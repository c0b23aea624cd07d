"""How much of a step's window the scrapes can show: the ``validate`` warning about short windows.

Counters are known at scrapes only. A step's own evidence begins at the first scrape after the step
started (the tallies before it hold the previous step's traffic) and its window is held once a
scrape at or after its end is queryable (``canary/rollout/SEMANTICS.md``): up to one scrape interval
of the window is not the step's own. With a window of ``k`` intervals at least ``(k - 1) / k`` of it
is; ``SCRAPES_PER_WINDOW`` (4) keeps that at three quarters, and is the range Prometheus' own
guidance gives ``rate()`` for the same reason (at least four samples in a range).

The scrape interval is a setting of the controller (``--scrape-interval``,
``PROMETHEUS_SCRAPE_INTERVAL``; default 30 s), and ``validate`` takes the same one: it runs in CI,
where no Prometheus is reachable, and a policy is checked against the interval the controller will
read it with.
"""

from __future__ import annotations

from canary.policy.model import PromotionPolicy
from canary.policy.units import format_duration

__all__ = ["SCRAPES_PER_WINDOW", "window_warnings"]

SCRAPES_PER_WINDOW = 4


def window_warnings(policy: PromotionPolicy, scrape_interval: float) -> list[str]:
    """One warning per held step whose window is shorter than ``SCRAPES_PER_WINDOW`` scrape intervals."""
    spec = policy.spec
    shortest = SCRAPES_PER_WINDOW * scrape_interval
    warnings = []
    for step in spec.canary_steps:
        window = spec.step_window(step)
        if window < shortest:
            warnings.append(
                f"step {step.weight}%: window {format_duration(window)} is shorter than "
                f"{SCRAPES_PER_WINDOW} scrape intervals ({format_duration(shortest)} at "
                f"{format_duration(scrape_interval)}): the step's own evidence begins at the first "
                f"scrape after it starts, so up to {format_duration(scrape_interval)} of the window is "
                f"not its own. Lengthen the window, or scrape more often (--scrape-interval)."
            )
    return warnings
