"""Safe PromQL text: escaping values that come from names, rendering query templates.

Revision, namespace and InferenceService names come from the cluster, and policy authors write query
templates: neither may be able to change the *shape* of a query. Every value is therefore escaped for
the place it lands in:

* inside a ``"double"`` or ``'single'`` quoted string: a PromQL string literal (``\\`` and the quote are
  escaped, control characters are written as escapes);
* inside a string that is the right-hand side of ``=~`` or ``!~``, or the regex argument of
  ``label_replace`` (its fifth): first escaped as an RE2 *literal* (``.`` matches only a dot), then as
  a string literal;
* inside a ```raw``` string: regex-escaped only (raw strings have no escapes), and a value containing a
  backtick is refused;
* outside any string: only ``{{ window }}`` and ``{{ interval }}`` (durations we produce ourselves) are
  allowed; a name outside quotes is refused, because nothing could stop it from being PromQL.

The lexer follows Prometheus' own: a ``#`` comment ends at a line feed *or* a carriage return.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from enum import Enum

__all__ = [
    "RAW_VARIABLES",
    "TemplateError",
    "format_duration_seconds",
    "label_name",
    "regex_alternation",
    "regex_literal",
    "render_template",
    "string_literal",
]

# The variables whose values we produce (PromQL durations) and that may stand outside quotes.
RAW_VARIABLES = frozenset({"window", "interval"})

# RE2 metacharacters. Go's regexp treats any escaped ASCII punctuation as itself, so escaping exactly
# these keeps the pattern readable in logs while making the value a literal.
_RE2_META = frozenset("\\.+*?()|[]{}^$")

_TEMPLATE_VARIABLE = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_]*)\s*}}")
# Functions whose argument at this (0-based) position is an RE2 pattern.
_REGEX_ARGUMENTS = {"label_replace": 4}
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_END_OF_COMMENT = re.compile(r"[\r\n]")
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TemplateError(ValueError):
    """A query template that cannot be rendered safely (the check then reports a bad query)."""


_NEEDS_ESCAPE = re.compile(r"[\\\"'\x00-\x1f\x7f]")


def string_literal(value: str, quote: str = '"') -> str:
    """``value`` escaped for the inside of a PromQL string quoted with ``quote`` (no quotes added)."""
    if _NEEDS_ESCAPE.search(value) is None:
        return value  # the common case: Kubernetes names need no escaping
    out: list[str] = []
    for char in value:
        if char == "\\":
            out.append("\\\\")
        elif char == quote:
            out.append("\\" + quote)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "".join(out)


def label_name(name: str) -> str:
    """``name`` if it is a Prometheus label name (it stands outside quotes in a matcher, a ``by`` or
    an ``on`` list, where nothing could escape it); a ValueError otherwise."""
    if _LABEL_NAME.fullmatch(name) is None:
        raise ValueError(f"{name!r} is not a Prometheus label name ([A-Za-z_][A-Za-z0-9_]*)")
    return name


@functools.lru_cache(maxsize=65_536)
def regex_literal(value: str) -> str:
    """``value`` as an RE2 pattern matching exactly that text (before string-literal escaping).

    Cached: every tick's sample selects every tracked revision by name again (2,000 at 1,000
    rollouts), and escaping them character by character was a few percent of the controller's CPU."""
    return "".join("\\" + char if char in _RE2_META else char for char in value)


def regex_alternation(values: list[str] | tuple[str, ...]) -> str:
    """An RE2 group matching exactly one of ``values``, sorted so that the query text is stable."""
    return "(" + "|".join(regex_literal(value) for value in sorted(set(values))) + ")"


def format_duration_seconds(seconds: float) -> str:
    """A PromQL duration in whole seconds (``"300s"``); at least one second."""
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, got {seconds}")
    return f"{max(1, round(seconds))}s"


class _Context(Enum):
    CODE = "code"
    STRING = "string"
    REGEX_STRING = "regex-string"
    RAW_STRING = "raw-string"
    RAW_REGEX_STRING = "raw-regex-string"


