"""The Kubernetes edge against the API emulator over HTTP: the InferenceService client, the state
store and leader election — each of the guarantees the reconciler relies on."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.emulator.clock import ManualClock
from canary_sandbox.stack import inference_service
from kubernetes import client, config

from canary.controller.leader import LeaderElector, NotLeader
from canary.kserve.admitted import list_states
from canary.kserve.client import ConflictError, InferenceServiceClient
from canary.kserve.store import (
    COMMAND_KEY,
    MAX_STATE_BYTES,
    ConfigMapStateStore,
    StateTooLarge,
    state_configmap_name,
)
from canary.kserve.view import observe
from canary.policy import load_text
from canary.rollout import Action, CommandKind, RolloutState, apply_command, decide
from canary.rollout.records import CommandRequest, ExplainCheck, ExplainDocument
from tests.policy.support import valid_policy


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Emulator, client.ApiClient]]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0))
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace("ml")
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        yield emulator, api


def create_isvc(api: client.ApiClient, name: str = "llama") -> dict[str, object]:
    created: dict[str, object] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", "ml", "inferenceservices", inference_service("ml", name, "s3://m/v1")
    )
    return created


def test_set_canary_percent_writes_only_that_field(manual_cluster: tuple[Emulator, client.ApiClient]) -> None:
    emulator, api = manual_cluster
    create_isvc(api)
    emulator.settle()  # KServe's status is written now; with time stopped nothing changes it meanwhile
    isvcs = InferenceServiceClient(api)
    current = isvcs.get("ml", "llama")
    assert current is not None
    patched = isvcs.set_canary_percent("ml", "llama", 10, current["metadata"]["resourceVersion"])
    assert patched["spec"]["predictor"]["canaryTrafficPercent"] == 10
    write = emulator.requests.entries(method="PATCH")[-1]
    assert write.content_type == "application/merge-patch+json"
    assert write.changed_paths == ("spec.predictor.canaryTrafficPercent",)
    promoted = isvcs.set_canary_percent("ml", "llama", None, patched["metadata"]["resourceVersion"])
    assert "canaryTrafficPercent" not in promoted["spec"]["predictor"]


def test_a_stale_read_gets_a_conflict_not_an_overwrite(
    manual_cluster: tuple[Emulator, client.ApiClient],
) -> None:
    emulator, api = manual_cluster
    create_isvc(api)
    emulator.settle()  # only the test's own writes change the object from here on
    isvcs = InferenceServiceClient(api)
    stale = isvcs.get("ml", "llama")
    assert stale is not None
    isvcs.set_canary_percent("ml", "llama", 40, stale["metadata"]["resourceVersion"])  # someone else
    with pytest.raises(ConflictError):
        isvcs.set_canary_percent("ml", "llama", 10, stale["metadata"]["resourceVersion"])
    fresh = isvcs.get("ml", "llama")
    assert fresh is not None
    assert fresh["spec"]["predictor"]["canaryTrafficPercent"] == 40


def test_percentages_outside_0_to_100_are_never_sent(cluster: tuple[Emulator, client.ApiClient]) -> None:
    emulator, api = cluster
    create_isvc(api)
    with pytest.raises(ValueError, match="0..100"):
        InferenceServiceClient(api).set_canary_percent("ml", "llama", 150, "1")
    assert emulator.requests.entries(method="PATCH") == []


def test_missing_inference_service_reads_as_none(cluster: tuple[Emulator, client.ApiClient]) -> None:
    _, api = cluster
    assert InferenceServiceClient(api).get("ml", "nope") is None


def test_state_store_round_trip_with_resource_version_preconditions(
    cluster: tuple[Emulator, client.ApiClient],
) -> None:
    _, api = cluster
    isvc = create_isvc(api)
    store = ConfigMapStateStore(api)
    assert store.load("ml", "llama").state_json is None
    uid = str(isvc["metadata"]["uid"])  # type: ignore[index]
    first, second = RolloutState(revision="r1"), RolloutState(revision="r2")
    version = store.save("ml", "llama", first, resource_version=None, owner_uid=uid)
    loaded = store.load("ml", "llama")
    assert (loaded.state(), loaded.resource_version) == (first, version)
    store.save("ml", "llama", second, resource_version=version, owner_uid=uid)
    with pytest.raises(ConflictError):
        store.save("ml", "llama", RolloutState(), resource_version=version, owner_uid=uid)
    with pytest.raises(ConflictError):  # creating what exists is a conflict too
        store.save("ml", "llama", RolloutState(), resource_version=None, owner_uid=uid)
    assert store.load("ml", "llama").state() == second
    assert [(s.namespace, s.inference_service) for s in list_states(api, None, ignored=lambda *_: None)] == [
        ("ml", "llama")
    ]


def test_state_is_deleted_with_its_inference_service(cluster: tuple[Emulator, client.ApiClient]) -> None:
    emulator, api = cluster
    isvc = create_isvc(api)
    ConfigMapStateStore(api).save(
        "ml", "llama", RolloutState(), resource_version=None, owner_uid=str(isvc["metadata"]["uid"])
    )  # type: ignore[index]
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        "serving.kserve.io", "v1beta1", "ml", "inferenceservices", "llama"
    )
    emulator.settle()
    with pytest.raises(client.ApiException) as missing:
        client.CoreV1Api(api).read_namespaced_config_map(state_configmap_name("llama"), "ml")
    assert missing.value.status == 404


def test_an_operator_command_written_meanwhile_makes_the_save_conflict(
    cluster: tuple[Emulator, client.ApiClient],
) -> None:
    _, api = cluster
    store = ConfigMapStateStore(api)
    version = store.save("ml", "llama", RolloutState(), resource_version=None, owner_uid=None)
    store.request_command("ml", "llama", CommandRequest(CommandKind.PAUSE, by="alice"))
    assert store.load("ml", "llama").command() == CommandRequest(CommandKind.PAUSE, by="alice")
    with pytest.raises(ConflictError):  # the controller read before the command: it must re-read
        store.save("ml", "llama", RolloutState(), resource_version=version, owner_uid=None)
    fresh = store.load("ml", "llama")
    store.save("ml", "llama", RolloutState(), resource_version=fresh.resource_version, owner_uid=None)
    assert store.load("ml", "llama").command() is None, "a saved state consumes the command"
    raw = client.CoreV1Api(api).read_namespaced_config_map(state_configmap_name("llama"), "ml")
    assert COMMAND_KEY not in (raw.data or {})


def test_a_command_for_an_unknown_rollout_is_a_clear_error(
    cluster: tuple[Emulator, client.ApiClient],
) -> None:
    _, api = cluster
    with pytest.raises(LookupError, match="no rollout state for ml/ghost"):
        ConfigMapStateStore(api).request_command("ml", "ghost", CommandRequest(CommandKind.ABORT))


def test_state_larger_than_the_bound_is_refused(cluster: tuple[Emulator, client.ApiClient]) -> None:
    _, api = cluster
    with pytest.raises(StateTooLarge):
        ConfigMapStateStore(api).save(
            "ml", "llama", RolloutState(revision="x" * 600_000), resource_version=None, owner_uid=None
        )


class FakeTime:
    """Wall and monotonic time that tests move by hand (the elector's only clocks)."""

    def __init__(self) -> None:
        self.wall = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)
        self.mono = 1000.0

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds


