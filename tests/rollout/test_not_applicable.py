"""What the controller does not manage, each with a clear reason and no action."""

from __future__ import annotations

from canary.kserve.status_model import KServeSim
from canary.rollout import Action, EventReason, RolloutState, Severity, decide
from canary.rollout.observed import DeploymentMode, ObservedInferenceService

from .helpers import T0, Harness, make_policy


def test_a_first_deployment_needs_no_action() -> None:
    sim = KServeSim()
    sim.reconcile()  # the first revision exists, nothing is rolled out yet
    harness = Harness(make_policy(), sim)
    decision = harness.tick()
    assert decision.action is Action.WAIT
    assert decision.event_reason is EventReason.FIRST_DEPLOYMENT
    assert "first deployment" in decision.summary
    assert "no stable revision to compare with" in decision.summary
    assert decision.new_state == RolloutState()
    # A second spec before the first revision was ever rolled out is still a first deployment.
    sim.change_model("s3://m/v2")
    sim.reconcile()
    assert harness.tick(60).event_reason is EventReason.FIRST_DEPLOYMENT
    sim.make_ready()
    sim.reconcile()
    adopted = harness.tick(60)
    assert adopted.event_reason is EventReason.CANARY_IDLE
    assert adopted.new_state.revision == "llama-predictor-00002"


def test_an_inference_service_without_any_status_waits() -> None:
    harness = Harness(make_policy(), KServeSim())
    decision = harness.tick(reconcile=False)
    assert decision.action is Action.WAIT
    assert "has not reported" in decision.summary


def test_standard_and_raw_deployment_modes_are_refused_clearly() -> None:
    for mode in ("RawDeployment", "Standard"):
        sim = KServeSim.serving(mode=mode)
        sim.change_model("s3://m/v2")
        sim.reconcile()
        decision = Harness(make_policy(), sim).tick()
        assert decision.action is Action.WAIT
        assert decision.event_reason is EventReason.UNSUPPORTED_DEPLOYMENT_MODE
        assert decision.severity is Severity.WARNING
        assert f"runs in {mode} mode" in decision.summary
        assert "canaryTrafficPercent only works in Knative" in decision.summary


def test_a_policy_for_a_missing_inference_service_does_nothing() -> None:
    decision = decide(
        make_policy(), ObservedInferenceService.missing("ml", "llama"), RolloutState(), None, T0
    )
    assert decision.action is Action.WAIT
    assert decision.event_reason is EventReason.INFERENCE_SERVICE_NOT_FOUND
    assert decision.severity is Severity.WARNING
    assert decision.summary == (
        "InferenceService ml/llama does not exist; policy llama-chat governs nothing until it is created."
    )
    assert decision.new_state == RolloutState()


def test_an_unreported_deployment_mode_waits() -> None:
    observed = ObservedInferenceService("ml", "llama", deployment_mode=DeploymentMode.UNKNOWN)
    decision = decide(make_policy(), observed, RolloutState(), None, T0)
    assert decision.action is Action.WAIT
    assert decision.summary == "KServe has not reported the deployment mode of ml/llama yet."


def test_naive_times_are_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="timezone-aware"):
        decide(
            make_policy(),
            ObservedInferenceService.missing("ml", "x"),
            RolloutState(),
            None,
            T0.replace(tzinfo=None),
        )
