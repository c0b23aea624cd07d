"""The ``kserve-canary backtest`` command behind its Typer definition (``canary/cli/backtest.py``):
load and select the policy, apply ``--what-if``, run, render. Returns an exit code and the messages
for stderr; never raises for bad input."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import structlog
import yaml

from canary.backtest.history import HistoryError
from canary.backtest.render import render_html, render_table, to_json
from canary.backtest.runner import Backtest, BacktestOptions, run_backtest
from canary.backtest.whatif import WhatIfError, apply_what_if, parse_override
from canary.metrics.client import PrometheusConfig
from canary.metrics.connection import parse_headers
from canary.policy.loader import LoadedPolicy, load_paths
from canary.rollout.past import PastRollout, PastRollouts

__all__ = [
    "BacktestRequest",
    "RecordReader",
    "describe_recorded",
    "execute",
    "select_recorded",
    "select_rollout",
]

# Reads the record of past rollouts (rollouts.json in the state ConfigMap) of NAMESPACE, NAME; None
# when there is no cluster to read it from (no kubeconfig); raises what the cluster client raises
# otherwise (the CLI turns it into one line and an exit code).
RecordReader = Callable[[str, str], PastRollouts | None]

EXIT_OK, EXIT_INVALID, EXIT_UNREACHABLE = 0, 1, 3


@dataclass(frozen=True)
class BacktestRequest:
    policy_path: Path
    isvc: str | None
    start: datetime | None  # None: from the recorded rollout (--rollout), else the last 6 hours
    end: datetime | None
    rollout: str | None
    what_if: tuple[str, ...]
    output_format: str
    output: Path | None
    prometheus_url: str
    prometheus_headers: tuple[str, ...] = ()
    prometheus_token_file: str | None = None
    prometheus_ca_file: str | None = None
    prometheus_timeout: float = 30.0
    scrape_interval: float = 30.0
    min_samples: float = 20.0
    now: datetime | None = None  # for the default range


def execute(
    request: BacktestRequest, console: Any, read_record: RecordReader | None = None
) -> tuple[int, list[str]]:
    _quiet_logs()
    loaded, problem = _policy(request)
    if loaded is None:
        return EXIT_INVALID, problem
    namespace, name = loaded.policy.metadata.namespace, loaded.policy.spec.target.inference_service
    past: PastRollout | None = None
    notes: list[str] = []
    record = read_record(namespace, name) if request.rollout is not None and read_record is not None else None
    if request.rollout is not None and record is None:
        if request.start is None or request.end is None:
            return EXIT_UNREACHABLE, [
                f"--rollout {request.rollout!r}: no kubeconfig to read the controller's record of past "
                "rollouts with; give --kubeconfig, or --from and --to to choose among the periods "
                "Prometheus shows"
            ]
        notes.append(
            "No kubeconfig: the rollout was chosen among the periods Prometheus shows, by the id this output "
            "prints (REVISION or REVISION@TIME), not from the controller's record."
        )
    if request.rollout is not None and record is not None:
        past = record.select(request.rollout)
        if past is None:
            known = ", ".join(entry.id for entry in reversed(record.rollouts)) or "none recorded"
            return EXIT_INVALID, [
                f"--rollout {request.rollout!r}: the controller's record of {namespace}/{name} has no such "
                f"rollout (recorded, latest first: {known})"
            ]
    start, end = _range(request, past, loaded.policy.spec.interval)
    try:
        overrides = [parse_override(text) for text in request.what_if]
        policy = apply_what_if(loaded, _document(loaded), overrides)
    except WhatIfError as error:
        return EXIT_INVALID, str(error).splitlines()
    try:
        headers = parse_headers(request.prometheus_headers)
    except ValueError as error:
        return EXIT_INVALID, [f"--prometheus-header: {error}"]
    try:
        config = PrometheusConfig(
            url=request.prometheus_url,
            headers=headers,
            bearer_token_file=request.prometheus_token_file,
            ca_file=request.prometheus_ca_file,
            timeout=request.prometheus_timeout,
        )
    except ValueError as error:
        return EXIT_INVALID, [f"--prometheus-url: {error}"]
    options = BacktestOptions(
        config,
        start,
        end,
        scrape_interval=request.scrape_interval,
        min_samples=request.min_samples,
    )
    try:
        result = run_backtest(policy, options, what_if=request.what_if)
    except HistoryError as error:
        return (EXIT_UNREACHABLE if error.unreachable else EXIT_INVALID), [str(error)]
    if notes:
        result = replace(result, notes=(*result.notes, *notes))
    if past is not None:
        chosen = select_recorded(result, past)
        if isinstance(chosen, str):
            return EXIT_INVALID, [chosen]
        result = chosen
    elif request.rollout is not None:
        chosen = select_rollout(result, request.rollout)
        if isinstance(chosen, str):
            return EXIT_INVALID, [chosen]
        result = chosen
    _emit(result, request, console)
    return EXIT_OK, []


def _quiet_logs() -> None:
    """The evidence layer logs as it does in the controller; here only its errors, on stderr, so
    that stdout holds the table, the JSON or the page alone."""
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )


def _range(request: BacktestRequest, past: PastRollout | None, interval: float) -> tuple[datetime, datetime]:
    """--from/--to as given; else the recorded rollout with a margin; else the last six hours."""
    now = request.now or datetime.now(UTC)
    if past is not None:
        began = past.started_at or past.ended_at
        margin = timedelta(seconds=max(5 * 60.0, 4 * interval, 0.1 * (past.ended_at - began).total_seconds()))
        start = request.start or began - margin
        end = request.end or min(past.ended_at + margin, now)
        return start, end
    return request.start or now - timedelta(hours=6), request.end or now


def select_recorded(result: Backtest, past: PastRollout) -> Backtest | str:
    """The period of the recorded rollout: its canary (and stable revision), overlapping its time."""
    began = past.started_at or past.ended_at
    slack = timedelta(minutes=5)
    replays = tuple(
        replace(replay, recorded=describe_recorded(past))
        for replay in result.replays
        if replay.period.canary == past.revision
        and (past.stable_revision is None or replay.period.stable == past.stable_revision)
        and replay.period.start <= past.ended_at + slack
        and replay.period.end >= began - slack
    )
    if not replays:
        found = ", ".join(replay.period.id for replay in result.replays) or "none"
        return (
            f"--rollout {past.id}: Prometheus shows no period in which {past.revision} served beside "
            f"{past.stable_revision or 'another revision'} around {began.isoformat()} .. "
            f"{past.ended_at.isoformat()} (periods found: {found})"
        )
    return Backtest(result.policy, result.history, replays, result.what_if, result.notes)


def describe_recorded(past: PastRollout) -> str:
    """The controller's own account of the rollout (its record), with the steps it wrote."""
    steps = ", ".join(f"{step.weight}% at {step.at.strftime('%H:%M:%SZ')}" for step in past.steps)
    reason = f": {past.reason}" if past.reason else ""
    return (
        f"recorded by the controller: {past.outcome.value} at {past.ended_at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        f"{reason}" + (f"; steps written: {steps}" if steps else "")
    )


