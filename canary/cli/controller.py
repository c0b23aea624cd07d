"""``kserve-canary run``: the controller, built from the command line's options.

Imported by ``run`` only: the controller pulls in everything (the Kubernetes client, Prometheus,
notifications), which no other command needs.
"""

from __future__ import annotations

import signal
from pathlib import Path

import structlog
import typer

from canary.cli.policies import secret_scope
from canary.controller.allocator import tune_allocator, tune_collector
from canary.controller.observability import configure_logging, default_bind_address
from canary.controller.runtime import Controller, ControllerConfig, PolicySource
from canary.controller.startup import preflight_or_exit
from canary.metrics.client import PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.notify import redact_processor
from canary.policy.scope import NamespaceSource
from canary.policy.units import parse_duration

__all__ = ["run_controller"]


def _parse_headers(values: list[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for value in values:
        name, separator, content = value.partition("=")
        if not separator or not name.strip():
            raise typer.BadParameter(f"expected K=V, got {value!r}", param_hint="--prometheus-header")
        headers[name.strip()] = content.strip()
    return headers


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


def _duration(text: str, option: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint=option) from None


def run_controller(
    *,
    policies: list[Path],
    kubeconfig: str | None,
    prometheus_url: str,
    prometheus_header: list[str],
    prometheus_token_file: str | None,
    prometheus_ca_file: str | None,
    prometheus_timeout: float,
    scrape_interval: float,
    min_samples: float,
    namespace: list[str],
    metrics_port: int,
    metrics_bind_address: str | None,
    leader_elect: bool,
    lease_name: str,
    lease_namespace: str,
    lease_duration: float,
    renew_deadline: float,
    retry_period: float,
    shards: int,
    tick: float,
    dry_run: bool,
    log_format: str,
    max_workers: int,
    policy_namespaces: str,
    secret_file_root: Path | None,
    secret_env_allow: list[str],
    notify_allow_host: list[str],
    notify_retry_for: str,
    notify_info_retry_for: str,
    policy_source: str,
    allow_custom_promql_from_crds: bool,
    cluster_name: str = "",
    dashboard_url: str = "",
) -> None:
    allocator = tune_allocator()  # before any thread starts (canary.controller.allocator)
    tune_collector()
    configure_logging(log_format, extra_processors=[redact_processor])
    if allocator:
        structlog.get_logger("canary.controller").debug("glibc allocator set", **allocator)
    # A wrong input is one line on stderr and exit code 2, not a traceback (canary.controller.startup).
    api_client = preflight_or_exit(
        kubeconfig=kubeconfig,
        prometheus_url=prometheus_url,
        metrics_port=metrics_port,
        metrics_host=metrics_bind_address or default_bind_address(),
    )
    source = PrometheusEvidenceSource(
        PrometheusConfig(
            url=prometheus_url,
            headers=_parse_headers(prometheus_header),
            bearer_token_file=prometheus_token_file,
            ca_file=prometheus_ca_file,
            timeout=prometheus_timeout,
        ),
        scrape_interval=scrape_interval,
        min_requests=min_samples,
    )
    controller = Controller(
        ControllerConfig(
            policy_paths=policies,
            namespaces=namespace,
            metrics_port=metrics_port,
            metrics_host=metrics_bind_address or default_bind_address(),
            leader_elect=leader_elect,
            lease_name=lease_name,
            lease_namespace=lease_namespace,
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
            shards=shards,
            tick=tick,
            dry_run=dry_run,
            max_workers=max_workers,
            policy_namespaces=NamespaceSource(policy_namespaces),
            secrets=secret_scope(secret_file_root, secret_env_allow),
            notify_allow_hosts=notify_allow_host,
            notify_retry_for=_duration(notify_retry_for, "--notify-retry-for"),
            notify_info_retry_for=_duration(notify_info_retry_for, "--notify-info-retry-for"),
            policy_sources=_policy_sources(policy_source),
            allow_custom_promql_from_crds=allow_custom_promql_from_crds,
            cluster_name=cluster_name,
            dashboard_url=dashboard_url,
        ),
        api_client=api_client,
        evidence=source,
    )
    signal.signal(signal.SIGTERM, lambda *_: controller.stop())
    signal.signal(signal.SIGINT, lambda *_: controller.stop())
    controller.run()
