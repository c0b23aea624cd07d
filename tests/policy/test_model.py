"""The policy model: defaults from docs/design.md §5, normalised units and cross-field rules."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from canary.policy import MetricKind, PromotionPolicy, load_text
from canary.policy.loader import PolicyError
from canary.policy.model import NoDataAction
from tests.policy.support import valid_policy


def parse(text: str) -> PromotionPolicy:
    result = load_text(text)
    assert result.ok, [str(error) for error in result.errors]
    return result.policies[0].policy


def test_defaults_are_those_of_the_design() -> None:
    spec = parse(valid_policy()).spec
    assert [step.weight for step in spec.steps] == [10, 30, 50, 100]
    assert (spec.window, spec.interval, spec.min_requests) == (600, 60, 100)
    assert (spec.progress_deadline, spec.failure_limit, spec.bake) == (600, 2, 0)
    assert (spec.on_no_data.after, spec.on_no_data.action) == (900, NoDataAction.HOLD)
    assert spec.auto_start is True
    assert spec.metrics.requests == "auto" and spec.metrics.gpu_labels == "auto"


def test_a_final_100_is_the_promotion_not_a_held_step() -> None:
    spec = parse(valid_policy()).spec
    assert [step.weight for step in spec.canary_steps] == [10, 30, 50]
    without_100 = parse(valid_policy().replace("[10, 30, 50, 100]", "[10, 30, 50]")).spec
    assert [step.weight for step in without_100.canary_steps] == [10, 30, 50]


def test_long_step_form_overrides_window_and_min_requests() -> None:
    text = valid_policy().replace(
        "steps: [10, 30, 50, 100]",
        "steps: [10, {weight: 50, window: 30m, minRequests: 2000, approval: manual}, 100]",
    )
    spec = parse(text).spec
    first, second = spec.canary_steps
    assert (spec.step_window(first), spec.step_min_requests(first)) == (600, 100)
    assert (spec.step_window(second), spec.step_min_requests(second), second.approval) == (
        1800,
        2000,
        "manual",
    )


def test_the_100_step_cannot_be_held() -> None:
    text = valid_policy().replace("[10, 30, 50, 100]", "[10, {weight: 100, window: 5m}]")
    result = load_text(text)
    assert not result.ok
    assert "promotion itself" in result.errors[0].message


def test_limits_are_normalised_to_canonical_units() -> None:
    text = valid_policy().replace(
        "    - {name: p99, metric: latency, quantile: 0.99, max: 800ms, maxIncrease: 20%}",
        "    - {name: p99, metric: latency, quantile: 0.99, max: 800ms, maxIncrease: 20%}\n"
        "    - {name: errors, metric: error-rate, max: 1%, maxIncrease: 50%, minStable: 0.1%}\n"
        "    - {name: gpu, metric: gpu-memory-peak, max: 70Gi, maxFraction: 90%}\n"
        "    - {name: warmup, metric: warmup-time, max: 3m}\n"
        "    - {name: ttft, promql: 'x{pod=~\"{{ revision }}.*\"}', unit: seconds, max: 2, maxIncrease: 0.25}",
    )
    checks = {check.name: check for check in parse(text).spec.checks}
    assert (checks["p99"].max, checks["p99"].max_increase) == (pytest.approx(0.8), pytest.approx(0.2))
    assert (checks["errors"].max, checks["errors"].min_stable) == (pytest.approx(0.01), pytest.approx(0.001))
    assert checks["gpu"].max == 70 * 1024**3 and checks["gpu"].max_fraction == pytest.approx(0.9)
    assert checks["warmup"].max == 180
    assert checks["ttft"].max == 2 and checks["ttft"].comparable_to_stable
    assert checks["p99"].effective_quantile == 0.99
    assert checks["errors"].metric is MetricKind.ERROR_RATE and checks["errors"].effective_quantile is None


def test_latency_quantile_defaults_to_p99() -> None:
    text = valid_policy().replace("quantile: 0.99, ", "")
    assert parse(text).spec.checks[0].effective_quantile == 0.99


@pytest.mark.parametrize(
    ("check", "message"),
    [
        ("{name: oom, metric: oom-kills, max: 0, maxIncrease: 10%}", "no comparable value"),
        ("{name: c, promql: 'sum(up)', max: 1, maxIncrease: 10%}", "without {{ revision }}"),
        ("{name: c, metric: latency, minStable: 1s}", "set maxIncrease too"),
        ("{name: c, metric: latency}", "needs a limit"),
        ("{name: c, metric: latency, min: 2s, max: 1s}", "is above 'max'"),
        ("{name: c, metric: error-rate, quantile: 0.5, max: 1%}", "does not apply"),
        ("{name: c, metric: latency, unit: seconds, max: 1s}", "only for promql"),
        ("{name: c, metric: latency, maxFraction: 0.5}", "only to metric gpu-memory-peak"),
        ("{name: c, promql: 'x', quantile: 0.5, max: 1}", "write it into the promql"),
        ("{name: c, promql: 'x{a=\"{{ revison }}\"}', max: 1}", "unknown template variable(s) revison"),
        ("{name: c, promql: 'x{a=\"{{ revision }\"}', max: 1}", "unbalanced"),
        ("{name: -bad-, metric: latency, max: 1s}", "letters, digits"),
    ],
)
def test_check_rules(check: str, message: str) -> None:
    text = valid_policy().replace(
        "{name: p99, metric: latency, quantile: 0.99, max: 800ms, maxIncrease: 20%}", check
    )
    result = load_text(text)
    assert not result.ok
    assert message in result.errors[0].message, result.errors


def test_query_overrides_are_checked() -> None:
    extra = "  metrics:\n    queries:\n      latncy: 'sum(x)'\n"
    result = load_text(valid_policy() + extra)
    assert "unknown query 'latncy'" in result.errors[0].message
    fine = load_text(
        valid_policy() + "  metrics:\n    queries:\n      request-count: 'sum(x{ns=\"{{ namespace }}\"})'\n"
    )
    assert fine.ok


def test_notify_targets_need_exactly_one_kind_and_secret_references() -> None:
    base = valid_policy() + "  notify:\n"
    assert load_text(base + "    - slack: {webhookUrlFrom: {env: SLACK_URL}}\n").ok
    both = load_text(base + "    - {slack: {webhookUrlFrom: {env: A}}, webhook: {urlFrom: {env: B}}}\n")
    assert "exactly one of 'slack', 'teams', 'discord' or 'webhook'" in both.errors[0].message
    bad_env = load_text(base + "    - webhook: {urlFrom: {env: 'not a name'}}\n")
    assert "not a valid environment variable name" in bad_env.errors[0].message
    two_refs = load_text(base + "    - webhook: {urlFrom: {env: A, file: /x}}\n")
    assert "exactly one of 'env' or 'file'" in two_refs.errors[0].message


def test_policy_key_is_namespace_and_inference_service() -> None:
    assert parse(valid_policy("a", target="llama")).key == "ml/llama"


def test_models_are_immutable() -> None:
    policy = parse(valid_policy())
    with pytest.raises(ValidationError):
        policy.spec.window = 5  # type: ignore[misc]


def test_multi_document_files_load_every_policy() -> None:
    result = load_text(valid_policy("one") + "---\n" + valid_policy("two"))
    assert [(p.policy.metadata.name, p.line, p.document) for p in result.policies] == [
        ("one", 1, 0),
        ("two", 13, 1),
    ]


def test_configmap_mount_dot_entries_are_skipped(tmp_path: pytest.TempPathFactory) -> None:
    from pathlib import Path

    from canary.policy import load_paths

    # One ConfigMap per namespace, mounted at <policy root>/<namespace>.
    root = Path(str(tmp_path)) / "ml"
    root.mkdir()
    data = root / "..2026_11_29_10_00_00.123"
    data.mkdir()
    (data / "llama.yaml").write_text(valid_policy("llama"))
    (root / "..data").symlink_to(data.name)
    (root / "llama.yaml").symlink_to("..data/llama.yaml")
    (root / ".hidden.yaml").write_text("not: a policy")
    result = load_paths([root.parent])
    assert result.ok
    assert [p.policy.metadata.name for p in result.policies] == ["llama"]
    assert result.files == [str(root / "llama.yaml")]


# A Flagger user's habits: thresholds in percent, request durations in milliseconds. Here a bare number
# is a fraction or seconds, so each of these would silently turn a check off; each is refused with the
# fix.
@pytest.mark.parametrize(
    ("check", "field", "fix"),
    [
        (
            "{name: c, metric: error-rate, max: 1}",
            "max",
            'would mean 100% (a bare number is a fraction: 0.01 = 1%), a limit that never fails; for 1 percent write "1%"',
        ),
        ("{name: c, metric: error-rate, max: 5}", "max", "would mean 500%"),
        ("{name: c, metric: kv-cache-usage, max: 1.0}", "max", 'for 1 percent write "1%"'),
        (
            "{name: c, metric: latency, max: 800}",
            "max",
            'seconds here (13m20s) but milliseconds in Flagger; write "800ms" or "800s"',
        ),
        ("{name: c, metric: latency, max: 50}", "max", 'write "50ms" or "50s"'),
        ("{name: c, metric: ttft, max: 2}", "max", 'write "2ms" or "2s"'),
        ("{name: c, metric: e2e-latency, max: 1s, maxIncrease: 20}", "maxIncrease", "would mean +2000%"),
        (
            "{name: c, metric: latency, maxIncrease: 20%, minStable: 100}",
            "minStable",
            'write "100ms" or "100s"',
        ),
        ("{name: c, promql: 'x', unit: ratio, max: 2}", "max", 'for 2 percent write "2%"'),
        ("{name: c, promql: 'x', unit: ratio, max: 1}", "max", 'write "1%"'),
    ],
)
def test_a_bare_number_a_peer_reads_in_another_unit_is_refused_with_the_fix(
    check: str, field: str, fix: str
) -> None:
    errors = _errors_of_check(check)
    assert [error.field for error in errors] == [f"spec.checks[0].{field}"], errors
    assert fix in errors[0].message


@pytest.mark.parametrize(
    "check",
    [
        "{name: c, metric: error-rate, max: 0.01}",
        "{name: c, metric: error-rate, max: 0}",
        "{name: c, metric: latency, max: 800ms}",
        "{name: c, metric: warmup-time, max: 300}",
        "{name: c, metric: oom-kills, max: 0}",
        "{name: c, metric: latency, maxIncrease: 0.5}",
        "{name: c, promql: 'x', unit: seconds, max: 2}",
    ],
)
def test_bare_numbers_that_mean_the_same_to_a_peer_stay_accepted(check: str) -> None:
    assert _errors_of_check(check) == []


def _errors_of_check(check: str) -> list[PolicyError]:
    text = valid_policy().replace(
        "{name: p99, metric: latency, quantile: 0.99, max: 800ms, maxIncrease: 20%}", check
    )
    return load_text(text).errors
