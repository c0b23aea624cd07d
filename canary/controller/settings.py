"""The controller's settings: a few small frozen groups, one per concern, in one :class:`ControllerSettings`.

``kserve-canary run`` builds them from its flags (canary/cli/__init__.py); tests build them directly.
Every field has the flag's default, except where policies are read from.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from canary.kserve.admitted import ConfigMapLimits
from canary.metrics.tenancy import Tenancy
from canary.notify.outbox import DEFAULT_IMPORTANT_RETRY_FOR, DEFAULT_INFO_RETRY_FOR
from canary.policy.scope import NamespaceSource, SecretScope

__all__ = [
    "ClusterSettings",
    "ControllerSettings",
    "LeaseSettings",
    "NotifySettings",
    "PolicyObjectSettings",
    "PolicySettings",
    "PolicySource",
    "PrometheusSettings",
    "ServingSettings",
    "TickSettings",
]


class PolicySource(StrEnum):
    """Where policies come from (``kserve-canary run --policy-source``)."""

    FILES = "files"  # the --policies directories
    CRD = "crd"  # PromotionPolicy objects; the CRD must be served (else /readyz fails)
    # Both: the files, and the objects when the CRD is served (asked again every minute).
    AUTO = "auto"


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """Where policies come from (docs/design.md §5) and what they may reach (docs/notifications.md,
    "Secrets"): namespaces from directories, secret files under ``secrets.file_root/<namespace>/``,
    environment variables allowed per namespace."""

    paths: tuple[str | os.PathLike[str], ...]  # the --policies directories
    sources: frozenset[PolicySource] = frozenset({PolicySource.AUTO})
    namespaces: NamespaceSource = NamespaceSource.DIRECTORY
    secrets: SecretScope = field(default_factory=SecretScope)
    # Custom PromQL scoped to the policy's namespace (canary.metrics.tenancy): the series admitted
    # cluster-wide, the tenancy labels of sources the profiles do not know.
    promql: Tenancy = field(default_factory=Tenancy)
    reload_period: float = 5.0  # seconds between reloads of the directories


@dataclass(frozen=True, slots=True)
class PolicyObjectSettings:
    """PromotionPolicy objects: what they may use, and how their status is written."""

    # An object's custom PromQL runs with the controller's Prometheus credentials: refused unless allowed.
    allow_custom_promql: bool = False
    # The one Secret per namespace an object's secret references name keys of (RBAC grants get on it).
    secret_name: str = "kserve-canary-notifications"  # noqa: S105 - a name, not a secret
    crd_recheck: float = 60.0  # seconds between asking whether the CRD is served (until it is)
    # Status writes: at most one per object per this many seconds, and this many per second in all.
    status_min_interval: float = 1.0
    status_writes_per_second: float = 5.0


@dataclass(frozen=True, slots=True)
class PrometheusSettings:
    """Where the evidence comes from (validated when the controller is built, after the preflight)."""

    url: str = "http://localhost:9090"
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # may carry credentials
    token_file: str | None = None  # bearer token, re-read per request
    ca_file: str | None = None
    timeout: float = 10.0  # seconds per query
    scrape_interval: float = 30.0  # of the metrics read
    min_samples: float = 20  # a latency or error rate from fewer requests is no data
    # Bytes of one answer read at most (canary.metrics.client.DEFAULT_MAX_ANSWER_BYTES: a thousand
    # rollouts' counter sample five times over); a larger answer fails its query as malformed-response.
    max_answer_bytes: int = 128 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """Who this replica is, and the Lease(s) it leads by (docs/ha.md)."""

    elect: bool = True  # False: this replica acts alone
    name: str = "kserve-canary"
    namespace: str = "kserve-canary"
    identity: str = field(default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname())
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    shards: int = 1  # shard Leases the rollouts are split into; 1: one Lease, one leader


@dataclass(frozen=True, slots=True)
class TickSettings:
    """The tick (canary/controller/tick.py): every due rollout evaluated at once."""

    # Seconds; never more than the smallest policy interval (`kserve-canary run --tick`, $TICK_SECONDS).
    period: float = field(default_factory=lambda: float(os.environ.get("TICK_SECONDS") or 5.0))
    budget: float = 0.8  # of the period: what is not decided by then is carried to the next tick
    max_workers: int = 8  # concurrent evaluations
    # explain.json on its own (the state unchanged) at most once per this many policy intervals
    explain_every_intervals: float = 5.0


@dataclass(frozen=True, slots=True)
class NotifySettings:
    """Notifications (docs/notifications.md)."""

    allow_hosts: tuple[str, ...] = ()  # hosts that may be private, loopback or plain http
    # For how long a notification is retried (seconds from the decision) before it is reported lost:
    # promotions, rollbacks, pauses, unguarded rollouts and warnings; the other (informational) ones.
    retry_for: float = DEFAULT_IMPORTANT_RETRY_FOR
    info_retry_for: float = DEFAULT_INFO_RETRY_FOR
    # Said in every message: which cluster it is about, and the dashboard's base URL its rollout page
    # is linked under (<base>/#/rollouts/<ns>/<name>); "": none.
    cluster_name: str = ""
    dashboard_url: str = ""


@dataclass(frozen=True, slots=True)
class ServingSettings:
    """/metrics, /healthz and /readyz."""

    port: int = 8080  # negative: not served
    # Loopback unless told otherwise: the CLI passes --metrics-bind-address (default $POD_IP).
    host: str = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    """The Kubernetes API: what is watched, how long a call may take, and whether anything is written."""

    namespaces: tuple[str, ...] = ()  # empty: every namespace
    request_timeout: float = 10.0
    watch_timeout: int = 300
    dry_run: bool = False  # decide and report; write nothing; take no Lease
    configmaps: ConfigMapLimits = field(default_factory=ConfigMapLimits)  # what the ConfigMap cache keeps


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    policies: PolicySettings
    objects: PolicyObjectSettings = field(default_factory=PolicyObjectSettings)
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    leasing: LeaseSettings = field(default_factory=LeaseSettings)
    tick: TickSettings = field(default_factory=TickSettings)
    notify: NotifySettings = field(default_factory=NotifySettings)
    serving: ServingSettings = field(default_factory=ServingSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
