"""``status NAME --watch``: follow one rollout until it ends, and exit with its outcome.

For CI pipelines, as ``argo rollouts status`` and ``kubectl rollout status`` are used: a line per change
on stdout, then exit 0 on a promotion (or nothing to roll out), and a code of its own for a rollback, a
pause that waits for a person, and a rollout still under way at ``--timeout`` (docs/cli.md).
"""

from __future__ import annotations

import time
from typing import NoReturn

import typer
from kubernetes import client

from canary.cli.exit_codes import EXIT_OK, EXIT_PAUSED, EXIT_REFUSED, EXIT_ROLLED_BACK, EXIT_STALLED
from canary.cli.help import fail
from canary.cli.output import printable
from canary.cli.rollouts import StatusRow, not_seen, status_row
from canary.kserve.store import ConfigMapStateStore
from canary.rollout.state import Phase

__all__ = ["follow"]

# What each end means, and its exit code. Idle: the newest revision is the rolled-out one.
_ENDS = {
    Phase.SUCCEEDED: EXIT_OK,
    Phase.IDLE: EXIT_OK,
    Phase.ROLLED_BACK: EXIT_ROLLED_BACK,
    Phase.PAUSED: EXIT_PAUSED,
}
_POLL_SECONDS = 1.0


def follow(api: client.ApiClient, namespace: str, name: str, timeout: float) -> NoReturn:
    """Print the rollout of ``namespace/name`` whenever it changes, until it ends or ``timeout``
    seconds pass (0: no limit); exit with the outcome's code."""
    store = ConfigMapStateStore(api)
    deadline = time.monotonic() + timeout if timeout > 0 else None
    shown = ""
    while True:
        stored = store.load(namespace, name)
        if stored.state_json is None:
            raise fail(printable(not_seen(api, namespace, name)), EXIT_REFUSED)
        row = status_row(stored)
        line = describe(row)
        if line != shown:
            typer.echo(printable(line))
            shown = line
        if row.phase == "Unreadable":
            raise typer.Exit(EXIT_REFUSED)
        code = _ENDS.get(Phase(row.phase))
        if code is not None:
            raise typer.Exit(code)
        if deadline is not None and time.monotonic() >= deadline:
            raise fail(
                printable(f"{namespace}/{name} is still {row.phase} after {timeout:g}s (--timeout): stalled"),
                EXIT_STALLED,
            )
        _pause(deadline)


def describe(row: StatusRow) -> str:
    """One line: who, phase, weight and step, and the last decision's reason."""
    where = f"{row.namespace}/{row.name}"
    parts = [f"{where}: {row.phase}"]
    if row.revision:
        parts.append(row.revision)
    if row.weight is not None:
        parts.append(f"{row.weight}%")
    if row.step is not None:
        parts.append(f"step {row.step} ({row.step_weight}%)")
    text = " ".join(parts)
    return f"{text} — {row.reason}" if row.reason else text


def _pause(deadline: float | None) -> None:
    left = _POLL_SECONDS if deadline is None else max(0.0, min(_POLL_SECONDS, deadline - time.monotonic()))
    time.sleep(left)
