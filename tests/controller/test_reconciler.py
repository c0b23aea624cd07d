"""The reconciler against the API emulator over HTTP: what it does with states it cannot trust.

Evidence comes from a real Prometheus-shaped source pointed at a closed port: none of these paths
may need it, and if one did, its answer would be a query error (never a decision).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.faultproxy import FaultProxy, ProxyFault
from canary_sandbox.prometheus import free_port
from canary_sandbox.stack import inference_service
from kubernetes import client, config

from canary.controller.observability import ControllerMetrics
from canary.controller.reconciler import Reconciler
from canary.evidence import Evidence, EvidenceRequest
from canary.kserve.client import InferenceServiceClient
from canary.kserve.store import COMMAND_KEY, EXPLAIN_KEY, STATE_KEY, ConfigMapStateStore
from canary.metrics.client import PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.notify import Notification, NotificationDispatcher
from canary.policy import load_text
from canary.rollout.persistence import text_shape
from canary.rollout.records import ExplainFormatError
from canary.rollout.state import Phase, RolloutState
from canary.rollout.vocabulary import NotificationAction
from tests.policy.support import valid_policy
from tests.rollout.helpers import EvidenceMaker

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


@contextlib.contextmanager
def serving(tmp_path: Path, kserve: KServeConfig) -> Iterator[tuple[Emulator, client.ApiClient]]:
    """The API emulator over HTTP, with ml/llama serving s3://m/v1."""
    emulator = Emulator(kserve)
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
        yield emulator, api


def unreachable_prometheus_reconciler(
    api: client.ApiClient, dispatcher: NotificationDispatcher, metrics: ControllerMetrics
) -> Reconciler:
    """A reconciler at ``NOW`` whose Prometheus is a free port (every query fails fast)."""
    return Reconciler(
        inference_services=InferenceServiceClient(api),
        store=ConfigMapStateStore(api),
        evidence=PrometheusEvidenceSource(PrometheusConfig(url=f"http://127.0.0.1:{free_port()}", timeout=1)),
        dispatcher=dispatcher,
        metrics=metrics,
        clock=lambda: NOW,
    )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Emulator, client.ApiClient, Reconciler, NotificationDispatcher]]:
    with serving(tmp_path, KServeConfig(reconcile_delay=0.0)) as (emulator, api):
        dispatcher = NotificationDispatcher()
        reconciler = unreachable_prometheus_reconciler(api, dispatcher, ControllerMetrics())
        try:
            yield emulator, api, reconciler, dispatcher
        finally:
            dispatcher.close(1)


def policy_for_llama() -> object:
    return load_text(valid_policy("llama")).policies[0]


def test_a_corrupt_state_is_reported_never_overwritten_and_nothing_is_written(
    world: tuple[Emulator, client.ApiClient, Reconciler, NotificationDispatcher],
) -> None:
    emulator, api, reconciler, _ = world
    ConfigMapStateStore(api).save_files(
        "ml", "llama", {STATE_KEY: "{not json"}, resource_version=None, owner_uid=None
    )
    mark = len(emulator.requests.entries())
    outcome = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert outcome.error is not None
    assert "not valid JSON" in outcome.error
    assert [n.reason for n in outcome.notifications] == ["StateUnreadable"]
    assert "kserve-canary-llama" in outcome.notifications[0].summary
    writes = [e for e in emulator.requests.entries(since=mark) if e.method in {"PUT", "PATCH", "POST"}]
    assert writes == [], "neither the state nor the InferenceService may be written"
    assert ConfigMapStateStore(api).load("ml", "llama").state_json == "{not json"
    again = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert again.notifications == [], "said once, not every interval"


def test_a_state_from_a_newer_controller_is_refused_clearly(
    world: tuple[Emulator, client.ApiClient, Reconciler, NotificationDispatcher],
) -> None:
    _, api, reconciler, _ = world
    ConfigMapStateStore(api).save_files(
        "ml",
        "llama",
        {STATE_KEY: json.dumps({"schemaVersion": 99, "phase": "Progressing"})},
        resource_version=None,
        owner_uid=None,
    )
    outcome = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert outcome.error is not None
    assert "99" in outcome.error


