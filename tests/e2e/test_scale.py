"""The controller process with 30 governed models (issue #12): Prometheus requests per tick do not grow
from 5 rollouts to 30, and the state ConfigMaps are written only when something a restart needs changed.

Counted from outside the controller: Prometheus' own ``prometheus_http_requests_total`` and the API
emulator's request log. Every state write the controller made while the rollouts held their first
step is compared with the state it replaced: something besides the evaluation's own numbers (its
time, verdict, request count, failed checks, the onNoData clock) must differ — a phase, a step, a
streak, an intent, a command's answer — or the explain document's verdicts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until

from benchmarks.scale import NS, V1, V2, holding_first_step, metric_values, policy, prometheus_queries

TICK = 2.0
INTERVAL = 6.0
MODELS = [f"m{index:02d}" for index in range(30)]
FIRST = MODELS[:5]
# The evaluation's own numbers: refreshed by every evaluation, recomputable after a restart.
NUMBERS = {"at", "verdict", "requests", "failedChecks", "queryError", "lastConclusiveAt", "noDataClockFrom"}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    traffic = [
        ModelTraffic(NS, name, 4.0, {V1: RevisionBehaviour(), V2: RevisionBehaviour()}) for name in MODELS
    ]
    with Stack(
        traffic,
        {f"{name}.yaml": policy(name, INTERVAL) for name in MODELS},
        fleet_tick=1.0,
        scrape_interval=1.0,
        request_log_size=500_000,
        env={"TICK_SECONDS": f"{TICK:g}"},
    ) as stack:
        for name in MODELS:
            stack.apply(inference_service(NS, name, V1))
        assert wait_until(
            lambda: all(stack.predictor_status(NS, name).get("latestRolledoutRevision") for name in MODELS),
            60,
        )
        yield stack


@pytest.fixture(scope="module")
def controller(stack: Stack) -> ControllerProcess:
    return stack.start_controller("scale")


def _counters(controller: ControllerProcess) -> dict[str, float]:
    text = controller.metrics()
    return {
        "ticks": sum(metric_values(text, "kserve_canary_ticks_total").values()),
        "collects": sum(
            metric_values(text, "kserve_canary_prometheus_query_duration_seconds_count").values()
        ),
        "evaluations": metric_values(text, "kserve_canary_tick_rollouts_total").get(
            '{outcome="decided"}', 0.0
        ),
    }


def _per_tick(stack: Stack, controller: ControllerProcess, seconds: float) -> tuple[float, dict[str, float]]:
    """Prometheus query requests per timer tick over ``seconds``, and what the controller did."""
    assert stack.prometheus is not None
    before, counted = prometheus_queries(stack.prometheus.url), _counters(controller)
    time.sleep(seconds)
    after, now = prometheus_queries(stack.prometheus.url), _counters(controller)
    assert controller.alive, controller.log()[-3000:]
    return (after - before) / (seconds / TICK), {key: now[key] - counted[key] for key in now}


def _state_writes(stack: Stack, since: float) -> list[tuple[str, dict[str, str]]]:
    writes = []
    for entry in stack.emulator.requests.entries():
        if (
            entry.time >= since
            and entry.method in ("PUT", "POST")
            and "/configmaps" in entry.path
            and entry.user_agent.startswith("kserve-canary/")
            and entry.status in (200, 201)
            and isinstance(entry.body, dict)
        ):
            name = str((entry.body.get("metadata") or {}).get("name") or entry.path.rsplit("/", 1)[-1])
            data = entry.body.get("data") or {}
            if name.startswith("kserve-canary-") and "state.json" in data:
                writes.append((name, data))
    return writes


def _without_numbers(state: dict[str, Any]) -> dict[str, Any]:
    evaluation = {key: value for key, value in (state.get("evaluation") or {}).items() if key not in NUMBERS}
    return {**state, "evaluation": evaluation}


def _verdicts(data: dict[str, str]) -> object:
    explain = json.loads(data["explain.json"]) if "explain.json" in data else {}
    return (explain.get("verdict"), [(c.get("name"), c.get("verdict")) for c in explain.get("checks") or []])


def test_prometheus_requests_per_tick_do_not_grow_from_5_to_30_rollouts_and_writes_follow_decisions(
    stack: Stack, controller: ControllerProcess
) -> None:
    for name in FIRST:
        stack.set_storage_uri(NS, name, V2)
    assert wait_until(lambda: holding_first_step(stack, FIRST), 60, 1.0), controller.log()[-3000:]
    five, did5 = _per_tick(stack, controller, 4 * INTERVAL)

    for name in MODELS[len(FIRST) :]:
        stack.set_storage_uri(NS, name, V2)
        time.sleep(INTERVAL / len(MODELS))  # staggered starts
    assert wait_until(lambda: holding_first_step(stack, MODELS), 90, 1.0), controller.log()[-3000:]
    measured_from = time.time()
    thirty, did30 = _per_tick(stack, controller, 4 * INTERVAL)
    assert thirty <= 2 * five + 2, (
        f"{five:.1f} Prometheus requests per tick with 5 rollouts ({did5}), {thirty:.1f} with 30 ({did30})"
    )

    # Writes only on decisions: compare every state write with the state it replaced.
    previous: dict[str, dict[str, str]] = {}
    numbers_only = []
    for name, data in _state_writes(stack, 0.0):
        before = previous.get(name)
        previous[name] = data
        if before is None:
            continue
        old, new = json.loads(before["state.json"]), json.loads(data["state.json"])
        changed = _without_numbers(old) != _without_numbers(new)
        answered = before.get("command-result.json") != data.get("command-result.json")
        explained = _verdicts(before) != _verdicts(data)
        if not (changed or answered or explained):
            numbers_only.append((name, old.get("evaluation"), new.get("evaluation")))
    assert numbers_only == [], numbers_only[:3]
    # While every rollout holds its first step, an evaluation writes nothing; an explain document whose
    # verdicts changed is written at most once per five intervals per rollout.
    writes = len(_state_writes(stack, measured_from))
    evaluations = did30["evaluations"]
    assert writes <= len(MODELS), f"{writes} state writes for about {evaluations:.0f} evaluations"
