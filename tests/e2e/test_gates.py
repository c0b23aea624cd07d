"""End to end, gates (issue 16 item 4): the controller as a process, the API emulator, a real
Prometheus, and real HTTP gate receivers on loopback — one that passes, one that fails, one that is
slow, one that is down — all in one controller at the same time, beside a model without gates whose
rollout must not wait for any of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from canary_sandbox.stack import ControllerProcess, Stack, wait_until
from typer.testing import CliRunner

from canary.cli import app
from canary.controller.gates import GATE_HEADER
from canary.notify.webhook import IDEMPOTENCY_HEADER, SIGNATURE_HEADER, TIMESTAMP_HEADER, verify_signature
from tests.e2e.support import HEALTHY, finished, notifications, phase, roll_out, serving, written_percentages
from tests.e2e.support import policy as e2e_policy
from tests.notify.outage import OutageReceiver, Received

NS = "e2e"
GATE_KEY = "gate-signing-key-0123456789"
CHECKS = (
    "{name: p90, metric: latency, quantile: 0.9, max: 2s, maxIncrease: 50%}",
    "{name: errors, metric: error-rate, max: 5%}",
)
RECEIVERS = ("pass", "fail", "slow", "down")


def policy(name: str, gates: str) -> str:
    return e2e_policy(NS, name, CHECKS, window="3s", tail=gates)


def hook(receiver: str, timeout: str = "2s") -> str:
    env = f"GATE_{receiver.upper()}_URL"
    return f"{{urlFrom: {{env: {env}}}, secretFrom: {{env: GATE_KEY}}, timeout: {timeout}}}"


POLICIES = {
    # Both kinds that hold traffic: before the first step, and at every step.
    "gate-pass": policy(
        "gate-pass",
        f"""  gates:
    - {{name: smoke, at: pre-rollout, webhook: {hook("pass")}, deadline: 1m}}
    - {{name: acceptance, at: step, webhook: {hook("pass")}, deadline: 1m}}
""",
    ),
    "gate-fail": policy(
        "gate-fail",
        f"""  gates:
    - {{name: smoke, at: pre-rollout, webhook: {hook("fail")}, deadline: 6s, failurePolicy: rollback}}
""",
    ),
    "gate-slow": policy(
        "gate-slow",
        f"""  gates:
    - {{name: smoke, at: pre-rollout, webhook: {hook("slow", timeout="1s")}, deadline: 2m}}
""",
    ),
    "gate-down": policy(
        "gate-down",
        f"""  gates:
    - {{name: load-test, at: pre-promotion, webhook: {hook("down")}, deadline: 4s, failurePolicy: hold}}
