"""The long-running controller: policies, watch, schedule, lead, serve health — and stop cleanly.

Threads, each with one job:

* the main loop reloads the policy directory every few seconds (hot reload, docs/design.md §5) and keeps
  the tick's policies in line with it;
* two watch caches (list + watch per namespace, or one cluster-wide): the InferenceServices and the
  controller's own ConfigMaps (state, ledger, outbox). Reconciles read from them, not with a GET; a
  governed InferenceService that changes (or a command left in a state ConfigMap) triggers a tick at
  once, so auto-start writes the first step within seconds of a new revision;
* the timer runs one tick for all rollouts (:mod:`canary.controller.tick`) every ``tick`` seconds:
  every due rollout is read, their evidence collected in one ``collect_many``, and each decided and
  written on a bounded worker pool;
* the leader elector renews the Lease; a replica reconciles only the keys it owns (``owns(key)``),
  and every write is fenced (``fence(key)``);
* the health server serves /metrics, /healthz and /readyz.

SIGTERM stops scheduling, lets evaluations in flight finish (a write is never cut in half), drains
notifications for a few seconds and releases the Lease so the standby takes over at once.

:func:`build_controller` builds one from its settings (:mod:`canary.controller.settings`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import structlog
from kubernetes import client, config

from canary import __version__
from canary.controller.caches import CachedReads, WatchCache, our_configmaps
from canary.controller.crsource import (
    CrdState,
    ParsedObject,
    PolicyObjects,
    PromotionPolicyClient,
)
from canary.controller.delivery import Delivery
from canary.controller.evidence import TickEvidenceSource
from canary.controller.failures import ReconcileFailures
from canary.controller.gates import GateRunner
from canary.controller.leader import ElectorOptions, LeaderElector
from canary.controller.observability import ControllerMetrics, HealthServer, Heartbeat
from canary.controller.policies import PolicyRegistry, ReloadReport
from canary.controller.projection import PolicyView, previous_status, project_status
from canary.controller.reconciler import Reconciler
from canary.controller.scheduler import TickScheduler
from canary.controller.settings import ControllerSettings, PolicySource, PrometheusSettings
from canary.controller.shards import ShardedElector
from canary.controller.status_writer import PolicyEvents, StatusWriter
from canary.controller.tick import Ownership, SingleLeaseOwnership, TickRunner
from canary.kserve.admitted import list_our_configmaps
from canary.kserve.client import InferenceServiceClient
from canary.kserve.file_status import FILE_STATUS_CONFIGMAP, FileStatusPublisher, summary_row
from canary.kserve.knative_config import ClusterProgressDeadline
from canary.kserve.ledger_store import ConfigMapLedgerStore
from canary.kserve.store import (
    COMMAND_KEY,
    LABEL_INFERENCE_SERVICE,
    ConfigMapStateStore,
    read_configmap,
    state_configmap_name,
    watch_configmaps,
)
from canary.metrics.client import PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.metrics.tenancy import Tenancy
from canary.notify.secrets import DEFAULT_REDACTOR
from canary.policy import LoadedPolicy, PromotionPolicy
from canary.policy.objects import ObjectRules
from canary.rollout.records import ExplainDocument
from canary.rollout.state import RolloutState, StateFormatError

__all__ = ["Controller", "build_controller", "load_api_client", "prometheus_evidence"]

log = structlog.get_logger("kserve_canary.controller")


def load_api_client(kubeconfig: str | None) -> client.ApiClient:
    """The given kubeconfig, else in-cluster config, else the default kubeconfig."""
    api: client.ApiClient
    if kubeconfig:
        api = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            api = client.ApiClient()
        except config.ConfigException:
            api = config.new_client_from_config()  # type: ignore[no-untyped-call]
    api.user_agent = f"kserve-canary/{__version__}"
    return api


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _shown_url(url: str) -> str:
    """``url`` without user information, query or fragment: what a log line may carry."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def prometheus_evidence(
    settings: PrometheusSettings, tenancy: Tenancy | None = None
) -> PrometheusEvidenceSource:
    """The evidence source of ``kserve-canary run``: the Prometheus of the settings, custom queries
    scoped by ``tenancy``."""
    return PrometheusEvidenceSource(
        PrometheusConfig(
            url=settings.url,
            headers=dict(settings.headers),
            bearer_token_file=settings.token_file,
            ca_file=settings.ca_file,
            timeout=settings.timeout,
            max_answer_bytes=settings.max_answer_bytes,
        ),
        scrape_interval=settings.scrape_interval,
        min_requests=settings.min_samples,
        namespace_query_seconds=settings.namespace_query_budget,
        tenancy=tenancy,
    )


