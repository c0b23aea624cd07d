"""Notifications as the controller delivers them: the dispatcher and its outbox, each policy's
destinations and where their secrets are read.

Slack and webhook notifications wait in an outbox ConfigMap per InferenceService until delivered, so
a restart or a takeover continues them; only the leader (``may_deliver``) sends from it, and takes
each rollout's outbox up once per leadership, before that rollout's first reconcile.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from typing import Any, cast

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.controller.caches import WatchCache
from canary.controller.observability import ControllerMetrics
from canary.controller.policies import PolicyRegistry
from canary.controller.settings import ControllerSettings
from canary.kserve.client import is_not_found
from canary.kserve.outbox import ConfigMapOutboxStore
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
from canary.notify.secrets import DEFAULT_REDACTOR
from canary.notify.urls import UrlGuard
from canary.policy import LoadedPolicy, PromotionPolicy

__all__ = ["Delivery"]

log = structlog.get_logger("kserve_canary.controller")


class Delivery:
    def __init__(
        self,
        settings: ControllerSettings,
        *,
        api_client: client.ApiClient,
        configmaps: WatchCache,
        registry: PolicyRegistry,
        metrics: ControllerMetrics,
        may_deliver: Callable[[], bool],
    ):
        self._settings = settings
        self._registry = registry
        self._core = client.CoreV1Api(api_client)
        self._resolver = SecretResolver(
            DEFAULT_REDACTOR,
            scope=settings.policies.secrets,
            url_guard=UrlGuard.allowing(settings.notify.allow_hosts),
        )
        self.context = MessageContext(
            cluster=settings.notify.cluster_name, dashboard_url=settings.notify.dashboard_url
        )
        dry_run, timeout = settings.cluster.dry_run, settings.cluster.request_timeout
        self.outbox = (
            None
            if dry_run
            else Outbox(
                ConfigMapOutboxStore(
                    api_client,
                    request_timeout=timeout,
                    cached=configmaps.get,
                    on_written=configmaps.put,
                    refresh=configmaps.refresh,
                )
            )
        )
        self.dispatcher = NotificationDispatcher(
            []
            if dry_run
            else [events_destination(api_client, resolver=self._resolver, context=self.context)],
            recorder=PrometheusDeliveryRecorder(metrics.registry),
            redactor=DEFAULT_REDACTOR,
            horizon=RetryHorizon(settings.notify.retry_for, settings.notify.info_retry_for),
            outbox=self.outbox,
            may_deliver=may_deliver,
        )
        self._resumed: set[str] = set()  # rollouts whose outbox this replica took up while leading
        # Per governed key: the policy, whether it is an object's (its secrets come from its
        # namespace's Secret), and its destinations once built (None: not yet, or the policy changed).
        self._destinations: dict[str, tuple[PromotionPolicy, bool, list[Destination] | None]] = {}

    # -- the policies' destinations ---------------------------------------------------------------

    def loaded(self, active: Mapping[str, LoadedPolicy]) -> None:
        """The policies now governing: a changed one's destinations are built again when next used."""
        for key, loaded in active.items():
            cached = self._destinations.get(key)
            from_object = loaded.object is not None
            if (
                cached is None
                or cached[1] != from_object
                or (cached[0] is not loaded.policy and cached[0] != loaded.policy)
            ):
                self._destinations[key] = (loaded.policy, from_object, None)

    def forget(self, key: str) -> None:
        self._destinations.pop(key, None)

    def destinations(self, policy: PromotionPolicy) -> list[Destination]:
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
        resolver = self.resolver_for(policy)
        built = destinations_for(policy.spec.notify, resolver=resolver, context=self.context)
        self._destinations[policy.key] = (policy, from_object, built)
        return built

    def resolver_for(self, policy: PromotionPolicy) -> SecretResolver:
        """Where a policy's secret references are read (notifications and gates alike)."""
        namespace = policy.metadata.namespace
        loaded = self._registry.get(policy.key)
        from_object = loaded is not None and loaded.object is not None
        # Scoped to the policy's namespace: a file's references reach only what is opened to its
        # namespace; an object's only keys of its namespace's Secret, never our environment or files.
        if from_object:
            return self._resolver.from_namespace_secret(
                namespace, self._read_secret, self._settings.objects.secret_name
            )
        return self._resolver.scoped(namespace)

    def _read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's data, decoded (None: there is none). Read at send time: a rotation applies."""
        try:
            response = self._core.read_namespaced_secret(
                name,
                namespace,
                _preload_content=False,
                _request_timeout=self._settings.cluster.request_timeout,
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

    # -- the outbox --------------------------------------------------------------------------------

    def lead_anew(self, still_ours: Callable[[str], bool] = lambda key: False) -> None:
        """Leadership changed: the outboxes of the rollouts no longer ``still_ours`` are taken up
        afresh when this replica leads them again (whoever leads next takes them up)."""
        self._resumed = {key for key in self._resumed if still_ours(key)}

    def resume(self, policy: PromotionPolicy) -> None:
        """Once per leadership, before the first reconcile of a rollout: send what its outbox holds
        (left by a killed process or by the previous leader)."""
        if self.outbox is None or policy.key in self._resumed:
            return
        namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
        try:
            pending = self.outbox.pending(namespace, name)
        except Exception as error:
            log.warning("notification outbox unreadable; trying again", key=policy.key, error=str(error))
            return
        self._resumed.add(policy.key)
        if not pending:
            return

        def resolve(entry: OutboxEntry) -> Destination | None:
            return next((d for d in self.destinations(policy) if d.ref == entry.ref), None)

        resumed = self.dispatcher.resume(pending, resolve)
        log.info("notification outbox taken up", key=policy.key, waiting=len(pending), resumed=resumed)
