"""Gates in a PromotionPolicy's status and in explain.json (canary.controller.projection, records): pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from canary.controller.projection import PolicyView, project_status
from canary.policy.model import GateStage
from canary.policy.status import GateOutcome, PromotionPolicyStatus
from canary.rollout.decision import Decision
from canary.rollout.records import ExplainDocument
from canary.rollout.state import GateProgress
from canary.rollout.vocabulary import Action, EventReason, Severity
from tests.controller.test_status_projection import POLICY, T0, progressing

SMOKE = GateProgress(
    key="pre-rollout/0",
    name="smoke",
    stage=GateStage.PRE_ROLLOUT,
    since=T0 - timedelta(minutes=9),
    passed_at=T0 - timedelta(minutes=8),
    last_at=T0 - timedelta(minutes=8),
    last_status=200,
    last_detail="HTTP 200",
)
ACCEPTANCE = GateProgress(
    key="step@30%/1",
    name="acceptance",
    stage=GateStage.STEP,
    since=T0 - timedelta(minutes=3),
    weight=30,
    attempts=4,
    last_at=T0 - timedelta(seconds=20),
    last_status=503,
    last_detail="gate acceptance (env GATE_URL): HTTP 503 Service Unavailable from https://ci.example",
)


def test_the_status_lists_each_gate_with_its_outcome_and_latest_attempt() -> None:
    state = replace(progressing(), gates=(SMOKE, ACCEPTANCE))
    status = project_status(PolicyView(generation=1, policy=POLICY, state=state), None, T0)
    assert [(g.name, g.at, g.step, g.result, g.attempts) for g in status.gates] == [
        ("smoke", "pre-rollout", None, GateOutcome.PASSED, 0),
        ("acceptance", "step", "30%", GateOutcome.WAITING, 4),
    ]
    assert status.gates[1].message == (
        "answered 503 at 2026-12-01T11:59:40Z (gate acceptance (env GATE_URL): HTTP 503 Service Unavailable "
        "from https://ci.example)"
    )
    body = status.to_api()
    assert body["gates"][1]["since"] == "2026-12-01T11:57:00Z"
    assert PromotionPolicyStatus.model_validate(body) == status
    late = replace(state, gates=(replace(ACCEPTANCE, deadline_passed_at=T0),))
    assert (
        project_status(PolicyView(1, POLICY, state=late), None, T0).gates[0].result
        is GateOutcome.DEADLINE_PASSED
    )


def test_explain_json_carries_the_gates_of_the_state() -> None:
    state = replace(progressing(), gates=(SMOKE, ACCEPTANCE))
    decision = Decision(
        Action.WAIT, None, state, ("Holding",), EventReason.GATE_WAITING, Severity.INFO, "d-1"
    )
    document = ExplainDocument.from_json(ExplainDocument.of(decision, None, T0).to_json())
    assert [(g.name, g.at, g.weight, g.attempts, g.last_status) for g in document.gates] == [
        ("smoke", "pre-rollout", None, 0, 200),
        ("acceptance", "step", 30, 4, 503),
    ]
    assert document.gates[0].passed_at == SMOKE.passed_at


def test_the_rollout_report_has_a_gates_table_from_the_state() -> None:
    from canary.report.rollout import ReportedRollout, render_report

    state = replace(progressing(), started_at=T0 - timedelta(minutes=10), gates=(SMOKE, ACCEPTANCE))
    rollout = ReportedRollout.of_state("ml", "llama", state, None)
    assert rollout is not None and rollout.gates == (SMOKE, ACCEPTANCE)
    page = render_report(
        rollout, None, start=T0.timestamp() - 600, end=T0.timestamp(), generated_at=T0, prometheus_url=None
    )
    assert "<h2>Gates</h2>" in page
    assert "<td>smoke</td><td>pre-rollout</td><td>—</td>" in page
    assert "passed 2026-12-01T11:52:00Z" in page
    assert "<td>acceptance</td><td>step</td><td>30%</td>" in page and "<td>4</td>" in page
    assert "answered 503 at 2026-12-01T11:59:40Z" in page
    no_gates = ReportedRollout.of_state("ml", "llama", replace(state, gates=()), None)
    assert no_gates is not None
    assert "<h2>Gates</h2>" not in render_report(
        no_gates, None, start=T0.timestamp() - 600, end=T0.timestamp(), generated_at=T0, prometheus_url=None
    )


def test_a_tick_that_only_records_a_gate_keeps_the_latest_evaluations_checks() -> None:
    from canary.controller.gates import explain_with_gates
    from canary.policy.units import Unit
    from canary.rollout.records import ExplainCheck

    stored = ExplainDocument(
        at=T0 - timedelta(minutes=1),
        decision_id="d-0",
        revision="llama-predictor-00002",
        verdict="pass",
        checks=(ExplainCheck("p99", "pass", 0.4, Unit.SECONDS, "≤ 800ms"),),
    )
    state = replace(progressing(), gates=(SMOKE, ACCEPTANCE))
    waiting = Decision(
        Action.WAIT, None, state, ("Holding",), EventReason.GATE_WAITING, Severity.INFO, "d-1",
        revision="llama-predictor-00002",
    )  # fmt: skip
    kept = explain_with_gates(stored, waiting, None, T0)
    assert kept is not None
    assert kept.checks == stored.checks and kept.at == stored.at
    assert [gate.name for gate in kept.gates] == ["smoke", "acceptance"]
    other = explain_with_gates(replace(stored, revision="llama-predictor-00001"), waiting, None, T0)
    assert other is not None and other.checks == () and other.at == T0
    assert explain_with_gates(stored, replace(waiting, new_state=replace(state, gates=())), None, T0) is None