def build_controller(
    settings: ControllerSettings,
    *,
    api_client: client.ApiClient,
    evidence: TickEvidenceSource | None = None,
    clock: Callable[[], datetime] = _utcnow,
    metrics: ControllerMetrics | None = None,
) -> Controller:
    """The controller of ``settings``, talking to the cluster through ``api_client``.

    ``evidence`` defaults to the Prometheus of ``settings.prometheus``; a source that can only
    ``collect`` is given as :class:`~canary.controller.evidence.CollectEach` ``(source)``.
    """
    metrics = metrics or ControllerMetrics()
    # Audit logs (and the emulator's request log) then say which replica wrote.
    api_client.user_agent = f"kserve-canary/{__version__} ({settings.leasing.identity})"
    metrics.count_api_requests(api_client)
    return Controller(
        settings,
        api_client=api_client,
        evidence=evidence
        if evidence is not None
        else prometheus_evidence(settings.prometheus, settings.policies.promql),
        registry=PolicyRegistry(
            settings.policies.paths,
            namespaces=settings.policies.namespaces,
            secrets=settings.policies.secrets,
            promql=settings.policies.promql.refusals,
            files=bool(settings.policies.sources & {PolicySource.FILES, PolicySource.AUTO}),
        ),
        clock=clock,
        metrics=metrics,
    )


