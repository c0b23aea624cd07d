"""Each refused value is an error at its field, with the reason: one case per validator branch.

The fuzz properties (tests/fuzz/test_policy_fuzz.py) reach these branches among thousands of drawn
documents and check only that every error names a field; they run without coverage measurement
(tests/conftest.py). Here each branch is reached on purpose and its message asserted.
"""

from __future__ import annotations

import pytest

from canary.policy.loader import load_text
from tests.policy.support import policy_with

_TARGET = "target: {inferenceService: m}\n"
_STEPS = "steps: [10, 50, 100]\n"


def _errors(text: str) -> list[tuple[str | None, str]]:
    result = load_text(text, "ml/bad.yaml")
    assert not result.policies, "accepted"
    return [(error.field, error.message) for error in result.errors]


def _check(check: str) -> str:
    return policy_with(_TARGET + _STEPS + f"checks:\n  - {check}\n")


@pytest.mark.parametrize(
    ("check", "field", "reason"),
    [
        # ratios (parse_ratio)
        ("{name: e, metric: error-rate, max: 1%, maxIncrease: [1]}", "maxIncrease", "got list"),
        ("{name: e, metric: error-rate, max: 1%, maxIncrease: half}", "maxIncrease", "'half' is not"),
        ("{name: e, metric: error-rate, max: 1%, maxIncrease: x%}", "maxIncrease", "'x%' is not"),
        ("{name: e, metric: error-rate, max: 1%, maxIncrease: -5%}", "maxIncrease", "must not be negative"),
        ("{name: e, metric: error-rate, max: 1%, tolerance: 2000%}", "tolerance", "between 1% and 1000%"),
        # sizes (parse_size)
        ("{name: g, metric: gpu-memory-peak, max: -1}", "max", "must not be negative"),
        # plain numbers (a custom check's count)
        ("{name: c, promql: up, unit: count, max: many}", "max", "'many' is not a number"),
        ("{name: c, promql: up, unit: count, max: inf}", "max", "not a finite number"),
        ("{name: c, promql: up, unit: count, max: [1]}", "max", "expected a number, got list"),
        # the check's shape
        ("{name: c, promql: ' ', unit: count, max: 1}", "promql", "must not be empty"),
        ("{name: c, promql: up, unit: count, max: 1, maxFraction: 0.5}", "", "applies only to metric gpu"),
        (
            "{name: l, metric: latency, quantile: 0.9, max: 1s, maxFraction: 0.5}",
            "",
            "applies only to metric",
        ),
    ],
)
def test_a_check_value_is_refused_at_its_field(check: str, field: str, reason: str) -> None:
    errors = _errors(_check(check))
    assert any(
        (name or "").startswith("spec.checks[0]") and (name or "").endswith(field) and reason in message
        for name, message in errors
    ), errors


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        (_TARGET + "steps: [100]\n", "spec.steps", "at least one canary step below 100"),
        (_TARGET + "steps: [10, {weight: 100, minRequests: 5}]\n", "spec.steps[1]", "promotion itself"),
        (_TARGET + _STEPS + "interval: 500ms\n", "spec.interval", "at least 1s"),
        (_TARGET + _STEPS + "progressDeadline: 0s\n", "spec.progressDeadline", "longer than 0s"),
        (_TARGET + _STEPS + "confidence: 20%\n", "spec.confidence", "between 50% and 99.99%"),
        (_TARGET + _STEPS + "metrics: {queries: {error-rate: ' '}}\n", "spec.metrics.queries", "is empty"),
        ("target: {inferenceService: Not_A_Name}\n" + _STEPS, "spec.target.inferenceService", "DNS-1035"),
        (
            _TARGET + _STEPS + "gates:\n  - {name: -bad-, at: step, webhook: {urlFrom: {env: GATE}}}\n",
            "spec.gates[0].name",
            "starting and ending alphanumeric",
        ),
        (_TARGET + _STEPS + "notify:\n  - {webhook: 5}\n", "spec.notify[0].webhook", "valid"),
        (
            _TARGET + _STEPS + "gates:\n  - {at: step, deadline: 0s, webhook: {urlFrom: {env: GATE}}}\n",
            "spec.gates[0].deadline",
            "longer than 0s",
        ),
    ],
)
def test_a_spec_value_is_refused_at_its_field(spec: str, field: str, reason: str) -> None:
    errors = _errors(policy_with(spec))
    assert any(name == field and reason in message for name, message in errors), errors


def test_a_namespace_that_is_not_a_dns_label_is_refused_at_its_field() -> None:
    head = "apiVersion: kserve-canary.dev/v1alpha1\nkind: PromotionPolicy\nmetadata: {name: a, namespace: Ml_1}\n"
    errors = _errors(policy_with(_TARGET + _STEPS, head=head))
    assert any(name == "metadata.namespace" and "DNS-1123" in message for name, message in errors), errors


def test_metadata_that_is_not_a_mapping_is_an_error_at_metadata_in_a_namespace_directory() -> None:
    head = "apiVersion: kserve-canary.dev/v1alpha1\nkind: PromotionPolicy\nmetadata: 5\n"
    result = load_text(policy_with(_TARGET + _STEPS, head=head), "ml/bad.yaml", namespace="ml")
    assert not result.policies
    assert any(error.field == "metadata" for error in result.errors), result.errors


def test_a_document_with_an_alias_loads_as_pyyaml_builds_it() -> None:
    # An alias is not a plain document: PyYAML's constructor builds it after its nodes are counted.
    text = _check("{name: e, metric: error-rate, max: 1%}") + "  window: &w 10m\n  progressDeadline: *w\n"
    result = load_text(text, "ml/alias.yaml")
    assert result.errors == [], result.errors
    assert result.policies[0].policy.spec.progress_deadline == 600.0
