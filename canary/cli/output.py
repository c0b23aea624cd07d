"""Text for terminals and pipes: no control characters, kubectl's durations and aligned columns.

Standard library only: ``status`` prints through here, and its start-up time is part of its interface.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

__all__ = ["NONE", "columns", "human_duration", "printable", "since", "timestamp"]

NONE = "<none>"  # what kubectl prints for a value that is not there

# What a ConfigMap holds reaches a terminal only through printable(): anyone who can edit the
# ConfigMap could otherwise clear the screen (ESC [ 2J), plant hyperlinks (OSC 8), or overwrite a
# line (\r, backspaces) in front of the person reading `status` or `explain`.
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: cursor, erase, colours
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: titles, hyperlinks; ended by BEL or ST
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b[ -~]?"  # any other escape
)
# C0 (but newline), DEL, C1, and the bidirectional overrides that reorder what is shown.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` without escape sequences or control characters (newlines stay; a tab is a space)."""
    return _CONTROL.sub("", _ESCAPE_SEQUENCE.sub("", text.replace("\t", " ")))


def human_duration(seconds: float) -> str:
    """A duration as kubectl prints ages (k8s.io/apimachinery's HumanDuration): 45s, 3m12s, 47m,
    5h3m, 26h, 5d3h, 12d, 3y45d."""
    total = int(seconds)
    if total < 0:
        return "0s"  # a clock ahead of ours: kubectl says 0s too
    if total < 120:
        return f"{total}s"
    minutes = total // 60
    if minutes < 10:
        rest = total % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = total // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        rest = hours % 24
        return f"{hours // 24}d{rest}h" if rest else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        rest = (hours // 24) % 365
        return f"{hours // 24 // 365}y{rest}d" if rest else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def since(moment: datetime | None, now: datetime | None = None) -> str:
    """How long ago ``moment`` was (``3m12s``); :data:`NONE` when there is no moment."""
    if moment is None:
        return NONE
    try:
        return human_duration(((now or datetime.now(UTC)) - moment).total_seconds())
    except (OverflowError, TypeError):
        return NONE


def timestamp(moment: datetime | None) -> str:
    """A moment for people, to the second, in UTC: ``2026-03-01T12:00:00Z``."""
    if moment is None:
        return NONE
    try:
        return moment.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"
    except (OverflowError, ValueError):
        return moment.isoformat(timespec="seconds")


def columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns three spaces apart, nothing truncated or wrapped, as kubectl prints them
    (the last column is not padded, so ``grep`` and ``awk`` see exactly the values)."""
    table = [list(header), *([printable(cell).replace("\n", " ") or NONE for cell in row] for row in rows)]
    widths = [max(len(row[index]) for row in table) for index in range(len(header))]
    lines = []
    for row in table:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths[:-1], strict=True)]
        lines.append("   ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)
