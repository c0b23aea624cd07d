"""Team A hostile, team B measured, in one controller process (issue #34; docs/security.md,
"Everything at once, measured"). The ``runs`` fixture (conftest.py) plays the same rollouts benign
and hostile (tests/hostile/world.py says what team A does); each test compares team B's outcomes,
or the controller's memory, with the issue's targets:

* team B's rollback is written within its interval plus one scrape of when the benign run wrote it;
* its rollback notice is accepted within 10 s of its receiver answering again (after an outage);
* the controller's peak resident memory stays within 20 % of the benign run's, and under the
  chart's memory limit (``resources.limits.memory`` in charts/kserve-canary/values.yaml).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.hostile.world import (
    HOSTILE,
    INTERVAL,
    SCRAPE,
    TEAM_A,
    TEAM_A_MODELS,
    Run,
    ignored_configmaps,
)

# Both runs, with their stacks: about 2 minutes on the shared two-core machine (make test-hostile).
pytestmark = pytest.mark.timeout(240)

TOLD_WITHIN = 10.0
RSS_HEADROOM = 1.2
CHART_VALUES = Path(__file__).resolve().parents[2] / "charts" / "kserve-canary" / "values.yaml"
UNITS = {"Ki": 1, "Mi": 1024, "Gi": 1024 * 1024}


def chart_memory_limit_kib() -> int:
    limit = str(yaml.safe_load(CHART_VALUES.read_text())["resources"]["limits"]["memory"])
    return int(limit[:-2]) * UNITS[limit[-2:]]


def test_team_a_was_hostile_in_every_way_at_once(runs: dict[str, Run]) -> None:
    """The hostile run did what it says (else the other tests would pass for nothing)."""
    benign, hostile = runs["benign"], runs["hostile"]
    assert ignored_configmaps(hostile) == HOSTILE and ignored_configmaps(benign) == 0
    assert hostile.rotations >= 50
    deferred = [line for line in hostile.log if f"namespace {TEAM_A} spent its budget" in str(line)]
    assert deferred, "team A's slow custom queries were never deferred"
    # Gates fail closed on dribbled, hung and oversized answers: those rollouts hold before the first
    # step; benign, the same gates pass and the rollouts move.
    for name, _notify, gate, slow in TEAM_A_MODELS:
        if gate is not None:
            assert 10 not in hostile.team_a_writes[name], (name, hostile.team_a_writes[name])
            assert 10 in benign.team_a_writes[name], (name, benign.team_a_writes[name])
        if slow:
            # Deferred custom checks hold their step; benign, the same checks answer in time.
            assert hostile.team_a_writes[name] == [10], hostile.team_a_writes[name]


def test_team_b_rollback_is_written_within_its_interval_plus_one_scrape(runs: dict[str, Run]) -> None:
    benign, hostile = runs["benign"], runs["hostile"]
    allowed = benign.rollback_after + INTERVAL + SCRAPE
    assert hostile.rollback_after <= allowed, (
        f"team B's rollback was written {hostile.rollback_after:.1f}s after its canary took traffic "
        f"(benign {benign.rollback_after:.1f}s, allowed {allowed:.1f}s)"
    )


def test_team_b_is_told_within_10s_of_its_receiver_answering(runs: dict[str, Run]) -> None:
    for name, one in runs.items():
        assert one.told_after <= TOLD_WITHIN, (
            f"{name}: team B's rollback was told {one.told_after:.1f}s after its receiver answered again"
        )


def test_peak_memory_stays_within_20_percent_of_benign_and_under_the_chart_limit(
    runs: dict[str, Run],
) -> None:
    benign, hostile = runs["benign"], runs["hostile"]
    limit = chart_memory_limit_kib()
    print(
        f"peak RSS benign {benign.peak_mib:.0f} MiB, hostile {hostile.peak_mib:.0f} MiB, limit {limit // 1024} MiB"
    )
    assert hostile.peak_rss_kib <= limit
    assert hostile.peak_rss_kib <= benign.peak_rss_kib * RSS_HEADROOM, (
        f"peak RSS {hostile.peak_mib:.0f} MiB hostile vs {benign.peak_mib:.0f} MiB benign "
        f"(+{hostile.peak_rss_kib / benign.peak_rss_kib - 1:.0%})"
    )
