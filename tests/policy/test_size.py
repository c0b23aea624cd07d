"""A policy whose evaluation could not be stored is refused at validate (issue 35, item 10)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from canary.kserve.store import MAX_STATE_BYTES
from canary.policy import load_text
from canary.policy.size import MAX_EVALUATION_BYTES, evaluation_bytes
from canary.policy.units import Unit
from canary.rollout.past import MAX_RECORD_BYTES
from canary.rollout.records import ExplainCheck, ExplainDocument
from canary.rollout.state import MAX_HISTORY, MAX_REASON_CHARS, HistoryEntry, Phase, RolloutState

HEAD = """\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {name: big, namespace: ml}
spec:
  target: {inferenceService: llama}
  checks:
"""


def policy_text(checks: list[str]) -> str:
    return HEAD + "".join(f"    - {check}\n" for check in checks)


def test_a_policy_whose_evaluation_could_not_be_stored_is_refused_with_the_size_and_the_fix() -> None:
    many = [f"{{name: p{i}, metric: latency, quantile: 0.99, max: 800ms}}" for i in range(60)]
    loaded = load_text(policy_text(many), "big.yaml")
    assert not loaded.policies
    (error,) = loaded.errors
    assert "its evaluation could not be stored: 60 checks" in error.message
    assert f"more than the {MAX_EVALUATION_BYTES:,}" in error.message and "use fewer checks" in error.message
    huge = 'sum(rate(x{a=\\"' + "y" * 100_000 + '\\"}[5m]))'  # three of them: about 330 KB stored
    loaded = load_text(
        policy_text([f'{{name: c{i}, promql: "{huge}", max: 1}}' for i in range(3)]), "huge.yaml"
    )
    assert not loaded.policies and "could not be stored" in loaded.errors[0].message


def test_what_the_fairness_quota_lets_through_fits() -> None:
    # Branch `fair` allows 8 custom queries per policy: 8 of 10 KiB each, with a few builtins, fit.
    query = 'sum(rate(x{a=\\"' + "y" * 10_000 + '\\"}[{{ window }}]))'
    checks = [f'{{name: c{i}, promql: "{query}", max: 1}}' for i in range(8)]
    checks += [f"{{name: p{i}, metric: latency, quantile: 0.99, max: 800ms}}" for i in range(10)]
    loaded = load_text(policy_text(checks), "fair.yaml")
    assert not loaded.errors, loaded.errors
    assert evaluation_bytes(loaded.policies[0].policy.spec) <= MAX_EVALUATION_BYTES


def test_the_bound_leaves_room_for_the_worst_state_and_record_and_over_estimates_the_evaluation() -> None:
    now = datetime(2026, 12, 6, tzinfo=UTC)
    entry = HistoryEntry(at=now, action="advance", phase=Phase.PROGRESSING, reason="r" * MAX_REASON_CHARS,
                         weight=50, event="CanaryAdvanced", id="d" * 40)  # fmt: skip
    state = RolloutState(revision="x" * 63, stable_revision="y" * 63, history=(entry,) * MAX_HISTORY)
    assert MAX_EVALUATION_BYTES + MAX_RECORD_BYTES + len(state.to_json().encode()) <= MAX_STATE_BYTES
    # An evaluation as recorded, with every query kept, is smaller than its estimate.
    text = policy_text([f"{{name: p{i}, metric: latency, quantile: 0.99, max: 800ms}}" for i in range(30)])
    spec = load_text(text).policies[0].policy.spec
    check = ExplainCheck(
        "p00", "fail", 0.5, Unit.SECONDS, "≤ 800ms and ≤ +20% vs stable", 0.4, 1e6, detail="d" * 300,
        query="q" * 2000, canary_query="c" * 2000, stable_query="s" * 2000, max_allowed=0.8,
    )  # fmt: skip
    document = ExplainDocument(at=now, decision_id="d", reasons=("r" * 200,), checks=(check,) * 30)
    assert len(json.dumps(json.loads(document.to_json())).encode()) < evaluation_bytes(spec)
