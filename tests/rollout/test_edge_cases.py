"""Less common situations, each a real one: adopted old states, hand-made changes, policy edits."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from canary.kserve.status_model import KServeSim
from canary.rollout import Action, EventReason, PauseKind, Phase, RolloutState, apply_command, decide
from canary.rollout import state as state_module
from canary.rollout.observed import ObservedInferenceService, TrafficTarget

from .helpers import HEALTHY_EVIDENCE, T0, Harness, make_policy, progressing

OLD, CANARY = "llama-predictor-00001", "llama-predictor-00002"


def test_git_set_first_step_with_a_canary_already_ready_starts_the_step_clock_at_once() -> None:
    harness = Harness(make_policy(), KServeSim.serving())
    harness.tick()
    harness.sim.change_model("s3://m/v2", percent=10)
    harness.sim.reconcile()
    harness.sim.make_ready()
    harness.sim.reconcile()
    decision = harness.tick(5)
    step = decision.new_state.step
    assert step is not None
    assert step.started_at == harness.now
    assert decision.new_state.phase is Phase.PROGRESSING


def test_a_state_from_an_older_controller_without_the_known_weight_adopts_the_spec() -> None:
    harness = progressing()
    document = json.loads(harness.state.to_json())
    del document["specWeight"]  # written before the field existed: it defaults
    harness.state = RolloutState.from_json(json.dumps(document))
    decision = harness.tick(60)
    assert decision.action is Action.WAIT
    assert decision.new_state.spec_weight is not None
    assert decision.new_state.spec_weight.weight == 10
    assert not decision.new_state.spec_weight.by_controller


def test_schema_migrations_run_in_order_from_an_older_version(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pretend this controller is at version 3 and version 1 called the phase "state".
    def one_to_two(document: dict[str, Any]) -> dict[str, Any]:
        document["phase"] = document.pop("state")
        return document

    def two_to_three(document: dict[str, Any]) -> dict[str, Any]:
        document["revision"] = document["revision"].lower()
        return document

    monkeypatch.setattr(state_module, "SCHEMA_VERSION", 3)
    monkeypatch.setattr(state_module, "_MIGRATIONS", {1: one_to_two, 2: two_to_three})
    old = json.dumps({"schemaVersion": 1, "state": "Succeeded", "revision": "LLAMA-00002"})
    migrated = RolloutState.from_json(old)
    assert (migrated.phase, migrated.revision) == (Phase.SUCCEEDED, "llama-00002")
    assert json.loads(migrated.to_json())["schemaVersion"] == 3


def test_resume_after_someone_changed_a_steady_inference_service_adopts_their_value() -> None:
    harness = Harness(make_policy(), KServeSim.serving())
    harness.tick()
    harness.sim.set_percent(0)  # a manual pin, no rollout of ours involved
    harness.sim.reconcile()
    paused = harness.tick(5)
    assert paused.action is Action.PAUSE
    assert paused.new_state.pause is not None
    assert paused.new_state.pause.resume_phase is Phase.IDLE
    assert not apply_command(paused.new_state, "abort", harness.now).accepted  # nothing to abort
    harness.state = apply_command(harness.state, "resume", harness.now).state
    resumed = harness.tick(5)
    assert resumed.action is Action.WAIT
    assert resumed.new_state.phase is Phase.IDLE
    assert resumed.new_state.spec_weight is not None
    assert resumed.new_state.spec_weight.weight == 0
    assert harness.writes() == []


def test_resume_after_an_external_change_back_to_the_controllers_value_writes_nothing() -> None:
    harness = progressing()
    harness.sim.set_percent(40)
    harness.tick(60)
    harness.sim.set_percent(10)  # the person put it back themselves
    harness.state = apply_command(harness.state, "resume", harness.now).state
    resumed = harness.tick(60)
    assert resumed.action is Action.WAIT
    assert resumed.new_state.intent is None
    assert harness.writes() == [10]


def test_promote_after_the_field_was_removed_by_hand_moves_on_at_once() -> None:
    harness = progressing(make_policy(bake="5m"))
    harness.sim.set_percent(None)
    harness.sim.reconcile()
    assert harness.tick(60).action is Action.PAUSE
    harness.state = apply_command(harness.state, "promote", harness.now).state
    promoted = harness.tick(5)
    assert promoted.action is Action.PROMOTE
    assert promoted.new_state.phase is Phase.BAKING
    assert promoted.new_state.bake_started_at == harness.now


def test_a_policy_edit_while_pending_that_drops_the_first_step_pauses() -> None:
    harness = Harness(make_policy(), KServeSim.serving())
    harness.start_rollout()
    harness.policy = make_policy(steps=[20, 50, 100])
    paused = harness.tick(60)
    assert paused.action is Action.PAUSE
    assert paused.new_state.pause is not None
    assert paused.new_state.pause.kind is PauseKind.POLICY_CHANGED
    assert paused.new_state.pause.resume_phase is Phase.PENDING
    harness.state = apply_command(harness.state, "resume", harness.now).state
    resumed = harness.tick(60)
    assert (resumed.action, resumed.weight) == (Action.START, 20)


def test_the_stable_revision_follows_where_kserve_routes_the_rest() -> None:
    harness = progressing()
    observed = harness.sim.observe()
    moved = replace(
        observed,
        traffic=(
            TrafficTarget(10, CANARY, latest_revision=True),
            TrafficTarget(90, "llama-predictor-00000", tag="prev"),
        ),
    )
    decision = decide(harness.policy, moved, harness.state, None, harness.now + _seconds(30))
    assert decision.new_state.stable_revision == "llama-predictor-00000"
    assert any(
        "KServe routes the rest of the traffic to llama-predictor-00000" in r for r in decision.reasons
    )


def test_a_canary_unready_before_its_step_started_holds_without_judging() -> None:
    harness = Harness(make_policy(), KServeSim.serving())
    harness.start_rollout()
    harness.sim.make_ready()
    harness.sim.reconcile()
    observed = harness.sim.observe()
    state = replace(harness.state, phase=Phase.PROGRESSING)
    crashed: ObservedInferenceService = replace(observed, predictor_ready=False, revision_failure="OOMKilled")
    decision = decide(harness.policy, crashed, state, None, harness.now + _seconds(60))
    assert decision.action is Action.WAIT
    assert decision.verdict is None
    assert "is not Ready" in decision.summary


def test_bake_without_absolute_limits_asks_for_nothing_and_ends_with_the_bake() -> None:
    relative_only = [{"name": "p99", "metric": "latency", "maxIncrease": "20%"}]
    harness = progressing(make_policy(checks=relative_only, bake="2m"))
    harness.run(lambda d: d.new_state.phase is Phase.BAKING)
    asked = len(harness.requests)
    phases = [harness.tick(60).new_state.phase for _ in range(2)]
    assert len(harness.requests) == asked  # the stable revision has no traffic: nothing to compare
    assert phases == [Phase.BAKING, Phase.SUCCEEDED]


def test_a_rollback_of_an_already_rolled_back_revision_is_recorded_once() -> None:
    harness = progressing()
    harness.tick(60, evidence=HEALTHY_EVIDENCE.failing(oom=1))
    state = replace(harness.state, phase=Phase.PROGRESSING, intent=None)
    state = apply_command(state, "abort", harness.now).state
    decision = decide(harness.policy, harness.sim.observe(), state, None, harness.now + _seconds(5))
    assert decision.action is Action.ROLLBACK
    assert [entry.revision for entry in decision.new_state.rolled_back] == [CANARY]
    assert decision.phase is Phase.ROLLED_BACK


def test_a_new_revision_without_a_rolled_out_one_is_still_a_first_deployment() -> None:
    sim = KServeSim()
    sim.reconcile()
    state = RolloutState(phase=Phase.IDLE, revision="llama-predictor-00000", fingerprint="x")
    decision = decide(make_policy(), sim.observe(), state, None, T0)
    assert decision.event_reason is EventReason.FIRST_DEPLOYMENT


def _seconds(count: float) -> timedelta:
    return timedelta(seconds=count)
