"""Shared by the fuzz properties: one budget knob and reproducible settings.

``FUZZ_EXAMPLES=N`` runs every property with N examples instead of its default (the defaults keep the
whole directory well under 90 s on two cores inside ``make test``); ``derandomize`` makes CI draw the
same inputs every run, so a failure reproduces from the test name alone.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def examples(default: int) -> int:
    override = os.environ.get("FUZZ_EXAMPLES")
    return int(override) if override else default


def fuzz_settings(default: int) -> settings:
    return settings(
        max_examples=examples(default),
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
