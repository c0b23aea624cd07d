"""The ``kserve-canary`` command line."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from canary import __version__
from canary.policy import load_paths
from canary.policy.schema import policy_json_schema

app = typer.Typer(
    name="kserve-canary",
    help="Automated, evidence-driven canary rollouts for KServe InferenceServices.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class OutputFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"kserve-canary {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Automated, evidence-driven canary rollouts for KServe InferenceServices."""


@app.command()
def validate(
    paths: Annotated[list[Path], typer.Argument(help="Policy files or directories (searched recursively).")],
    output: Annotated[OutputFormat, typer.Option("--format", help="text for people, json for machines.")] = (
        OutputFormat.TEXT
    ),
) -> None:
    """Check policy files; exit 0 when all are valid, 1 when any is not (2: usage error)."""
    result = load_paths(paths)
    if output is OutputFormat.JSON:
        document = {
            "valid": result.ok,
            "files": result.files,
            "policies": [
                {
                    "name": loaded.policy.metadata.name,
                    "target": loaded.policy.key,
                    "path": loaded.path,
                    "line": loaded.line,
                }
                for loaded in result.policies
            ],
            "errors": [error.as_dict() for error in sorted(result.errors, key=lambda error: error.sort_key)],
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        console = Console(highlight=False, soft_wrap=True)
        for error in sorted(result.errors, key=lambda error: error.sort_key):
            console.print(str(error), markup=False)
        for loaded in result.policies:
            console.print(
                f"ok  {loaded.origin}: {loaded.policy.metadata.name} -> {loaded.policy.key}", markup=False
            )
        summary = f"{len(result.policies)} valid {'policy' if len(result.policies) == 1 else 'policies'}"
        summary += f", {len(result.errors)} {'error' if len(result.errors) == 1 else 'errors'}"
        summary += f" in {len(result.files)} {'file' if len(result.files) == 1 else 'files'}"
        console.print(summary, markup=False)
    raise typer.Exit(0 if result.ok else 1)


@app.command()
def schema() -> None:
    """Print the JSON Schema of the policy file (for yaml-language-server and editors)."""
    typer.echo(json.dumps(policy_json_schema(), indent=2, sort_keys=True))


def main() -> None:
    app()
