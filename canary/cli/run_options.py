"""The options of ``kserve-canary run``, one alias each, grouped by the settings group they fill
(:mod:`canary.controller.settings`; :func:`canary.cli.controller.controller_settings` builds the
groups). Typer and the standard library only: ``--help`` imports nothing else.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class LogFormat(StrEnum):
    AUTO = "auto"
    JSON = "json"
    CONSOLE = "console"


# Where policies come from and what they may reach (PolicySettings, PolicyObjectSettings); the secret
# and custom-PromQL scope options are canary.cli's, shared with `validate`.
PoliciesOption = Annotated[
    list[Path], typer.Option("--policies", envvar="POLICY_DIR", help="Policy directory (repeatable).")
]
PolicySourceOption = Annotated[
    str,
    typer.Option(
        "--policy-source",
        envvar="POLICY_SOURCE",
        help="Where policies come from: files (--policies), crd (PromotionPolicy objects; /readyz "
        "fails while the CRD is not served), or auto: both, the objects once the CRD is served. "
        "Comma-separated: files,crd.",
    ),
]
AllowCustomPromqlFromCrdsOption = Annotated[
    bool,
    typer.Option(
        "--allow-custom-promql-from-crds",
        envvar="ALLOW_CUSTOM_PROMQL_FROM_CRDS",
        help="Accept custom PromQL (checks[].promql, metrics.queries) in PromotionPolicy objects: "
        "it runs with the controller's Prometheus credentials (put prom-label-proxy in front).",
    ),
]

# Prometheus (PrometheusSettings)
PrometheusUrlOption = Annotated[str, typer.Option(envvar="PROMETHEUS_URL")]
PrometheusHeaderOption = Annotated[
    list[str], typer.Option(help="Extra header K=V, e.g. X-Scope-OrgID=tenant (repeatable).")
]
PrometheusTokenFileOption = Annotated[
    str | None,
    typer.Option(envvar="PROMETHEUS_TOKEN_FILE", help="Bearer token file (re-read per request)."),
]
PrometheusCaFileOption = Annotated[str | None, typer.Option(envvar="PROMETHEUS_CA_FILE")]
PrometheusTimeoutOption = Annotated[
    float, typer.Option(envvar="PROMETHEUS_TIMEOUT", help="Seconds per query.")
]
ScrapeIntervalOption = Annotated[
    float,
    typer.Option(envvar="PROMETHEUS_SCRAPE_INTERVAL", help="Scrape interval of the metrics read (s)."),
]
NamespaceQueryBudgetOption = Annotated[
    float,
    typer.Option(
        envvar="NAMESPACE_QUERY_BUDGET",
        help="Seconds of Prometheus time the custom queries of one namespace may take per tick; "
        "the rest are deferred (builtin checks never are).",
    ),
]
MinSamplesOption = Annotated[
    float,
    typer.Option(
        envvar="MIN_SAMPLES",
        help="A latency or error rate from fewer requests is no data (neither pass nor fail).",
    ),
]

# The Lease(s) (LeaseSettings)
LeaderElectOption = Annotated[bool, typer.Option("--leader-elect/--no-leader-elect", envvar="LEADER_ELECT")]
LeaseNameOption = Annotated[str, typer.Option(envvar="LEASE_NAME")]
LeaseNamespaceOption = Annotated[str, typer.Option(envvar="LEASE_NAMESPACE")]
LeaseDurationOption = Annotated[float, typer.Option(envvar="LEASE_DURATION", help="Seconds.")]
RenewDeadlineOption = Annotated[float, typer.Option(envvar="LEASE_RENEW_DEADLINE", help="Seconds.")]
RetryPeriodOption = Annotated[float, typer.Option(envvar="LEASE_RETRY_PERIOD", help="Seconds.")]
ShardsOption = Annotated[
    int,
    typer.Option(
        min=1,
        envvar="SHARDS",
        help="Shard Leases the governed InferenceServices are split into (docs/ha.md); 1: one "
        "Lease, one leader.",
    ),
]

# The tick (TickSettings)
TickOption = Annotated[
    float,
    typer.Option(
        min=0.1,
        envvar="TICK_SECONDS",
        help="Seconds between ticks: every due rollout is evaluated together (one counter sample); "
        "keep it at most the smallest policy interval.",
    ),
]
MaxWorkersOption = Annotated[int, typer.Option(envvar="MAX_WORKERS", help="Concurrent evaluations.")]

# Notifications (NotifySettings)
NotifyAllowHostOption = Annotated[
    list[str],
    typer.Option(
        "--notify-allow-host",
        envvar="NOTIFY_ALLOW_HOSTS",
        help="A notification host that may be private, loopback or plain http (repeatable).",
    ),
]
NotifyRetryForOption = Annotated[
    str,
    typer.Option(
        envvar="NOTIFY_RETRY_FOR",
        help="How long a promotion, rollback, pause, unguarded-rollout or warning notification is "
        "retried before it is reported lost (1h, 30m, 90s).",
    ),
]
NotifyInfoRetryForOption = Annotated[
    str,
    typer.Option(
        envvar="NOTIFY_INFO_RETRY_FOR",
        help="The same for informational notifications (started, advanced, ...).",
    ),
]
ClusterNameOption = Annotated[
    str,
    typer.Option(
        envvar="CLUSTER_NAME",
        help="The cluster's name, said in every notification (Events, Slack, Teams, Discord).",
    ),
]
DashboardUrlOption = Annotated[
    str,
    typer.Option(
        envvar="DASHBOARD_URL",
        help="The dashboard's base URL: every notification links <base>/#/rollouts/<ns>/<name>.",
    ),
]

# /metrics, /healthz, /readyz (ServingSettings)
MetricsPortOption = Annotated[int, typer.Option(envvar="METRICS_PORT", help="/metrics, /healthz, /readyz.")]
MetricsBindAddressOption = Annotated[
    str | None,
    typer.Option(
        envvar="METRICS_BIND_ADDRESS",
        help="Address of /metrics, /healthz, /readyz; default: $POD_IP, else 127.0.0.1.",
    ),
]

# The Kubernetes API (ClusterSettings) and the process
KubeconfigOption = Annotated[
    str | None, typer.Option(envvar="KUBECONFIG", help="Kubeconfig file; default: in-cluster config.")
]
NamespaceOption = Annotated[
    list[str],
    typer.Option("--namespace", "-n", envvar="WATCH_NAMESPACES", help="Watched namespace (repeatable)."),
]
DryRunOption = Annotated[
    bool,
    typer.Option("--dry-run", envvar="DRY_RUN", help="Decide and report; write nothing; take no lease."),
]
LogFormatOption = Annotated[LogFormat, typer.Option(envvar="LOG_FORMAT", metavar="auto|json|console")]
