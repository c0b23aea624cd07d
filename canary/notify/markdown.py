"""Text from elsewhere shown as text in the chat services that read Markdown (Teams' Adaptive Cards,
Discord): Prometheus' error messages and a proxy's (they reach summaries, reasons and check lines),
names from a policy, the cluster's name.

:func:`inert` puts a backslash before every character that starts Markdown syntax: links and images
(``[``, ``]``), autolinks and HTML (``<``, ``>``), emphasis, strike-through, spoilers and code (``*``,
``_``, ``~``, ``|``, a backtick), headings and quotes (``#``), and the backslash itself. CommonMark,
Teams and Discord show an escaped character as itself. A bare URL would still be linked by the
services' own autolinkers, so its ``://`` is written ``:\\/\\/`` and a ``www.`` (GitHub-flavoured
Markdown links those without a scheme) ``www\\.``: they read the same and link nowhere. Line breaks
become spaces: a line of ``===`` or ``---`` under a text makes it a heading, and a line that starts
with ``-``, ``+`` or ``1.`` a list, so untrusted text stays on the line it was put on.
"""

from __future__ import annotations

import re

__all__ = ["clip", "inert"]

_SYNTAX = re.compile(r"([\\`*_~|\[\]<>#])")
_LINE_BREAKS = re.compile(r"[\r\n\v\f\x85\u2028\u2029]+")
_WWW = re.compile(r"(?i)\b(www)\.")


def inert(text: str) -> str:
    """``text`` with its Markdown syntax escaped, its URLs unlinked and its line breaks made spaces
    (see the module docstring)."""
    text = _SYNTAX.sub(r"\\\1", _LINE_BREAKS.sub(" ", text))
    return _WWW.sub(r"\1\\.", text.replace("://", r":\/\/"))


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in "…" when cut, never inside an escape."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if (len(cut) - len(cut.rstrip("\\"))) % 2:  # a lone backslash would escape the ellipsis
        cut = cut[:-1]
    return cut + "…"
