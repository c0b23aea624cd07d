"""Team A hostile, team B measured: the controller as a process, a real Prometheus behind a fault
proxy, the API emulator (docs/security.md, "Fairness between namespaces").

* Team A's policy has eight custom checks whose queries take Prometheus 9 s each (a delaying proxy
  in front of it). Team B's canary breaks its error-rate limit: its rollback must be written as
  soon as its own evidence says so — team A's PromQL is deferred past its namespace's budget of
  query time, and never delays team B's builtin checks.
* Prometheus hangs for everyone. Team B's canary never becomes Ready: its readiness deadline needs
  no Prometheus, and its rollback must be written within a tick or two of the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from canary_sandbox.faultproxy import FaultProxy, ProxyFault
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until

from tests.faults.support import HEALTHY, V1, V2, isvc_writes, policy, step_shown

TEAM_A, TEAM_B = "team-a", "team-b"
BAD = RevisionBehaviour(median_ms=80, error_rate=0.5)
NEVER_READY = RevisionBehaviour(median_ms=80, ready_after_s=None)
SLOW_MARKER = "hogmarker"  # in every custom query of team A: the proxy delays what carries it
DEADLINE = 4.0  # team B's progressDeadline for the canary that never becomes Ready

HOG = policy("hog", TEAM_A, window="30s").replace(
    "    - {name: oom, metric: oom-kills, max: 0, critical: true}\n",
    "    - {name: oom, metric: oom-kills, max: 0, critical: true}\n"
    + "".join(
        f'    - {{name: slow{index}, promql: \'count(up{{job="{SLOW_MARKER}{index}", '
        f'pod="{{{{ revision }}}}"}}) or vector(0)\', unit: count, max: 1}}\n'
        for index in range(8)
    ),
)
STUCK = policy("stuck", TEAM_B).replace("progressDeadline: 20s", f"progressDeadline: {DEADLINE:g}s")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    models = [
        ModelTraffic(TEAM_A, "hog", 40.0, {V1: HEALTHY, V2: HEALTHY}),
        ModelTraffic(TEAM_B, "fraud", 40.0, {V1: HEALTHY, V2: BAD}),
        ModelTraffic(TEAM_B, "stuck", 40.0, {V1: HEALTHY, V2: NEVER_READY}),
    ]
    texts = {"hog.yaml": HOG, "fraud.yaml": policy("fraud", TEAM_B), "stuck.yaml": STUCK}
    with Stack(models, texts) as started:
        started.env = {"HOOK_URL": f"{started.receiver.url}/hook"}
        for model in models:
            started.apply(inference_service(model.namespace, model.inference_service, V1))
        assert wait_until(
            lambda: all(
                started.predictor_status(m.namespace, m.inference_service).get("latestRolledoutRevision")
                for m in models
            ),
            30,
        )
        yield started


@pytest.fixture(scope="module")
def proxy(stack: Stack) -> Iterator[FaultProxy]:
    assert stack.prometheus is not None
    with FaultProxy(stack.prometheus.url) as started:
        yield started


@pytest.fixture(scope="module")
def controller(stack: Stack, proxy: FaultProxy) -> Iterator[ControllerProcess]:
    started = stack.start_controller(
        "tenants", prometheus_url=proxy.url, extra_args=["--prometheus-timeout", "10"]
    )
    yield started
    started.kill()


def rolled_back_at(stack: Stack, namespace: str, name: str) -> float | None:
    return next((w.time for w in isvc_writes(stack, namespace, name) if w.weight == 0), None)


def test_team_a_slow_promql_does_not_delay_team_b_rollback(
    stack: Stack, proxy: FaultProxy, controller: ControllerProcess
) -> None:
    proxy.add(ProxyFault.delay(9.0), path=r"/api/v1/query", body=SLOW_MARKER)
    stack.set_storage_uri(TEAM_A, "hog", V2)
    assert wait_until(lambda: step_shown(stack, TEAM_A, "hog", 10), 20)
    time.sleep(2.0)  # team A's custom checks are being asked, every tick
    stack.set_storage_uri(TEAM_B, "fraud", V2)
    assert wait_until(lambda: step_shown(stack, TEAM_B, "fraud", 10), 20)
    shown = time.time()
    assert wait_until(lambda: rolled_back_at(stack, TEAM_B, "fraud") is not None, 20), (
        "team B's canary was not rolled back"
    )
    took = (rolled_back_at(stack, TEAM_B, "fraud") or 0.0) - shown
    print(f"team B's rollback written {took:.1f}s after its canary took traffic")
    assert took < 8.0, f"team B's rollback was written {took:.1f}s after its canary took traffic"
    assert "namespace team-a spent its budget of 2s of Prometheus query time" in controller.log()
    assert [w.weight for w in isvc_writes(stack, TEAM_A, "hog")] == [10]  # deferred holds, never passes


def test_a_hanging_prometheus_does_not_hold_a_readiness_deadline(
    stack: Stack, proxy: FaultProxy, controller: ControllerProcess
) -> None:
    proxy.add(ProxyFault.hang(60.0), path=r"/api/v1/", first=True)
    stack.set_storage_uri(TEAM_B, "stuck", V2)
    assert wait_until(lambda: bool(isvc_writes(stack, TEAM_B, "stuck")), 20)
    started = isvc_writes(stack, TEAM_B, "stuck")[0].time
    assert wait_until(lambda: rolled_back_at(stack, TEAM_B, "stuck") is not None, 25), (
        "team B's canary that never became Ready was not rolled back while Prometheus hung"
    )
    late = (rolled_back_at(stack, TEAM_B, "stuck") or 0.0) - started - DEADLINE
    print(f"rolled back {late:.1f}s after its readiness deadline")
    assert late < 3.0, f"rolled back {late:.1f}s after its readiness deadline"
    proxy.clear()
