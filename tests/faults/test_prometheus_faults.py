"""Prometheus misbehaving, through a fault proxy between the controller and the real Prometheus.

Per-model value faults (the canary's series rewritten to NaN, +Inf, -Inf, or removed) and
whole-answer faults (``status: error``, malformed JSON, HTML, a hang, a reset, a slow answer) for one
model's queries, then Prometheus down for everyone. Every fault holds: nothing advances, nothing
rolls back, a Warning or an inconclusive Event says why; a slow (but in-time) Prometheus is no fault.
When the faults go, every rollout finishes, and the invariants hold for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from canary_sandbox.faultproxy import FaultProxy, ProxyFault
from canary_sandbox.stack import ControllerProcess, wait_until

from canary.metrics.catalog import REVISION_LABEL
from tests.faults.support import (
    TERMINAL,
    V2,
    World,
    assert_signal,
    check_all,
    check_told,
    phase,
    revision,
    step_shown,
    wait_for_phase,
    written,
)

NAMESPACE = "prom"
VALUE_FAULTS = {"nan": "NaN", "pinf": "+Inf", "ninf": "-Inf", "empty": "empty"}
WHOLE_ANSWER_FAULTS = {
    "status-error": ProxyFault.status_error(),
    "malformed-json": ProxyFault.malformed_json(),
    "html": ProxyFault.html(),
    "hang": ProxyFault.hang(4.0),
    "reset": ProxyFault.reset(),
}
MODELS = [*VALUE_FAULTS, "outage", "slow"]
QUERY = r"/api/v1/query"
FAULT_SECONDS = 3.5  # each fault lasts longer than the 2 s window plus an interval


@pytest.fixture(scope="module")
def proxy(world: World) -> Iterator[FaultProxy]:
    assert world.stack.prometheus is not None
    with FaultProxy(world.stack.prometheus.url) as started:
        yield started


@pytest.fixture(scope="module")
def controller(world: World, proxy: FaultProxy) -> ControllerProcess:
    stack = world.stack
    for name, value in VALUE_FAULTS.items():
        # Only the canary's series, in every query: the stable revision keeps its honest numbers.
        proxy.add(
            ProxyFault.rewrite(value, f'"{REVISION_LABEL}": "{revision(name, 2)}"'),
            path=QUERY,
            body=revision(name, 2),
        )
    proxy.add(ProxyFault.delay(0.6), path=QUERY, body=revision("slow", 2))
    started = stack.start_controller(
        "prom", prometheus_url=proxy.url, extra_args=["--prometheus-timeout", "1.5"]
    )
    time.sleep(2)  # Prometheus sees the stable revisions first
    for name in MODELS:
        if name != "outage":  # its rollout starts with its own test
            stack.set_storage_uri(NAMESPACE, name, V2)
    return started


def test_nan_inf_and_empty_answers_for_the_canary_hold_its_first_step(
    world: World, controller: ControllerProcess
) -> None:
    stack = world.stack
    for name in VALUE_FAULTS:
        assert wait_until(lambda n=name: step_shown(stack, NAMESPACE, n, 10), 30), n_state(world, name)
    time.sleep(3 * 2.0)  # three windows: with a real answer every step would have passed by now
    for name in VALUE_FAULTS:
        assert written(stack, NAMESPACE, name) == [10], name
        assert phase(stack, NAMESPACE, name) == "Progressing"
        # NaN and ±Inf are no value anyone can judge (a query error); no series is no data. Either
        # is said in an Event, the log and the state.
        if name == "empty":
            signal = ("CanaryInconclusive", "no data for the canary", '"verdict": "inconclusive"')
        else:
            signal = ("PrometheusUnavailable", "invalid value for the canary", '"queryError": true')
        reason, log_text, state_text = signal
        assert_signal(stack, world.case(name), reason=reason, log_text=log_text, state_text=state_text)


def test_a_slow_but_timely_prometheus_is_no_fault(world: World, controller: ControllerProcess) -> None:
    stack = world.stack
    assert wait_for_phase(stack, NAMESPACE, "slow", TERMINAL, 60) == "Succeeded"
    assert written(stack, NAMESPACE, "slow") == [10, 30, 50, None]
    check_all(stack, world.recorder, world.case("slow"))
    check_told(stack, world.case("slow"))


def test_every_whole_answer_fault_and_an_outage_hold_and_the_rollouts_finish_after(
    world: World, controller: ControllerProcess, proxy: FaultProxy
) -> None:
    stack = world.stack
    stack.set_storage_uri(NAMESPACE, "outage", V2)
    assert wait_until(lambda: step_shown(stack, NAMESPACE, "outage", 10), 30), n_state(world, "outage")
    outage = world.case("outage")
    for kind, fault in WHOLE_ANSWER_FAULTS.items():
        start = time.time()
        # Ahead of the slow model's delay: the grouped query that carries the outage model's
        # revision carries the others' too, and fails for all of them (they hold as well).
        rule = proxy.add(fault, path=QUERY, body=revision("outage", 2), first=True)
        time.sleep(FAULT_SECONDS)
        proxy.remove(rule)
        outage.evidence_failing.append((start, time.time()))
        assert rule.hits > 0, f"{kind}: the controller never met it"
    assert written(stack, NAMESPACE, "outage") == [10], "no step passes while its evidence is failing"
    assert_signal(
        stack,
        outage,
        reason="PrometheusUnavailable",
        log_text="PrometheusUnavailable",
        state_text='"queryError": true',
    )

    # Prometheus down for everyone (connections reset, label APIs included).
    cases = {name: world.case(name) for name in MODELS}
    before = {name: written(stack, NAMESPACE, name) for name in MODELS}
    start = time.time()
    rule = proxy.add(ProxyFault.reset(), first=True)
    time.sleep(FAULT_SECONDS)
    proxy.remove(rule)
    for case in cases.values():
        case.evidence_failing.append((start, time.time()))
    for name in MODELS:
        if phase(stack, NAMESPACE, name) not in TERMINAL:
            assert written(stack, NAMESPACE, name) == before[name], f"{name} moved while Prometheus was down"

    proxy.clear()  # the value faults go too: every rollout finishes, on real evidence
    for name in MODELS:
        assert wait_for_phase(stack, NAMESPACE, name, TERMINAL, 60) == "Succeeded", name
        check_all(stack, world.recorder, cases[name])
        check_told(stack, cases[name])
    assert controller.alive


def n_state(world: World, name: str) -> str:
    return str(world.stack.state(NAMESPACE, name))
