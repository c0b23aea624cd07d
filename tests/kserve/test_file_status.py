"""The file policies' status ConfigMap (canary/kserve/file_status.py) against the API emulator over
HTTP: written when a row changes and not otherwise, at most once per interval, a failing write said
once and tried again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog.testing
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from kubernetes import client, config

from canary.kserve.file_status import FILE_STATUS_CONFIGMAP, FILE_STATUS_KEY, FileStatusPublisher, summary_row
from tests.cli.support import progressing


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Emulator, client.ApiClient]]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        yield emulator, config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


def test_written_on_change_once_per_interval_and_a_failure_said_once(
    api: tuple[Emulator, client.ApiClient],
) -> None:
    emulator, api_client = api
    now = [0.0]
    publisher = FileStatusPublisher(api_client, "kserve-canary", min_interval=2.0, monotonic=lambda: now[0])
    row = summary_row("ml", "llama", "policies/ml/llama.yaml:1", progressing("llama-predictor-00002"))
    with structlog.testing.capture_logs() as logs:
        # No such namespace yet: the write fails, said once however often it is tried again.
        assert publisher.publish([row]) == "failed"
        now[0] += 2.0
        assert publisher.publish([row]) == "failed"
    assert [entry["event"] for entry in logs] == ["file-policy status not written; trying again"]
    emulator.create_namespace("kserve-canary")
    now[0] += 2.0
    assert publisher.publish([row]) == "written"
    assert publisher.publish([row]) == "unchanged"
    moved = {**row, "weight": 30}
    assert publisher.publish([moved]) == "deferred"  # within the interval: the next pass writes it
    now[0] += 2.0
    assert publisher.publish([moved]) == "written"
    stored = client.CoreV1Api(api_client).read_namespaced_config_map(FILE_STATUS_CONFIGMAP, "kserve-canary")
    assert json.loads(stored.data[FILE_STATUS_KEY]) == {"rollouts": [moved]}
