"""The tick against the API emulator over HTTP, reading from the real watch caches: which rollouts are
due, one evidence collect for all of them, the budget and what it carries over, ownership.

The evidence source is a recording one written here (not our PrometheusEvidenceSource mocked): it
implements the TickEvidenceSource protocol, and answers every request with no data.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import structlog
from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig
from canary_sandbox.stack import inference_service
from kubernetes import client, config

from canary.controller.caches import CachedReads, WatchCache
from canary.controller.evidence import CollectEach, TickEvidenceSource
from canary.controller.leader import NotLeader
from canary.controller.observability import ControllerMetrics
from canary.controller.reconciler import Reconciler
from canary.controller.tick import TickRunner
from canary.evidence import REQUESTS, Evidence, EvidenceRequest, Measurement
from canary.kserve.admitted import ConfigMapLimits, list_our_configmaps
from canary.kserve.client import InferenceServiceClient
from canary.kserve.ledger_store import ConfigMapLedgerStore
from canary.kserve.store import (
    ConfigMapStateStore,
    read_configmap,
    watch_configmaps,
)
from canary.notify import NotificationDispatcher
from canary.policy import LoadedPolicy, PromotionPolicy, load_text
from canary.rollout.bookkeeping import TIMER_SLACK

NS = "ml"
MODELS = [f"m{index}" for index in range(6)]


def policy_text(name: str) -> str:
    return f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: {NS}}}
spec:
  target: {{inferenceService: {name}}}
  steps: [10, 50, 100]
  window: 5m
  interval: 1m
  minRequests: 100
  checks:
    - {{name: p99, metric: latency, quantile: 0.99, max: 2s}}
"""


