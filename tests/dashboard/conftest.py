"""The dashboard against the Kubernetes API emulator over HTTP, with the real reconciler in-process as
the controller (as tests/controller/test_command_binding.py runs it) and a rollout under way."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.prometheus import free_port
from canary_sandbox.stack import inference_service
from kubernetes import client, config

from canary.controller.observability import ControllerMetrics
from canary.controller.reconciler import Reconciler
from canary.dashboard.server import TOKEN_HEADER, Dashboard, load_client
from canary.kserve.client import InferenceServiceClient
from canary.kserve.store import ConfigMapStateStore, StoredState
from canary.metrics.client import PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.notify import NotificationDispatcher
from canary.policy import LoadedPolicy, load_text
from canary.rollout.state import Phase, RolloutState, StepProgress
from tests.policy.support import valid_policy

CANARY = "llama-predictor-00002"


@dataclass
class Clock:
    """The controller's clock: the real time, shifted by ``offset``."""

    offset: timedelta = field(default_factory=timedelta)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@dataclass
class World:
    emulator: Emulator
    server: EmulatorServer
    kubeconfig: Path
    api: client.ApiClient
    reconciler: Reconciler
    clock: Clock
    policy: LoadedPolicy

    @property
    def store(self) -> ConfigMapStateStore:
        return ConfigMapStateStore(self.api)

    def stored(self) -> StoredState:
        return self.store.load("ml", "llama")

    def reconcile(self) -> None:
        outcome = self.reconciler.reconcile(self.policy)
        assert outcome.error is None, outcome.error

    def start_rollout(self) -> RolloutState:
        """A new predictor spec, reconciled until its rollout holds its first step."""
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object(
            "serving.kserve.io",
            "v1beta1",
            "ml",
            "inferenceservices",
            "llama",
            {"spec": {"predictor": {"model": {"storageUri": "s3://m/v2"}}}},
        )
        self.emulator.settle()
        for _ in range(50):
            self.reconcile()
            self.emulator.settle()
            state = self.stored().state()
            if state.revision == CANARY and state.phase is Phase.PROGRESSING and state.step is not None:
                return state
            time.sleep(0.05)
        raise AssertionError(f"no rollout of {CANARY}: {self.stored().state_json}")

    def advance_stored_state(self) -> RolloutState:
        """The next step written into state.json directly (what the controller does when a step
        passes, without the Prometheus evidence it would need)."""
        stored = self.stored()
        state = stored.state()
        assert state.step is not None
        step = StepProgress(state.step.index + 1, 30, started_at=datetime.now(UTC))
        advanced = replace(state, step=step)
        files = {"state.json": advanced.to_json()}
        if stored.explain_json:
            files["explain.json"] = stored.explain_json
        self.store.save_files(
            "ml", "llama", files, resource_version=stored.resource_version, owner_uid=stored.owner_uid
        )
        return advanced


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0, revision_ready_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace("ml")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "serving.kserve.io",
            "v1beta1",
            "ml",
            "inferenceservices",
            inference_service("ml", "llama", "s3://m/v1"),
        )
        emulator.settle()
        dispatcher = NotificationDispatcher()
        # No Prometheus answers there: every evaluation is inconclusive, the rollout holds its step.
        source = PrometheusEvidenceSource(PrometheusConfig(url=f"http://127.0.0.1:{free_port()}", timeout=1))
        clock = Clock()
        reconciler = Reconciler(
            inference_services=InferenceServiceClient(api),
            store=ConfigMapStateStore(api),
            evidence=source,
            dispatcher=dispatcher,
            metrics=ControllerMetrics(),
            clock=clock,
        )
        world = World(
            emulator, server, kubeconfig, api, reconciler, clock, load_text(valid_policy("llama")).policies[0]
        )
        world.reconcile()
        try:
            yield world
        finally:
            dispatcher.close(1)


class Controller:
    """The real reconciler running beside the dashboard, as the controller's scheduler runs it."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stopping.wait(0.2):
            self.world.reconciler.reconcile(self.world.policy)

    def __enter__(self) -> Controller:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(5)


def start_dashboard(world: World, **options: object) -> Dashboard:
    """The dashboard with its own client from the user's kubeconfig, as ``run_dashboard`` builds it."""
    api = load_client(str(world.kubeconfig), None)
    settings: dict[str, object] = {"kubeconfig": str(world.kubeconfig), "command_wait": 10.0, **options}
    return Dashboard(api, **settings).start()  # type: ignore[arg-type]


@pytest.fixture
def dashboard(world: World) -> Iterator[Dashboard]:
    board = start_dashboard(world)
    try:
        yield board
    finally:
        board.stop()


class Api:
    """Requests to the dashboard as its page makes them (the token in the header)."""

    def __init__(self, board: Dashboard) -> None:
        self.board = board
        self.session = requests.Session()

    def get(self, path: str, **headers: str) -> requests.Response:
        return self.session.get(
            self.board.origin + path, headers={TOKEN_HEADER: self.board.token, **headers}, timeout=30
        )

    def post(self, path: str, body: object | None = None, **headers: str) -> requests.Response:
        return self.session.post(
            self.board.origin + path,
            json=body if body is not None else {},
            headers={TOKEN_HEADER: self.board.token, "Origin": self.board.origin, **headers},
            timeout=60,
        )
