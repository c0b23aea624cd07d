"""Help as people read it: metavars (NAME, FILE), no Python types (<bool>, <list[Path]>,
<str>) and no braces around arguments ({target})."""

from __future__ import annotations

import re

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from canary.cli import app

COMMANDS = sorted(get_command(app).commands)  # type: ignore[attr-defined]
ARTEFACT = re.compile(r"<(bool|str|int|float|path|list\[[^\]]*\])[^>]*>|\{[a-z_]+\}|<[a-z]+ range>")


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_has_no_type_artefacts(command: str) -> None:
    result = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    assert ARTEFACT.findall(result.output) == [], result.output
    assert "╭" not in result.output, "plain help: no boxes"


def test_arguments_show_their_metavar() -> None:
    pause = CliRunner().invoke(app, ["pause", "--help"]).output
    assert "Usage: kserve-canary pause [OPTIONS] NAME" in pause
    assert "--kubeconfig FILE" in pause and "--wait, --timeout SECONDS" in pause
    validate = CliRunner().invoke(app, ["validate", "--help"]).output
    assert "Usage: kserve-canary validate [OPTIONS] PATH..." in validate
    status = CliRunner().invoke(app, ["status", "--help"]).output
    assert "-o, --output, --format wide|json|yaml" in status


def test_dashboard_calls_the_dashboard_package() -> None:
    result = CliRunner().invoke(app, ["dashboard", "--help"])
    assert result.exit_code == 0
    for option in (
        "--address ADDRESS",
        "--port PORT",
        "--open / --no-browser",
        "-n, --namespace",
        "--prometheus-url URL",
    ):
        assert option in result.output
