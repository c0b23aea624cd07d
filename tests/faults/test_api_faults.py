"""The Kubernetes API misbehaving: 500, 429 and 409 answers (the emulator's faults), responses lost
after the write was applied, watches answered 410 Gone or cut (a fault proxy between the controller
and the emulator). Writes are retried or decided again; a write that landed although its answer was
lost is recognised as the controller's own (no pause, no step written twice with a new decision);
a broken watch costs at most the interval, never a hot loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from canary_sandbox.faultproxy import FaultProxy, ProxyFault
from canary_sandbox.stack import ControllerProcess

from tests.faults.support import (
    TERMINAL,
    V2,
    World,
    check_all,
    check_told,
    controller_agent,
    events,
    wait_for_phase,
    written,
)

NAMESPACE = "api"
MODELS = ["err500", "err429", "conflict", "lost", "loststate", "watched"]
ISVC = rf"/namespaces/{NAMESPACE}/inferenceservices"


@pytest.fixture(scope="module")
def proxy(world: World) -> Iterator[FaultProxy]:
    with FaultProxy(world.stack.server.url) as started:
        yield started


def proxied_kubeconfig(world: World, proxy: FaultProxy) -> Path:
    document = world.stack.server.kubeconfig()
    document["clusters"][0]["cluster"]["server"] = proxy.url
    assert world.stack.workdir is not None
    path = world.stack.workdir / "kubeconfig-proxied.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="module")
def controller(world: World, proxy: FaultProxy) -> ControllerProcess:
    stack = world.stack
    started = stack.start_controller(
        "api", kubeconfig=proxied_kubeconfig(world, proxy), extra_args=["-n", NAMESPACE]
    )
    time.sleep(2)
    for name in MODELS:
        if name != "watched":
            stack.set_storage_uri(NAMESPACE, name, V2)
    # After our own spec changes (KServe needs reconcile_delay to create the revisions): the
    # controller's first writes meet the faults.
    faults = stack.emulator.faults
    faults.add(rf"{ISVC}/err500$", method="PATCH", status=500, count=3)
    faults.add(r"/configmaps/kserve-canary-err429$", method="PUT", status=429, count=3)
    faults.add(rf"{ISVC}/conflict$", method="PATCH", status=409, count=2)
    proxy.add(ProxyFault.drop_response(), path=rf"{ISVC}/lost$", method="PATCH", count=1)
    proxy.add(ProxyFault.drop_response(), path=r"/configmaps/kserve-canary-loststate$", method="PUT", count=2)
    return started


@pytest.mark.parametrize("name", ["err500", "err429", "conflict"])
def test_error_answers_are_retried_and_the_rollout_finishes(
    world: World, controller: ControllerProcess, name: str
) -> None:
    stack = world.stack
    assert wait_for_phase(stack, NAMESPACE, name, TERMINAL, 60) == "Succeeded"
    answered = [e.status for e in stack.emulator.requests.entries() if e.fault is not None and name in e.path]
    assert answered, f"{name}: the controller never met the fault"
    assert [w for w in written(stack, NAMESPACE, name)][-3:] == [30, 50, None]
    case = world.case(name)
    check_all(stack, world.recorder, case)
    check_told(stack, case)


@pytest.mark.parametrize("name", ["lost", "loststate"])
def test_a_response_lost_after_the_write_was_applied_is_recognised_as_our_own(
    world: World, controller: ControllerProcess, proxy: FaultProxy, name: str
) -> None:
    stack = world.stack
    assert wait_for_phase(stack, NAMESPACE, name, TERMINAL, 60) == "Succeeded"
    dropped = [e for e in proxy.log if e.fault == "drop-response" and e.path.endswith(name)]
    assert dropped, f"{name}: no response was dropped"
    reasons = [event.reason for event in events(stack, NAMESPACE, name)]
    assert "ExternalTrafficChange" not in reasons, "our own landed write was taken for someone else's"
    assert written(stack, NAMESPACE, name)[-3:] == [30, 50, None]
    case = world.case(name)
    check_all(stack, world.recorder, case)
    check_told(stack, case)


def test_watches_answered_410_gone_or_cut_cost_no_hot_loop_and_the_rollout_starts(
    world: World, controller: ControllerProcess, proxy: FaultProxy
) -> None:
    stack = world.stack
    gone = proxy.add(ProxyFault.watch_gone(), path=ISVC, count=3)
    cut = proxy.add(ProxyFault.watch_drop(0.2), path=ISVC)
    assert proxy.cut_watches() >= 1, "the controller watches its InferenceServices"
    mark = len(stack.emulator.requests.entries())
    started = time.monotonic()
    stack.set_storage_uri(NAMESPACE, "watched", V2)
    assert wait_for_phase(stack, NAMESPACE, "watched", TERMINAL, 60) == "Succeeded"
    elapsed = time.monotonic() - started
    proxy.remove(cut)
    assert gone.hits == 3
    assert cut.hits > 0
    lists = [
        entry
        for entry in stack.emulator.requests.entries(since=mark)
        if entry.method == "GET"
        and entry.path.endswith(f"/namespaces/{NAMESPACE}/inferenceservices")
        and controller_agent(entry) is not None
    ]
    # list + watch again after each broken watch, with a backoff: not a loop as fast as the API answers
    assert len(lists) <= 2 * elapsed + 5, f"{len(lists)} lists in {elapsed:.0f}s"
    case = world.case("watched")
    check_all(stack, world.recorder, case)
    check_told(stack, case)
    assert controller.alive