def elector(api: client.ApiClient, identity: str, clock: FakeTime) -> LeaderElector:
    return LeaderElector(
        api,
        name="kserve-canary",
        namespace="ml",
        identity=identity,
        lease_duration=15,
        renew_deadline=10,
        retry_period=2,
        wall_clock=lambda: clock.wall,
        monotonic=lambda: clock.mono,
    )


def test_exactly_one_of_two_replicas_leads_and_only_it_may_write(
    cluster: tuple[Emulator, client.ApiClient],
) -> None:
    _, api = cluster
    clock = FakeTime()
    first, second = elector(api, "a", clock), elector(api, "b", clock)
    assert first.try_acquire_or_renew()
    assert not second.try_acquire_or_renew()
    assert (first.is_leader, second.is_leader) == (True, False)
    first.fence()
    with pytest.raises(NotLeader):
        second.fence()


def test_a_leader_that_stops_renewing_is_fenced_before_its_lease_expires(
    cluster: tuple[Emulator, client.ApiClient],
) -> None:
    _, api = cluster
    clock = FakeTime()
    first, second = elector(api, "a", clock), elector(api, "b", clock)
    assert first.try_acquire_or_renew()
    clock.advance(11)  # past the renew deadline, not yet past the lease duration
    with pytest.raises(NotLeader, match="not renewed"):
        first.fence()
    assert not second.try_acquire_or_renew(), "the lease is still valid for everyone else"
    clock.advance(5)  # now expired: the other replica takes over
    assert second.try_acquire_or_renew()
    second.fence()


