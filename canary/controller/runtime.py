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
"""

from __future__ import annotations

import base64
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

import structlog
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from canary import __version__
from canary.controller.caches import CachedReads, WatchCache
from canary.controller.crsource import (
    CrdState,
    ParsedObject,
    PolicyObjects,
    PromotionPolicyClient,
)
from canary.controller.evidence import TickEvidenceSource
from canary.controller.gates import GateRunner
from canary.controller.leader import LeaderElector
from canary.controller.observability import ControllerMetrics, HealthServer, Heartbeat
from canary.controller.policies import PolicyRegistry
from canary.controller.projection import PolicyView, previous_status, project_status
from canary.controller.reconciler import Reconciler
from canary.controller.scheduler import TickScheduler
from canary.controller.shards import ShardedElector
from canary.controller.status_writer import PolicyEvents, StatusWriter
from canary.controller.tick import Ownership, SingleLeaseOwnership, TickRunner
from canary.kserve.client import InferenceServiceClient, is_not_found
from canary.kserve.ledger_store import ConfigMapLedgerStore
from canary.kserve.outbox import ConfigMapOutboxStore
from canary.kserve.store import (
    COMMAND_KEY,
    LABEL_INFERENCE_SERVICE,
    ConfigMapStateStore,
    list_configmaps,
    read_configmap,
    state_configmap_name,
    watch_configmaps,
)
from canary.notify import (
    Destination,
    MessageContext,
    NotificationDispatcher,
    Outbox,
    OutboxEntry,
    PrometheusDeliveryRecorder,
    RetryHorizon,
    SecretResolver,
    destinations_for,
    events_destination,
)
from canary.notify.outbox import DEFAULT_IMPORTANT_RETRY_FOR, DEFAULT_INFO_RETRY_FOR
from canary.notify.secrets import DEFAULT_REDACTOR
from canary.notify.urls import UrlGuard
from canary.policy import LoadedPolicy, PromotionPolicy
from canary.policy.loader import ObjectRules
from canary.policy.scope import NamespaceSource, SecretScope
from canary.rollout.records import ExplainDocument
from canary.rollout.state import RolloutState, StateFormatError

__all__ = ["Controller", "ControllerConfig", "PolicySource", "load_api_client"]

log = structlog.get_logger("kserve_canary.controller")


class PolicySource(StrEnum):
    """Where policies come from (``kserve-canary run --policy-source``)."""

    FILES = "files"  # the --policies directories
    CRD = "crd"  # PromotionPolicy objects; the CRD must be served (else /readyz fails)
    # Both: the files, and the objects when the CRD is served (asked again every minute).
    AUTO = "auto"


@dataclass
class ControllerConfig:
    policy_paths: Sequence[str | os.PathLike[str]]
    namespaces: Sequence[str] = ()  # empty: every namespace
    metrics_port: int = 8080
    # Loopback unless told otherwise: the CLI passes --metrics-bind-address (default $POD_IP).
    metrics_host: str = "127.0.0.1"
    leader_elect: bool = True
    lease_name: str = "kserve-canary"
    lease_namespace: str = "kserve-canary"
    identity: str = field(default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname())
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    # Shard Leases the rollouts are split into (docs/ha.md); 1: one Lease, one leader.
    shards: int = 1
    dry_run: bool = False
    max_workers: int = 8
    # The tick (seconds): every due rollout is evaluated at once; never more than the smallest policy
    # interval (`kserve-canary run --tick`, $TICK_SECONDS).
    tick: float = field(default_factory=lambda: float(os.environ.get("TICK_SECONDS") or 5.0))
    tick_budget: float = 0.8  # of the tick: what is not decided by then is carried to the next tick
    # explain.json on its own (the state unchanged) at most once per this many policy intervals
    explain_every_intervals: float = 5.0
    reload_period: float = 5.0
    watch_timeout: int = 300
    request_timeout: float = 10.0
    # What policies may reach (docs/notifications.md, "Secrets"): namespaces from directories, secret
    # files under file_root/<namespace>/, environment variables allowed per namespace, notification
    # hosts that may be private or plain http.
    policy_namespaces: NamespaceSource = NamespaceSource.DIRECTORY
    secrets: SecretScope = field(default_factory=SecretScope)
    notify_allow_hosts: Sequence[str] = ()
    # For how long a notification is retried (seconds from the decision) before it is reported lost:
    # promotions, rollbacks, pauses, unguarded rollouts and warnings; the other (informational) ones.
    notify_retry_for: float = DEFAULT_IMPORTANT_RETRY_FOR
    notify_info_retry_for: float = DEFAULT_INFO_RETRY_FOR
    # Policy sources (docs/design.md §5): files, PromotionPolicy objects, or both (auto).
    policy_sources: frozenset[PolicySource] = frozenset({PolicySource.AUTO})
    # An object's custom PromQL runs with the controller's Prometheus credentials: refused unless allowed.
    allow_custom_promql_from_crds: bool = False
    # The one Secret per namespace an object's secret references name keys of (RBAC grants get on it).
    crd_secret_name: str = "kserve-canary-notifications"  # noqa: S105 - a name, not a secret
    # Status writes of PromotionPolicy objects: at most one per object per this many seconds, and
    # at most this many per second in all.
    status_min_interval: float = 1.0
    status_writes_per_second: float = 5.0
    crd_recheck: float = 60.0  # seconds between asking whether the CRD is served (until it is)
    # Said in every notification (docs/notifications.md): which cluster a message is about, and the
    # dashboard's base URL its rollout page is linked under (<base>/#/rollouts/<ns>/<name>); "": none.
    cluster_name: str = ""
    dashboard_url: str = ""


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


class Controller:
    def __init__(
        self,
        settings: ControllerConfig,
        *,
        api_client: client.ApiClient,
        evidence: TickEvidenceSource,
        clock: Callable[[], datetime] = _utcnow,
        metrics: ControllerMetrics | None = None,
    ):
        self.settings = settings
        self.metrics = metrics or ControllerMetrics()
        self._api_client = api_client
        # Audit logs (and the emulator's request log) then say which replica wrote.
        api_client.user_agent = f"kserve-canary/{__version__} ({settings.identity})"
        sources = settings.policy_sources
        self._read_files = bool(sources & {PolicySource.FILES, PolicySource.AUTO})
        self._crd_required = PolicySource.CRD in sources
        self._registry = PolicyRegistry(
            settings.policy_paths,
            namespaces=settings.policy_namespaces,
            secrets=settings.secrets,
            files=self._read_files,
        )
        self._clock = clock
        self._stop = threading.Event()
        self._wake_main = threading.Event()  # a PromotionPolicy or a state changed: reload now
        self._heartbeat = Heartbeat(tolerance=max(60.0, 6 * settings.reload_period))
        self._resolver = SecretResolver(
            DEFAULT_REDACTOR,
            scope=settings.secrets,
            url_guard=UrlGuard.allowing(settings.notify_allow_hosts),
        )
        # Slack and webhook notifications wait in an outbox ConfigMap per InferenceService until
        # delivered, so a restart or a takeover continues them; only the leader sends from it.
        self.metrics.count_api_requests(api_client)
        timeout = settings.request_timeout
        self._isvcs = InferenceServiceClient(api_client, request_timeout=timeout)
        scopes: list[str | None] = list(settings.namespaces) or [None]
        self.inference_service_cache = WatchCache(
            "InferenceService",
            lister=self._isvcs.list,
            watcher=lambda scope, version, seconds: self._isvcs.watch(
                scope, version, timeout_seconds=seconds
            ),
            getter=self._isvcs.get,
            scopes=scopes,
            watch_timeout=settings.watch_timeout,
            on_event=self._inference_service_changed,
            on_synced=self._cache_synced,
        )
        core = client.CoreV1Api(api_client)
        self.configmap_cache = WatchCache(
            "ConfigMap",
            lister=lambda scope: list_configmaps(api_client, scope, timeout=max(timeout, 30.0)),
            watcher=lambda scope, version, seconds: watch_configmaps(
                api_client, scope, version, timeout_seconds=seconds, request_timeout=timeout
            ),
            getter=lambda namespace, name: read_configmap(core, namespace, name, timeout),
            scopes=scopes,
            watch_timeout=settings.watch_timeout,
            on_event=self._configmap_changed,
            on_synced=self._cache_synced,
        )
        # PromotionPolicy objects: a second policy source, listed and watched like the caches above.
        self._policy_client = PromotionPolicyClient(api_client, request_timeout=timeout)
        self.policy_objects: PolicyObjects | None = (
            PolicyObjects(
                self._policy_client,
                scopes=scopes,
                rules=ObjectRules(
                    allow_custom_promql=settings.allow_custom_promql_from_crds,
                    secret_name=settings.crd_secret_name,
                ),
                watch_timeout=settings.watch_timeout,
                recheck=settings.crd_recheck,
                on_change=self._wake_main.set,
                spawn=self._spawn,
            )
            if sources & {PolicySource.CRD, PolicySource.AUTO}
            else None
        )
        self.status_writer: StatusWriter | None = (
            StatusWriter(
                self._policy_client,
                self.policy_objects.cache,
                min_interval=settings.status_min_interval,
                max_per_second=settings.status_writes_per_second,
            )
            if self.policy_objects is not None and not settings.dry_run
            else None
        )
        self._policy_events = PolicyEvents(
            api_client,
            redactor=DEFAULT_REDACTOR,
            request_timeout=timeout,
            reporting_instance=settings.identity,
        )
        self._parsed_objects: list[ParsedObject] = []
        self._core = core
        self._outbox = (
            None
            if settings.dry_run
            else Outbox(
                ConfigMapOutboxStore(
                    api_client,
                    request_timeout=timeout,
                    cached=self.configmap_cache.get,
                    on_written=self.configmap_cache.put,
                    refresh=self.configmap_cache.refresh,
                )
            )
        )
        self._resumed: set[str] = set()  # rollouts whose outbox this replica took up while leading
        self._message_context = MessageContext(
            cluster=settings.cluster_name, dashboard_url=settings.dashboard_url
        )
        self._dispatcher = NotificationDispatcher(
            []
            if settings.dry_run
            else [events_destination(api_client, resolver=self._resolver, context=self._message_context)],
            recorder=PrometheusDeliveryRecorder(self.metrics.registry),
            redactor=DEFAULT_REDACTOR,
            horizon=RetryHorizon(settings.notify_retry_for, settings.notify_info_retry_for),
            outbox=self._outbox,
            may_deliver=self._is_leading,
        )
        # Per governed key: the policy, whether it is an object's (its secrets come from its
        # namespace's Secret), and its destinations once built (None: not yet, or the policy changed).
        self._destinations: dict[str, tuple[PromotionPolicy, bool, list[Destination] | None]] = {}
        self._elector: LeaderElector | None = None
        self._sharded: ShardedElector | None = None
        self._held_shards: frozenset[int] = frozenset()
        if settings.leader_elect and not settings.dry_run and settings.shards > 1:
            self._sharded = ShardedElector(
                api_client,
                name=settings.lease_name,
                namespace=settings.lease_namespace,
                identity=settings.identity,
                shards=settings.shards,
                lease_duration=settings.lease_duration,
                renew_deadline=settings.renew_deadline,
                retry_period=settings.retry_period,
                request_timeout=min(settings.request_timeout, settings.retry_period * 2),
                on_change=self._shards_changed,
                in_flight=self._in_flight,
            )
        elif settings.leader_elect and not settings.dry_run:
            self._elector = LeaderElector(
                api_client,
                name=settings.lease_name,
                namespace=settings.lease_namespace,
                identity=settings.identity,
                lease_duration=settings.lease_duration,
                renew_deadline=settings.renew_deadline,
                retry_period=settings.retry_period,
                request_timeout=min(settings.request_timeout, settings.retry_period * 2),
                on_change=self._leadership_changed,
            )
        if self._elector is None and self._sharded is None and not settings.dry_run:
            # A single replica without election acts alone: it is the leader (for dashboards and the
            # no-leader alert). A dry run never acts, so it never leads.
            self.metrics.leader.set(1)
        self.ownership: Ownership = self._sharded or SingleLeaseOwnership(self._elector)
        store = ConfigMapStateStore(api_client, request_timeout=timeout, on_written=self.configmap_cache.put)
        # Gate calls run on their own small pool; a finished one asks the tick for its rollout.
        self.gates = GateRunner(resolver_for=self._policy_resolver, on_done=self._gate_done, clock=clock)
        self.reconciler = Reconciler(
            inference_services=self._isvcs,
            store=store,
            ledgers=ConfigMapLedgerStore(
                api_client, request_timeout=timeout, on_written=self.configmap_cache.put
            ),
            reads=CachedReads(self.inference_service_cache, self.configmap_cache),
            evidence=evidence,
            dispatcher=self._dispatcher,
            metrics=self.metrics,
            clock=clock,
            fence=self.ownership.fence,
            dry_run=settings.dry_run,
            explain_every_intervals=settings.explain_every_intervals,
            gates=self.gates,
        )
        self._timer = TickScheduler(self._tick_once, period=settings.tick)
        self.ticks = TickRunner(
            reconciler=self.reconciler,
            evidence=evidence,
            policy=self._registry.get,
            destinations=self._policy_destinations,
            ownership=self.ownership,
            metrics=self.metrics,
            clock=clock,
            period=settings.tick,
            budget=settings.tick_budget,
            max_workers=settings.max_workers,
            synced=self.reconciler.reads.synced,
            before_reconcile=self._before_reconcile,
            wake=self._timer.wake,
        )
        self._health: HealthServer | None = None
        self._threads: list[threading.Thread] = []
        self._loaded_once = False

    # -- lifecycle -----------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        self._wake_main.set()

    def run(self) -> None:
        """Run until :meth:`stop` (or SIGTERM through the CLI)."""
        settings = self.settings
        if settings.metrics_port >= 0:
            self._health = HealthServer(
                self.metrics,
                host=settings.metrics_host,
                port=settings.metrics_port,
                liveness=self._heartbeat.check,
                readiness=self._readiness,
            )
            self._health.start()
        log.info(
            "kserve-canary starting",
            identity=settings.identity,
            policies=[os.fspath(path) for path in settings.policy_paths] if self._read_files else None,
            policySources=sorted(str(source) for source in settings.policy_sources),
            namespaces=list(settings.namespaces) or "all",
            dryRun=settings.dry_run,
            leaderElection=self._elector is not None,
            metricsPort=self._health.port if self._health else None,
        )
        if self._elector is not None:
            self._spawn("leader-election", lambda: self._elector.run(self._stop) if self._elector else None)
        if self._sharded is not None:
            self._spawn("shard-election", lambda: self._sharded.run(self._stop) if self._sharded else None)
        watched: list[str | None] = list(settings.namespaces) or [None]
        for namespace in watched:
            for cache in (self.inference_service_cache, self.configmap_cache):
                self._spawn(f"watch-{cache.kind}-{namespace or 'all'}", self._watcher(cache, namespace))
        if self.policy_objects is not None:
            objects = self.policy_objects
            self._spawn("policy-objects", lambda: objects.run(self._stop))
        self._reload()
        self._timer.start()
        try:
            while not self._stop.is_set():
                woken = self._wake_main.wait(self.settings.reload_period)
                self._wake_main.clear()
                if woken:
                    # A burst of watch events is one reload, not one per event.
                    self._stop.wait(min(0.2, self.settings.reload_period))
                if self._stop.is_set():
                    break
                self._heartbeat.beat()
                self._reload()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        log.info("shutting down: finishing evaluations in flight")
        self._timer.shutdown(wait=True)
        self.ticks.close(wait=True)
        self.gates.close()
        drained = self._dispatcher.close(timeout=5.0)
        for thread in self._threads:
            thread.join(timeout=self.settings.retry_period + self.settings.request_timeout)
        if self._health is not None:
            self._health.stop()
        log.info("stopped", notificationsDrained=drained)

    def _spawn(self, name: str, target: Callable[[], object]) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    # -- policies --------------------------------------------------------------------------------

    def _governed(self, policy: PromotionPolicy) -> bool:
        return not self.settings.namespaces or policy.metadata.namespace in self.settings.namespaces

    def _reload(self) -> None:
        try:
            self._reload_policies()
        except Exception as error:
            # The loader reports bad files itself; this is the last line: keep what runs, try again.
            log.error("policy reload failed; the policies already loaded keep running", error=repr(error))
        try:
            self._project_statuses()
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
            for error in report.errors:
                log.error(
                    "policy error", error=str(error), file=error.path, line=error.line, field=error.field
                )
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
            for key in report.held:
                # Not paused, not rolled back: the state waits for whichever policy remains.
                self._destinations.pop(key, None)
            for key in report.removed:
                self._destinations.pop(key, None)
                if self.ownership.owns(key):
                    self.reconciler.pause_removed(report.removed_policies[key])
        active = {
            key: loaded for key, loaded in self._registry.active.items() if self._governed(loaded.policy)
        }
        for key, loaded in active.items():
            cached = self._destinations.get(key)
            from_object = loaded.object is not None
            if (
                cached is None
                or cached[1] != from_object
                or (cached[0] is not loaded.policy and cached[0] != loaded.policy)
            ):
                self._destinations[key] = (loaded.policy, from_object, None)
        self.metrics.policies.labels("loaded").set(len(active))
        invalid = {error.path for error in self._registry.errors if not error.conflict}
        invalid_objects = {path for path in invalid if path.startswith("promotionpolicy/")}
        # A conflict's claimant is not invalid; a held model is counted apart (nobody governs it).
        self.metrics.policies.labels("invalid-files").set(len(invalid - invalid_objects))
        self.metrics.policies.labels("invalid-objects").set(len(invalid_objects))
        self.metrics.policies.labels("held").set(len(self._registry.held))
        self.ticks.sync({key: loaded.policy.spec.interval for key, loaded in active.items()})
        # The tick is never longer than the smallest policy interval.
        smallest = self.ticks.smallest_interval()
        period = min(self.settings.tick, smallest) if smallest else self.settings.tick
        self.ticks.period = period
        self._timer.set_period(period)
        if report.added:
            # New policies are due at once: their first evaluation should not wait for the next
            # tick (at startup the timer's first tick may have run before the policies were loaded).
            self._timer.wake()
        self._loaded_once = True

    def _policy_destinations(self, policy: PromotionPolicy) -> list[Destination]:
        cached = self._destinations.get(policy.key)
        # Identity first: comparing two policies field by field on every reconcile was 3 % of the
        # controller's CPU at 1,000 rollouts; an equal new object (a reload) is compared once.
        # A policy without notify targets has no destinations, built once all the same.
        if cached is not None and cached[2] is not None and (cached[0] is policy or cached[0] == policy):
            if cached[0] is not policy:
                self._destinations[policy.key] = (policy, cached[1], cached[2])
            return cached[2]
        loaded = self._registry.get(policy.key)
        from_object = loaded is not None and loaded.object is not None
        resolver = self._policy_resolver(policy)
        built = destinations_for(policy.spec.notify, resolver=resolver, context=self._message_context)
        self._destinations[policy.key] = (policy, from_object, built)
        return built

    def _gate_done(self, key: str) -> None:
        self.ticks.trigger(key)  # its next decision records the gate's answer

    def _policy_resolver(self, policy: PromotionPolicy) -> SecretResolver:
        """Where a policy's secret references are read (notifications and gates alike)."""
        namespace = policy.metadata.namespace
        loaded = self._registry.get(policy.key)
        from_object = loaded is not None and loaded.object is not None
        # Scoped to the policy's namespace: a file's references reach only what is opened to its
        # namespace; an object's only keys of its namespace's Secret, never our environment or files.
        if from_object:
            return self._resolver.from_namespace_secret(
                namespace, self._read_secret, self.settings.crd_secret_name
            )
        return self._resolver.scoped(namespace)

    def _read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's data, decoded (None: there is none). Read at send time: a rotation applies."""
        try:
            response = self._core.read_namespaced_secret(
                name, namespace, _preload_content=False, _request_timeout=self.settings.request_timeout
            )
        except ApiException as error:
            if is_not_found(error):
                return None
            raise
        body = json.loads(cast(Any, response).data)
        data = body.get("data") or {}
        decoded = {key: base64.b64decode(value).decode("utf-8", "replace") for key, value in data.items()}
        decoded.update(body.get("stringData") or {})
        return decoded

    # -- PromotionPolicy status ------------------------------------------------------------------

    def _project_statuses(self) -> None:
        """Every object's status projected from the stored rollout state; written when it changed."""
        objects, writer = self.policy_objects, self.status_writer
        if objects is None or not self._loaded_once or self.settings.dry_run:
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
            view = PolicyView(parsed.generation, policy, parsed.errors, conflict, state, explain, generation)
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
        self._resumed = {key for key in self._resumed if sharded.shard_of(key) in held}
        for key in self.ticks.keys:
            if sharded.shard_of(key) in gained:
                self.reconciler.forget(key)
                self.ticks.trigger(key)

    def _in_flight(self) -> set[str]:
        """The rollouts read and not yet written (a drained shard is released only after them)."""
        ticks = getattr(self, "ticks", None)  # asked from the renew thread; None while constructing
        return ticks.in_flight() if ticks is not None else set()

    def _leadership_changed(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        # Whoever leads next takes every outbox up afresh (this replica too, when it leads again).
        self._resumed.clear()

    def _resume_outbox(self, policy: PromotionPolicy) -> None:
        """Once per leadership, before the first reconcile of a rollout: send what its outbox holds
        (left by a killed process or by the previous leader)."""
        if self._outbox is None or policy.key in self._resumed:
            return
        namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
        try:
            pending = self._outbox.pending(namespace, name)
        except Exception as error:
            log.warning("notification outbox unreadable; trying again", key=policy.key, error=str(error))
            return
        self._resumed.add(policy.key)
        if not pending:
            return

        def resolve(entry: OutboxEntry) -> Destination | None:
            return next((d for d in self._policy_destinations(policy) if d.ref == entry.ref), None)

        resumed = self._dispatcher.resume(pending, resolve)
        log.info("notification outbox taken up", key=policy.key, waiting=len(pending), resumed=resumed)

    def _before_reconcile(self, loaded: LoadedPolicy) -> None:
        self._resume_outbox(loaded.policy)

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
            self._crd_required
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


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``predicate`` until true or ``timeout`` (for tests and the demo)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def default_policy_dir() -> Path:
    return Path(os.environ.get("POLICY_DIR", "/etc/kserve-canary/policies"))
