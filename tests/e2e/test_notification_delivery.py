"""End to end, a notification outlives its controller (issue 11, item 3): the controller as a process,
SIGKILLed while the webhook receiver is down; a restarted process, or the standby replica taking the
Lease over, delivers what the outbox ConfigMap holds — once, with the same idempotency key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until
from kubernetes import client

from canary.kserve.outbox import OUTBOX_KEY, outbox_configmap_name
from canary.notify.webhook import IDEMPOTENCY_HEADER
from tests.e2e.support import V1, V2
from tests.e2e.test_rollouts import policy
from tests.notify.outage import OutageReceiver, Received

NS = "e2e"
MODEL = "durable"
HEALTHY = {V1: RevisionBehaviour(median_ms=80), V2: RevisionBehaviour(median_ms=80, ready_after_s=1.0)}
HORIZONS = ["--notify-retry-for", "2m", "--notify-info-retry-for", "2m"]
LEASE = ["--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "0.5"]


@pytest.fixture
def hook() -> Iterator[OutageReceiver]:
    receiver = OutageReceiver()
    yield receiver
    receiver.stop()


@pytest.fixture
def stack(hook: OutageReceiver) -> Iterator[Stack]:
    # A long window: the rollout stays at its first step, "started" is the one notification.
    with Stack([ModelTraffic(NS, MODEL, 60.0, HEALTHY)], {f"{MODEL}.yaml": policy(MODEL, window="5m")}) as s:
        s.env = {"HOOK_URL": f"{hook.url}/hook"}
        s.apply(inference_service(NS, MODEL, V1))
        assert wait_until(lambda: s.predictor_status(NS, MODEL).get("latestRolledoutRevision"), 30)
        yield s


def outbox(stack: Stack) -> list[dict[str, Any]]:
    try:
        found = client.CoreV1Api(stack.api).read_namespaced_config_map(outbox_configmap_name(MODEL), NS)
    except client.ApiException:
        return []
    return list(json.loads((found.data or {}).get(OUTBOX_KEY) or '{"entries": []}')["entries"])


def started_waiting(stack: Stack) -> bool:
    return any(entry["notification"]["action"] == "started" for entry in outbox(stack))


def started_requests(hook: OutageReceiver) -> list[Received]:
    return [r for r in hook.requests if r.path == "/hook" and json.loads(r.body)["action"] == "started"]


def delivered_by(controller: ControllerProcess) -> list[dict[str, Any]]:
    return [
        line
        for line in controller.log_lines()
        if line.get("event") == "notification delivered" and line.get("target_kind") == "webhook"
    ]


def test_the_outbox_survives_a_controller_restart(stack: Stack, hook: OutageReceiver) -> None:
    hook.status = 500
    first = stack.start_controller("first", extra_args=HORIZONS)
    stack.set_storage_uri(NS, MODEL, V2)
    assert wait_until(lambda: started_waiting(stack), 30), first.log()[-3000:]
    assert wait_until(lambda: len(started_requests(hook)) >= 2, 15), "tried, and answered 500"
    hook.go_down()  # and then not even listening
    first.kill()  # SIGKILL while the receiver is down: the in-memory queue is gone
    assert started_waiting(stack), "the outbox kept it"

    hook.come_up(status=200)
    second = stack.start_controller("second", extra_args=HORIZONS)
    assert wait_until(lambda: any(r.accepted for r in started_requests(hook)), 30), second.log()[-3000:]
    assert wait_until(lambda: outbox(stack) == [], 10), "delivered: out of the outbox"
    attempts = started_requests(hook)
    assert len([r for r in attempts if r.accepted]) == 1
    assert len({r.headers[IDEMPOTENCY_HEADER] for r in attempts}) == 1, "one key before and after"
    assert {json.loads(r.body)["id"] for r in attempts} == {attempts[0].headers[IDEMPOTENCY_HEADER]}
    assert delivered_by(second) and not delivered_by(first)


def test_a_takeover_replica_delivers_the_previous_leaders_queue(stack: Stack, hook: OutageReceiver) -> None:
    from tests.e2e.test_resilience import lease_holder

    hook.status = 503
    leader = stack.start_controller("replica-a", leader_elect=True, extra_args=[*LEASE, *HORIZONS])
    assert wait_until(lambda: lease_holder(stack) == "replica-a", 15)
    standby = stack.start_controller("replica-b", leader_elect=True, extra_args=[*LEASE, *HORIZONS])
    stack.set_storage_uri(NS, MODEL, V2)
    assert wait_until(lambda: started_waiting(stack), 30), leader.log()[-3000:]
    assert wait_until(lambda: len(started_requests(hook)) >= 2, 15)
    hook.go_down()
    leader.kill()  # no lease release: the standby waits for the lease to expire, then leads

    hook.come_up(status=200)
    assert wait_until(lambda: lease_holder(stack) == "replica-b", 20)
    assert wait_until(lambda: any(r.accepted for r in started_requests(hook)), 30), standby.log()[-3000:]
    assert wait_until(lambda: outbox(stack) == [], 10)
    attempts = started_requests(hook)
    assert len([r for r in attempts if r.accepted]) == 1
    assert len({r.headers[IDEMPOTENCY_HEADER] for r in attempts}) == 1
    assert delivered_by(standby) and not delivered_by(leader)
    assert any(line.get("event") == "notification outbox taken up" for line in standby.log_lines())