def test_a_first_look_stores_the_state_next_to_the_inference_service(
    world: tuple[Emulator, client.ApiClient, Reconciler, NotificationDispatcher],
) -> None:
    emulator, api, reconciler, _ = world
    outcome = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert outcome.error is None
    assert outcome.wrote_state
    assert not outcome.patched
    stored = ConfigMapStateStore(api).load("ml", "llama")
    assert stored.state_json is not None
    assert stored.state().phase is Phase.IDLE
    configmap = client.CoreV1Api(api).read_namespaced_config_map("kserve-canary-llama", "ml")
    owner = (configmap.metadata.owner_references or [])[0]
    assert (owner.kind, owner.name, owner.block_owner_deletion) == ("InferenceService", "llama", False)
    assert emulator.revision_count("ml", "llama") == 1


def test_a_removed_policy_pauses_an_active_rollout_and_never_rolls_it_back(
    world: tuple[Emulator, client.ApiClient, Reconciler, NotificationDispatcher],
) -> None:
    emulator, api, reconciler, _ = world
    store = ConfigMapStateStore(api)
    active = RolloutState(phase=Phase.PROGRESSING, revision="llama-predictor-00002")
    store.save("ml", "llama", active, resource_version=None, owner_uid=None)
    mark = len(emulator.requests.entries())
    reconciler.pause_removed(policy_for_llama().policy)  # type: ignore[attr-defined]
    state = store.load("ml", "llama").state()
    assert state.phase is Phase.PAUSED
    assert state.pause is not None
    assert "policy removed" in state.pause.reason
    isvc_writes = [
        e
        for e in emulator.requests.entries(since=mark)
        if "/inferenceservices/" in e.path and e.method != "GET"
    ]
    assert isvc_writes == []


DEEP = "[" * 100_000 + "]" * 100_000  # json gives up with RecursionError, not ValueError


@pytest.mark.parametrize(
    ("text", "says"), [(DEEP, "nested too deeply"), ("[1, 2]", "not a JSON object"), ('"x"', "found str")]
)
def test_a_hostile_state_json_is_a_format_error_and_nothing_is_written(
    world: tuple[Emulator, client.ApiClient, Reconciler, NotificationDispatcher], text: str, says: str
) -> None:
    emulator, api, reconciler, _ = world
    ConfigMapStateStore(api).save_files(
        "ml", "llama", {STATE_KEY: text}, resource_version=None, owner_uid=None
    )
    mark = len(emulator.requests.entries())
    outcome = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert outcome.error is not None
    assert says in outcome.error
    assert [e for e in emulator.requests.entries(since=mark) if e.method in {"PUT", "PATCH", "POST"}] == []


@pytest.mark.parametrize("text", [DEEP, "[1, 2]", "null", '{"command": "explode"}'])
def test_a_hostile_command_json_is_ignored_and_consumed(
    world: tuple[Emulator, client.ApiClient, Reconciler, NotificationDispatcher], text: str
) -> None:
    _, api, reconciler, _ = world
    store = ConfigMapStateStore(api)
    first = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert first.error is None
    before = store.load("ml", "llama").state()
    client.CoreV1Api(api).patch_namespaced_config_map(
        "kserve-canary-llama",
        "ml",
        {"data": {COMMAND_KEY: text}},
        _content_type="application/merge-patch+json",
    )
    outcome = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert outcome.error is None
    assert outcome.wrote_state, "saving the state consumes the command"
    after = store.load("ml", "llama")
    assert after.command_json is None
    assert after.state().phase is before.phase


@pytest.mark.parametrize("text", [DEEP, "[1, 2]", '{"at": "yesterday"}'])
def test_a_hostile_explain_json_never_stops_a_reconcile(
    world: tuple[Emulator, client.ApiClient, Reconciler, NotificationDispatcher], text: str
) -> None:
    _, api, reconciler, _ = world
    store = ConfigMapStateStore(api)
    store.save_files(
        "ml",
        "llama",
        {STATE_KEY: RolloutState().to_json(), EXPLAIN_KEY: text},
        resource_version=None,
        owner_uid=None,
    )
    outcome = reconciler.reconcile(policy_for_llama())  # type: ignore[arg-type]
    assert outcome.error is None
    assert outcome.decision is not None
    with pytest.raises(ExplainFormatError, match=r"explain\.json"):
        store.load("ml", "llama").explain()


