from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig, ManualClock
from kubernetes import client, config

from tests.sandbox.emulator.support import NAMESPACE, Isvcs

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z: a fixed start makes timestamps reproducible


@pytest.fixture
def emulator() -> Emulator:
    """Manual time: tests step it with ``emulator.advance`` and see exactly what falls due."""
    emulator = Emulator(
        KServeConfig(reconcile_delay=0.5, revision_ready_delay=1.0, scale_down_grace=30.0),
        ManualClock(START),
        seed=7,
    )
    emulator.create_namespace(NAMESPACE)
    return emulator


@pytest.fixture
def server(emulator: Emulator) -> Iterator[EmulatorServer]:
    with EmulatorServer(emulator, bookmark_interval=0.2) as running:
        yield running


@pytest.fixture
def kubeconfig(server: EmulatorServer, tmp_path: Path) -> Path:
    return server.write_kubeconfig(tmp_path / "kubeconfig.yaml")


@pytest.fixture
def api_client(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    yield api
    api.close()


@pytest.fixture
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


@pytest.fixture
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture
def isvcs(custom: client.CustomObjectsApi) -> Isvcs:
    return Isvcs(custom)
