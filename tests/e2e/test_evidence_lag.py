"""End to end behind a 30 s ingestion lag (issue 33, item 7): a window counts evidence, not the clock.

The fleet's samples reach Prometheus 30 s late, with their own timestamps (remote write, a Thanos
sidecar's upload, Mimir's ingesters: ``canary_sandbox.exporter.IngestionLag``), scraped every second,
and the policies hold each step for 9 s. A canary that serves 8 % errors from the 50 % step on must
be rolled back, never promoted on the few seconds of the step that are visible; a healthy one is
still promoted; and the controller says how old its evidence is.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.stack import ControllerProcess, Stack
from kubernetes import client

from tests.e2e.support import HEALTHY, finished, history, policy, roll_out, serving

NS = "lag"
RPS = 400.0  # enough that a pass test on the visible evidence can promote within seconds
LAG = 30.0
FAILS_AT_HALF = RevisionBehaviour(
    median_ms=80, ready_after_s=1.0, loaded_error_rate=0.08, loaded_from_share=0.5
)
MODELS = {"lagbad": FAILS_AT_HALF, "laggood": HEALTHY}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    policies = {
        f"{name}.yaml": policy(
            NS,
            name,
            ["{name: errors, metric: error-rate, max: 2%}"],
            window="9s",
            deadline="60s",
            notify=False,
        )
        for name in MODELS
    }
    with serving(NS, MODELS, policies, rps=RPS, stable=HEALTHY, ingestion_lag=LAG) as started:
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    # The stable revisions' first samples reach Prometheus only after the lag.
    return roll_out(stack, "lag", NS, MODELS, settle=LAG + 3)


def test_a_canary_failing_from_the_50_percent_step_behind_a_30s_lag_is_rolled_back(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert finished(stack, NS, "lagbad", 240) == "RolledBack", history(stack, NS, "lagbad")
    assert stack.canary_percent(NS, "lagbad") == 0
    told = history(stack, NS, "lagbad")
    assert "promote" not in [entry["action"] for entry in (stack.state(NS, "lagbad") or {})["history"]]
    assert "errors" in told.split("rollback:")[-1], told


def test_a_healthy_canary_behind_the_same_lag_is_promoted_and_the_lag_is_said(
    stack: Stack, controller: ControllerProcess
) -> None:
    assert finished(stack, NS, "laggood", 240) == "Succeeded", history(stack, NS, "laggood")
    # The promotion's evaluation (explain.json) says how far its evidence reached, and how old it was.
    stored = client.CoreV1Api(stack.api).read_namespaced_config_map("kserve-canary-laggood", NS)
    explain = json.loads((stored.data or {})["explain.json"])
    assert explain["evidenceUntil"] is not None, explain
    assert any("s behind" in reason for reason in explain["reasons"]), explain["reasons"]