def test_a_lease_taken_over_behind_our_back_fences_the_old_leader(
    cluster: tuple[Emulator, client.ApiClient],
) -> None:
    _, api = cluster
    clock = FakeTime()
    first = elector(api, "a", clock)
    assert first.try_acquire_or_renew()
    coordination = client.CoordinationV1Api(api)
    lease = coordination.read_namespaced_lease("kserve-canary", "ml")
    assert lease.spec is not None
    lease.spec.holder_identity = "intruder"
    coordination.replace_namespaced_lease("kserve-canary", "ml", lease)
    with pytest.raises(NotLeader, match="intruder"):
        first.fence()


def test_releasing_the_lease_lets_the_standby_take_over_at_once(
    cluster: tuple[Emulator, client.ApiClient],
) -> None:
    _, api = cluster
    clock = FakeTime()
    first, second = elector(api, "a", clock), elector(api, "b", clock)
    assert first.try_acquire_or_renew()
    first.release()
    assert not first.is_leader
    assert second.try_acquire_or_renew(), "no need to wait for the lease to expire"
    lease = client.CoordinationV1Api(api).read_namespaced_lease("kserve-canary", "ml")
    assert lease.spec is not None
    assert (lease.spec.holder_identity, lease.spec.lease_transitions) == ("b", 1)


@pytest.fixture
def manual_cluster(tmp_path: Path) -> Iterator[tuple[Emulator, client.ApiClient]]:
    """A cluster whose time moves only when a test says so (revisions become Ready on ``advance``)."""
    emulator = Emulator(KServeConfig(reconcile_delay=0.0), ManualClock())
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace("ml")
        yield emulator, config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("promote", [False, True], ids=["start", "promote"])
def test_the_client_sends_exactly_the_decisions_patch(
    manual_cluster: tuple[Emulator, client.ApiClient], promote: bool
) -> None:
    """What the apiserver receives is ``Decision.patch``, once parsed: there is no second recipe."""
    emulator, api = manual_cluster
    create_isvc(api)
    emulator.advance(5)  # v1 Ready and rolled out
    isvcs = InferenceServiceClient(api)
    policy = load_text(valid_policy("llama")).policies[0].policy
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    watching = decide(policy, observe(isvcs.get("ml", "llama")), RolloutState(), None, now).new_state
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "serving.kserve.io",
        "v1beta1",
        "ml",
        "inferenceservices",
        "llama",
        {"spec": {"predictor": {"model": {"storageUri": "s3://m/v2"}}}},
        _content_type="application/merge-patch+json",
    )
    emulator.settle()  # v2 created, not Ready yet
    observed = observe(isvcs.get("ml", "llama"))
    decision = decide(policy, observed, watching, None, now)
    assert decision.action is Action.START
    if promote:
        # An operator's promote of the started rollout, once the write above has landed.
        isvcs.apply_patch("ml", "llama", decision.patch or {})
        emulator.advance(5)
        commanded = apply_command(decision.new_state, CommandKind.PROMOTE, now, by="alice").state
        observed = observe(isvcs.get("ml", "llama"))
        decision = decide(policy, observed, commanded, None, now + timedelta(seconds=1))
        assert decision.action is Action.PROMOTE
    assert decision.patch is not None
    assert decision.patch["metadata"] == {"resourceVersion": observed.resource_version}
    mark = len(emulator.requests.entries())
    isvcs.apply_patch("ml", "llama", decision.patch)
    (sent,) = [entry for entry in emulator.requests.entries(since=mark) if entry.method == "PATCH"]
    assert sent.body == decision.patch
    assert sent.changed_paths == ("spec.predictor.canaryTrafficPercent",)


