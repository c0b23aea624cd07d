"""Text from elsewhere shown as text in the chat services that read Markdown (Teams' Adaptive Cards,
Discord): Prometheus' error messages and a proxy's (they reach summaries, reasons and check lines),
names from a policy, the cluster's name.

:func:`inert` puts a backslash before every character that starts Markdown syntax: links and images
(``[``, ``]``), autolinks and HTML (``<``, ``>``), emphasis, strike-through, spoilers and code (``*``,
``_``, ``~``, ``|``, a backtick), headings and quotes (``#``), and the backslash itself. CommonMark,
Teams and Discord show an escaped character as itself. A bare URL would still be linked by the
services' own autolinkers, so its ``://`` is written ``:\\/\\/``: it reads the same and links nowhere.
"""

from __future__ import annotations

import re

__all__ = ["clip", "inert"]

_SYNTAX = re.compile(r"([\\`*_~|\[\]<>#])")


def inert(text: str) -> str:
    """``text`` with its Markdown syntax escaped and its URLs unlinked (see the module docstring)."""
    return _SYNTAX.sub(r"\\\1", text).replace("://", r":\/\/")


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in "…" when cut, never inside an escape."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if (len(cut) - len(cut.rstrip("\\"))) % 2:  # a lone backslash would escape the ellipsis
        cut = cut[:-1]
    return cut + "…"
