"""A namespace editor fills the controller's ConfigMap cache (issue #34, finding 3): the controller as a
process, the emulator over HTTP, a real Prometheus.

Team A creates 150 ConfigMaps of about 1 MB, each labelled ``app.kubernetes.io/managed-by=kserve-canary``:
under names the controller never writes, under a state's name with a command of 1 MB, and with
``binaryData``. The controller lists them in pages, keeps none, says so (a warning and
``kserve_canary_configmaps_ignored_total``), and its resident memory stays near that of a start
without them; team B's rollout (namespace ``e2e``) still starts.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import ControllerProcess, Stack, inference_service, wait_until
from kubernetes import client

from benchmarks.scale import metric_values
from tests.e2e.test_rollouts import NS, V1, V2, policy

TEAM_A, TEAM_B = "team-a", NS
MODEL = "fraud"
HOSTILE = 150
MB = 1_000_000
MANAGED = {"app.kubernetes.io/managed-by": "kserve-canary"}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    models = [ModelTraffic(TEAM_B, MODEL, 20.0, {V1: RevisionBehaviour(), V2: RevisionBehaviour()})]
    with Stack(models, {f"{MODEL}.yaml": policy(MODEL)}) as started:
        started.env = {"HOOK_URL": f"{started.receiver.url}/hook"}
        started.emulator.create_namespace(TEAM_A)
        started.apply(inference_service(TEAM_B, MODEL, V1))
        assert wait_until(
            lambda: bool(started.predictor_status(TEAM_B, MODEL).get("latestRolledoutRevision")), 30
        )
        yield started


def hostile_configmap(index: int) -> dict[str, object]:
    """About 1 MB each, in three shapes the label alone would let into the cache."""
    kind = index % 3
    labels = {**MANAGED, "kserve-canary.dev/inference-service": f"m{index}"}
    if kind == 0:  # a name the controller never writes
        return {"metadata": {"name": f"junk-{index}", "labels": labels}, "data": {"blob": "x" * MB}}
    if kind == 1:  # a state's name, with a 1 MB command beside no state
        return {
            "metadata": {"name": f"kserve-canary-m{index}", "labels": labels},
            "data": {"command.json": "{" + "y" * (MB - 1)},
        }
    raw = base64.b64encode(b"z" * (MB * 3 // 4)).decode()  # binaryData: 1 MB of base64 on the wire
    return {"metadata": {"name": f"kserve-canary-m{index}", "labels": labels}, "binaryData": {"b": raw}}


def _memory(controller: ControllerProcess) -> tuple[int, int]:
    """(VmRSS, VmHWM) of the controller process in KiB: now, and the peak so far."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{controller.process.pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def _ignored(controller: ControllerProcess) -> float:
    return sum(metric_values(controller.metrics(), "kserve_canary_configmaps_ignored_total").values())


def _settled(stack: Stack, name: str, hostile: int) -> tuple[ControllerProcess, tuple[int, int]]:
    """A controller started, its caches listed (every hostile ConfigMap judged), team B's state read."""
    controller = stack.start_controller(name)
    assert wait_until(
        lambda: stack.state(TEAM_B, MODEL) is not None and _ignored(controller) >= hostile, 60
    ), controller.log()[-3000:]
    time.sleep(2.0)
    return controller, _memory(controller)


def test_hostile_configmaps_are_ignored_and_cost_no_memory(stack: Stack) -> None:
    benign, (benign_rss, benign_peak) = _settled(stack, "benign", 0)
    benign.terminate()

    core = client.CoreV1Api(stack.api)
    for index in range(HOSTILE):
        core.create_namespaced_config_map(TEAM_A, hostile_configmap(index))

    hostile, (rss, peak) = _settled(stack, "hostile", HOSTILE)
    assert hostile.alive
    ignored = metric_values(hostile.metrics(), "kserve_canary_configmaps_ignored_total")
    assert ignored == {f'{{namespace="{TEAM_A}"}}': float(HOSTILE)}
    assert stack.state(TEAM_B, MODEL) is not None
    warnings = [
        line
        for line in hostile.log_lines()
        if line.get("event") == "ConfigMap labelled as kserve-canary's ignored"
    ]
    assert {line["configmap"] for line in warnings} >= {
        f"{TEAM_A}/junk-0",
        f"{TEAM_A}/kserve-canary-m1",
        f"{TEAM_A}/kserve-canary-m2",
    }
    # A watch event of one more is ignored the same way.
    core.create_namespaced_config_map(TEAM_A, hostile_configmap(HOSTILE))
    assert wait_until(
        lambda: (
            sum(metric_values(hostile.metrics(), "kserve_canary_configmaps_ignored_total").values())
            == HOSTILE + 1
        ),
        10,
    )
    print(
        f"RSS benign {benign_rss // 1024} MiB (peak {benign_peak // 1024}); with {HOSTILE} x 1 MB hostile ConfigMaps {rss // 1024} MiB (peak {peak // 1024})"
    )
    assert rss <= benign_rss * 1.2, (benign_rss, rss)
    assert peak <= benign_peak * 1.2, (benign_peak, peak)  # a page of two hostile objects at most
