"""``run --dry-run`` decides from the cluster's state, as the live controller would: a revision the
state records as rolled back is not announced as a new rollout, and a paused rollout stays paused
(issue: dry-run announced a dark launch for a rolled-back model). Against the API emulator over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.prometheus import free_port
from canary_sandbox.stack import inference_service
from kubernetes import client, config

from canary.controller.observability import ControllerMetrics
from canary.controller.reconciler import Reconciler
from canary.kserve.client import InferenceServiceClient
from canary.kserve.store import ConfigMapStateStore
from canary.metrics.client import PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.notify import NotificationDispatcher
from canary.policy import LoadedPolicy, load_text
from canary.rollout import Action
from canary.rollout.state import Pause, PauseKind, Phase, RolloutState
from tests.policy.support import valid_policy

V2 = "llama-predictor-00002"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Emulator, client.ApiClient]]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0, revision_ready_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace("ml")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        objects = client.CustomObjectsApi(api)
        objects.create_namespaced_custom_object(
            "serving.kserve.io",
            "v1beta1",
            "ml",
            "inferenceservices",
            inference_service("ml", "llama", "s3://m/v1"),
        )
        emulator.settle()
        objects.patch_namespaced_custom_object(
            "serving.kserve.io",
            "v1beta1",
            "ml",
            "inferenceservices",
            "llama",
            {"spec": {"predictor": {"model": {"storageUri": "s3://m/v2"}}}},
        )
        emulator.settle()
        yield emulator, api


def uid(api: client.ApiClient) -> str:
    found = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", "ml", "inferenceservices", "llama"
    )
    return str(found["metadata"]["uid"])  # type: ignore[index]


def dry_run(api: client.ApiClient) -> tuple[Reconciler, LoadedPolicy, NotificationDispatcher]:
    dispatcher = NotificationDispatcher()
    source = PrometheusEvidenceSource(PrometheusConfig(url=f"http://127.0.0.1:{free_port()}", timeout=1))
    reconciler = Reconciler(
        inference_services=InferenceServiceClient(api),
        store=ConfigMapStateStore(api),
        evidence=source,
        dispatcher=dispatcher,
        metrics=ControllerMetrics(),
        clock=lambda: datetime.now(UTC),
        dry_run=True,
    )
    return reconciler, load_text(valid_policy("llama")).policies[0], dispatcher


def test_a_rolled_back_revision_is_not_announced_as_a_new_rollout(
    cluster: tuple[Emulator, client.ApiClient],
) -> None:
    _, api = cluster
    store = ConfigMapStateStore(api)
    rolled_back = RolloutState(
        phase=Phase.ROLLED_BACK, revision=V2, started_at=datetime.now(UTC), inference_service_uid=uid(api)
    )
    store.save("ml", "llama", rolled_back, resource_version=None, owner_uid=uid(api))
    before = store.load("ml", "llama").resource_version
    reconciler, policy, dispatcher = dry_run(api)
    try:
        outcome = reconciler.reconcile(policy)
    finally:
        dispatcher.close(1)
    assert outcome.error is None, outcome.error
    assert outcome.decision is not None
    assert outcome.decision.action is not Action.START, outcome.decision.summary
    assert outcome.decision.new_state.phase is Phase.ROLLED_BACK, outcome.decision.summary
    assert store.load("ml", "llama").resource_version == before, "a dry run writes nothing"


def test_a_paused_rollout_stays_paused(cluster: tuple[Emulator, client.ApiClient]) -> None:
    _, api = cluster
    now = datetime.now(UTC)
    paused = RolloutState(
        phase=Phase.PAUSED,
        revision=V2,
        started_at=now,
        pause=Pause(PauseKind.MANUAL, "paused by alice", now, Phase.PROGRESSING),
        inference_service_uid=uid(api),
    )
    ConfigMapStateStore(api).save("ml", "llama", paused, resource_version=None, owner_uid=uid(api))
    reconciler, policy, dispatcher = dry_run(api)
    try:
        outcome = reconciler.reconcile(policy)
    finally:
        dispatcher.close(1)
    assert outcome.decision is not None
    assert outcome.decision.new_state.phase is Phase.PAUSED, outcome.decision.summary
    assert "paused by alice" in outcome.decision.summary or outcome.decision.action is Action.WAIT
