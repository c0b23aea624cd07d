"""A PromotionPolicy's status projected from the rollout state (canary.controller.projection): pure."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import yaml

from canary.controller.projection import PolicyView, previous_status, project_status, status_unchanged
from canary.policy import PolicyError, PromotionPolicy
from canary.policy.status import ConditionType, PromotionPolicyStatus
from canary.policy.units import Unit
from canary.rollout.artefact import Artefact
from canary.rollout.records import ExplainCheck, ExplainDocument
from canary.rollout.state import HistoryEntry, Pause, PauseKind, Phase, RolloutState, StepProgress
from tests.policy.support import valid_policy

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = PromotionPolicy.model_validate(yaml.safe_load(valid_policy("llama")))
REV1, REV2 = "llama-predictor-00001", "llama-predictor-00002"


def progressing(at: datetime = T0, revision: str = REV2, index: int = 1) -> RolloutState:
    weight = [10, 30, 50][index]
    return RolloutState(
        phase=Phase.PROGRESSING,
        revision=revision,
        stable_revision=REV1,
        step=StepProgress(index=index, weight=weight, started_at=at),
        history=(
            HistoryEntry(
                at=at,
                action="advance",
                weight=weight,
                phase=Phase.PROGRESSING,
                event="CanaryAdvanced",
                reason=f"Step {index + 1} passed",
                id="d1",
            ),
        ),
    )


def view(state: RolloutState | None, **changes: object) -> PolicyView:
    base = PolicyView(generation=4, policy=POLICY, state=state, inference_service_generation=7)
    return replace(base, **changes)  # type: ignore[arg-type]


def conditions(status: PromotionPolicyStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status.value, c.reason) for c in status.conditions}


def test_a_progressing_rollout() -> None:
    status = project_status(view(progressing()), None, T0)
    body = status.to_api()
    assert "verdict" not in body["lastDecision"]  # no evaluation yet
    assert (body["phase"], body["weight"], body["step"]) == ("Progressing", 30, "2/3")
    assert (body["canaryRevision"], body["stableRevision"], body["observedGeneration"]) == (REV2, REV1, 4)
    assert body["targetGeneration"] == 7
    assert body["lastDecision"] == {
        "action": "advance",
        "reason": "CanaryAdvanced",
        "message": "Step 2 passed",
        "at": "2026-12-01T12:00:00Z",
    }
    assert conditions(status) == {
        "Ready": ("False", "Progressing"),
        "Reconciling": ("True", "Progressing"),
        "Stalled": ("False", "NotStalled"),
        "Promoted": ("False", "Progressing"),
        "RolledBack": ("False", "NotRolledBack"),
        "PolicyValid": ("True", "Valid"),
        "Conflict": ("False", "NoConflict"),
    }
    assert all(REV2 in c.message for c in status.conditions), "every message names the revision"
    assert all(c.observed_generation == 4 for c in status.conditions)


def test_the_same_state_projects_the_same_status_later_so_nothing_is_written() -> None:
    first = project_status(view(progressing()), None, T0)
    again = project_status(view(progressing()), first, T0 + timedelta(minutes=5))
    assert status_unchanged(again, first.to_api())
    # Round trip through the API's JSON (what the cache holds): still unchanged.
    read = previous_status({"status": first.to_api()})
    assert read is not None
    assert status_unchanged(
        project_status(view(progressing()), read, T0 + timedelta(hours=1)), first.to_api()
    )


def test_a_new_revision_turns_promoted_false_at_once() -> None:
    done = RolloutState(phase=Phase.SUCCEEDED, revision=REV1, stable_revision=REV1)
    succeeded = project_status(view(done), None, T0)
    assert conditions(succeeded)["Promoted"] == ("True", "Succeeded")
    assert conditions(succeeded)["Ready"] == ("True", "Succeeded")
    assert succeeded.to_api()["weight"] == 100
    later = T0 + timedelta(hours=2)
    pending = RolloutState(phase=Phase.PENDING, revision=REV2, stable_revision=REV1)
    started = project_status(view(pending, inference_service_generation=9), succeeded, later)
    promoted = started.condition(ConditionType.PROMOTED)
    assert promoted is not None
    assert (promoted.status.value, promoted.reason) == ("False", "Progressing")
    assert promoted.last_transition_time == later
    assert REV2 in promoted.message and REV1 not in promoted.message
    assert started.to_api()["targetGeneration"] == 9
    # PolicyValid did not change status: its transition time stays.
    valid = started.condition(ConditionType.POLICY_VALID)
    assert valid is not None and valid.last_transition_time == T0


def test_an_invalid_spec_is_stalled_with_the_field_message() -> None:
    errors = (
        PolicyError("promotionpolicy/ml/llama", None, "spec.checks[0].max", "not a duration: 'soon'"),
        PolicyError("promotionpolicy/ml/llama", None, "spec.maxIncrase", "unknown field 'maxIncrase'"),
    )
    status = project_status(view(None, policy=None, errors=errors), None, T0)
    assert status.to_api()["phase"] == "Invalid"
    valid = status.condition(ConditionType.POLICY_VALID)
    assert valid is not None and (valid.status.value, valid.reason) == ("False", "InvalidSpec")
    assert "spec.checks[0].max: not a duration: 'soon'" in valid.message
    assert "spec.maxIncrase: unknown field 'maxIncrase'" in valid.message
    assert conditions(status)["Stalled"] == ("True", "InvalidSpec")
    assert conditions(status)["Ready"] == ("False", "InvalidSpec")
    assert conditions(status)["Reconciling"][0] == "False"


def test_a_broken_generation_while_the_previous_one_runs() -> None:
    errors = (PolicyError("promotionpolicy/ml/llama", None, "spec.window", "must be at least interval"),)
    status = project_status(view(progressing(), errors=errors), None, T0)
    assert status.to_api()["phase"] == "Progressing", "the previous valid version still runs"
    assert conditions(status)["Stalled"] == ("True", "InvalidSpec")
    assert conditions(status)["PolicyValid"] == ("False", "InvalidSpec")


def test_a_conflict_holds_the_rollout() -> None:
    claimed = "InferenceService ml/llama is also claimed by promotionpolicy/ml/other"
    status = project_status(view(progressing(), conflict=claimed), None, T0)
    body = status.to_api()
    assert body["phase"] == "Invalid" and "weight" not in body
    assert conditions(status)["Conflict"] == ("True", "TargetClaimed")
    assert conditions(status)["Stalled"] == ("True", "TargetClaimed")
    conflict = status.condition(ConditionType.CONFLICT)
    assert conflict is not None and "promotionpolicy/ml/other" in conflict.message


def test_an_approval_pause_is_reconciling_and_an_external_change_stalls() -> None:
    state = progressing()
    approval = replace(
        state,
        phase=Phase.PAUSED,
        pause=Pause(PauseKind.APPROVAL, "step 2 needs approval", T0, Phase.PROGRESSING),
    )
    assert conditions(project_status(view(approval), None, T0))["Reconciling"] == ("True", "AwaitingApproval")
    assert conditions(project_status(view(approval), None, T0))["Promoted"] == ("False", "AwaitingApproval")
    external = replace(
        state,
        phase=Phase.PAUSED,
        pause=Pause(PauseKind.EXTERNAL_CHANGE, "someone set 70%", T0, Phase.PROGRESSING, 70),
    )
    assert conditions(project_status(view(external), None, T0))["Stalled"] == (
        "True",
        "ExternalTrafficChange",
    )


def test_a_rollback_stalls_and_says_why() -> None:
    state = replace(
        progressing(),
        phase=Phase.ROLLED_BACK,
        history=(
            HistoryEntry(
                at=T0,
                action="rollback",
                weight=0,
                phase=Phase.ROLLED_BACK,
                event="CanaryRolledBack",
                reason="p99 812ms > 800ms",
                id="d2",
            ),
        ),
    )
    status = project_status(view(state), None, T0)
    assert conditions(status)["RolledBack"] == ("True", "CanaryRolledBack")
    assert conditions(status)["Stalled"] == ("True", "RolledBack")
    rolled = status.condition(ConditionType.ROLLED_BACK)
    assert rolled is not None and "p99 812ms > 800ms" in rolled.message
    assert status.to_api()["weight"] == 0


def test_checks_come_from_the_latest_evaluation_of_this_revision() -> None:
    explain = ExplainDocument(
        at=T0,
        decision_id="d1",
        revision=REV2,
        checks=(
            ExplainCheck(
                name="p99", verdict="pass", value=0.412, unit=Unit.SECONDS, limit="<= 800ms", detail="met"
            ),
            ExplainCheck(name="errors", verdict="no-data", value=None, unit=Unit.RATIO, limit="<= 1%"),
        ),
    )
    body = project_status(view(progressing(), explain=explain), None, T0).to_api()
    assert body["checks"] == [
        {"name": "p99", "verdict": "pass", "value": "412ms", "limit": "<= 800ms", "statement": "met"},
        {"name": "errors", "verdict": "no-data", "limit": "<= 1%"},
    ]
    older = replace(explain, revision=REV1)
    assert (
        "checks" not in project_status(view(progressing(), explain=older), None, T0).to_api()
        or not (project_status(view(progressing(), explain=older), None, T0).to_api()["checks"])
    )


def test_the_target_generation_is_the_one_the_rollout_started_at_not_the_current_one() -> None:
    # The InferenceService is at generation 9 after the controller's own writes; the rollout began
    # at 7, the generation the author's apply produced: that is what `kubectl wait` is told to expect.
    state = replace(progressing(), started_generation=7)
    status = project_status(view(state, inference_service_generation=9), None, T0)
    assert status.to_api()["targetGeneration"] == 7


def test_the_last_decision_carries_the_latest_evaluation_of_this_rollout_for_the_verdict_column() -> None:
    from canary.rollout.state import EvaluationRecord, EvaluationVerdict

    evaluated = replace(
        progressing(),
        started_at=T0 - timedelta(minutes=5),
        evaluation=EvaluationRecord(at=T0 + timedelta(seconds=30), verdict=EvaluationVerdict.INCONCLUSIVE),
    )
    assert project_status(view(evaluated), None, T0).to_api()["lastDecision"]["verdict"] == "inconclusive"
    # An evaluation from before this rollout began is the previous rollout's: no verdict.
    stale = replace(evaluated, started_at=T0 + timedelta(minutes=1))
    assert "verdict" not in project_status(view(stale), None, T0).to_api()["lastDecision"]


def test_the_status_names_what_the_canary_and_the_stable_revision_serve() -> None:
    state = replace(
        progressing(),
        artefact=Artefact("s3://models/llama/v2", runtime="kserve-vllm", model_format="huggingface"),
        stable_artefact=Artefact(image="ghcr.io/acme/llama:1"),
    )
    body = project_status(view(state), None, T0).to_api()
    assert body["canaryArtefact"] == {
        "storageUri": "s3://models/llama/v2",
        "runtime": "kserve-vllm",
        "modelFormat": "huggingface",
    }
    assert body["stableArtefact"] == {"image": "ghcr.io/acme/llama:1"}
    # A state that recorded none (written before artefacts were): nothing said, read as unknown.
    assert "canaryArtefact" not in project_status(view(progressing()), None, T0).to_api()
