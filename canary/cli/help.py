"""Help text as people read it, and one place where every failure becomes one or two lines.

Typer labels every parameter with its Python type (``--help <bool>``, ``PATHS <list[Path]>``) and
wraps required arguments in braces (``{target}``). Here each argument and option shows its metavar
(``NAMESPACE/NAME``, ``FILE``) and flags show nothing, as kubectl's and click's own help do: the
classes below replace Typer's parameter classes on the commands this group is built with.

This module imports Typer, the standard library and the exit codes only: it runs before every
command, ``--help`` included.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

from canary.cli.exit_codes import EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE

__all__ = [
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CanaryGroup",
    "fail",
]

DEBUG_KEY = "debug"


class _Argument(TyperArgument):
    def display_type_rich(self, ctx: Any) -> str | None:
        return None  # the metavar already says what it is

    def _usage_display_name(self) -> str:
        name = self.metavar or (self.name or "").upper()
        if self.nargs != 1:
            name += "..."
        return name if self.required else f"[{name}]"


class _Option(TyperOption):
    def display_type_rich(self, ctx: Any) -> str | None:
        if self.metavar is not None:
            return self.metavar
        kind = getattr(self, "type", None)  # click's ParamType, set by Parameter.__init__
        choices = getattr(kind, "choices", None)
        if choices:
            return "|".join(str(getattr(choice, "value", choice)) for choice in choices)
        # click's own names: TEXT, INTEGER, FLOAT, PATH ("float range" is a FLOAT)
        return str(getattr(kind, "name", "value")).split()[0].upper()


def _clean(command: Any) -> None:
    for param in getattr(command, "params", ()):
        # Same fields, other help methods: the subclasses add no state, so re-tagging is safe.
        if type(param) is TyperArgument:
            param.__class__ = _Argument
        elif type(param) is TyperOption:
            param.__class__ = _Option


class CanaryGroup(TyperGroup):
    """The ``kserve-canary`` group: clean help, and failures as one or two lines with an exit code."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        _clean(self)
        for command in self.commands.values():
            _clean(command)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise  # exit codes, usage errors: already what they should be
        except Exception as error:
            if ctx.meta.get(DEBUG_KEY) or _debug_from_environment():
                traceback.print_exc()
            # The classification knows the Kubernetes client's and urllib3's exceptions; it is imported
            # only here, on the way out, so that a failure costs nothing until it happens.
            from canary.cli.failures import describe  # noqa: PLC0415

            code, lines = describe(error)
            for line in lines:
                typer.echo(line, err=True)
            raise typer.Exit(code) from None


def _debug_from_environment() -> bool:
    return os.environ.get("KSERVE_CANARY_DEBUG", "").lower() in {"1", "true", "yes"}


def fail(message: str, code: int = EXIT_REFUSED, hint: str | None = None) -> typer.Exit:
    """Print ``message`` (and ``hint``) on stderr; the Exit to raise with ``code``."""
    typer.echo(message, err=True)
    if hint:
        typer.echo(hint, err=True)
    return typer.Exit(code)
