"""``kserve-canary backtest``: what a policy would have done over recorded history.

This module is imported by :mod:`canary.cli` to register the command, so at import time it needs
Typer and the standard library only; the backtest itself (Prometheus client, policy models, the
core, Rich) is imported when the command runs.
"""

from __future__ import annotations

import os
import re
import sys
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from canary.cli import ContextOption, KubeconfigOption, app
from canary.cli.help import EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, fail
from canary.cli.run_options import ScrapeIntervalOption

if TYPE_CHECKING:
    from canary.backtest.command import BacktestRequest, RecordReader

__all__ = ["backtest", "parse_time"]


class BacktestFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    HTML = "html"


_RELATIVE = re.compile(r"^now(?:-(\d+(?:\.\d+)?)(s|m|h|d))?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, option: str, now: datetime) -> datetime:
    """RFC 3339 (``2026-11-20T10:00:00Z``; without an offset: UTC), ``now`` or ``now-2h``."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        amount, unit = relative.groups()
        return now - timedelta(seconds=float(amount) * _UNITS[unit]) if amount else now
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise fail(
            f"{option} {text!r}: not a time; use RFC 3339 (2026-11-20T10:00:00Z), now, or now-2h",
            EXIT_USAGE,
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


_PolicyArgument = Annotated[
    Path,
    typer.Argument(metavar="POLICY", help="The policy file (a directory or file as validate reads it)."),
]
_IsvcOption = Annotated[
    str | None,
    typer.Option(
        "--isvc",
        metavar="NAMESPACE/NAME",
        help="The InferenceService (required when the file holds several policies).",
    ),
]
_FromOption = Annotated[
    str | None,
    typer.Option(
        "--from",
        metavar="TIME",
        help="Start of the history: RFC 3339, or now-6h. Default: the --rollout's start, else now-6h.",
    ),
]
_ToOption = Annotated[
    str | None,
    typer.Option(
        "--to",
        metavar="TIME",
        help="End of the history: RFC 3339, or now. Default: the --rollout's end, else now.",
    ),
]
_RolloutOption = Annotated[
    str | None,
    typer.Option(
        "--rollout",
        metavar="ID",
        help="One past rollout from the controller's record (rollouts.json in its state ConfigMap): "
        "1 the latest, 2 the one before, a revision, or REVISION@STARTED as the record names it.",
    ),
]
_WhatIfOption = Annotated[
    list[str],
    typer.Option(
        "--what-if",
        metavar="KEY=VALUE",
        help="Change the policy for this backtest (repeatable): window=5m, checks.p99.max=600ms.",
    ),
]
_FormatOption = Annotated[
    BacktestFormat, typer.Option("--format", "-o", metavar="table|json|html", help="What to print.")
]
_OutputOption = Annotated[
    Path | None, typer.Option("--output", metavar="FILE", help="Write to FILE instead of stdout.")
]
_PrometheusUrlOption = Annotated[
    str, typer.Option(envvar="PROMETHEUS_URL", metavar="URL", help="The Prometheus holding the history.")
]
_PrometheusHeaderOption = Annotated[
    list[str],
    typer.Option(metavar="NAME=VALUE", help="Extra header, e.g. X-Scope-OrgID=tenant (repeatable)."),
]
_PrometheusTokenFileOption = Annotated[
    str | None,
    typer.Option(envvar="PROMETHEUS_TOKEN_FILE", metavar="FILE", help="Bearer token file."),
]
_PrometheusCaFileOption = Annotated[str | None, typer.Option(envvar="PROMETHEUS_CA_FILE", metavar="FILE")]
_PrometheusTimeoutOption = Annotated[
    float, typer.Option(envvar="PROMETHEUS_TIMEOUT", help="Seconds per query.")
]
_MinSamplesOption = Annotated[
    float,
    typer.Option(envvar="MIN_SAMPLES", help="A latency or error rate from fewer requests is no data."),
]


@app.command()
def backtest(
    policy: _PolicyArgument,
    isvc: _IsvcOption = None,
    start: _FromOption = None,
    end: _ToOption = None,
    rollout: _RolloutOption = None,
    kubeconfig: KubeconfigOption = None,
    context: ContextOption = None,
    what_if: _WhatIfOption = [],  # noqa: B006 - typer reads the default, never mutates it
    output_format: _FormatOption = BacktestFormat.TABLE,
    output: _OutputOption = None,
    prometheus_url: _PrometheusUrlOption = "http://localhost:9090",
    prometheus_header: _PrometheusHeaderOption = [],  # noqa: B006
    prometheus_token_file: _PrometheusTokenFileOption = None,
    prometheus_ca_file: _PrometheusCaFileOption = None,
    prometheus_timeout: _PrometheusTimeoutOption = 30.0,
    scrape_interval: ScrapeIntervalOption = 30.0,
    min_samples: _MinSamplesOption = 20,
) -> None:
    """Replay a policy over recorded history: what it would have done and when, each check against
    its limits over time, and how that differs from what happened.

    The replay cannot move traffic: it judges the traffic shares that actually served. Exit 0 when
    the backtest ran, 1 for an invalid policy or --what-if, 3 when Prometheus cannot answer.
    """
    now = datetime.now(UTC)
    begin, finish = _period(start, end, now)
    from canary.backtest.command import BacktestRequest  # noqa: PLC0415 - lazy: start-up time

    request = BacktestRequest(
        policy_path=policy,
        isvc=isvc,
        start=begin,
        end=finish,
        rollout=rollout,
        what_if=tuple(what_if),
        output_format=output_format.value,
        output=output,
        prometheus_url=prometheus_url,
        prometheus_headers=tuple(prometheus_header),
        prometheus_token_file=prometheus_token_file,
        prometheus_ca_file=prometheus_ca_file,
        prometheus_timeout=prometheus_timeout,
        scrape_interval=scrape_interval,
        min_samples=min_samples,
        now=now,
    )
    _run(request, _record_reader(kubeconfig, context) if rollout is not None else None)


def _period(start: str | None, end: str | None, now: datetime) -> tuple[datetime | None, datetime | None]:
    """``--from`` and ``--to`` as times (None: not given); refused when they are the wrong way round."""
    begin = parse_time(start, "--from", now) if start is not None else None
    finish = parse_time(end, "--to", now) if end is not None else None
    if begin is not None and finish is not None and finish <= begin:
        raise fail(f"--to ({finish.isoformat()}) must be after --from ({begin.isoformat()})", EXIT_USAGE)
    return begin, finish


def _run(request: BacktestRequest, reader: RecordReader | None) -> None:
    """Run the backtest ``request`` and exit as its outcome says."""
    from canary.backtest.command import execute  # noqa: PLC0415 - lazy: start-up time

    code, messages = execute(request, _console(), reader)
    for message in messages:
        typer.echo(message, err=True)
    if code in (EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE):
        raise typer.Exit(code)


def _record_reader(kubeconfig: str | None, context: str | None) -> Any:
    """Reads the record of past rollouts through the person's kubeconfig (imported only for --rollout)."""

    def read(namespace: str, name: str) -> Any:
        from canary.cli.cluster import api_client  # noqa: PLC0415 - lazy: the Kubernetes client
        from canary.cli.failures import NoKubeconfig  # noqa: PLC0415
        from canary.cli.rollouts import _load  # noqa: PLC0415

        try:
            api = api_client(kubeconfig, context)
        except NoKubeconfig:
            if kubeconfig:  # named, but not there: say so rather than ignore it
                raise
            return None
        return _load(api, namespace, name).past_rollouts()

    return read


def _console() -> Any:
    from rich.console import Console  # noqa: PLC0415 - lazy: start-up time

    # Piped or redirected: as wide as COLUMNS says, else 160 columns (a table must not wrap at 80).
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
    return Console(highlight=False, width=width)
