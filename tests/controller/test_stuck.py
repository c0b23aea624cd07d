"""A rollout whose reconcile keeps failing says why within one interval (issue 35, item 10): a Warning
Event on its InferenceService (once per change of the error, with a count), the Stalled condition of
its PromotionPolicy, and ``explain``'s warning lines — with the real reconciler and tick over HTTP
against the API emulator, whose apiserver refuses the state writes."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from kubernetes import client

from canary.cli.warnings import latest_warnings
from canary.controller.failures import FAILED_REASON, ReconcileFailures
from canary.controller.projection import PolicyView, project_status
from canary.policy.status import ConditionType
from tests.controller.test_tick import NS, World, _wait, world  # noqa: F401 (the fixture)

KEY = f"{NS}/m0"


def _events(model: World) -> list[client.CoreV1Event]:
    listed = client.CoreV1Api(model.api).list_namespaced_event(
        NS, field_selector="involvedObject.kind=InferenceService,involvedObject.name=m0,type=Warning"
    )
    return [event for event in listed.items if event.reason == FAILED_REASON]


def test_refused_state_writes_are_a_warning_event_with_a_count_the_stalled_condition_and_explain(
    world: World,  # noqa: F811 (the fixture of tests/controller/test_tick.py)
) -> None:
    failures = ReconcileFailures(world.api, world.clock)
    runner = world.runner(on_reconciled=failures.observe)
    _wait(lambda: world.reconciler.reads.synced(NS))
    runner.run_tick()
    assert failures.of(KEY) is None
    for method in ("POST", "PUT", "PATCH"):  # the apiserver refuses every ConfigMap write
        world.emulator.faults.add(r"/configmaps", method=method, status=422, count=None, message="too large")
    world.push("m0")
    world.emulator.settle()
    for _ in range(40):  # until the cache has seen the new revision and three reconciles failed
        runner.trigger(KEY)
        runner.run_tick()
        known = failures.of(KEY)
        if known is not None and known.count >= 3:
            break
        time.sleep(0.1)
    failure = failures.of(KEY)
    assert failure is not None and failure.count == 3 and "422" in failure.error
    (event,) = _events(world)  # one Event for the one error, counted
    assert (event.type, event.count, event.involved_object.kind) == ("Warning", 3, "InferenceService")
    assert "the rollout cannot proceed: apiserver answered 422" in event.message
    shown = latest_warnings(world.api, NS, "m0")
    assert shown[0].startswith(f"warning {FAILED_REASON} ×3 (last ") and "422" in shown[0]
    loaded = world.policies[KEY]
    view = PolicyView(1, loaded.policy, failure=f"{failure.error} ({failure.count} times in a row)")
    stalled = next(
        c for c in project_status(view, None, datetime.now(UTC)).conditions if c.type == ConditionType.STALLED
    )
    assert (stalled.status, stalled.reason) == ("True", "ReconcileFailed")
    assert (
        "cannot proceed: apiserver answered 422" in stalled.message and "3 times in a row" in stalled.message
    )
    # Fixed: the next reconcile succeeds and the failure is forgotten.
    world.emulator.faults.clear()
    runner.trigger(KEY)
    assert KEY not in runner.run_tick().failed
    assert failures.of(KEY) is None