class _MadeEvidence:
    """Prometheus' side of the edge, with chosen values (tests.rollout.helpers.EvidenceMaker)."""

    def __init__(self, maker: EvidenceMaker) -> None:
        self.maker = maker

    def collect(self, policy: object, request: EvidenceRequest) -> Evidence:
        return self.maker(request)


def rolling_out_v2(
    api: client.ApiClient, evidence: _MadeEvidence, offset: list[timedelta]
) -> tuple[Reconciler, object]:
    """A reconciler whose clock is the real time moved on by ``offset[0]``, after its first look at
    ml/llama, and llama's spec changed to s3://m/v2 (the rollout the next reconciles start)."""
    reconciler = Reconciler(
        inference_services=InferenceServiceClient(api),
        store=ConfigMapStateStore(api),
        evidence=evidence,
        dispatcher=NotificationDispatcher(),
        metrics=ControllerMetrics(),
        clock=lambda: datetime.now(UTC) + offset[0],
    )
    loaded = policy_for_llama()
    reconciler.reconcile(loaded)  # type: ignore[arg-type]
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", "ml", "inferenceservices", "llama",
        {"spec": {"predictor": {"model": {"storageUri": "s3://m/v2"}}}},
    )  # fmt: skip
    return reconciler, loaded


def test_a_hold_that_repeats_is_logged_at_debug_and_every_change_at_info(tmp_path: Path) -> None:
    """33 lines a second at 1,000 rollouts said nothing new: a repeated hold goes to debug; the first
    evaluation, another verdict and an action stay at info, each with its numbers."""
    evidence = _MadeEvidence(EvidenceMaker())
    offset = [timedelta()]  # the controller's clock: the real time (the emulator's), moved on by hand
    kserve = KServeConfig(reconcile_delay=0.0, revision_ready_delay=0.0)
    with serving(tmp_path, kserve) as (emulator, api):
        reconciler, loaded = rolling_out_v2(api, evidence, offset)
        emulator.settle()
        decisions: list[dict[str, object]] = []
        with structlog.testing.capture_logs() as logs:
            store = ConfigMapStateStore(api)
            for _ in range(100):  # until the first step holds (KServe made v2 Ready, in real time)
                reconciler.reconcile(loaded)  # type: ignore[arg-type]
                emulator.settle()
                step = store.load("ml", "llama").state().step
                if step is not None and step.started_at is not None:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(store.load("ml", "llama").state_json)
            for _ in range(8):
                reconciler.reconcile(loaded)  # type: ignore[arg-type]
                emulator.settle()
                offset[0] += timedelta(minutes=1)  # the policy's interval
            evidence.maker = EvidenceMaker().failing(p99=2.0)  # a regression: another verdict
            reconciler.reconcile(loaded)  # type: ignore[arg-type]
        decisions = [line for line in logs if line.get("decisionId")]
    evaluated = [line for line in decisions if line.get("verdict")]
    shown = [(line["log_level"], line["action"], line["verdict"], line["reasons"]) for line in evaluated]
    assert len(evaluated) >= 6, shown
    assert evaluated[0]["log_level"] == "info", "the first evaluation is news"

    def said(line: dict[str, object]) -> object:  # what a reader learns, numbers and durations aside
        reasons = sorted(text_shape(str(reason)) for reason in line["reasons"])  # type: ignore[attr-defined]
        return line["verdict"], {name: check["verdict"] for name, check in line["checks"].items()}, reasons  # type: ignore[attr-defined]

    for previous, line in itertools.pairwise(evaluated):
        expected = "debug" if line["action"] == "wait" and said(line) == said(previous) else "info"
        assert line["log_level"] in ({"debug"} if expected == "debug" else {"info", "warning"}), shown
    assert sum(line["log_level"] == "debug" for line in evaluated) >= 3, shown
    assert all(line["checks"] for line in evaluated), "every line, at any level, carries its numbers"
    last = evaluated[-1]
    assert last["verdict"] == "fail" and last["log_level"] in {"info", "warning"}, last
    started = [line for line in decisions if line["action"] != "wait"]
    assert started and all(line["log_level"] != "debug" for line in started)


