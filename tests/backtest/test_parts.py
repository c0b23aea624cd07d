"""The backtest's pure parts, without Prometheus: overrides, periods, policy selection."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from canary.backtest.history import TrafficPoint, find_periods
from canary.backtest.whatif import WhatIfError, apply_what_if, parse_override
from canary.policy import load_paths
from tests.backtest.support import HEALTHY, write_policy
from tests.cli.support import invoke

T = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
OLD, NEW = "m-predictor-00001", "m-predictor-00002"


def points(*rates: dict[str, float]) -> list[TrafficPoint]:
    return [TrafficPoint(T + timedelta(seconds=15 * index), rate) for index, rate in enumerate(rates)]


def test_an_override_is_key_equals_a_yaml_value() -> None:
    assert parse_override("window=5m").path == ("window",)
    assert parse_override("spec.checks.p99.max=600ms").path == ("checks", "p99", "max")
    assert parse_override("steps=[10, 50, 100]").value == [10, 50, 100]
    assert parse_override("confidence=0.99").value == 0.99
    for bad, reason in (
        ("window", "expected KEY=VALUE"),
        ("=5m", "expected KEY=VALUE"),
        ("checks..max=1", "is not a field path"),
        ("target.inferenceService=other", "cannot be changed in a backtest"),
        ("steps=[10,", "the value is not YAML"),
    ):
        with pytest.raises(WhatIfError, match=reason):
            parse_override(bad)


def test_what_if_validates_as_the_file_and_names_the_override(tmp_path: Path) -> None:
    [loaded] = load_paths([write_policy(tmp_path, HEALTHY)]).policies
    document = yaml.safe_load(Path(loaded.path).read_text(encoding="utf-8"))

    changed = apply_what_if(
        loaded, document, [parse_override("window=5m"), parse_override("checks.p99.max=600ms")]
    )

    assert (changed.spec.window, changed.spec.checks[1].max) == (300.0, 0.6)
    assert loaded.policy.spec.window == 240.0  # the file's policy is untouched
    for override, message in (
        ("windw=5m", "--what-if windw=5m: spec.windw: "),
        ("checks.p95.max=1s", "the policy has no check 'p95' (it has errors, p99)"),
        ("checks.p99.max=fast", "--what-if checks.p99.max=fast: spec.checks[1].max: "),
        ("steps=[10, 200]", "--what-if steps=[10, 200]: spec.steps"),
        ("interval.every=1m", "spec.interval is not a mapping"),
    ):
        with pytest.raises(WhatIfError) as refused:
            apply_what_if(loaded, document, [parse_override(override)])
        assert message in str(refused.value), str(refused.value)


def test_a_period_is_two_revisions_serving_and_a_missing_point_neither_ends_nor_fills_it() -> None:
    found = find_periods(
        points(
            {OLD: 10.0},
            {OLD: 9.0, NEW: 1.0},
            {},  # nothing recorded: missing
            {OLD: 7.0, NEW: 3.0},
            {NEW: 10.0},
        ),
        15.0,
    )

    [period] = found
    assert (period.canary, period.stable) == (NEW, OLD)
    assert (period.start, period.end) == (T + timedelta(seconds=15), T + timedelta(seconds=45))
    assert period.missing_steps == 1
    assert period.outcome == "canary-took-over"


def test_periods_of_one_pair_close_together_are_one_and_the_outcome_is_what_served_next() -> None:
    quiet = [{OLD: 10.0}] * 3  # 45 s without canary requests (1% of a quiet model) between two runs
    found = find_periods(points({OLD: 9.0, NEW: 1.0}, *quiet, {OLD: 9.0, NEW: 1.0}, {OLD: 10.0}), 15.0)
    far = find_periods(points({OLD: 9.0, NEW: 1.0}, *([{OLD: 10.0}] * 30), {OLD: 9.0, NEW: 1.0}), 15.0)

    assert [(p.start, p.end, p.outcome) for p in found] == [(T, T + timedelta(seconds=60), "stable-kept")]
    assert len(far) == 2 and far[-1].outcome == "open"


def test_a_policy_file_with_several_policies_needs_isvc(tmp_path: Path) -> None:
    two = tmp_path / "two.yaml"
    document = """\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: ml}}
spec:
  target: {{inferenceService: {name}}}
  checks: [{{name: errors, metric: error-rate, max: 2%}}]
"""
    two.write_text(document.format(name="a") + "---\n" + document.format(name="b"), encoding="utf-8")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return invoke("backtest", str(two), "--prometheus-url", "http://127.0.0.1:1", *args)

    ambiguous, unknown, broken = run(), run("--isvc", "ml/c"), run("--isvc", "c")

    assert ambiguous.returncode == 1
    assert "holds policies for ml/a, ml/b: choose one with --isvc NAMESPACE/NAME" in ambiguous.stderr
    assert unknown.returncode == 1
    assert "no policy for ml/c (it has policies for ml/a, ml/b)" in unknown.stderr
    assert broken.returncode == 1
    assert "--isvc 'c': expected NAMESPACE/NAME" in broken.stderr
