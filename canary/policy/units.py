"""Parsing of the human units a policy file is written in.

Everything is normalised to one canonical unit per dimension so that the decision core never
has to think about units again:

========== ============================== ===================
dimension  accepted input                 canonical value
========== ============================== ===================
duration   ``"90s"``, ``"10m"``, ``"1h30m"``, ``"250ms"``, number of seconds   seconds (float)
ratio      ``"1%"``, ``"0.5%"``, or a number in [0, 1]    fraction (float)
size       ``"70Gi"``, ``"512Mi"``, ``"1.5G"``, number of bytes  bytes (float)
count      a non-negative number                            float
========== ============================== ===================

The parsers raise :class:`ValueError` with a message that names the accepted forms, which
pydantic turns into a located validation error (``spec.window: ...``).
"""

from __future__ import annotations

import math
import re
from enum import StrEnum

__all__ = [
    "Unit",
    "format_duration",
    "format_value",
    "parse_duration",
    "parse_in_unit",
    "parse_ratio",
    "parse_size",
    "peer_unit_mistake",
]


class Unit(StrEnum):
    """The unit a check's value is measured in (custom PromQL checks declare theirs)."""

    SECONDS = "seconds"
    RATIO = "ratio"  # 0..1; written as "1%" or 0.01
    BYTES = "bytes"
    MEBIBYTES = "MiB"  # DCGM reports framebuffer memory in MiB
    COUNT = "count"
    NONE = "none"  # a plain number without dimension


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_FACTORS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION_HELP = 'a duration such as "90s", "10m", "1h30m" or "250ms"'
# A longer duration is a typo, and one past the calendar (1e300 seconds) would overflow the core's
# datetime arithmetic (OverflowError) instead of being reported where it is written.
MAX_DURATION_SECONDS = 100 * 365 * 86400.0


def _finite_number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an int of 309 digits or more
            raise ValueError("must be a finite number (this one is too large)") from None
        if not math.isfinite(number):
            raise ValueError("must be a finite number")
        return number
    return None


def parse_duration(value: object) -> float:
    """Parse a duration into seconds. A bare number is seconds; negative durations are refused."""
    number = _finite_number(value)
    if number is not None:
        if number < 0:
            raise ValueError(f"must not be negative (got {value!r}); expected {DURATION_HELP}")
        return _at_most_a_century(number, value)
    if not isinstance(value, str):
        raise ValueError(f"expected {DURATION_HELP}, got {type(value).__name__}")
    text = value.strip()
    if text.startswith("-"):
        raise ValueError(f"must not be negative (got {value!r}); expected {DURATION_HELP}")
    if text == "0":
        return 0.0
    position = 0
    total = 0.0
    for match in _DURATION_PART.finditer(text):
        if match.start() != position:
            break
        total += float(match.group(1)) * _DURATION_FACTORS[match.group(2)]
        position = match.end()
    if position == 0 or position != len(text):
        raise ValueError(f"{value!r} is not {DURATION_HELP}")
    return _at_most_a_century(total, value)


def _at_most_a_century(seconds: float, value: object) -> float:
    if not seconds <= MAX_DURATION_SECONDS:  # also "999...9s", more digits than a float holds: inf
        raise ValueError(f"{value!r} is too long: a duration is at most 100 years")
    return seconds


def format_duration(seconds: float) -> str:
    """The inverse of :func:`parse_duration`, for messages: ``5400 -> "1h30m"``."""
    if seconds < 0:
        return "-" + format_duration(-seconds)
    if seconds < 1 and seconds != 0:
        return f"{round(seconds * 1000)}ms"
    whole = round(seconds)
    if whole == 0:
        return "0s"
    parts = []
    for suffix, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        amount, whole = divmod(whole, size)
        if amount:
            parts.append(f"{amount}{suffix}")
    return "".join(parts)


_RATIO_HELP = 'a percentage such as "1%" or a fraction between 0 and 1 such as 0.01'


def parse_ratio(value: object, *, allow_above_one: bool = False) -> float:
    """Parse ``"1%"`` or ``0.01`` into the fraction 0.01.

    A bare number is a fraction, not a percentage: ``1`` means 100 %. ``allow_above_one`` is for
    relative limits (``maxIncrease: 150%``).
    """
    number = _finite_number(value)
    if number is None:
        if not isinstance(value, str):
            raise ValueError(f"expected {_RATIO_HELP}, got {type(value).__name__}")
        text = value.strip()
        if not text.endswith("%"):
            raise ValueError(f"{value!r} is not {_RATIO_HELP}")
        try:
            number = float(text[:-1]) / 100.0
        except ValueError:
            raise ValueError(f"{value!r} is not {_RATIO_HELP}") from None
        if not math.isfinite(number):
            raise ValueError(f"{value!r} is not {_RATIO_HELP}")
    if number < 0:
        raise ValueError(f"must not be negative (got {value!r})")
    if number > 1 and not allow_above_one:
        raise ValueError(f"must be at most 100% (got {value!r}); a bare number is a fraction: 0.9 = 90%")
    return number