def test_a_forgotten_rollout_drops_its_series(tmp_path: Path) -> None:
    """Its policy removed (or its shard regained by another replica): the gauges it exported go,
    so dashboards show no ghost of a rollout nobody drives."""
    with serving(tmp_path, KServeConfig(reconcile_delay=0.0)) as (_, api):
        dispatcher = NotificationDispatcher()
        metrics = ControllerMetrics()
        reconciler = unreachable_prometheus_reconciler(api, dispatcher, metrics)
        try:
            loaded = policy_for_llama()
            outcome = reconciler.reconcile(loaded)  # type: ignore[arg-type]
            assert outcome.error is None

            def llama_metrics() -> set[str]:
                return {
                    line.split("{")[0]
                    for line in metrics.exposition().decode().splitlines()
                    if 'inference_service="llama"' in line and not line.startswith("#")
                }

            assert {"kserve_canary_rollout_phase", "kserve_canary_rollout_weight"} <= llama_metrics()
            reconciler.forget("ml/llama")
            # What is left is the decisions counter: a count of what happened, never a ghost state.
            assert llama_metrics() <= {"kserve_canary_decisions_total", "kserve_canary_decisions_created"}
        finally:
            dispatcher.close(1)


def test_a_write_whose_answer_was_lost_is_told_once_with_the_numbers_of_its_evaluation(
    tmp_path: Path,
) -> None:
    """The patch lands, its answer does not: the reconcile ends in an error before its log line and
    notification. The next one finds the write in the spec and tells it — once, with the decision's
    id and the verdict and requests of the evaluation that made it — while a write that was told
    (the first advance) is never told again."""
    evidence = _MadeEvidence(EvidenceMaker())
    offset = [timedelta()]
    kserve = KServeConfig(reconcile_delay=0.0, revision_ready_delay=0.0)
    with serving(tmp_path, kserve) as (emulator, direct), FaultProxy(direct.configuration.host) as proxy:
        api = client.ApiClient(client.Configuration(host=proxy.url))
        reconciler, loaded = rolling_out_v2(api, evidence, offset)
        emulator.settle()
        told: list[Notification] = []
        errors: list[Exception] = []
        after_loss = 0
        with structlog.testing.capture_logs() as logs:
            for _ in range(300):
                try:
                    outcome = reconciler.reconcile(loaded)  # type: ignore[arg-type]
                except Exception as error:
                    errors.append(error)
                else:
                    if outcome.error is not None:
                        errors.append(RuntimeError(outcome.error))
                    told.extend(outcome.notifications)
                    if outcome.decision is not None and outcome.decision.weight == 30 and outcome.patched:
                        # The next write to the InferenceService lands; its answer is lost.
                        proxy.add(
                            ProxyFault.drop_response(),
                            path=r"/inferenceservices/llama$",
                            method="PATCH",
                            count=1,
                        )
                emulator.settle()
                after_loss += bool(errors)
                if after_loss > 6:
                    break
                time.sleep(0.02)  # KServe makes the revision Ready in real time
                offset[0] += timedelta(minutes=1)
            else:
                raise AssertionError(f"no lost answer: {[n.summary for n in told]}")
    assert len(errors) == 1, errors
    advances = [n for n in told if n.action is NotificationAction.ADVANCED]
    assert [(n.from_weight, n.to_weight) for n in advances] == [(10, 30), (30, 50)], [n.summary for n in told]
    lines = {line["decisionId"]: line for line in logs if line.get("action") == "advance"}
    landed = lines[advances[1].id]
    assert landed["weight"] == 50
    assert landed["verdict"] == "pass" and landed["requests"] >= 100, landed
    assert "Wrote canaryTrafficPercent 50%" in advances[1].summary
    assert "decided on a pass evaluation" in advances[1].summary
    spec = client.CustomObjectsApi(direct).get_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", "ml", "inferenceservices", "llama"
    )
    assert spec["spec"]["predictor"]["canaryTrafficPercent"] == 50  # type: ignore[index]