def test_any_other_patch_is_refused_before_it_is_sent(cluster: tuple[Emulator, client.ApiClient]) -> None:
    emulator, api = cluster
    create_isvc(api)
    isvcs = InferenceServiceClient(api)
    for patch in (
        {"spec": {"predictor": {"canaryTrafficPercent": 10}}},  # no precondition
        {"metadata": {"resourceVersion": ""}, "spec": {"predictor": {"canaryTrafficPercent": 10}}},
        {"metadata": {"resourceVersion": "1", "annotations": {"a": "b"}}, "spec": {"predictor": {}}},
        {"metadata": {"resourceVersion": "1"}, "spec": {"predictor": {"canaryTrafficPercent": True}}},
        {"metadata": {"resourceVersion": "1"}, "spec": {"predictor": {"canaryTrafficPercent": -1}}},
    ):
        with pytest.raises(ValueError, match=r"canaryTrafficPercent|resourceVersion"):
            isvcs.apply_patch("ml", "llama", patch)
    assert emulator.requests.entries(method="PATCH") == []


def test_an_evaluation_too_large_to_store_is_shortened_to_fit_and_says_what_it_left_out(
    cluster: tuple[Emulator, client.ApiClient],
) -> None:
    # 400 custom checks with 2 kB of PromQL each: about 1.6 MB of queries, three times the state's
    # bound. Before, the write was refused and the rollout stuck at its step, logging "reconcile failed".
    promql = 'sum(rate(x{pod=~"{{ revision }}-.*"}[5m])) + ' * 45
    checks = tuple(
        ExplainCheck(
            name=f"c{index}",
            verdict="fail" if index == 399 else "pass",
            value=1.0,
            limit="≤ 2",
            query=promql,
            canary_query=promql,
            detail="d" * 2000,
        )
        for index in range(400)
    )
    document = ExplainDocument(
        at=datetime.now(UTC), decision_id="d1", reasons=("holding step 1",), checks=checks
    )
    assert len(document.to_json()) > 2 * MAX_STATE_BYTES
    _, api = cluster
    store = ConfigMapStateStore(api)
    state = RolloutState(revision="llama-predictor-00002")
    store.save("ml", "llama", state, resource_version=None, owner_uid=None, explain=document)
    stored = store.load("ml", "llama").explain()
    assert stored is not None
    assert stored.reasons[0] == "holding step 1"
    assert stored.reasons[-1].startswith("This record was shortened to fit the state ConfigMap: every query")
    assert stored.checks[-1].name == "c399", "the failing check is kept"
    kept = len(stored.checks)
    assert 0 < kept < 400
    assert stored.reasons[-1].endswith(f"and {400 - kept} of 400 checks left out.")
    # A record that fits is stored whole.
    small = ExplainDocument(at=datetime.now(UTC), decision_id="d2", checks=checks[:3])
    stored_files = store.load("ml", "llama")
    store.save(
        "ml", "llama", state, resource_version=stored_files.resource_version, owner_uid=None, explain=small
    )
    assert store.load("ml", "llama").explain() == small