""",
    ),
    "plain": policy("plain", ""),
}


@pytest.fixture(scope="module")
def receivers() -> Iterator[dict[str, OutageReceiver]]:
    made = {name: OutageReceiver() for name in RECEIVERS}
    made["fail"].status = 503
    made["slow"].delay = 3.0  # beyond the gate's 1s timeout
    made["down"].go_down()
    yield made
    for receiver in made.values():
        receiver.stop()


@pytest.fixture(scope="module")
def stack(receivers: dict[str, OutageReceiver]) -> Iterator[Stack]:
    env = {
        "GATE_KEY": GATE_KEY,
        **{f"GATE_{name.upper()}_URL": f"{receiver.url}/gate" for name, receiver in receivers.items()},
    }
    policies = {f"{name}.yaml": text for name, text in POLICIES.items()}
    with serving(NS, dict.fromkeys(POLICIES, HEALTHY), policies, env=env) as started:
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    return roll_out(stack, "gates", NS, POLICIES, settle=2)  # a new version without a percentage


def gate_requests(receiver: OutageReceiver, model: str) -> list[Received]:
    return [r for r in receiver.requests if json.loads(r.body)["inferenceService"]["name"] == model]


def state_gates(stack: Stack, name: str) -> list[dict[str, Any]]:
    state = stack.state(NS, name) or {}
    return list(state.get("gates") or [])


def test_a_passing_gate_is_called_signed_before_each_step_and_the_rollout_promotes(
    stack: Stack, controller: ControllerProcess, receivers: dict[str, OutageReceiver]
) -> None:
    assert finished(stack, NS, "gate-pass", 50) == "Succeeded"
    written = written_percentages(stack, "gate-pass")
    assert written[:2] == [0, 10], "0 at once, the first step only after the pre-rollout gate"
    assert written[-1] is None
    calls = gate_requests(receivers["pass"], "gate-pass")
    bodies = [json.loads(call.body) for call in calls]
    assert [(b["gate"]["name"], b["step"] and b["step"]["weight"]) for b in bodies] == [
        ("smoke", None),
        ("acceptance", 10),
        ("acceptance", 50),
    ], "each call point called once: a passed gate is never repeated"
    for call in calls:
        assert verify_signature(
            call.body, call.headers[TIMESTAMP_HEADER], call.headers[SIGNATURE_HEADER], GATE_KEY
        )
        assert call.headers[IDEMPOTENCY_HEADER] == json.loads(call.body)["id"]
        assert GATE_KEY not in call.body.decode()
    assert calls[0].headers[GATE_HEADER] == "smoke; at=pre-rollout"
    assert bodies[0]["kind"] == "GateRequest" and bodies[0]["apiVersion"] == "kserve-canary.dev/v1alpha1"
    # A step below the highest passes on exposure: nothing failed, counted checks may be "not yet".
    evidence = bodies[1]["evidence"]
    assert evidence["verdict"] in {"pass", "inconclusive"} and evidence["failedChecks"] == []
    assert evidence["requests"] >= 10
    assert all(gate["passedAt"] for gate in state_gates(stack, "gate-pass"))
    log = controller.log()
    assert GATE_KEY not in log and receivers["pass"].url not in log


def test_a_failing_gate_holds_at_0_with_retries_then_rolls_back_at_its_deadline(
    stack: Stack, controller: ControllerProcess, receivers: dict[str, OutageReceiver]
) -> None:
    assert finished(stack, NS, "gate-fail", 40) == "RolledBack"
    assert set(written_percentages(stack, "gate-fail")) == {0}, "never any traffic"
    assert len(gate_requests(receivers["fail"], "gate-fail")) >= 2, "retried before the deadline"
    rolled_back = next(n for n in notifications(stack, "gate-fail") if n["action"] == "rolled-back")
    assert "gate smoke (pre-rollout) did not pass within its deadline 6s" in rolled_back["summary"]
    assert "latest answered 503" in rolled_back["summary"]
    waiting = [n for n in notifications(stack, "gate-fail") if n["action"] == "gate-waiting"]
    assert waiting, [n["action"] for n in notifications(stack, "gate-fail")]


def test_a_slow_gate_holds_only_its_own_rollout_and_passes_once_it_answers_in_time(
    stack: Stack, controller: ControllerProcess, receivers: dict[str, OutageReceiver]
) -> None:
    # The rollout without gates runs on while the slow gate times out, attempt after attempt.
    assert finished(stack, NS, "plain", 50) == "Succeeded"
    assert set(written_percentages(stack, "gate-slow")) == {0}
    assert phase(stack, NS, "gate-slow") == "Pending"
    gates = state_gates(stack, "gate-slow")
    assert gates and gates[0]["attempts"] >= 2 and gates[0]["lastStatus"] is None
    assert "timed out" in gates[0]["lastDetail"]
    explained = CliRunner().invoke(app, ["explain", f"{NS}/gate-slow", "--kubeconfig", str(stack.kubeconfig)])
    assert explained.exit_code == 0, explained.output
    assert "GATE    AT            STEP     RESULT" in explained.output
    row = next(line for line in explained.output.splitlines() if line.startswith("smoke "))
    assert "pre-rollout" in row and "waiting" in row and "no answer at" in row and "timed out" in row
    assert receivers["slow"].url not in explained.output, "the URL is a secret"
    receivers["slow"].delay = 0.0
    assert wait_until(lambda: stack.canary_percent(NS, "gate-slow") == 10, 40), state_gates(
        stack, "gate-slow"
    )
    assert written_percentages(stack, "gate-slow")[:2] == [0, 10]


def test_a_gate_that_is_down_holds_the_promotion_past_its_deadline_until_it_is_back(
    stack: Stack, controller: ControllerProcess, receivers: dict[str, OutageReceiver]
) -> None:
    assert wait_until(lambda: any(g.get("deadlinePassedAt") for g in state_gates(stack, "gate-down")), 50), (
        stack.state(NS, "gate-down")
    )
    assert written_percentages(stack, "gate-down") == [10, 50], "the steps ran; the promotion waits"
    assert phase(stack, NS, "gate-down") == "Progressing"
    assert "connection failed" in state_gates(stack, "gate-down")[0]["lastDetail"]
    assert wait_until(
        lambda: any(n["action"] == "gate-failed" for n in notifications(stack, "gate-down")), 20
    )
    receivers["down"].come_up(status=200)
    assert finished(stack, NS, "gate-down", 50) == "Succeeded"
    assert written_percentages(stack, "gate-down") == [10, 50, None]