def select_rollout(result: Backtest, wanted: str) -> Backtest | str:
    """The backtest of one rollout, by ``REVISION`` or ``REVISION@TIME`` (TIME within the period, or
    within five minutes of its start); or the message saying which rollouts there are."""
    revision, _, when = wanted.partition("@")
    moment: datetime | None = None
    if when:
        try:
            moment = datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            return f"--rollout {wanted!r}: {when!r} is not an RFC 3339 time"
    slack = timedelta(minutes=5)
    replays = tuple(
        replay
        for replay in result.replays
        if replay.period.canary == revision
        and (moment is None or replay.period.start - slack <= moment <= replay.period.end)
    )
    if not replays:
        found = ", ".join(replay.period.id for replay in result.replays) or "none"
        return f"--rollout {wanted!r}: no such rollout between --from and --to (found: {found})"
    return Backtest(result.policy, result.history, replays, result.what_if, result.notes)


def _policy(request: BacktestRequest) -> tuple[LoadedPolicy | None, list[str]]:
    if not request.policy_path.exists():
        return None, [f"{request.policy_path}: no such file or directory"]
    result = load_paths([request.policy_path])
    if result.errors:
        return None, [str(error) for error in result.errors]
    candidates = result.policies
    if request.isvc is not None:
        namespace, _, name = request.isvc.partition("/")
        if not name:
            return None, [f"--isvc {request.isvc!r}: expected NAMESPACE/NAME"]
        candidates = [
            loaded
            for loaded in candidates
            if loaded.policy.metadata.namespace == namespace
            and loaded.policy.spec.target.inference_service == name
        ]
        if not candidates:
            targets = ", ".join(_target(loaded) for loaded in result.policies)
            return None, [
                f"{request.policy_path}: no policy for {request.isvc} (it has policies for {targets})"
            ]
    if len(candidates) > 1:
        targets = ", ".join(_target(loaded) for loaded in candidates)
        return None, [
            f"{request.policy_path} holds policies for {targets}: choose one with --isvc NAMESPACE/NAME"
        ]
    return candidates[0], []


def _target(loaded: LoadedPolicy) -> str:
    return f"{loaded.policy.metadata.namespace}/{loaded.policy.spec.target.inference_service}"


def _document(loaded: LoadedPolicy) -> dict[str, Any]:
    """The policy's document as its file holds it (for --what-if: changed there, validated again)."""
    text = Path(loaded.path).read_text(encoding="utf-8")
    documents = [document for document in yaml.safe_load_all(text)]
    document = documents[loaded.document]
    if not isinstance(document, dict):
        raise WhatIfError(f"{loaded.path}: document {loaded.document + 1} is not a mapping")
    return document


def _emit(result: Backtest, request: BacktestRequest, console: Any) -> None:
    import json  # noqa: PLC0415

    if request.output_format == "table":
        if request.output is not None:
            from rich.console import Console  # noqa: PLC0415

            with request.output.open("w", encoding="utf-8") as handle:
                render_table(result, Console(file=handle, width=200, highlight=False))
            return
        render_table(result, console)
        return
    text = (
        json.dumps(to_json(result), indent=2) + "\n"
        if request.output_format == "json"
        else render_html(result)
    )
    if request.output is not None:
        request.output.write_text(text, encoding="utf-8")
    else:
        console.file.write(text)
