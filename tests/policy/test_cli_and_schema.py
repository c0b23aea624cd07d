"""``kserve-canary validate`` and ``schema``, and the committed schema and example policies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from canary.cli import app
from canary.policy import load_paths
from tests.policy.support import valid_policy

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "policies").rglob("*.yaml"))
# Two policy roots (each DIR/<namespace>/*.yaml), and what the operator opens to their namespaces.
ROOTS = [str(REPO / "policies" / "examples"), str(REPO / "policies" / "demo")]
SCOPE = [
    "--secret-env-allow",
    "ml=SLACK_WEBHOOK_URL,ml=DEPLOY_HOOK_URL,payments=DEPLOY_HOOK_URL,vision=SLACK_WEBHOOK_URL",
    "--secret-env-allow",
    "demo=DEMO_*",
    "--secret-file-root",
    "/var/run/secrets/kserve-canary",
]


def test_validate_exits_0_on_the_shipped_policies() -> None:
    result = CliRunner().invoke(app, ["validate", *SCOPE, *ROOTS])
    assert result.exit_code == 0, result.output
    assert f"{len(EXAMPLES)} valid policies, 0 errors" in result.output


def test_without_the_secret_scope_the_shipped_policies_validate_and_name_what_the_controller_decides() -> (
    None
):
    """Which secrets a namespace may read is the controller's setting (`run --secret-env-allow`): without
    it, validate checks everything else and names each reference it left to the controller."""
    result = CliRunner().invoke(app, ["validate", *ROOTS])
    assert result.exit_code == 0, result.output
    assert f"{len(EXAMPLES)} valid policies, 0 errors" in result.output
    assert (
        "not checked here: spec.notify[0].slack.webhookUrlFrom.env SLACK_WEBHOOK_URL: "
        "the controller's --secret-env-allow ml=GLOB decides"
    ) in result.output
    assert (
        "not checked here: spec.notify[1].webhook.secretFrom.file: the controller's --secret-file-root"
        in (result.output)
    )


def test_with_part_of_the_secret_scope_validate_refuses_as_the_controller_would() -> None:
    """What `run` would refuse: given the scope, no other environment variable and no file."""
    result = CliRunner().invoke(app, ["validate", "--secret-env-allow", "ml=ML_*", *ROOTS])
    assert result.exit_code == 1
    assert (
        "ml/llm-vllm.yaml:41: spec.notify[1].webhook.secretFrom.file: file references are disabled"
        in result.output
    )
    assert "environment variable SLACK_WEBHOOK_URL is not allowed for namespace ml (allowed: ML_*" in (
        result.output
    )
    assert "not checked here" not in result.output


def test_validate_exits_1_and_prints_located_errors(tmp_path: Path) -> None:
    (tmp_path / "ml").mkdir()
    (tmp_path / "ml" / "bad.yaml").write_text(valid_policy().replace("max: 800ms", "max: fast"))
    result = CliRunner().invoke(app, ["validate", str(tmp_path)])
    assert result.exit_code == 1
    assert f"{tmp_path / 'ml' / 'bad.yaml'}:11: spec.checks[0].max: 'fast' is not a duration" in result.output


def test_validate_exits_2_on_usage_errors(tmp_path: Path) -> None:
    assert CliRunner().invoke(app, ["validate"]).exit_code == 2
    assert CliRunner().invoke(app, ["validate", "--format", "xml", str(tmp_path)]).exit_code == 2


def test_validate_reports_a_missing_path(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "nope")])
    assert result.exit_code == 2, "a path that is not there is a usage error (docs/cli.md: 2)"
    assert "no such file or directory" in result.output


def test_python_dash_m_canary_is_the_same_command() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "canary", "validate", "--format", "json", *SCOPE, *ROOTS],
        capture_output=True,
        text=True,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["valid"] is True


def test_committed_schema_is_up_to_date() -> None:
    printed = CliRunner().invoke(app, ["schema"]).output
    committed = (REPO / "policies" / "schema.json").read_text()
    assert json.loads(printed) == json.loads(committed), "run `make schema` and commit policies/schema.json"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda path: path.name)
def test_schema_accepts_every_example_policy(example: Path) -> None:
    schema = json.loads((REPO / "policies" / "schema.json").read_text())
    for document in yaml.safe_load_all(example.read_text()):
        jsonschema.validate(document, schema)


def test_examples_cover_the_documented_use_cases() -> None:
    policies = {
        p.policy.metadata.name: p.policy for p in load_paths([REPO / "policies" / "examples"]).policies
    }
    llm = policies["llama-chat"]
    assert any(check.promql and "time_to_first_token" in check.promql for check in llm.spec.checks)
    assert {c.metric for c in llm.spec.checks} >= {"oom-kills", "kv-cache-usage", "gpu-memory-peak"}
    assert {c.metric for c in policies["fraud-scorer"].spec.checks} == {"latency", "error-rate"}
    assert any(c.max_fraction for c in policies["detector"].spec.checks)


def test_schema_rejects_a_misspelt_field() -> None:
    schema = json.loads((REPO / "policies" / "schema.json").read_text())
    document = yaml.safe_load(valid_policy().replace("maxIncrease", "maxIncrase"))
    with pytest.raises(jsonschema.ValidationError, match="maxIncrase"):
        jsonschema.validate(document, schema)


def test_validate_reads_the_scope_from_the_controller_s_environment_variables() -> None:
    """The Deployment sets SECRET_ENV_ALLOW (comma-separated) and SECRET_FILE_ROOT; CI can reuse them."""
    env = {
        "SECRET_ENV_ALLOW": "ml=SLACK_WEBHOOK_URL,ml=DEPLOY_HOOK_URL,payments=DEPLOY_HOOK_URL,"
        "vision=SLACK_WEBHOOK_URL,demo=DEMO_*",
        "SECRET_FILE_ROOT": "/var/run/secrets/kserve-canary",
    }
    result = CliRunner().invoke(app, ["validate", *ROOTS], env=env)
    assert result.exit_code == 0, result.output
    bad = CliRunner().invoke(app, ["validate", "--secret-env-allow", "ML_*", *ROOTS])
    assert bad.exit_code == 2
    assert "expected NAMESPACE=GLOB" in bad.output
