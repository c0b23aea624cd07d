"""How a check's limits read for people: one formatter for the judge, notifications and the demo.

``≤ 800ms and ≤ +20% vs stable when stable ≥ 100ms``: comparator first, so a passing value reads as a
sentence (``612ms ≤ 800ms``). A relative limit in effect reads ``1.5 × stable 286ms = 429ms``.
"""

from __future__ import annotations

from canary.policy.model import Check
from canary.policy.units import Unit, format_value

__all__ = ["limit_parts", "limit_text", "percent", "relative_bound_text"]


def percent(fraction: float) -> str:
    """``0.2`` → ``20%``."""
    return format_value(fraction, Unit.RATIO)


def limit_parts(check: Check, *, relative: bool = True, with_floor: bool = True) -> list[str]:
    """Each limit of ``check`` on its own: ``["≤ 800ms", "≤ +20% vs stable"]``.

    ``relative`` False leaves out ``maxIncrease`` (judged without the stable revision, or not
    comparable with it); ``with_floor`` False leaves out its ``minStable`` condition.
    """
    unit = check.value_unit
    parts = []
    if check.max is not None:
        parts.append(f"≤ {format_value(check.max, unit)}")
    if check.min is not None:
        parts.append(f"≥ {format_value(check.min, unit)}")
    if check.max_fraction is not None:
        parts.append(f"≤ {percent(check.max_fraction)} of GPU memory")
    if relative and check.max_increase is not None:
        floor = (
            f" when stable ≥ {format_value(check.min_stable, unit)}"
            if with_floor and check.min_stable is not None
            else ""
        )
        parts.append(f"≤ +{percent(check.max_increase)} vs stable{floor}")
    return parts


def limit_text(check: Check, *, relative: bool) -> str:
    """The whole condition, in one line: ``≤ 800ms and ≤ +20% vs stable`` (``no limit`` without any)."""
    return " and ".join(limit_parts(check, relative=relative)) or "no limit"


def relative_bound_text(max_increase: float, stable: float, allowed: float, unit: Unit) -> str:
    """The relative limit in effect: ``1.5 × stable 286ms = 429ms``."""
    return f"{1.0 + max_increase:.3g} × stable {format_value(stable, unit)} = {format_value(allowed, unit)}"