class RecordingSource:
    """An EvidenceSource that remembers every call and answers "no requests yet"."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[str, datetime]]] = []
        self.alarms: set[tuple[str, str]] = set()  # what take_alarms reports next (once)
        self.alarms_in_sample: set[tuple[str, str]] = set()  # raised by the next collect_many
        self.watched: list[tuple[str, str, datetime]] = []  # watch_warm_up: (policy, revision, born)
        self.warm_up_samples: list[datetime] = []  # sample_warm_up calls
        self.alarms_in_warm_up_sample: set[tuple[str, str]] = set()  # raised by the next sample_warm_up

    def _answer(self, request: EvidenceRequest) -> Evidence:
        empty = Measurement.no_data("no requests in the window")
        return Evidence(request, {REQUESTS: empty, **{check.name: empty for check in request.checks}})

    def collect(self, policy: PromotionPolicy, request: EvidenceRequest) -> Evidence:
        self.calls.append([(policy.key, request.at)])
        return self._answer(request)

    def collect_many(self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]]) -> list[Evidence]:
        self.calls.append([(policy.key, request.at) for policy, request in rollouts])
        self.alarms |= self.alarms_in_sample
        self.alarms_in_sample = set()
        return [self._answer(request) for _, request in rollouts]

    def take_alarms(self) -> set[tuple[str, str]]:
        alarms, self.alarms = self.alarms, set()
        return alarms

    def watch_warm_up(self, policy: PromotionPolicy, revision: str, born: datetime, at: datetime) -> None:
        self.watched.append((policy.key, revision, born))

    def sample_warm_up(self, at: datetime) -> None:
        self.warm_up_samples.append(at)
        self.alarms |= self.alarms_in_warm_up_sample
        self.alarms_in_warm_up_sample = set()


@dataclass
class Clock:
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __call__(self) -> datetime:
        return self.now


@dataclass
class Owner:
    keys: set[str] | None = None  # None: every key
    fenced: list[str] = field(default_factory=list)

    def owns(self, key: str) -> bool:
        return self.keys is None or key in self.keys

    def fence(self, key: str) -> None:
        if not self.owns(key):
            raise NotLeader(f"{key} is not ours")
        self.fenced.append(key)


@dataclass
class World:
    emulator: Emulator
    api: client.ApiClient
    isvc_cache: WatchCache
    cm_cache: WatchCache
    reconciler: Reconciler
    source: RecordingSource
    clock: Clock
    owner: Owner
    policies: dict[str, LoadedPolicy]
    metrics: ControllerMetrics

    def runner(self, **kwargs: object) -> TickRunner:
        options: dict[str, object] = {
            "reconciler": self.reconciler,
            "evidence": self.source,
            "policy": self.policies.get,
            "ownership": self.owner,
            "metrics": self.metrics,
            "clock": self.clock,
            "period": 5.0,
            "synced": self.reconciler.reads.synced,
        }
        options.update(kwargs)
        runner = TickRunner(**options)  # type: ignore[arg-type]
        runner.sync({key: loaded.policy.spec.interval for key, loaded in self.policies.items()})
        return runner

    def push(self, name: str) -> None:
        client.CustomObjectsApi(self.api).patch_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", NS, "inferenceservices", name,
            {"spec": {"predictor": {"model": {"storageUri": "s3://m/v2"}}}},
        )  # fmt: skip

    def settle(self, runner: TickRunner, ticks: int = 20) -> None:
        """Tick (with KServe settling and the caches catching up) until every rollout holds its step."""
        for _ in range(ticks):
            for key in self.policies:
                runner.trigger(key)  # as the watch does when KServe changes the status
            runner.run_tick()
            self.emulator.settle()
            time.sleep(0.15)
            states = [self.reconciler.reads.state(NS, name) for name in MODELS]
            steps = [s.state().step if s.state_json else None for s in states]
            if all(step is not None and step.started_at is not None for step in steps):
                return
        raise AssertionError([s.state_json for s in (self.reconciler.reads.state(NS, n) for n in MODELS)])

    def holding(self, runner: TickRunner) -> None:
        """Every model on v2, holding its first step (the clock one interval and a second on): the
        rollouts are due at once, for their first evaluation."""
        _wait(lambda: self.reconciler.reads.synced(NS))
        runner.run_tick()  # first look: every model is idle on v1
        for name in MODELS:
            self.push(name)
        self.emulator.settle()
        self.settle(runner)
        self.clock.now += timedelta(minutes=1, seconds=1)

    def evaluated_once(self, runner: TickRunner) -> None:
        """As :meth:`holding`, then every rollout evaluated once (the runner knows their canaries)."""
        self.holding(runner)
        runner.run_tick()
        self.source.calls.clear()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    emulator = Emulator(KServeConfig(reconcile_delay=0.0, revision_ready_delay=0.0))
    stop = threading.Event()
    with EmulatorServer(emulator) as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        emulator.create_namespace(NS)
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        for name in MODELS:
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                "serving.kserve.io", "v1beta1", NS, "inferenceservices", inference_service(NS, name, "s3://m/v1")
            )  # fmt: skip
        emulator.settle()
        metrics = ControllerMetrics()
        metrics.count_api_requests(api)
        isvcs = InferenceServiceClient(api)
        core = client.CoreV1Api(api)
        isvc_cache = WatchCache(
            "InferenceService",
            lister=isvcs.list,
            watcher=lambda scope, version, seconds: isvcs.watch(scope, version, timeout_seconds=seconds),
            getter=isvcs.get,
            scopes=[NS],
        )
        cm_cache = WatchCache(
            "ConfigMap",
            lister=lambda scope: list_our_configmaps(
                api, scope, limits=ConfigMapLimits(), ignored=lambda *_: None
            ),
            watcher=lambda scope, version, seconds: watch_configmaps(
                api, scope, version, timeout_seconds=seconds
            ),
            getter=lambda namespace, name: read_configmap(core, namespace, name, 10.0),
            scopes=[NS],
        )
        threads = [
            threading.Thread(target=cache.run, args=(NS, stop), daemon=True)
            for cache in (isvc_cache, cm_cache)
        ]
        for thread in threads:
            thread.start()
        dispatcher = NotificationDispatcher()
        clock = Clock()
        owner = Owner()
        source = RecordingSource()
        reconciler = Reconciler(
            inference_services=isvcs,
            store=ConfigMapStateStore(api, on_written=cm_cache.put),
            ledgers=ConfigMapLedgerStore(api, on_written=cm_cache.put),
            reads=CachedReads(isvc_cache, cm_cache),
            evidence=source,
            dispatcher=dispatcher,
            metrics=metrics,
            clock=clock,
            fence=owner.fence,
        )
        policies = {f"{NS}/{name}": load_text(policy_text(name)).policies[0] for name in MODELS}
        try:
            yield World(
                emulator, api, isvc_cache, cm_cache, reconciler, source, clock, owner, policies, metrics
            )
        finally:
            stop.set()
            dispatcher.close(1)


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_nothing_is_reconciled_before_the_caches_have_listed(world: World) -> None:
    runner = world.runner(synced=lambda namespace: False)
    outcome = runner.run_tick()
    assert sorted(outcome.skipped) == sorted(world.policies)
    assert outcome.decided == [] and world.source.calls == []
    assert sorted(runner.due(world.clock())) == sorted(world.policies), "a skipped rollout stays due"


def test_one_collect_per_tick_for_every_due_rollout_with_the_same_time(world: World) -> None:
    _wait(lambda: world.reconciler.reads.synced(NS))
    runner = world.runner()
    first = runner.run_tick()  # first look: every model is idle on v1
    assert sorted(first.decided) == sorted(world.policies)
    for name in MODELS:
        world.push(name)
    world.emulator.settle()
    world.settle(runner)
    world.source.calls.clear()
    assert runner.due(world.clock()) == [], "nothing is due before an interval has passed"

    world.clock.now += timedelta(minutes=1, seconds=1)
    reads_before = world.metrics.api_totals()[0]
    outcome = runner.run_tick()
    assert sorted(outcome.due) == sorted(world.policies)
    assert sorted(outcome.decided) == sorted(world.policies)
    assert outcome.collect_calls == 1
    assert len(world.source.calls) == 1
    (call,) = world.source.calls
    assert sorted(key for key, _ in call) == sorted(world.policies)
    assert {at for _, at in call} == {world.clock.now}, "one evaluation time for the whole tick"
    assert world.metrics.api_totals()[0] == reads_before, "a tick reads from the caches, not with GETs"
    # The first evaluation writes its verdict (and explain document).
    assert {result.store_reason for result in outcome.outcomes.values()} <= {"explain-first", "verdict"}
    assert runner.due(world.clock()) == [], "evaluated: due again one interval later"
    world.clock.now += timedelta(minutes=1)
    assert sorted(runner.due(world.clock())) == sorted(world.policies)
    writes_before = world.metrics.api_totals()[1]
    again = runner.run_tick()
    assert sorted(again.decided) == sorted(world.policies)
    assert all(not result.wrote_state for result in again.outcomes.values()), (
        "an inconclusive evaluation that changes nothing a restart needs is not written"
    )
    assert world.metrics.api_totals()[1] == writes_before


def test_a_source_that_can_only_collect_is_asked_for_each_rollout_on_its_own(world: World) -> None:
    _wait(lambda: world.reconciler.reads.synced(NS))
    runner = world.runner(evidence=CollectEach(world.source))  # only its collect is ever called
    runner.run_tick()
    for name in MODELS:
        world.push(name)
    world.emulator.settle()
    world.settle(runner)
    world.source.calls.clear()
    world.clock.now += timedelta(minutes=1, seconds=1)
    outcome = runner.run_tick()
    assert outcome.collect_calls == 1, "the tick asks its source once"
    assert len(world.source.calls) == len(MODELS) == outcome.evidence_requests
    assert all(len(call) == 1 for call in world.source.calls), "the adapter collects one at a time"
    assert sorted(outcome.decided) == sorted(world.policies)


def test_a_tick_out_of_budget_carries_the_rest_first_into_the_next_tick(world: World) -> None:
    _wait(lambda: world.reconciler.reads.synced(NS))
    ticks = itertools.count()
    # Every look at the monotonic clock is a second later: a 5 s tick with a 4 s budget reads three.
    runner = world.runner(monotonic=lambda: float(next(ticks)))
    first = runner.run_tick()
    assert first.carried, first
    served = set(first.decided) | set(first.in_flight)
    assert served and not served & set(first.carried)
    second_due = runner.due(world.clock())
    assert second_due[: len(first.carried)] == first.carried, "carried rollouts come first"
    seen = served
    for _ in range(5):
        outcome = runner.run_tick()
        seen |= set(outcome.decided) | set(outcome.in_flight)
    assert seen == set(world.policies), "no rollout is starved"


def test_a_rollout_not_owned_is_skipped_and_its_writes_would_be_fenced(world: World) -> None:
    _wait(lambda: world.reconciler.reads.synced(NS))
    mine = {f"{NS}/m0", f"{NS}/m1"}
    world.owner.keys = mine
    runner = world.runner()
    outcome = runner.run_tick()
    assert set(outcome.decided) == mine
    assert set(outcome.skipped) == set(world.policies) - mine
    assert set(world.owner.fenced) == mine, "every write is fenced with its own key"
    world.owner.keys = None  # the other keys come to this replica
    regained = runner.run_tick()
    assert set(regained.decided) == set(world.policies) - mine, "skipped rollouts stayed due"


def test_a_broken_rollout_does_not_stop_the_others(world: World) -> None:
    _wait(lambda: world.reconciler.reads.synced(NS))
    ConfigMapStateStore(world.api).save_files(
        NS, "m0", {"state.json": "{not json"}, resource_version=None, owner_uid=None
    )
    _wait(lambda: world.cm_cache.get(NS, "kserve-canary-m0") is not None)
    runner = world.runner()
    outcome = runner.run_tick()
    assert outcome.failed == [f"{NS}/m0"]
    assert sorted(outcome.decided) == sorted(set(world.policies) - {f"{NS}/m0"})


def test_a_rollout_needing_no_evidence_is_decided_while_the_others_are_still_read(world: World) -> None:
    # After a restart with thousands of idle models, the first decision must not wait for the last read.
    _wait(lambda: world.reconciler.reads.synced(NS))
    first, last = f"{NS}/{MODELS[0]}", f"{NS}/{MODELS[-1]}"
    seen_before_last_read: list[bool] = []

    def before_reconcile(loaded: LoadedPolicy) -> None:
        if loaded.policy.key != last:
            return
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and world.reconciler.reads.state(NS, MODELS[0]).state_json is None:
            time.sleep(0.02)
        seen_before_last_read.append(world.reconciler.reads.state(NS, MODELS[0]).state_json is not None)

    runner = world.runner(before_reconcile=before_reconcile, period=60.0)
    outcome = runner.run_tick()
    assert runner.due(world.clock()) == [] and first in outcome.decided and last in outcome.decided
    assert seen_before_last_read == [True], "the first idle model's state was written only after every read"


def test_an_alarm_makes_its_rollout_due_now_and_evaluated_before_its_interval(world: World) -> None:
    """The evidence source saw m2's canary OOM-killed: m2 is evaluated in the next tick, 10 s after
    its last evaluation at a 1m interval, and alone; an alarm for a revision no rollout judges
    changes nothing."""
    runner = world.runner()
    world.evaluated_once(runner)

    world.clock.now += timedelta(seconds=10)
    assert runner.due(world.clock()) == []
    world.source.alarms = {(NS, "m2-predictor-00002"), (NS, "elsewhere-predictor-00009")}
    outcome = runner.run_tick()
    assert outcome.due == [f"{NS}/m2"]
    assert world.source.calls == [[(f"{NS}/m2", world.clock.now)]], "m2 alone, judged now"
    result = outcome.outcomes[f"{NS}/m2"]
    assert result.evaluated and result.decision is not None
    assert result.decision.new_state.evaluation.at == world.clock.now
    assert world.metrics.tick_rollouts.labels("alarmed")._value.get() == 1

    world.clock.now += timedelta(seconds=5)
    assert runner.due(world.clock()) == [], "the alarm is used once; m2's interval counts from its look"
    world.source.alarms = {(NS, "m2-predictor-00002")}
    runner.run_tick()  # taken at the tick's start: m2 due again, looked at again
    assert world.source.calls[-1] == [(f"{NS}/m2", world.clock.now)]


def test_a_canary_warming_up_is_watched_and_its_alarm_waits_for_its_step_to_be_judged(world: World) -> None:
    """Every model's first step has just started (no evaluation due): each canary is handed to the
    evidence source to watch from its rollout's start, and sampled in ticks where nothing needs
    evidence. That sample sees m2's canary OOM-killed at that very moment: m2 is due at once, but its
    step's window is still empty, so nothing can be judged; the alarm is kept, and m2 is judged in
    the next tick, 5 s later, instead of a whole interval later."""
    runner = world.runner()
    _wait(lambda: world.reconciler.reads.synced(NS))
    runner.run_tick()
    for name in MODELS:
        world.push(name)
    world.emulator.settle()
    world.settle(runner)  # the clock stands still: every first step started at this very moment
    states = {name: world.reconciler.reads.state(NS, name).state() for name in MODELS}
    watched = {(key, revision): born for key, revision, born in world.source.watched}
    assert watched == {
        (f"{NS}/{name}", f"{name}-predictor-00002"): states[name].started_at for name in MODELS
    }
    assert world.source.calls == [], "no evaluation was due"

    world.source.alarms_in_warm_up_sample = {(NS, "m2-predictor-00002")}
    runner.trigger(f"{NS}/m3")  # as a watch event does: m3 is looked at, and nothing needs evidence
    outcome = runner.run_tick()
    assert outcome.due == [f"{NS}/m3"] and world.source.calls == []
    assert world.source.warm_up_samples[-1] == world.clock.now, "the watched canaries were sampled"
    assert runner.due(world.clock()) == [f"{NS}/m2"], "the kill that sample saw: due at once"
    outcome = runner.run_tick()
    assert outcome.due == [f"{NS}/m2"] and world.source.calls == [], "the step's window is empty"
    assert runner.due(world.clock()) == [f"{NS}/m2"], "the alarm is kept"

    world.clock.now += timedelta(seconds=5)
    outcome = runner.run_tick()
    assert world.source.calls == [[(f"{NS}/m2", world.clock.now)]], "m2 alone, judged now"
    assert outcome.outcomes[f"{NS}/m2"].evaluated
    world.clock.now += timedelta(seconds=5)
    assert f"{NS}/m2" not in runner.due(world.clock()), "judged: the alarm is used"


def test_a_rollout_is_due_in_the_tick_that_fires_just_before_its_interval_ends(world: World) -> None:
    """A timer fires a few milliseconds late by a different amount each time; the tick an interval
    after an evaluation must still evaluate it, not the next one (TIMER_SLACK, as the core's)."""
    runner = world.runner()
    world.evaluated_once(runner)
    world.clock.now += timedelta(minutes=1) - TIMER_SLACK / 2
    outcome = runner.run_tick()
    assert sorted(outcome.due) == sorted(world.policies)
    assert all(result.evaluated for result in outcome.outcomes.values())
    assert len(world.source.calls) == 1


def test_a_canary_alarmed_by_the_tick_s_own_sample_is_decided_first(world: World) -> None:
    """Every rollout is due; the sample sees m5's canary OOM-killed: m5 (last by name) is decided
    first, before the holds (one worker: decisions in submission order), and not looked at again."""
    runner = world.runner(max_workers=1)
    world.holding(runner)
    world.source.alarms_in_sample = {(NS, "m5-predictor-00002")}
    with structlog.testing.capture_logs() as logs:
        outcome = runner.run_tick()
    assert sorted(outcome.decided) == sorted(world.policies)
    decided = [line["inferenceService"] for line in logs if line.get("decisionId")]
    assert decided[0] == "m5", decided
    assert runner.due(world.clock()) == [], "judged in this tick with the kill in its evidence"


def test_a_rollout_looked_at_for_an_alarm_gets_its_evidence_before_the_others(world: World) -> None:
    """m5 is alarmed while every rollout is due: its evidence is collected on its own, first (its
    rollback waits for no hold's evidence); the others share the next collect."""
    runner = world.runner()
    world.evaluated_once(runner)
    world.clock.now += timedelta(minutes=1)
    world.source.alarms = {(NS, "m5-predictor-00002")}
    outcome = runner.run_tick()
    assert sorted(outcome.decided) == sorted(world.policies)
    assert outcome.collect_calls == 2
    first, second = world.source.calls
    assert [key for key, _ in first] == [f"{NS}/m5"]
    assert sorted(key for key, _ in second) == sorted(set(world.policies) - {f"{NS}/m5"})


def test_collect_each_collects_each_rollout_on_its_own_and_raises_no_alarm() -> None:
    """The adapter for a source that can only collect: one failing is that rollout's missing evidence."""

    class Flaky(RecordingSource):
        def collect(self, policy: PromotionPolicy, request: EvidenceRequest) -> Evidence:
            if policy.key == f"{NS}/m1":
                raise RuntimeError("exporter exploded")
            return super().collect(policy, request)

    at = datetime.now(UTC)
    asks = []
    for name in MODELS[:3]:
        policy = load_text(policy_text(name)).policies[0].policy
        request = EvidenceRequest(
            NS,
            name,
            f"{name}-predictor-00002",
            None,
            at - timedelta(minutes=5),
            at,
            tuple(policy.spec.checks),
        )
        asks.append((policy, request))
    source = Flaky()
    adapted: TickEvidenceSource = CollectEach(source)
    answers = adapted.collect_many(asks)
    assert [answer is None for answer in answers] == [False, True, False]
    assert [answer.request for answer in answers if answer is not None] == [asks[0][1], asks[2][1]]
    assert source.calls == [[(f"{NS}/m0", at)], [(f"{NS}/m2", at)]], (
        "one collect per rollout, m2 after m1 failed"
    )
    adapted.watch_warm_up(asks[0][0], "m0-predictor-00002", at, at)
    adapted.sample_warm_up(at)
    assert not adapted.take_alarms()