def _placeholder_contexts(template: str) -> list[tuple[re.Match[str], _Context, str]]:
    """Each ``{{ name }}`` in ``template`` with the lexical context it stands in and its quote char.

    A small PromQL lexer: it tracks string literals (with their escapes) and comments, remembers
    whether the last operator before a string was ``=~``/``!~``, and which argument of which
    function call a string is (``label_replace``'s fifth argument is a regex), either of which
    makes the string a regex.
    """
    placeholders = {match.start(): match for match in _TEMPLATE_VARIABLE.finditer(template)}
    found: list[tuple[re.Match[str], _Context, str]] = []
    index = 0
    quote: str | None = None
    string_is_regex = False
    last_operator = ""
    last_identifier: str | None = None  # the identifier just before, if the last token was one
    # Open brackets: (bracket, function name of a "(", index of the current argument).
    nesting: list[tuple[str, str | None, int]] = []
    length = len(template)
    while index < length:
        match = placeholders.get(index)
        if match is not None:
            if quote is None:
                context = _Context.CODE
            elif quote == "`":
                context = _Context.RAW_REGEX_STRING if string_is_regex else _Context.RAW_STRING
            else:
                context = _Context.REGEX_STRING if string_is_regex else _Context.STRING
            found.append((match, context, quote or ""))
            index = match.end()
            continue
        char = template[index]
        if quote is not None:
            if char == "\\" and quote != "`":
                index += 2  # an escape inside a string never ends it
                continue
            if char == quote:
                quote = None
            index += 1
            continue
        if char in "\"'`":
            quote = char
            in_regex_argument = bool(nesting) and (
                nesting[-1][0] == "("
                and nesting[-1][1] is not None
                and _REGEX_ARGUMENTS.get(nesting[-1][1]) == nesting[-1][2]
            )
            string_is_regex = last_operator in {"=~", "!~"} or in_regex_argument
            last_operator, last_identifier = char, None
        elif char == "#":
            # Prometheus ends a comment at "\n" or "\r" (its lexer's isEndOfLine).
            end = _END_OF_COMMENT.search(template, index)
            index = length if end is None else end.start()
            continue
        elif not char.isspace():
            identifier = _IDENTIFIER.match(template, index)
            if identifier is not None:
                last_operator = last_identifier = identifier.group()
                index = identifier.end()
                continue
            two = template[index : index + 2]
            if char in "([{":
                nesting.append((char, last_identifier if char == "(" else None, 0))
            elif char in ")]}" and nesting:
                nesting.pop()
            elif char == "," and nesting:
                bracket, function, argument = nesting[-1]
                nesting[-1] = (bracket, function, argument + 1)
            last_operator = two if two in {"=~", "!~"} else char
            last_identifier = None
            if two in {"=~", "!~"}:
                index += 2
                continue
        index += 1
    if quote is not None:
        raise TemplateError(f"unterminated {quote} string in the query template")
    return found


def render_template(template: str, variables: Mapping[str, str]) -> str:
    """Substitute ``{{ name }}`` placeholders, escaping each value for where it stands.

    ``variables`` maps a template variable to its raw value (a revision name, a namespace, a
    duration such as ``"300s"`` for ``window``). Raises :class:`TemplateError` for an unknown
    variable, a name outside quotes, or a value that cannot be made safe in a raw string.
    """
    pieces: list[str] = []
    position = 0
    for match, context, quote in _placeholder_contexts(template):
        name = match.group(1)
        if name not in variables:
            raise TemplateError(f"unknown template variable {name!r}; known: {', '.join(sorted(variables))}")
        value = variables[name]
        if context is _Context.CODE:
            if name not in RAW_VARIABLES:
                raise TemplateError(
                    f'{{{{ {name} }}}} must stand inside a quoted string (e.g. "{{{{ {name} }}}}"), '
                    "where its value can be escaped"
                )
            rendered = value
        elif context is _Context.STRING:
            rendered = string_literal(value, quote)
        elif context is _Context.REGEX_STRING:
            rendered = string_literal(regex_literal(value), quote)
        else:
            rendered = regex_literal(value) if context is _Context.RAW_REGEX_STRING else value
            if "`" in rendered:
                raise TemplateError(f"the value of {{{{ {name} }}}} contains a backtick; use a quoted string")
        pieces.append(template[position : match.start()])
        pieces.append(rendered)
        position = match.end()
    pieces.append(template[position:])
    return "".join(pieces)
