from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from canary.policy.units import (
    Unit,
    format_duration,
    format_value,
    parse_duration,
    parse_in_unit,
    parse_ratio,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("10m", 600),
        ("1h30m", 5400),
        ("250ms", 0.25),
        ("1d", 86400),
        ("0", 0),
        (45, 45),
        ("1.5m", 90),
    ],
)
def test_durations_parse_to_seconds(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["10 minutes", "-1m", "m", "10x", "1h 30m", "", "1m30", True, -5, [1]])
def test_bad_durations_are_refused_with_the_accepted_forms(text: object) -> None:
    with pytest.raises(ValueError, match=r"duration|negative"):
        parse_duration(text)


@given(st.integers(min_value=1, max_value=10**7))
def test_format_duration_round_trips_whole_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("text", "fraction"), [("1%", 0.01), ("0.1%", 0.001), (0.01, 0.01), ("100%", 1.0), (1, 1.0)]
)
def test_ratios_are_fractions(text: object, fraction: float) -> None:
    assert parse_ratio(text) == pytest.approx(fraction)


def test_a_bare_number_above_one_is_not_silently_read_as_a_percentage() -> None:
    with pytest.raises(ValueError, match="at most 100%"):
        parse_ratio(2)
    assert parse_ratio("150%", allow_above_one=True) == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("text", "size"), [("70Gi", 70 * 1024**3), ("512Mi", 512 * 1024**2), ("1G", 1e9), (1024, 1024)]
)
def test_sizes_parse_to_bytes(text: object, size: float) -> None:
    assert parse_size(text) == pytest.approx(size)


@pytest.mark.parametrize("text", ["70 gigabytes", "-1Gi", "Gi"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="size|negative"):
        parse_size(text)


def test_limits_are_parsed_in_the_metric_unit() -> None:
    assert parse_in_unit("800ms", Unit.SECONDS) == pytest.approx(0.8)
    assert parse_in_unit("1%", Unit.RATIO) == pytest.approx(0.01)
    assert parse_in_unit("1Gi", Unit.MEBIBYTES) == pytest.approx(1024)
    assert parse_in_unit(3, Unit.COUNT) == 3
    assert parse_in_unit("2.5", Unit.NONE) == 2.5
    with pytest.raises(ValueError, match="negative"):
        parse_in_unit(-1, Unit.COUNT)
    with pytest.raises(ValueError, match="finite"):
        parse_in_unit(math.inf, Unit.NONE)


def test_values_render_for_people() -> None:
    assert format_value(0.8, Unit.SECONDS) == "800ms"
    assert format_value(0.0123, Unit.RATIO) == "1.23%"
    assert format_value(70 * 1024**3, Unit.BYTES) == "70Gi"
    assert format_value(math.nan, Unit.SECONDS) == "NaN"
    assert format_value(math.inf, Unit.RATIO) == "+Inf"
    assert format_value(200, Unit.SECONDS) == "3m20s"