_SIZE_PATTERN = re.compile(r"^(\d+(?:\.\d+)?)\s*(Ki|Mi|Gi|Ti|K|k|M|G|T)?B?$")
_SIZE_FACTORS = {
    None: 1.0,
    "K": 1e3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 1024.0,
    "Mi": 1024.0**2,
    "Gi": 1024.0**3,
    "Ti": 1024.0**4,
}
_SIZE_HELP = 'a size such as "70Gi", "512Mi" or a number of bytes'


def parse_size(value: object) -> float:
    """Parse a Kubernetes-style quantity of memory into bytes."""
    number = _finite_number(value)
    if number is not None:
        if number < 0:
            raise ValueError(f"must not be negative (got {value!r})")
        return number
    if not isinstance(value, str):
        raise ValueError(f"expected {_SIZE_HELP}, got {type(value).__name__}")
    match = _SIZE_PATTERN.match(value.strip())
    if not match:
        raise ValueError(f"{value!r} is not {_SIZE_HELP}")
    size = float(match.group(1)) * _SIZE_FACTORS[match.group(2)]
    if not math.isfinite(size):  # "999...9Gi": more digits than a float holds
        raise ValueError(f"{value!r} is too large: must be a finite size")
    return size


def _parse_plain(value: object) -> float:
    number = _finite_number(value)
    if number is None:
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                raise ValueError(f"{value!r} is not a number") from None
            if not math.isfinite(number):
                raise ValueError(f"{value!r} is not a finite number")
        else:
            raise ValueError(f"expected a number, got {type(value).__name__}")
    return number


def parse_in_unit(value: object, unit: Unit) -> float:
    """Parse a limit written for a value measured in ``unit`` into that unit's canonical number."""
    if unit is Unit.SECONDS:
        return parse_duration(value)
    if unit is Unit.RATIO:
        return parse_ratio(value)
    if unit is Unit.BYTES:
        return parse_size(value)
    if unit is Unit.MEBIBYTES:
        return parse_size(value) / 1024.0**2 if isinstance(value, str) else _parse_plain(value)
    number = _parse_plain(value)
    if unit is Unit.COUNT and number < 0:
        raise ValueError(f"a count must not be negative (got {value!r})")
    return number


def format_value(value: float, unit: Unit | str) -> str:
    """Render a canonical value for people: ``0.0123 ratio -> "1.23%"``, ``0.8 s -> "800ms"``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    unit = Unit(unit)
    if unit is Unit.SECONDS:
        if abs(value) < 1:
            return f"{value * 1000:.0f}ms" if abs(value) >= 0.01 else f"{value * 1000:.2f}ms"
        if abs(value) < 120:
            return f"{value:.2f}s"
        return format_duration(value)
    if unit is Unit.RATIO:
        return f"{value * 100:.3g}%"
    if unit is Unit.BYTES:
        for suffix, size in (("Ti", 1024.0**4), ("Gi", 1024.0**3), ("Mi", 1024.0**2), ("Ki", 1024.0)):
            if abs(value) >= size:
                return f"{value / size:.3g}{suffix}"
        return f"{value:.0f}B"
    if unit is Unit.MEBIBYTES:
        return f"{value:.0f}MiB"
    if unit is Unit.COUNT:
        return f"{value:.0f}" if value == int(value) else f"{value:.2f}"
    return f"{value:.4g}"


# A bare number means a fraction here and a percentage in Flagger (``threshold: 1`` is 1 %), and a
# latency in seconds here and in milliseconds in Flagger (``request-duration`` ``max: 500`` is
# 500 ms). Where the two readings differ by the factor a person would not notice, the policy must
# say its unit: a silent 100x or 1000x turns a check off.
def peer_unit_mistake(value: object, unit: Unit, *, relative: bool = False) -> str | None:
    """The mistake a bare ``value`` would be for a limit in ``unit``, with the fix; None if none."""
    number = _finite_number(value)
    if number is None or number == 0:
        return None
    plain = f"{number:g}"
    if unit is Unit.SECONDS and not relative:
        return (
            f"{value!r} has no unit: a bare latency is seconds here ({format_duration(number)}) but "
            f'milliseconds in Flagger; write "{plain}ms" or "{plain}s"'
        )
    if unit is Unit.RATIO and number >= 1:
        if relative:
            return (
                f"{value!r} would mean +{number * 100:g}% (a bare number is a fraction: 0.2 = +20%); "
                f'write "{number * 100:g}%" if you mean that, or "{plain}%"'
            )
        return (
            f"{value!r} would mean {number * 100:g}% (a bare number is a fraction: 0.01 = 1%), a limit "
            f'that never fails; for {plain} percent write "{plain}%"'
        )
    return None
