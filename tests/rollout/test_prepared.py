"""A decision prepared for its evidence request (``prepare``) and finished by ``decide(prepared=)``."""

from __future__ import annotations

from datetime import timedelta

import pytest

from canary.rollout import Action, Phase, decide, evidence_request, prepare
from canary.rollout import core as core_module

from .helpers import HEALTHY_EVIDENCE, in_sequence, progressing

SLOW = HEALTHY_EVIDENCE.failing(p99=0.95)


def test_a_prepared_decision_is_the_decision_at_every_tick_of_a_rollout() -> None:
    harness = progressing()
    answers = in_sequence(*([HEALTHY_EVIDENCE] * 12 + [SLOW] + [HEALTHY_EVIDENCE] * 40))
    actions: set[Action] = set()
    while harness.state.phase is not Phase.SUCCEEDED:
        harness.now += timedelta(seconds=45)
        observed = harness.sim.observe()
        prepared = prepare(harness.policy, observed, harness.state, harness.now)
        request = evidence_request(harness.policy, observed, harness.state, harness.now)
        assert prepared.request == request
        evidence = answers(request) if request else None
        decision = decide(harness.policy, observed, harness.state, evidence, harness.now, prepared=prepared)
        assert decision == decide(harness.policy, observed, harness.state, evidence, harness.now)
        actions.add(decision.action)
        harness.state = decision.new_state
        if decision.action.writes:
            harness.sim.set_percent(decision.weight)
        harness.sim.reconcile()
    assert {Action.WAIT, Action.ADVANCE, Action.PROMOTE} <= actions


def test_decide_with_a_preparation_skips_the_rules_before_the_evaluation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness = progressing()
    harness.now += timedelta(minutes=1)
    observed = harness.sim.observe()
    prepared = prepare(harness.policy, observed, harness.state, harness.now)
    assert prepared.request is not None
    evidence = HEALTHY_EVIDENCE(prepared.request)
    expected = decide(harness.policy, observed, harness.state, evidence, harness.now)

    def not_again(*_: object) -> None:
        raise AssertionError("the rules up to the evaluation ran again")

    monkeypatch.setattr(core_module, "_reach", not_again)
    again = decide(harness.policy, observed, harness.state, evidence, harness.now, prepared=prepared)
    assert again == expected
    assert again.verdict is not None


def test_a_preparation_of_other_inputs_is_not_used() -> None:
    harness = progressing()
    harness.now += timedelta(minutes=1)
    observed = harness.sim.observe()
    earlier = prepare(harness.policy, observed, harness.state, harness.now - timedelta(seconds=30))
    assert earlier.request is None  # nothing was due half a minute earlier
    request = evidence_request(harness.policy, observed, harness.state, harness.now)
    assert request is not None
    evidence = HEALTHY_EVIDENCE(request)
    expected = decide(harness.policy, observed, harness.state, evidence, harness.now)
    assert (
        decide(harness.policy, observed, harness.state, evidence, harness.now, prepared=earlier) == expected
    )
    alarmed = prepare(harness.policy, observed, harness.state, harness.now, alarm=True)
    assert (
        decide(harness.policy, observed, harness.state, evidence, harness.now, prepared=alarmed) == expected
    )
    assert expected.verdict is not None
