"""``kserve-canary run``: the controller, built from the command line's options.

Imported by ``run`` only: the controller pulls in everything (the Kubernetes client, Prometheus,
notifications), which no other command needs. ``run`` hands its parsed flags (by option name, as
:mod:`canary.cli.run_options` declares them) to :func:`controller_settings`, which builds
:class:`~canary.controller.settings.ControllerSettings` group by group (raising
``typer.BadParameter`` for a value it cannot read), and the settings to :func:`run_controller`.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
import typer

from canary.cli.policies import promql_tenancy, secret_scope
from canary.controller.allocator import tune_allocator, tune_collector
from canary.controller.observability import configure_logging, default_bind_address
from canary.controller.runtime import build_controller
from canary.controller.settings import (
    ClusterSettings,
    ControllerSettings,
    LeaseSettings,
    NotifySettings,
    PolicyObjectSettings,
    PolicySettings,
    PolicySource,
    PrometheusSettings,
    ServingSettings,
    TickSettings,
)
from canary.controller.startup import preflight_or_exit
from canary.metrics.connection import parse_headers
from canary.notify import redact_processor
from canary.policy.scope import NamespaceSource
from canary.policy.units import parse_duration

__all__ = ["controller_settings", "duration", "headers", "run_controller"]


def headers(values: list[str]) -> dict[str, str]:
    """``--prometheus-header NAME=VALUE`` (repeated)."""
    try:
        return parse_headers(values)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--prometheus-header") from None


def _policy_sources(text: str) -> frozenset[PolicySource]:
    try:
        sources = frozenset(PolicySource(part.strip()) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(
            f"expected files, crd, auto or files,crd, got {text!r}", param_hint="--policy-source"
        ) from None
    if not sources:
        raise typer.BadParameter("name at least one source", param_hint="--policy-source")
    return sources


def duration(text: str, option: str) -> float:
    """A duration flag (``1h``, ``30m``, ``90s``) in seconds."""
    try:
        return parse_duration(text)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint=option) from None


def controller_settings(flags: Mapping[str, Any]) -> ControllerSettings:
    """``run``'s parsed flags (``typer.Context.params``: the option names of
    :mod:`canary.cli.run_options`), as settings groups."""
    return ControllerSettings(
        policies=PolicySettings(
            paths=tuple(Path(path) for path in flags["policies"]),
            sources=_policy_sources(flags["policy_source"]),
            namespaces=NamespaceSource(str(flags["policy_namespaces"])),
            secrets=secret_scope(
                None if flags["secret_file_root"] is None else Path(flags["secret_file_root"]),
                list(flags["secret_env_allow"]),
            ),
            promql=promql_tenancy(
                list(flags["custom_promql_allow_metric"]), list(flags["custom_promql_tenancy_label"])
            ),
        ),
        objects=PolicyObjectSettings(allow_custom_promql=flags["allow_custom_promql_from_crds"]),
        prometheus=PrometheusSettings(
            url=flags["prometheus_url"],
            headers=headers(list(flags["prometheus_header"])),
            token_file=flags["prometheus_token_file"],
            ca_file=flags["prometheus_ca_file"],
            timeout=flags["prometheus_timeout"],
            scrape_interval=flags["scrape_interval"],
            min_samples=flags["min_samples"],
            namespace_query_budget=flags["namespace_query_budget"],
        ),
        leasing=LeaseSettings(
            elect=flags["leader_elect"],
            name=flags["lease_name"],
            namespace=flags["lease_namespace"],
            duration=flags["lease_duration"],
            renew_deadline=flags["renew_deadline"],
            retry_period=flags["retry_period"],
            shards=flags["shards"],
        ),
        tick=TickSettings(period=flags["tick"], max_workers=flags["max_workers"]),
        notify=NotifySettings(
            allow_hosts=tuple(flags["notify_allow_host"]),
            retry_for=duration(flags["notify_retry_for"], "--notify-retry-for"),
            info_retry_for=duration(flags["notify_info_retry_for"], "--notify-info-retry-for"),
            cluster_name=flags["cluster_name"],
            dashboard_url=flags["dashboard_url"],
        ),
        serving=ServingSettings(
            flags["metrics_port"], flags["metrics_bind_address"] or default_bind_address()
        ),
        cluster=ClusterSettings(namespaces=tuple(flags["namespace"]), dry_run=flags["dry_run"]),
    )


def run_controller(settings: ControllerSettings, *, kubeconfig: str | None, log_format: str) -> None:
    allocator = tune_allocator()  # before any thread starts (canary.controller.allocator)
    tune_collector()
    configure_logging(log_format, extra_processors=[redact_processor])
    if allocator:
        structlog.get_logger("canary.controller").debug("glibc allocator set", **allocator)
    # A wrong input is one line on stderr and exit code 2, not a traceback (canary.controller.startup).
    api_client = preflight_or_exit(
        kubeconfig=kubeconfig,
        prometheus_url=settings.prometheus.url,
        metrics_port=settings.serving.port,
        metrics_host=settings.serving.host,
    )
    controller = build_controller(settings, api_client=api_client)
    signal.signal(signal.SIGTERM, lambda *_: controller.stop())
    signal.signal(signal.SIGINT, lambda *_: controller.stop())
    controller.run()