class Controller:
    """Built by :func:`build_controller`; each part built by the method named after it, in the order
    they depend on each other (the callbacks into this controller run only once :meth:`run` runs)."""

    def __init__(
        self,
        settings: ControllerSettings,
        *,
        api_client: client.ApiClient,
        evidence: TickEvidenceSource,
        registry: PolicyRegistry,
        clock: Callable[[], datetime],
        metrics: ControllerMetrics,
    ):
        self.settings = settings
        self.metrics = metrics
        self._registry = registry
        self._clock = clock
        self._stop = threading.Event()
        self._wake_main = threading.Event()  # a PromotionPolicy or a state changed: reload now
        self._heartbeat = Heartbeat(tolerance=max(60.0, 6 * settings.policies.reload_period))
        self._health: HealthServer | None = None
        self._threads: list[threading.Thread] = []
        self._loaded_once = False
        self._parsed_objects: list[ParsedObject] = []
        self._isvcs = InferenceServiceClient(api_client, request_timeout=settings.cluster.request_timeout)
        self.inference_service_cache, self.configmap_cache = self._watch_caches(api_client)
        self.policy_objects, self.status_writer = self._policy_objects(api_client)
        # The status of file policies, where the viewer role reads it (canary/kserve/file_status.py).
        self._file_status = FileStatusPublisher(
            api_client, settings.leasing.namespace, request_timeout=settings.cluster.request_timeout
        )
        self._policy_events = PolicyEvents(
            api_client,
            redactor=DEFAULT_REDACTOR,
            request_timeout=settings.cluster.request_timeout,
            reporting_instance=settings.leasing.identity,
        )
        self.delivery = Delivery(
            settings,
            api_client=api_client,
            configmaps=self.configmap_cache,
            registry=registry,
            metrics=metrics,
            may_deliver=self._is_leading,
        )
        self._held_shards: frozenset[int] = frozenset()
        self._elector, self._sharded = self._electors(api_client)
        self.ownership: Ownership = self._sharded or SingleLeaseOwnership(self._elector)
        # Gate calls run on their own small pool; a finished one asks the tick for its rollout.
        self.gates = GateRunner(resolver_for=self.delivery.resolver_for, on_done=self._gate_done, clock=clock)
        # A rollout whose reconcile keeps failing says why: a Warning Event and the Stalled condition.
        self.failures = ReconcileFailures(api_client, clock, dry_run=settings.cluster.dry_run)
        self.reconciler = self._reconciler(api_client, evidence)
        self._timer = TickScheduler(self._tick_once, period=settings.tick.period)
        self.ticks = self._tick_runner(evidence)

    # -- the parts -----------------------------------------------------------------------------

    def _watch_caches(self, api_client: client.ApiClient) -> tuple[WatchCache, WatchCache]:
        """The InferenceServices and the controller's ConfigMaps, listed and watched."""
        cluster = self.settings.cluster
        timeout = cluster.request_timeout
        scopes: list[str | None] = list(cluster.namespaces) or [None]
        inference_services = WatchCache(
            "InferenceService",
            lister=self._isvcs.list,
            watcher=lambda scope, version, seconds: self._isvcs.watch(
                scope, version, timeout_seconds=seconds
            ),
            getter=self._isvcs.get,
            scopes=scopes,
            watch_timeout=cluster.watch_timeout,
            on_event=self._inference_service_changed,
            on_synced=self._cache_synced,
        )
        core = client.CoreV1Api(api_client)
        limits = cluster.configmaps
        configmaps = WatchCache(
            "ConfigMap",
            # Only what the controller wrote is kept, read in pages (canary.kserve.admitted).
            lister=lambda scope: list_our_configmaps(
                api_client, scope, limits=limits, ignored=self._configmap_ignored, timeout=max(timeout, 30.0)
            ),
            watcher=lambda scope, version, seconds: watch_configmaps(
                api_client, scope, version, timeout_seconds=seconds, request_timeout=timeout
            ),
            getter=lambda namespace, name: read_configmap(core, namespace, name, timeout),
            scopes=scopes,
            watch_timeout=cluster.watch_timeout,
            on_event=self._configmap_changed,
            on_synced=self._cache_synced,
            admit=our_configmaps(limits, self._configmap_ignored),
        )
        return inference_services, configmaps

    def _configmap_ignored(self, namespace: str, name: str, reason: str) -> None:
        """A ConfigMap labelled as ours that the controller did not write: never kept, told."""
        self.metrics.configmaps_ignored.labels(namespace).inc()
        log.warning(
            "ConfigMap labelled as kserve-canary's ignored", configmap=f"{namespace}/{name}", reason=reason
        )

    def _policy_objects(
        self, api_client: client.ApiClient
    ) -> tuple[PolicyObjects | None, StatusWriter | None]:
        """PromotionPolicy objects (a second policy source, listed and watched like the caches) and
        the writer of their status; None when they are not a source (or nothing is written)."""
        settings = self.settings
        if not settings.policies.sources & {PolicySource.CRD, PolicySource.AUTO}:
            return None, None
        policy_client = PromotionPolicyClient(api_client, request_timeout=settings.cluster.request_timeout)
        objects = PolicyObjects(
            policy_client,
            scopes=list(settings.cluster.namespaces) or [None],
            rules=ObjectRules(
                allow_custom_promql=settings.objects.allow_custom_promql,
                secret_name=settings.objects.secret_name,
                promql=settings.policies.promql.refusals,
            ),
            watch_timeout=settings.cluster.watch_timeout,
            recheck=settings.objects.crd_recheck,
            on_change=self._wake_main.set,
            spawn=self._spawn,
        )
        if settings.cluster.dry_run:
            return objects, None
        writer = StatusWriter(
            policy_client,
            objects.cache,
            min_interval=settings.objects.status_min_interval,
            max_per_second=settings.objects.status_writes_per_second,
        )
        return objects, writer

    def _electors(self, api_client: client.ApiClient) -> tuple[LeaderElector | None, ShardedElector | None]:
        """The Lease (or shard Leases) this replica leads by; none for a dry run or without election."""
        settings, lease = self.settings, self.settings.leasing
        elector: LeaderElector | None = None
        sharded: ShardedElector | None = None
        options = ElectorOptions(
            name=lease.name,
            namespace=lease.namespace,
            identity=lease.identity,
            lease_duration=lease.duration,
            renew_deadline=lease.renew_deadline,
            retry_period=lease.retry_period,
            request_timeout=min(settings.cluster.request_timeout, lease.retry_period * 2),
        )
        if lease.elect and not settings.cluster.dry_run and lease.shards > 1:
            sharded = ShardedElector(
                api_client,
                shards=lease.shards,
                on_change=self._shards_changed,
                in_flight=self._in_flight,
                **options,
            )
        elif lease.elect and not settings.cluster.dry_run:
            elector = LeaderElector(api_client, on_change=self._leadership_changed, **options)
        if elector is None and sharded is None and not settings.cluster.dry_run:
            # A single replica without election acts alone: it is the leader (for dashboards and the
            # no-leader alert). A dry run never acts, so it never leads.
            self.metrics.leader.set(1)
        return elector, sharded

    def _reconciler(self, api_client: client.ApiClient, evidence: TickEvidenceSource) -> Reconciler:
        timeout = self.settings.cluster.request_timeout
        put = self.configmap_cache.put
        return Reconciler(
            inference_services=self._isvcs,
            store=ConfigMapStateStore(api_client, request_timeout=timeout, on_written=put),
            ledgers=ConfigMapLedgerStore(api_client, request_timeout=timeout, on_written=put),
            reads=CachedReads(self.inference_service_cache, self.configmap_cache),
            evidence=evidence,
            dispatcher=self.delivery.dispatcher,
            metrics=self.metrics,
            clock=self._clock,
            fence=self.ownership.fence,
            dry_run=self.settings.cluster.dry_run,
            explain_every_intervals=self.settings.tick.explain_every_intervals,
            gates=self.gates,
            knative_deadline=ClusterProgressDeadline(api_client, request_timeout=timeout),
        )

    def _tick_runner(self, evidence: TickEvidenceSource) -> TickRunner:
        tick = self.settings.tick
        return TickRunner(
            reconciler=self.reconciler,
            evidence=evidence,
            policy=self._registry.get,
            destinations=self.delivery.destinations,
            ownership=self.ownership,
            metrics=self.metrics,
            clock=self._clock,
            period=tick.period,
            budget=tick.budget,
            max_workers=tick.max_workers,
            synced=self.reconciler.reads.synced,
            before_reconcile=self._before_reconcile,
            wake=self._timer.wake,
            on_reconciled=self.failures.observe,
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        self._wake_main.set()

    def run(self) -> None:
        """Run until :meth:`stop` (or SIGTERM through the CLI)."""
        self._serve_health()
        self._log_start()
        self._start_threads()
        self._reload()
        self._timer.start()
        period = self.settings.policies.reload_period
        try:
            while not self._stop.is_set():
                woken = self._wake_main.wait(period)
                self._wake_main.clear()
                if woken:
                    # A burst of watch events is one reload, not one per event.
                    self._stop.wait(min(0.2, period))
                if self._stop.is_set():
                    break
                self._heartbeat.beat()
                self._reload()
        finally:
            self._shutdown()

    def _serve_health(self) -> None:
        serving = self.settings.serving
        if serving.port >= 0:
            self._health = HealthServer(
                self.metrics,
                host=serving.host,
                port=serving.port,
                liveness=self._heartbeat.check,
                readiness=self._readiness,
            )
            self._health.start()

    def _log_start(self) -> None:
        settings = self.settings
        policies = settings.policies
        read_files = bool(policies.sources & {PolicySource.FILES, PolicySource.AUTO})
        log.info(
            "kserve-canary starting",
            identity=settings.leasing.identity,
            policies=[os.fspath(path) for path in policies.paths] if read_files else None,
            policySources=sorted(str(source) for source in policies.sources),
            namespaces=list(settings.cluster.namespaces) or "all",
            dryRun=settings.cluster.dry_run,
            # Where the evidence comes from (credentials in the URL are not logged); the metric
            # profile is logged as "metric profile detected" when the first evaluation asks for it.
            prometheus=_shown_url(settings.prometheus.url),
            leaderElection=self._elector is not None,
            metricsPort=self._health.port if self._health else None,
        )

    def _start_threads(self) -> None:
        if self._elector is not None:
            self._spawn("leader-election", lambda: self._elector.run(self._stop) if self._elector else None)
        if self._sharded is not None:
            self._spawn("shard-election", lambda: self._sharded.run(self._stop) if self._sharded else None)
        watched: list[str | None] = list(self.settings.cluster.namespaces) or [None]
        for namespace in watched:
            for cache in (self.inference_service_cache, self.configmap_cache):
                self._spawn(f"watch-{cache.kind}-{namespace or 'all'}", self._watcher(cache, namespace))
        if self.policy_objects is not None:
            objects = self.policy_objects
            self._spawn("policy-objects", lambda: objects.run(self._stop))

    def _shutdown(self) -> None:
        log.info("shutting down: finishing evaluations in flight")
        self._timer.shutdown(wait=True)
        self.ticks.close(wait=True)
        self.gates.close()
        drained = self.delivery.dispatcher.close(timeout=5.0)
        for thread in self._threads:
            thread.join(timeout=self.settings.leasing.retry_period + self.settings.cluster.request_timeout)
        if self._health is not None:
            self._health.stop()
        log.info("stopped", notificationsDrained=drained)

    def _spawn(self, name: str, target: Callable[[], object]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- policies --------------------------------------------------------------------------------

    def _governed(self, policy: PromotionPolicy) -> bool:
        namespaces = self.settings.cluster.namespaces
        return not namespaces or policy.metadata.namespace in namespaces

    def _reload(self) -> None:
        try:
            self._reload_policies()
        except Exception as error:
            # The loader reports bad files itself; this is the last line: keep what runs, try again.
            log.error("policy reload failed; the policies already loaded keep running", error=repr(error))
        try:
            self._project_statuses()
            self._publish_file_statuses()
        except Exception as error:
            log.error("PromotionPolicy status projection failed; trying again", error=repr(error))

    def _reload_policies(self) -> None:
        objects = self.policy_objects
        if objects is not None:
            if not objects.synced and not self._loaded_once:
                # Deciding before the objects are listed could let a file govern a model an object
                # also claims (a conflict nobody would see yet): wait for the list (or the 404).
                return
            self._parsed_objects = objects.snapshot()
            self._registry.set_objects(
                [parsed.running for parsed in self._parsed_objects if parsed.running is not None],
                [error for parsed in self._parsed_objects for error in parsed.errors],
            )
        report = self._registry.reload()
        if report.changed:
            self._log_reload(report)
            for key in report.held:
                # Not paused, not rolled back: the state waits for whichever policy remains.
                self.delivery.forget(key)
            for key in report.removed:
                self.delivery.forget(key)
                if self.ownership.owns(key):
                    self.reconciler.pause_removed(report.removed_policies[key])
        active = {
            key: loaded for key, loaded in self._registry.active.items() if self._governed(loaded.policy)
        }
        self.delivery.loaded(active)
        self._count_policies(active)
        self.ticks.sync({key: loaded.policy.spec.interval for key, loaded in active.items()})
        # The tick is never longer than the smallest policy interval.
        smallest = self.ticks.smallest_interval()
        tick = self.settings.tick.period
        period = min(tick, smallest) if smallest else tick
        self.ticks.period = period
        self._timer.set_period(period)
        if report.added:
            # New policies are due at once: their first evaluation should not wait for the next
            # tick (at startup the timer's first tick may have run before the policies were loaded).
            self._timer.wake()
        self._loaded_once = True

    def _log_reload(self, report: ReloadReport) -> None:
        for error in report.errors:
            log.error("policy error", error=str(error), file=error.path, line=error.line, field=error.field)
        for conflict in report.conflicts:
            log.error(
                "policy conflict: neither policy governs the InferenceService; its rollout is held",
                error=str(conflict),
                key=conflict.key,
                claimants=[claimant.origin for claimant in conflict.claimants],
            )
        for key in report.kept_previous:
            log.warning("policy edit rejected: the previous version keeps running", key=key)
        if report.added or report.updated or report.removed or report.held:
            log.info(
                "policies loaded",
                added=report.added,
                updated=report.updated,
                removed=report.removed,
                held=report.held,
            )

    def _count_policies(self, active: Mapping[str, LoadedPolicy]) -> None:
        self.metrics.policies.labels("loaded").set(len(active))
        invalid = {error.path for error in self._registry.errors if not error.conflict}
        invalid_objects = {path for path in invalid if path.startswith("promotionpolicy/")}
        # A conflict's claimant is not invalid; a held model is counted apart (nobody governs it).
        self.metrics.policies.labels("invalid-files").set(len(invalid - invalid_objects))
        self.metrics.policies.labels("invalid-objects").set(len(invalid_objects))
        self.metrics.policies.labels("held").set(len(self._registry.held))

    def _gate_done(self, key: str) -> None:
        self.ticks.trigger(key)  # its next decision records the gate's answer

    # -- PromotionPolicy status ------------------------------------------------------------------

    def _project_statuses(self) -> None:
        """Every object's status projected from the stored rollout state; written when it changed."""
        objects, writer = self.policy_objects, self.status_writer
        if objects is None or not self._loaded_once or self.settings.cluster.dry_run:
            return
        now = self._clock()
        held = self._registry.held
        for parsed in self._parsed_objects:
            obj = objects.get(parsed.namespace, parsed.name)
            if obj is None:
                continue
            policy = parsed.running.policy if parsed.running is not None else None
            key = policy.key if policy is not None else None
            # The replica (or shard owner) that drives the rollout writes its status; an object that
            # governs nothing is written by the owner of a key of its own, so by one replica.
            if not self.ownership.owns(key or f"{parsed.namespace}/promotionpolicy.{parsed.name}"):
                continue
            conflict = None
            if key is not None and key in held:
                others = [c.origin for c in held[key].claimants if c.origin != parsed.origin]
                conflict = f"InferenceService {key} is also claimed by {', '.join(others)}"
            state, explain, generation = (
                self._stored_rollout(policy) if policy is not None else (None, None, None)
            )
            failure = self.failures.of(key) if key is not None else None
            view = PolicyView(
                parsed.generation, policy, parsed.errors, conflict, state, explain, generation,
                failure=None if failure is None else f"{failure.error} ({failure.count} times in a row)",
            )  # fmt: skip
            if writer is not None:
                writer.write(parsed.namespace, parsed.name, project_status(view, previous_status(obj), now))
            if parsed.errors:
                self._policy_events.record(
                    obj,
                    reason="InvalidSpec",
                    message="; ".join(str(error) for error in parsed.errors),
                    now=now,
                )
            if conflict:
                self._policy_events.record(
                    obj,
                    reason="TargetClaimed",
                    message=f"{conflict}: neither governs it; its rollout is held until all but one "
                    "are removed",
                    now=now,
                )

    def _publish_file_statuses(self) -> None:
        """The file policies' rollouts, one row each, into the ConfigMap the viewer role may read."""
        if not self._loaded_once or self.settings.cluster.dry_run:
            return
        if not self.ownership.owns(f"{self.settings.leasing.namespace}/{FILE_STATUS_CONFIGMAP}"):
            return  # one replica writes it (the owner of that key's shard)
        rows = []
        for key, loaded in self._registry.active.items():
            if loaded.object is not None or not self._governed(loaded.policy):
                continue
            state, _explain, _generation = self._stored_rollout(loaded.policy)
            if state is not None:
                namespace, name = key.split("/", 1)
                rows.append(summary_row(namespace, name, loaded.origin, state))
        self._file_status.publish(rows)

    def _stored_rollout(
        self, policy: PromotionPolicy
    ) -> tuple[RolloutState | None, ExplainDocument | None, int | None]:
        namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
        stored = self.reconciler.reads.state(namespace, name)
        try:
            state = stored.state() if stored.state_json else None
        except StateFormatError:
            state = None
        try:
            explain = stored.explain_reading()  # a status shows no PromQL
        except StateFormatError:
            explain = None
        isvc = self.inference_service_cache.get(namespace, name) or {}
        generation = (isvc.get("metadata") or {}).get("generation")
        return state, explain, generation if isinstance(generation, int) else None

    # -- work ----------------------------------------------------------------------------------

    def _is_leading(self) -> bool:
        if self._sharded is not None:
            return self._sharded.is_leader  # holds a shard
        return self._elector is None or self._elector.is_leader

    def _shards_changed(self, held: frozenset[int]) -> None:
        self.metrics.leader.set(1 if held else 0)
        sharded = self._sharded
        if sharded is None:
            return
        gained, self._held_shards = held - self._held_shards, held
        # A rollout whose shard comes (back) to this replica is read afresh, as after a restart
        # (what another replica decided meanwhile is not in this process's memory), takes its
        # outbox up again, and is reconciled in the next tick rather than at its next interval.
        self.delivery.lead_anew(lambda key: sharded.shard_of(key) in held)
        for key in self.ticks.keys:
            if sharded.shard_of(key) in gained:
                self.reconciler.forget(key)
                self.ticks.trigger(key)

    def _in_flight(self) -> set[str]:
        """The rollouts read and not yet written (a drained shard is released only after them)."""
        return self.ticks.in_flight()  # asked from the renew thread, which run() starts

    def _leadership_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        # Whoever leads next takes every outbox up afresh (this replica too, when it leads again).
        self.delivery.lead_anew()

    def _before_reconcile(self, loaded: LoadedPolicy) -> None:
        self.delivery.resume(loaded.policy)

    def _tick_once(self) -> None:
        if self._stop.is_set():
            return
        self.ticks.run_tick()

    def _watcher(self, cache: WatchCache, namespace: str | None) -> Callable[[], None]:
        return lambda: cache.run(namespace, self._stop)

    def _cache_synced(self, scope: str | None) -> None:
        """A cache has listed a namespace: its rollouts can be reconciled now, not a tick later."""
        log.info("watch cache listed", namespace=scope or "all")
        if self.inference_service_cache.all_synced and self.configmap_cache.all_synced:
            self._timer.wake()

    def _inference_service_changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A watch event: a governed InferenceService changed; reconcile it in a tick now."""
        metadata = obj.get("metadata") or {}
        key = f"{metadata.get('namespace')}/{metadata.get('name')}"
        if self._registry.get(key) is not None:
            self.ticks.trigger(key)

    def _configmap_changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A watch event on our ConfigMaps: an operator's command waits in a state, or a state was
        deleted (it is written again from the ledger, now rather than an interval later); act now.
        A state governed by a PromotionPolicy changed: its status is projected again soon."""
        if self.policy_objects is not None and self._parsed_objects:
            self._wake_main.set()
        if kind != "DELETED" and COMMAND_KEY not in (obj.get("data") or {}):
            return
        metadata = obj.get("metadata") or {}
        model = (metadata.get("labels") or {}).get(LABEL_INFERENCE_SERVICE)
        if model and metadata.get("name") == state_configmap_name(model):
            key = f"{metadata.get('namespace')}/{model}"
            if self._registry.get(key) is not None:
                self.ticks.trigger(key)

    def _readiness(self) -> tuple[bool, str]:
        crd = self._crd_note()
        if not self._loaded_once:
            return False, f"policies not loaded yet{crd}\n"
        if (
            PolicySource.CRD in self.settings.policies.sources
            and self.policy_objects is not None
            and self.policy_objects.state
            in {
                CrdState.NOT_SERVED,
                CrdState.FORBIDDEN,
            }
        ):
            return False, f"--policy-source crd, but{crd.removeprefix(';')}\n"
        role = "leader" if self._is_leading() else "standby"
        synced = self.inference_service_cache.all_synced and self.configmap_cache.all_synced
        caches = "" if synced else ", caches listing"
        held = f", {len(self._registry.held)} held by conflicts" if self._registry.held else ""
        return True, f"ok ({role}, {len(self._registry.active)} policies{held}{caches}){crd}\n"

    def _crd_note(self) -> str:
        """What /readyz says about the PromotionPolicy source when it is not read."""
        objects = self.policy_objects
        if objects is None or objects.state is CrdState.SERVED:
            return ""
        if objects.state is CrdState.NOT_SERVED:
            return "; the PromotionPolicy CRD is not served: PromotionPolicy objects are not read"
        if objects.state is CrdState.FORBIDDEN:
            return "; listing PromotionPolicy objects is forbidden: they are not read"
        return "; asking whether the PromotionPolicy CRD is served"
