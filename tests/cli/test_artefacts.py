"""Every surface names what the canary and the stable revision serve (#35 item 6): the real reconciler
against the API emulator records the artefacts, and `status -o wide`, `explain`, `report`, the
webhook, Slack, Teams and Discord bodies (over real HTTP) and the InferenceService's Events show them,
with the URIs' credentials and presigned query strings gone."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.prometheus import free_port
from kubernetes import client, config

from canary.controller.observability import ControllerMetrics
from canary.controller.reconciler import Reconciler
from canary.kserve.client import InferenceServiceClient
from canary.kserve.store import ConfigMapStateStore
from canary.metrics.client import PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.notify import NotificationDispatcher
from canary.notify.destinations import destination_for, events_destination
from canary.notify.secrets import Redactor, SecretResolver
from canary.policy import load_text
from canary.policy.model import NotifyTarget
from canary.rollout.state import Phase, RolloutState
from tests.cli.support import progressing, run
from tests.notify.support import Receiver
from tests.policy.support import valid_policy

CANARY = "llama-predictor-00002"
STABLE = "llama-predictor-00001"
# What the spec says, credentials and all: none of these may reach a person.
STABLE_URI = "https://reader:s3cr3t-token@models.example.com/llama/v1?X-Amz-Signature=deadbeef42"
CANARY_URI = "s3://models/llama/v2?X-Amz-Credential=AKIAEXAMPLE7&X-Amz-Signature=cafe1234"
SECRETS = ("s3cr3t-token", "reader:", "X-Amz", "deadbeef42", "AKIAEXAMPLE7", "cafe1234")
STABLE_SHOWN = "https://models.example.com/llama/v1 (runtime kserve-vllm, format huggingface:1)"
CANARY_SHOWN = "s3://models/llama/v2 (runtime kserve-vllm, format huggingface:1)"
KINDS = ("webhook", "slack", "teams", "discord")


def _isvc(uri: str) -> dict[str, Any]:
    model = {
        "modelFormat": {"name": "huggingface", "version": "1"},
        "runtime": "kserve-vllm",
        "storageUri": uri,
    }
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "llama", "namespace": "ml"},
        "spec": {"predictor": {"model": model}},
    }


@dataclass
class Rollout:
    kubeconfig: Path
    home: Path
    api: client.ApiClient
    receiver: Receiver
    state: RolloutState

    def cli(self, *arguments: str) -> str:
        done = run(*arguments, home=self.home, KUBECONFIG=str(self.kubeconfig), COLUMNS="400")
        assert done.returncode == 0, done.stderr
        return done.stdout

    def bodies(self, kind: str) -> list[Any]:
        return [request.json() for request in self.receiver.requests if request.path == f"/{kind}"]


@pytest.fixture
def rollout(tmp_path: Path) -> Iterator[Rollout]:
    """v1 adopted, then v2 applied: the real reconciler starts its rollout and tells everyone."""
    emulator = Emulator(KServeConfig(reconcile_delay=0.0, revision_ready_delay=0.2))
    receiver = Receiver()
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace("ml")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        custom = client.CustomObjectsApi(api)
        custom.create_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", "ml", "inferenceservices", _isvc(STABLE_URI)
        )
        emulator.settle()
        resolver = SecretResolver(Redactor(), {kind.upper(): f"{receiver.url}/{kind}" for kind in KINDS})
        destinations = [
            destination_for(
                NotifyTarget.model_validate(
                    {kind: {"urlFrom" if kind == "webhook" else "webhookUrlFrom": {"env": kind.upper()}}}
                ),
                resolver=resolver,
                ref=f"notify[{index}]",
            )
            for index, kind in enumerate(KINDS)
        ]
        dispatcher = NotificationDispatcher([*destinations, events_destination(api, resolver=resolver)])
        reconciler = Reconciler(
            inference_services=InferenceServiceClient(api),
            store=ConfigMapStateStore(api),
            # No Prometheus answers there: the rollout holds its first step.
            evidence=PrometheusEvidenceSource(
                PrometheusConfig(url=f"http://127.0.0.1:{free_port()}", timeout=1)
            ),
            dispatcher=dispatcher,
            metrics=ControllerMetrics(),
            clock=lambda: datetime.now(UTC),
        )
        policy = load_text(valid_policy("llama")).policies[0]
        store = ConfigMapStateStore(api)
        try:
            _until(emulator, reconciler, policy, store, lambda state: state.revision == STABLE)  # v1 adopted
            custom.patch_namespaced_custom_object(
                "serving.kserve.io",
                "v1beta1",
                "ml",
                "inferenceservices",
                "llama",
                {"spec": {"predictor": {"model": {"storageUri": CANARY_URI}}}},
            )
            state = _until(
                emulator,
                reconciler,
                policy,
                store,
                lambda state: state.revision == CANARY and state.phase is Phase.PROGRESSING,
            )
            home = tmp_path / "home"
            home.mkdir()
            yield Rollout(kubeconfig, home, api, receiver, state)
        finally:
            dispatcher.close(5)
            receiver.stop()


def _until(
    emulator: Emulator,
    reconciler: Reconciler,
    policy: Any,
    store: ConfigMapStateStore,
    done: Callable[[RolloutState], bool],
) -> RolloutState:
    """Reconcile as the controller does until the stored state is ``done``."""
    for _ in range(100):
        emulator.settle()
        assert reconciler.reconcile(policy).error is None
        stored = store.load("ml", "llama")
        if stored.state_json is not None and done(state := stored.state()):
            return state
        time.sleep(0.05)
    raise AssertionError(f"the state never got there: {store.load('ml', 'llama').state_json}")


def _wait_for_all_kinds(receiver: Receiver) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if all(any(r.path == f"/{kind}" for r in receiver.requests) for kind in KINDS):
            return
        time.sleep(0.05)
    raise AssertionError(f"not every destination was told: {[r.path for r in receiver.requests]}")


def _text_of(body: Any) -> str:
    return json.dumps(body, ensure_ascii=False)


def test_the_state_records_both_artefacts_without_their_credentials(rollout: Rollout) -> None:
    state = rollout.state
    assert (state.revision, state.stable_revision) == (CANARY, STABLE)
    assert state.artefact is not None and state.stable_artefact is not None
    assert state.artefact.describe() == CANARY_SHOWN
    assert state.stable_artefact.describe() == STABLE_SHOWN
    assert not any(secret in state.to_json() for secret in SECRETS)


def test_status_wide_json_and_explain_name_both_artefacts(rollout: Rollout) -> None:
    wide = rollout.cli("status", "-o", "wide").splitlines()
    assert wide[0].split()[7:12] == ["COMMAND", "CANARY", "ARTEFACT", "STABLE", "STABLE"], wide[0]
    assert CANARY_SHOWN in wide[1] and STABLE_SHOWN in wide[1] and STABLE in wide[1]
    (row,) = json.loads(rollout.cli("status", "-o", "json"))
    assert row["stableRevision"] == STABLE
    assert row["canaryArtefact"] == {
        "storageUri": "s3://models/llama/v2",
        "image": None,
        "runtime": "kserve-vllm",
        "modelFormat": "huggingface:1",
    }
    assert row["stableArtefact"]["storageUri"] == "https://models.example.com/llama/v1"
    explained = rollout.cli("explain", "ml/llama")
    assert f"canary {CANARY} serves {CANARY_SHOWN}" in explained
    assert f"stable {STABLE} serves {STABLE_SHOWN}" in explained
    everything = "\n".join(wide) + explained + rollout.cli("explain", "ml/llama", "-o", "json")
    assert not any(secret in everything for secret in SECRETS)


def test_the_report_names_both_artefacts(rollout: Rollout, tmp_path: Path) -> None:
    page_path = tmp_path / "report.html"
    rollout.cli("report", "ml/llama", "--no-charts", "-o", str(page_path))
    page = page_path.read_text()
    assert f"<th>canary serves</th><td>{CANARY_SHOWN}</td>" in page
    assert f"<th>stable serves</th><td>{STABLE_SHOWN}</td>" in page
    assert not any(secret in page for secret in SECRETS)


def test_every_notification_and_the_event_name_both_artefacts(rollout: Rollout) -> None:
    _wait_for_all_kinds(rollout.receiver)
    (webhook, *_) = [body for body in rollout.bodies("webhook") if body["reason"] == "CanaryStarted"]
    assert webhook["artefacts"] == {
        "canary": {
            "storageUri": "s3://models/llama/v2",
            "image": None,
            "runtime": "kserve-vllm",
            "modelFormat": "huggingface:1",
        },
        "stable": {
            "storageUri": "https://models.example.com/llama/v1",
            "image": None,
            "runtime": "kserve-vllm",
            "modelFormat": "huggingface:1",
        },
    }
    for kind in ("slack", "teams", "discord"):
        started = [body for body in rollout.bodies(kind) if CANARY in _text_of(body)]
        assert started, kind
        text = _text_of(started[-1]).replace("\\\\", "")  # Teams escapes Markdown: "s3\\://"
        assert CANARY_SHOWN in text and STABLE_SHOWN in text, (kind, text)
    for request in rollout.receiver.requests:
        assert not any(secret in request.body.decode() for secret in SECRETS), request.path
    events = client.CoreV1Api(rollout.api).list_namespaced_event("ml").items
    started_events = [event.message for event in events if event.reason == "CanaryStarted"]
    assert (
        started_events
        and f"Canary {CANARY} ({CANARY_SHOWN}), stable {STABLE} ({STABLE_SHOWN})" in (started_events[-1])
    )
    assert not any(secret in (event.message or "") for event in events for secret in SECRETS)


def test_a_state_written_before_artefacts_were_recorded_reads_as_unknown(cluster: Any) -> None:
    # Before artefacts were recorded: no ``artefact`` nor ``stableArtefact`` in state.json.
    current = json.loads(replace(progressing(CANARY), stable_revision=STABLE).to_json())
    old = {key: value for key, value in current.items() if key not in {"artefact", "stableArtefact"}}
    cluster.save("ml", "llama", {"state.json": json.dumps(old)})
    done = run("status", "-o", "wide", home=cluster.home, KUBECONFIG=str(cluster.kubeconfig), COLUMNS="400")
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[1]
    assert row.count(" unknown ") == 2, row
    explained = run("explain", "ml/llama", home=cluster.home, KUBECONFIG=str(cluster.kubeconfig))
    assert f"canary {CANARY} serves unknown" in explained.stdout, explained.stdout
    assert f"stable {STABLE} serves unknown" in explained.stdout
