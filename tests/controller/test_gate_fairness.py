"""One namespace's gates cannot keep another namespace's gate uncalled (docs/security.md, "Fairness
between namespaces"): the real gate runner over HTTP to loopback receivers.

Team A has eight rollouts whose gates hang for their whole timeout (10 s). Team B's gate must be
called within a second all the same: the workers take the namespaces in turn, and one namespace
runs at most ``max_per_namespace`` attempts at once."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from canary.controller.gates import GateRunner
from canary.notify.secrets import Redactor, SecretResolver
from canary.policy import PromotionPolicy
from canary.policy.model import GateStage
from canary.rollout.gates import GateCall
from tests.notify.support import Receiver, Reply
from tests.rollout.helpers import SIX_CHECKS

CALLED_WITHIN = 2.0


def gated_policy(namespace: str, model: str) -> PromotionPolicy:
    gate: dict[str, Any] = {
        "at": "pre-rollout",
        "name": "smoke",
        "webhook": {"urlFrom": {"env": "GATE_URL"}, "timeout": "10s"},
    }
    return PromotionPolicy.model_validate(
        {
            "apiVersion": "kserve-canary.dev/v1alpha1",
            "kind": "PromotionPolicy",
            "metadata": {"name": model, "namespace": namespace},
            "spec": {"target": {"inferenceService": model}, "checks": SIX_CHECKS, "gates": [gate]},
        }
    )


def call_of(policy: PromotionPolicy) -> GateCall:
    return GateCall(
        policy_key=policy.key,
        revision=f"{policy.spec.target.inference_service}-predictor-00002",
        key="pre-rollout/smoke",
        index=0,
        name="smoke",
        stage=GateStage.PRE_ROLLOUT,
        timeout=10.0,
        since=datetime.now(UTC),
        deadline=timedelta(minutes=15),
        body='{"kind": "GateRequest"}',
    )


def test_one_namespaces_hanging_gates_do_not_keep_another_namespaces_gate_uncalled() -> None:
    team_a, team_b = Receiver(), Receiver()
    team_a.reply(*[Reply(hang=True) for _ in range(16)])
    resolvers = {
        "team-a": SecretResolver(Redactor(), {"GATE_URL": team_a.url + "/gate"}),
        "team-b": SecretResolver(Redactor(), {"GATE_URL": team_b.url + "/gate"}),
    }
    runner = GateRunner(resolver_for=lambda policy: resolvers[policy.metadata.namespace])
    try:
        for index in range(8):
            hostile = gated_policy("team-a", f"slow-{index}")
            assert runner.submit(hostile, [call_of(hostile)]) == 1
        team_a.entered_hang.wait(5)
        started = time.monotonic()
        honest = gated_policy("team-b", "fraud")
        assert runner.submit(honest, [call_of(honest)]) == 1
        team_b.wait_for(1, timeout=CALLED_WITHIN + 3)
        took = time.monotonic() - started
        assert took < CALLED_WITHIN, f"team B's gate was called after {took:.1f}s"
        deadline = time.monotonic() + 5
        while not runner.results("team-b/fraud") and time.monotonic() < deadline:
            time.sleep(0.05)
        (result,) = runner.results("team-b/fraud")
        assert result.passed, result
        assert team_a.in_flight <= 2  # team A holds its share of the workers, no more
    finally:
        team_a.release.set()
        runner.close()
        team_a.stop()
        team_b.stop()
