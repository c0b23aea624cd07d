"""`kserve-canary validate`: a path that does not exist is a usage error (exit 2, docs/cli.md), and a 100
step with a window is answered with what its author meant: bake."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.support import run
from tests.policy.support import valid_policy


def test_a_missing_path_exits_2_in_one_line(tmp_path: Path) -> None:
    completed = run("validate", str(tmp_path / "nonexistent"), home=tmp_path)
    assert completed.returncode == 2
    assert completed.stderr == f"error: {tmp_path / 'nonexistent'}: no such file or directory\n"


def test_a_window_on_the_100_step_suggests_bake(tmp_path: Path) -> None:
    (tmp_path / "ml").mkdir()
    policy = valid_policy().replace("steps: [10, 30, 50, 100]", "steps: [10, 50, {weight: 100, window: 30m}]")
    (tmp_path / "ml" / "good.yaml").write_text(policy)
    completed = run("validate", str(tmp_path), home=tmp_path)
    assert completed.returncode == 1, completed.stdout
    assert "to keep watching the promoted revision for 30m, set spec.bake: 30m" in completed.stdout
    assert "put the window on the step before it" in completed.stdout
    fixed = policy.replace("{weight: 100, window: 30m}]", "100]\n  bake: 30m")
    (tmp_path / "ml" / "good.yaml").write_text(fixed)
    assert run("validate", str(tmp_path), home=tmp_path).returncode == 0


def test_validate_refuses_custom_promql_naming_another_namespace_with_file_field_reason_and_fix(
    tmp_path: Path,
) -> None:
    """A policy file of team-a reading team-b's Stripe secrets: refused, where and why, with the fix
    (today's main printed "1 valid policy")."""
    (tmp_path / "team-a").mkdir()
    policy = valid_policy("fraud").replace("  namespace: ml\n", "")  # the directory decides: team-a
    peek = '    - {name: peek, promql: \'count(kube_secret_info{namespace="team-b", secret=~"stripe.*"})\', max: 1}\n'
    (tmp_path / "team-a" / "fraud.yaml").write_text(policy + peek)
    completed = run("validate", str(tmp_path), home=tmp_path)
    assert completed.returncode == 1, completed.stdout
    (line,) = (line for line in completed.stdout.splitlines() if "promql" in line)
    assert line.startswith(f"{tmp_path / 'team-a' / 'fraud.yaml'}:11: spec.checks[1].promql: ")
    assert 'namespace="team-b" names another namespace' in line  # the reason
    assert "a policy of namespace team-a reads only its own series" in line
    assert 'drop the matcher (the controller adds namespace="team-a")' in line  # the fix
    assert "--custom-promql-allow-metric team-a=kube_secret_info" in line
    # The operator's allowlist admits the named series for that namespace, and only there.
    allowed = run(
        "validate", str(tmp_path), "--custom-promql-allow-metric", "team-a=kube_secret_info", home=tmp_path
    )
    assert allowed.returncode == 0, allowed.stdout
    elsewhere = run(
        "validate", str(tmp_path), "--custom-promql-allow-metric", "team-b=kube_secret_info", home=tmp_path
    )
    assert elsewhere.returncode == 1


def test_a_window_shorter_than_four_scrape_intervals_is_warned_about(tmp_path: Path) -> None:
    # Issue 33, item 7: a 2-minute window read at a 1-minute scrape interval loses half its evidence.
    (tmp_path / "ml").mkdir()
    policy = valid_policy().replace("steps: [10, 30, 50, 100]", "steps: [10, 30, 50, 100]\n  window: 2m")
    (tmp_path / "ml" / "p.yaml").write_text(policy)
    at_a_minute = run("validate", str(tmp_path), "--scrape-interval", "60", home=tmp_path)
    assert at_a_minute.returncode == 0, at_a_minute.stdout  # a warning, not an error
    assert "warning: step 10%: window 2m is shorter than 4 scrape intervals (4m at 1m)" in at_a_minute.stdout
    at_15s = run("validate", str(tmp_path), "--scrape-interval", "15", home=tmp_path)
    assert "scrape intervals" not in at_15s.stdout, at_15s.stdout
    by_default = run("validate", str(tmp_path), "-o", "json", home=tmp_path)  # the controller's 30 s
    assert not any("scrape intervals" in w for w in json.loads(by_default.stdout)["policies"][0]["warnings"])
