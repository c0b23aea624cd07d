"""The controller's ground pulled away: its state ConfigMap corrupted, emptied or deleted (mid-step,
after a rollback, after a promotion), the InferenceService deleted, deleted and re-created at once
(its predecessor's state still there) or after garbage collection, the policy edited, broken or
deleted mid-step. Nothing is promoted blindly, no rollback is undone, no write reaches an object it
was not read from, and a fault that stops a rollout says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from canary_sandbox.stack import ControllerProcess, inference_service, wait_until
from kubernetes import client

from tests.faults.support import (
    BAD,
    HEALTHY,
    TERMINAL,
    V1,
    V2,
    V3,
    World,
    assert_signal,
    check_all,
    check_told,
    isvc_writes,
    phase,
    policy,
    raw_state,
    step_shown,
    wait_for_phase,
    written,
)

NAMESPACE = "state"
MODELS = [
    "corrupt",
    "emptied",
    "delprogress",
    "delrolledback",
    "delpromoted",
    "isvcdel",
    "recreate",
    "recreategc",
    "poledit",
    "polbroken",
    "poldel",
]
BEHAVIOURS = {"delrolledback": {V1: HEALTHY, V2: BAD, V3: HEALTHY}}
# The steps whose windows the policy faults land in are long enough to be caught in.
POLICIES = {name: policy(name, NAMESPACE, window="6s") for name in ("poledit", "polbroken", "poldel")}
STEP_MODELS = ["corrupt", "emptied", "delprogress", "isvcdel", "poledit", "polbroken", "poldel"]


def core(world: World) -> client.CoreV1Api:
    return client.CoreV1Api(world.stack.api)


def state_map(name: str) -> str:
    return f"kserve-canary-{name}"


def replace_state_data(world: World, name: str, data: dict[str, str]) -> None:
    """Read and replace, as ``kubectl edit`` does: again when the controller wrote in between (409)."""
    for _ in range(10):
        found = core(world).read_namespaced_config_map(state_map(name), NAMESPACE)
        found.data = data
        try:
            core(world).replace_namespaced_config_map(state_map(name), NAMESPACE, found)
            return
        except client.ApiException as error:
            if error.status != 409:
                raise
    raise AssertionError(f"could not replace the state of {name}: the controller kept writing")


def delete_state(world: World, name: str) -> None:
    core(world).delete_namespaced_config_map(state_map(name), NAMESPACE)


def writes_after(world: World, name: str, since: float) -> list[Any]:
    return [w.weight for w in isvc_writes(world.stack, NAMESPACE, name) if w.time > since]


@dataclass
class Faulted:
    controller: ControllerProcess
    at: dict[str, float]  # when each model's fault was applied (real time)


CORRUPT = '{"schemaVersion": 2, "phase": "Progre'


@pytest.fixture(scope="module")
def faulted(world: World) -> Faulted:
    """Every rollout started at once; each mid-step fault applied while its model is at 10 %."""
    stack = world.stack
    started = stack.start_controller("state", extra_args=["-n", NAMESPACE])
    time.sleep(2)
    for name in MODELS:
        stack.set_storage_uri(NAMESPACE, name, V2)
    for name in [*STEP_MODELS, "recreate", "recreategc"]:
        assert wait_until(lambda n=name: step_shown(stack, NAMESPACE, n, 10), 30), raw_state(
            stack, NAMESPACE, name
        )
    at: dict[str, float] = {}
    policy_dir = stack.policy_dir / NAMESPACE
    actions: dict[str, Callable[[], None]] = {
        "corrupt": lambda: replace_state_data(world, "corrupt", {"state.json": CORRUPT}),
        "emptied": lambda: replace_state_data(world, "emptied", {}),
        "delprogress": lambda: delete_state(world, "delprogress"),
        "isvcdel": lambda: delete_isvc(world, "isvcdel"),
        "recreate": lambda: recreate_at_once(world, "recreate"),
        "recreategc": lambda: delete_isvc(world, "recreategc"),
        "poledit": lambda: stack.write_policy(
            "poledit.yaml", policy("poledit", NAMESPACE, window="6s", steps="[20, 60, 100]")
        ),
        "polbroken": lambda: stack.write_policy(
            "polbroken.yaml",
            policy("polbroken", NAMESPACE, window="6s").replace("window: 6s", "window: soon"),
        ),
        "poldel": lambda: (policy_dir / "poldel.yaml").unlink(),
    }
    for name, action in actions.items():
        at[name] = time.time()
        action()
    # The re-created objects' own rollouts run alongside the other cases.
    assert wait_until(lambda: stack.state(NAMESPACE, "recreategc") is None, 15), "collected"
    stack.apply(inference_service(NAMESPACE, "recreategc", V1))
    for name in ("recreate", "recreategc"):
        assert wait_until(
            lambda n=name: stack.predictor_status(NAMESPACE, n).get("latestRolledoutRevision"), 30
        )
    wait_until(lambda: False, 2.0)
    for name in ("recreate", "recreategc"):
        stack.set_storage_uri(NAMESPACE, name, V2)
    return Faulted(started, at)


def delete_isvc(world: World, name: str) -> None:
    world.stack.custom.delete_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", NAMESPACE, "inferenceservices", name, propagation_policy="Background"
    )


def recreate_at_once(world: World, name: str) -> None:
    """``kubectl replace --force``: deleted and created again while the garbage collector lags, so
    the predecessor's state is still there when the new object appears."""
    stack = world.stack
    stack.emulator.store.garbage_collection_delay = 8.0
    try:
        delete_isvc(world, name)
        stack.apply(inference_service(NAMESPACE, name, V1))
    finally:
        stack.emulator.store.garbage_collection_delay = 0.0


def test_a_corrupted_state_holds_the_rollout_and_says_so_until_it_is_deleted(
    world: World, faulted: Faulted
) -> None:
    stack = world.stack
    case = world.case("corrupt")
    assert_signal(stack, case, reason="StateUnreadable", log_text="rollout state unreadable")
    wait_until(lambda: False, max(0.0, faulted.at["corrupt"] + 3 * 2.0 - time.time()))
    assert writes_after(world, "corrupt", faulted.at["corrupt"]) == [], (
        "an unreadable state is never acted on"
    )
    assert raw_state(stack, NAMESPACE, "corrupt") == CORRUPT, "an unreadable state is never overwritten"
    delete_state(world, "corrupt")  # the operator's way out: the rollout is found again, at 10 %
    assert wait_for_phase(stack, NAMESPACE, "corrupt", TERMINAL, 60) == "Succeeded"
    check_all(stack, world.recorder, case)
    check_told(stack, case)


@pytest.mark.parametrize("name", ["emptied", "delprogress"])
def test_a_state_emptied_or_deleted_mid_step_is_found_again_without_shortening_the_window(
    world: World, faulted: Faulted, name: str
) -> None:
    stack = world.stack
    assert wait_for_phase(stack, NAMESPACE, name, TERMINAL, 60) == "Succeeded"
    case = world.case(name)
    check_all(stack, world.recorder, case)
    check_told(stack, case)


def test_a_state_deleted_after_a_rollback_never_rewrites_the_rolled_back_revision(
    world: World, faulted: Faulted
) -> None:
    stack = world.stack
    assert wait_for_phase(stack, NAMESPACE, "delrolledback", TERMINAL, 60) == "RolledBack"
    delete_state(world, "delrolledback")
    since = time.time()
    wait_until(lambda: False, 2 * 2.0)
    assert writes_after(world, "delrolledback", since) == []
    assert stack.canary_percent(NAMESPACE, "delrolledback") == 0
    check_all(stack, world.recorder, world.case("delrolledback"))
    # A fixed version is a new revision: its rollout starts from the first step.
    stack.set_storage_uri(NAMESPACE, "delrolledback", V3)
    assert wait_until(
        lambda: (
            (stack.state(NAMESPACE, "delrolledback") or {}).get("revision") == "delrolledback-predictor-00003"
        ),
        30,
    )
    assert wait_for_phase(stack, NAMESPACE, "delrolledback", TERMINAL, 60) == "Succeeded"
    case = world.case("delrolledback")
    check_all(stack, world.recorder, case)
    check_told(stack, case)


def test_a_state_deleted_after_a_promotion_writes_nothing(world: World, faulted: Faulted) -> None:
    stack = world.stack
    assert wait_for_phase(stack, NAMESPACE, "delpromoted", TERMINAL, 60) == "Succeeded"
    delete_state(world, "delpromoted")
    since = time.time()
    wait_until(lambda: False, 2 * 2.0)
    assert writes_after(world, "delpromoted", since) == []
    assert stack.canary_percent(NAMESPACE, "delpromoted") is None
    check_all(stack, world.recorder, world.case("delpromoted"))


def test_an_inference_service_deleted_mid_step_leaves_no_state_behind(world: World, faulted: Faulted) -> None:
    stack = world.stack
    assert wait_until(lambda: stack.state(NAMESPACE, "isvcdel") is None, 15), [
        (e.sequence, e.method, e.path[-40:], e.status, e.user_agent[-8:])
        for e in stack.emulator.requests.entries()
        if "isvcdel" in e.path and e.method != "GET" and e.time > faulted.at["isvcdel"] - 1
    ]
    wait_until(lambda: False, 2.0)
    assert writes_after(world, "isvcdel", faulted.at["isvcdel"]) == []
    assert faulted.controller.alive
    check_all(stack, world.recorder, world.case("isvcdel"))


def _fresh_rollout(world: World, name: str) -> None:
    stack = world.stack
    assert wait_for_phase(stack, NAMESPACE, name, TERMINAL, 60) == "Succeeded"
    state = stack.state(NAMESPACE, name) or {}
    assert state.get("inferenceServiceUid") == stack.get(NAMESPACE, name)["metadata"]["uid"]
    # The new object's rollout went through every step of its own.
    assert written(stack, NAMESPACE, name)[-4:] == [10, 30, 50, None]
    case = world.case(name)
    check_all(stack, world.recorder, case)
    check_told(stack, case)


def test_an_inference_service_re_created_at_once_never_gets_the_old_state(
    world: World, faulted: Faulted
) -> None:
    _fresh_rollout(world, "recreate")


def test_an_inference_service_re_created_after_garbage_collection_starts_afresh(
    world: World, faulted: Faulted
) -> None:
    _fresh_rollout(world, "recreategc")


def test_a_policy_edited_mid_step_so_the_weight_is_no_step_pauses(world: World, faulted: Faulted) -> None:
    stack = world.stack
    assert wait_for_phase(stack, NAMESPACE, "poledit", {"Paused"}, 20) == "Paused"
    case = world.case("poledit", window=6.0)
    assert_signal(
        stack, case, reason="CanaryPaused", log_text="no longer one of its steps", state_text="policy-changed"
    )
    wait_until(lambda: False, 2.0)
    assert writes_after(world, "poledit", faulted.at["poledit"]) == []
    check_all(stack, world.recorder, case)
    check_told(stack, case)


def test_a_policy_broken_mid_step_keeps_the_previous_version_running(world: World, faulted: Faulted) -> None:
    stack = world.stack
    assert wait_until(lambda: "polbroken.yaml:7: spec.window" in faulted.controller.log(), 20), (
        faulted.controller.log()[-3000:]
    )
    assert wait_for_phase(stack, NAMESPACE, "polbroken", TERMINAL, 60) == "Succeeded"
    case = world.case("polbroken", window=6.0)
    check_all(stack, world.recorder, case)
    check_told(stack, case)


def test_a_policy_deleted_mid_step_pauses_says_so_even_racing_a_reconcile_and_never_rolls_back(
    world: World, faulted: Faulted
) -> None:
    stack = world.stack
    assert wait_for_phase(stack, NAMESPACE, "poldel", {"Paused"}, 20) == "Paused"
    wait_until(lambda: False, 3.0)
    assert writes_after(world, "poldel", faulted.at["poldel"]) == [], "a removed policy never rolls back"
    case = world.case("poldel", window=6.0)
    assert_signal(stack, case, reason="CanaryPaused", log_text="policy removed", state_text="policy removed")
    check_all(stack, world.recorder, case)
    assert phase(stack, NAMESPACE, "poldel") == "Paused"
