"""The controller killed: SIGKILL at seeded random moments, ten kills half a second apart, and the
leader of three replicas killed mid-step. Every rollout still finishes; no step is skipped, repeated
with a shorter window or written by a replica without the Lease.
"""

from __future__ import annotations

import random

import pytest
from canary_sandbox.stack import wait_until

from tests.faults.support import (
    TERMINAL,
    V2,
    World,
    check_all,
    check_told,
    check_writes_from_leader,
    lease_holder,
    step_shown,
    wait_for_phase,
    written,
)

NAMESPACE = "proc"
MODELS = ["random", "loop", "replicas"]
SEED = 11
pytestmark = pytest.mark.usefixtures("stops_its_controllers")
LEASE = ["--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5"]


def test_sigkill_at_seeded_random_moments_resumes_without_skipping_or_shortening(world: World) -> None:
    stack = world.stack
    rng = random.Random(SEED)
    controller = stack.start_controller("random-0", extra_args=["-n", NAMESPACE])
    stack.set_storage_uri(NAMESPACE, "random", V2)
    kills = []
    for number in range(1, 5):
        # A random moment of the process's life: starting, listing, deciding, writing, telling.
        delay = rng.uniform(1.0, 4.0)
        wait_until(lambda: False, delay)  # a bounded pause of a random length
        kills.append(round(delay, 2))
        controller.kill()
        controller = stack.start_controller(
            f"random-{number}", extra_args=["-n", NAMESPACE], wait_ready=number == 4
        )
    assert wait_for_phase(stack, NAMESPACE, "random", TERMINAL, 60) == "Succeeded", kills
    assert [w for w in written(stack, NAMESPACE, "random") if w != 10][-3:] == [30, 50, None]
    case = world.case("random")
    check_all(stack, world.recorder, case)
    check_told(stack, case)
    controller.terminate()


def test_ten_kills_half_a_second_apart_and_the_rollout_still_progresses(world: World) -> None:
    stack = world.stack
    stack.set_storage_uri(NAMESPACE, "loop", V2)
    for number in range(10):
        controller = stack.start_controller(f"loop-{number}", extra_args=["-n", NAMESPACE], wait_ready=False)
        wait_until(lambda: False, 0.5)
        controller.kill()
    survivor = stack.start_controller("loop-survivor", extra_args=["-n", NAMESPACE])
    assert wait_for_phase(stack, NAMESPACE, "loop", TERMINAL, 60) == "Succeeded"
    case = world.case("loop")
    check_all(stack, world.recorder, case)
    check_told(stack, case)
    assert survivor.alive
    survivor.terminate()


def test_three_replicas_with_leader_election_and_the_leader_killed_mid_step(world: World) -> None:
    stack = world.stack
    mark = len(stack.emulator.requests.entries())
    replicas = {
        name: stack.start_controller(name, leader_elect=True, extra_args=[*LEASE, "-n", NAMESPACE])
        for name in ("replica-a", "replica-b", "replica-c")
    }
    assert wait_until(lambda: lease_holder(stack) in replicas, 15)
    stack.set_storage_uri(NAMESPACE, "replicas", V2)
    assert wait_until(lambda: step_shown(stack, NAMESPACE, "replicas", 30), 40)
    leader = lease_holder(stack)
    replicas.pop(leader).kill()
    assert wait_until(lambda: lease_holder(stack) in replicas, 15), lease_holder(stack)
    assert wait_for_phase(stack, NAMESPACE, "replicas", TERMINAL, 90) == "Succeeded"
    problems = check_writes_from_leader(stack, since=mark)
    assert not problems, "\n".join(problems)
    case = world.case("replicas")
    check_all(stack, world.recorder, case)
    check_told(stack, case)
    assert all(replica.alive for replica in replicas.values())
