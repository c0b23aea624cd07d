"""``kserve-canary run``: the controller, built from the command line's options.

Imported by ``run`` only: the controller pulls in everything (the Kubernetes client, Prometheus,
notifications), which no other command needs. ``run`` turns its flags into
:class:`~canary.controller.settings.ControllerSettings` with the helpers here (each raises
``typer.BadParameter`` for a value it cannot read) and hands them to :func:`run_controller`.
"""

from __future__ import annotations

import signal
from pathlib import Path

import structlog
import typer

from canary.cli.policies import secret_scope
from canary.controller.allocator import tune_allocator, tune_collector
from canary.controller.observability import configure_logging, default_bind_address
from canary.controller.runtime import build_controller
from canary.controller.settings import ControllerSettings, PolicySettings, PolicySource, ServingSettings
from canary.controller.startup import preflight_or_exit
from canary.metrics.tenancy import Tenancy
from canary.notify import redact_processor
from canary.policy.scope import NamespaceSource
from canary.policy.units import parse_duration

__all__ = ["duration", "headers", "policy_settings", "run_controller", "serving_settings"]


def headers(values: list[str]) -> dict[str, str]:
    """``--prometheus-header K=V`` (repeated)."""
    parsed: dict[str, str] = {}
    for value in values:
        name, separator, content = value.partition("=")
        if not separator or not name.strip():
            raise typer.BadParameter(f"expected K=V, got {value!r}", param_hint="--prometheus-header")
        parsed[name.strip()] = content.strip()
    return parsed


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


def policy_settings(
    paths: list[Path],
    source: str,
    namespaces: str,
    secret_file_root: Path | None,
    secret_env_allow: list[str],
    promql: Tenancy | None = None,
) -> PolicySettings:
    """``--policies``, ``--policy-source``, ``--policy-namespaces``, the secret scope and the scope
    of custom PromQL."""
    return PolicySettings(
        paths=tuple(paths),
        sources=_policy_sources(source),
        namespaces=NamespaceSource(namespaces),
        secrets=secret_scope(secret_file_root, secret_env_allow),
        promql=promql or Tenancy(),
    )


def serving_settings(port: int, bind_address: str | None) -> ServingSettings:
    """``--metrics-port`` and ``--metrics-bind-address`` (default: $POD_IP, else loopback)."""
    return ServingSettings(port=port, host=bind_address or default_bind_address())


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
