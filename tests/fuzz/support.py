"""Shared by the fuzz properties: the budget knobs and reproducible settings.

Each property has a default number of examples that keeps the whole directory within about 90 s on two
cores (the policy properties: 8,000 inputs in total). ``FUZZ_SCALE=F`` multiplies every default
(``FUZZ_SCALE=1.25``: the policies' 10,000; ``FUZZ_SCALE=10`` for a long local run);
``FUZZ_EXAMPLES=N`` runs every property with exactly N. ``derandomize`` makes CI draw the same inputs
on every run, so a failure reproduces from the test name.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def examples(default: int) -> int:
    exact = os.environ.get("FUZZ_EXAMPLES")
    if exact:
        return int(exact)
    return max(1, round(default * float(os.environ.get("FUZZ_SCALE") or 1)))


def fuzz_settings(default: int) -> settings:
    return settings(
        max_examples=examples(default),
        deadline=None,
        derandomize=True,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )
