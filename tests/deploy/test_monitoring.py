"""The Grafana dashboard and the alerts, against the controller's real metrics and a real PromQL engine.

* metric names: every series the dashboard and the alerts select is one the controller exports
  (its real /metrics from a run as deployed);
* alerts: ``promtool test rules`` (Prometheus' own rule evaluator) fires each alert on series shaped
  like the controller's, and keeps it silent where it must (a stale ex-leader, a moving rollout);
* dashboard: every panel query parses (``promtool check rules``), and the rollout panels evaluate to
  the leader's values with the phase and verdict encodings the value mappings expect.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from canary.controller.observability import PHASES
from tests.deploy.manifests import CHART, DEPLOY
from tests.deploy.scenario import ScenarioResult

DASHBOARD = DEPLOY / "base" / "dashboards" / "kserve-canary.json"
RULES = CHART / "files" / "prometheus-rules.yaml"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
VARIABLES = {
    "$job": "kserve-canary",
    "$namespace": ".*",
    "$model": ".*",
    "$check": "p99",
    "$__rate_interval": "2m",
}
JOB = 'job="kserve-canary"'
LEADER_A = 'instance="10.0.0.1:8080", pod="kserve-canary-a"'
LEADER_B = 'instance="10.0.0.2:8080", pod="kserve-canary-b"'


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def panel_targets() -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, variables substituted."""
    found = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in VARIABLES.items():
                expr = expr.replace(variable, value)
            found.append((panel["title"], expr))
    for annotation in dashboard()["annotations"]["list"]:
        if "expr" in annotation:
            found.append((annotation["name"], annotation["expr"].replace("$job", "kserve-canary")))
    return found


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(kserve_canary_[a-z_]+)", expr))


def exported_names(exposition: str) -> set[str]:
    """Sample names the exposition's families produce (counters _total, histograms _bucket...)."""
    names = set()
    for line in exposition.splitlines():
        match = re.match(r"# TYPE (\S+) (\w+)", line)
        if not match:
            continue
        name, kind = match.groups()
        if kind == "counter":
            names.add(name if name.endswith("_total") else name + "_total")
        else:
            suffixes = {"histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count"]}
            names.update(name + suffix for suffix in suffixes.get(kind, [""]))
    return names


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def test_dashboard_structure() -> None:
    board = dashboard()
    assert board["uid"] == "kserve-canary" and board["title"] == "kserve-canary"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    assert {"job", "namespace", "model", "check"} <= set(variables)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]) and panel["gridPos"]["x"] + panel["gridPos"][
            "w"
        ] <= 24
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    titles = " | ".join(panel["title"].lower() for panel in board["panels"])
    for subject in (
        "phase per model",
        "weight per model",
        "decisions",
        "canary, stable and limits",
        "query errors",
    ):
        assert subject in titles, subject
    # The phase and verdict value mappings are the encodings the queries compute.
    mappings = {
        panel["title"]: panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
        for panel in board["panels"]
        if panel["type"] == "state-timeline"
    }
    assert [mappings["Phase per model"][str(i)]["text"] for i in range(len(PHASES))] == list(PHASES)
    assert [mappings["Verdict per check"][str(i)]["text"] for i in range(4)] == [
        "pass",
        "no-data",
        "error",
        "fail",
    ]


def test_dashboard_and_alerts_select_metrics_the_controller_exports(cluster_wide_run: ScenarioResult) -> None:
    exported = exported_names(cluster_wide_run.metrics)
    used = set().union(*(metric_names(expr) for _, expr in panel_targets()))
    used |= set().union(*(metric_names(rule["expr"]) for rule in alert_rules()))
    assert used - exported == set(), f"not exported by the controller: {sorted(used - exported)}"
    # What a run with an unreachable Prometheus and two checks with limits exports.
    assert re.search(
        r'kserve_canary_check_limit\{[^}]*bound="max",check="p99"[^}]*\} 0\.5', cluster_wide_run.metrics
    )
    assert re.search(
        r'kserve_canary_prometheus_query_errors_total\{error_class="unreachable"\} [1-9]',
        cluster_wide_run.metrics,
    )
    assert re.search(
        r'kserve_canary_rollout_phase\{[^}]*phase="Progressing"\} 1\.0', cluster_wide_run.metrics
    )


def test_every_query_parses(tmp_path: Path) -> None:
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(panel_targets())
    ]}]}  # fmt: skip
    (tmp_path / "dashboard.yaml").write_text(yaml.safe_dump(rules))
    shutil.copy(RULES, tmp_path / "alerts.yaml")
    checked = promtool("check", "rules", "dashboard.yaml", "alerts.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout
    # And promtool does reject a broken one (the check can fail).
    (tmp_path / "broken.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "r", "expr": "sum(("}]}]})
    )
    assert promtool("check", "rules", "broken.yaml", cwd=tmp_path).returncode != 0


def render_annotations(rule: dict[str, Any], labels: dict[str, str], value: str) -> dict[str, str]:
    """The alert's annotations with {{ $labels.x }} and {{ $value }} filled in, as Prometheus does."""
    rendered = {}
    for key, template in rule.get("annotations", {}).items():
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
        rendered[key] = text.replace("{{ $value }}", value)
    return rendered


def expect(alert: str, labels: dict[str, str], value: str = "1") -> dict[str, Any]:
    rule = next(r for r in alert_rules() if r["alert"] == alert)
    full = {**labels, **rule.get("labels", {})}
    return {"exp_labels": full, "exp_annotations": render_annotations(rule, full, value)}


def series(name: str, labels: str, values: str) -> dict[str, str]:
    return {"series": f"{name}{{{JOB}, {labels}}}", "values": values}


def rollout(instance: str, model: str, phase: str, minutes: int) -> list[dict[str, str]]:
    """The phase series of one model as the controller sets them (one at 1)."""
    return [
        series(
            "kserve_canary_rollout_phase",
            f'{instance}, namespace="models", inference_service="{model}", phase="{p}"',
            f"{1 if p == phase else 0}x{minutes}",
        )
        for p in PHASES
    ]


ALERT_TESTS: list[dict[str, Any]] = [
    {  # one leader: quiet; nobody leading for 5 minutes: NoLeader; no controller at all: NoLeader too
        "interval": "1m",
        "input_series": [
            series("kserve_canary_leader", LEADER_A, "1x10 0x20"),
            series("kserve_canary_leader", LEADER_B, "0x30"),
        ],
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": "KServeCanaryNoLeader", "exp_alerts": []},
            {"eval_time": "14m", "alertname": "KServeCanaryNoLeader", "exp_alerts": []},
            {
                "eval_time": "16m",
                "alertname": "KServeCanaryNoLeader",
                "exp_alerts": [expect("KServeCanaryNoLeader", {})],
            },
        ],
    },
    {
        "interval": "1m",
        "input_series": [series("kserve_canary_policies", f'{LEADER_A}, state="loaded"', "3x10")],
        "alert_rule_test": [
            {
                "eval_time": "6m",
                "alertname": "KServeCanaryNoLeader",
                "exp_alerts": [expect("KServeCanaryNoLeader", {})],
            },
        ],
    },
    {  # Prometheus unreachable for 15 minutes; a bad custom query is another alert
        "interval": "1m",
        "input_series": [
            series(
                "kserve_canary_prometheus_query_errors_total",
                f'{LEADER_A}, error_class="unreachable"',
                "0+6x30",
            ),
            series(
                "kserve_canary_prometheus_query_errors_total",
                f'{LEADER_A}, error_class="bad-query"',
                "0+1x40",
            ),
        ],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "KServeCanaryPrometheusUnreachable", "exp_alerts": []},
            {
                "eval_time": "15m",
                "alertname": "KServeCanaryPrometheusUnreachable",
                "exp_alerts": [expect("KServeCanaryPrometheusUnreachable", {"error_class": "unreachable"})],
            },
            {
                "eval_time": "35m",
                "alertname": "KServeCanaryQueryErrors",
                "exp_alerts": [expect("KServeCanaryQueryErrors", {"error_class": "bad-query"})],
            },
        ],
    },
    {  # a 503 from Prometheus or its proxy, and answers that are not Prometheus', page as unreachable does
        "interval": "1m",
        "input_series": [
            series(
                "kserve_canary_prometheus_query_errors_total",
                f'{LEADER_A}, error_class="{error_class}"',
                "0+3x30",
            )
            for error_class in ("unavailable", "malformed-response")
        ],
        "alert_rule_test": [
            {
                "eval_time": "15m",
                "alertname": "KServeCanaryPrometheusUnreachable",
                "exp_alerts": [
                    expect("KServeCanaryPrometheusUnreachable", {"error_class": "unavailable"}),
                    expect("KServeCanaryPrometheusUnreachable", {"error_class": "malformed-response"}),
                ],
            },
        ],
    },
    {  # stuck: Progressing at 10% for hours on the leader; a moving rollout and a stale ex-leader stay quiet
        "interval": "5m",
        "input_series": [
            series("kserve_canary_leader", LEADER_A, "1x60"),
            series("kserve_canary_leader", LEADER_B, "0x60"),
            *rollout(LEADER_A, "stuck", "Progressing", 60),
            series(
                "kserve_canary_rollout_weight",
                f'{LEADER_A}, namespace="models", inference_service="stuck"',
                "10x60",
            ),
            *rollout(LEADER_A, "moving", "Progressing", 60),
            series(
                "kserve_canary_rollout_weight",
                f'{LEADER_A}, namespace="models", inference_service="moving"',
                "10x11 30x11 50x11 10x11 30x11 50x4",
            ),
            *rollout(LEADER_B, "ghost", "Progressing", 60),
            series(
                "kserve_canary_rollout_weight",
                f'{LEADER_B}, namespace="models", inference_service="ghost"',
                "10x60",
            ),
            *rollout(LEADER_A, "waiting", "Paused", 60),
            series(
                "kserve_canary_rollout_weight",
                f'{LEADER_A}, namespace="models", inference_service="waiting"',
                "50x60",
            ),
        ],
        "alert_rule_test": [
            {"eval_time": "2h", "alertname": "KServeCanaryRolloutStuck", "exp_alerts": []},
            {
                "eval_time": "3h",
                "alertname": "KServeCanaryRolloutStuck",
                "exp_alerts": [
                    expect("KServeCanaryRolloutStuck", {"namespace": "models", "inference_service": "stuck"})
                ],
            },
            {"eval_time": "30m", "alertname": "KServeCanaryRolloutPaused", "exp_alerts": []},
            {
                "eval_time": "90m",
                "alertname": "KServeCanaryRolloutPaused",
                "exp_alerts": [
                    expect(
                        "KServeCanaryRolloutPaused", {"namespace": "models", "inference_service": "waiting"}
                    )
                ],
            },
        ],
    },
    {  # a Slack delivery failed after retries; Events keep being delivered
        "interval": "1m",
        "input_series": [
            series(
                "kserve_canary_notifications_total",
                f'{LEADER_A}, target_kind="slack", outcome="failed"',
                "0 0 0 1 1 1 1",
            ),
            series(
                "kserve_canary_notifications_total",
                f'{LEADER_A}, target_kind="kubernetes-event", outcome="delivered"',
                "0+1x6",
            ),
        ],
        "alert_rule_test": [
            {"eval_time": "2m", "alertname": "KServeCanaryNotificationsFailing", "exp_alerts": []},
            {
                "eval_time": "5m",
                "alertname": "KServeCanaryNotificationsFailing",
                "exp_alerts": [expect("KServeCanaryNotificationsFailing", {"target_kind": "slack"})],
            },
        ],
    },
    {
        "interval": "1m",
        "input_series": [series("kserve_canary_policies", f'{LEADER_A}, state="invalid-files"', "0 0 2x20")],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "KServeCanaryPolicyErrors", "exp_alerts": []},
            {
                "eval_time": "15m",
                "alertname": "KServeCanaryPolicyErrors",
                "exp_alerts": [expect("KServeCanaryPolicyErrors", {}, "2")],
            },
        ],
    },
]


def test_alerts_fire_when_they_must_and_only_then(tmp_path: Path) -> None:
    shutil.copy(RULES, tmp_path / "alerts.yaml")
    (tmp_path / "alerts_test.yaml").write_text(
        yaml.safe_dump({"rule_files": ["alerts.yaml"], "evaluation_interval": "1m", "tests": ALERT_TESTS})
    )
    tested = promtool("test", "rules", "alerts_test.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert {rule["alert"] for rule in alert_rules()} == {
        test["alertname"] for case in ALERT_TESTS for test in case["alert_rule_test"]
    }, "every alert has a test"


def test_a_wrong_expectation_fails_promtool(tmp_path: Path) -> None:
    shutil.copy(RULES, tmp_path / "alerts.yaml")
    wrong = json.loads(json.dumps(ALERT_TESTS[-1]))
    wrong["alert_rule_test"][0]["exp_alerts"] = [expect("KServeCanaryPolicyErrors", {}, "2")]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump({"rule_files": ["alerts.yaml"], "tests": [wrong]}))
    assert promtool("test", "rules", "t.yaml", cwd=tmp_path).returncode != 0


def panel_expr(title: str, ref: str = "A") -> str:
    panel = next(p for p in dashboard()["panels"] if p["title"] == title)
    expr = next(t["expr"] for t in panel["targets"] if t["refId"] == ref)
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    return str(expr)


@pytest.fixture
def dashboard_series() -> list[dict[str, str]]:
    """Two replicas: A leads now; B led before and still exports what it last saw."""
    model = 'namespace="models", inference_service="llama"'
    return [
        series("kserve_canary_leader", LEADER_A, "1x10"),
        series("kserve_canary_leader", LEADER_B, "0x10"),
        *rollout(LEADER_A, "llama", "Progressing", 10),
        *rollout(LEADER_B, "llama", "Pending", 10),
        series("kserve_canary_rollout_weight", f"{LEADER_A}, {model}", "30x10"),
        series("kserve_canary_rollout_weight", f"{LEADER_B}, {model}", "10x10"),
        *[
            series(
                "kserve_canary_check_verdict",
                f'{LEADER_A}, {model}, check="p99", verdict="{v}"',
                f"{int(v == 'fail')}x10",
            )
            for v in ("pass", "fail", "no-data", "error")
        ],
        series("kserve_canary_check_value", f'{LEADER_A}, {model}, check="p99", revision="canary"', "0.9x10"),
        series("kserve_canary_check_value", f'{LEADER_A}, {model}, check="p99", revision="stable"', "0.6x10"),
        series("kserve_canary_check_limit", f'{LEADER_A}, {model}, check="p99", bound="max"', "0.8x10"),
        series(
            "kserve_canary_check_limit", f'{LEADER_A}, {model}, check="p99", bound="max-vs-stable"', "0.72x10"
        ),
        series("kserve_canary_check_value", f'{LEADER_B}, {model}, check="p99", revision="canary"', "0.1x10"),
    ]


def test_rollout_panels_show_the_leaders_view(tmp_path: Path, dashboard_series: list[dict[str, str]]) -> None:
    llama = {"namespace": "models", "inference_service": "llama"}
    tests = [
        {
            "expr": panel_expr("Canary weight per model"),
            "eval_time": "5m",
            "exp_samples": [{"labels": str_labels(llama), "value": 30}],
        },
        {
            "expr": panel_expr("Phase per model"),
            "eval_time": "5m",
            "exp_samples": [{"labels": str_labels(llama), "value": PHASES.index("Progressing")}],
        },
        {
            "expr": panel_expr("Verdict per check"),
            "eval_time": "5m",
            "exp_samples": [{"labels": str_labels({**llama, "check": "p99"}), "value": 3}],
        },
        {
            "expr": panel_expr("$check: canary, stable and limits", "A"),
            "eval_time": "5m",
            "exp_samples": [
                {"labels": str_labels({**llama, "revision": "canary"}), "value": 0.9},
                {"labels": str_labels({**llama, "revision": "stable"}), "value": 0.6},
            ],
        },
        {
            "expr": panel_expr("$check: canary, stable and limits", "B"),
            "eval_time": "5m",
            "exp_samples": [
                {"labels": str_labels({**llama, "bound": "max"}), "value": 0.8},
                {"labels": str_labels({**llama, "bound": "max-vs-stable"}), "value": 0.72},
            ],
        },
    ]
    (tmp_path / "empty.yaml").write_text(yaml.safe_dump({"groups": []}))
    document = {
        "rule_files": ["empty.yaml"],
        "tests": [{"interval": "1m", "input_series": dashboard_series, "promql_expr_test": tests}],
    }
    (tmp_path / "panels_test.yaml").write_text(yaml.safe_dump(document))
    tested = promtool("test", "rules", "panels_test.yaml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr


def str_labels(labels: dict[str, str]) -> str:
    return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def test_limits_exported_for_the_dashboard() -> None:
    """The dashboard's dashed lines: max and min as written, max-vs-stable from the stable value."""
    from canary.controller.observability import ControllerMetrics
    from canary.policy import load_text

    policy = (
        load_text(
            "apiVersion: kserve-canary.dev/v1alpha1\nkind: PromotionPolicy\n"
            "metadata: {name: m, namespace: ml}\n"
            "spec:\n  target: {inferenceService: m}\n  checks:\n"
            "    - {name: p99, metric: latency, max: 800ms, maxIncrease: 20%}\n"
            "    - {name: errors, metric: error-rate, max: 1%, maxIncrease: 50%, minStable: 0.1%}\n"
            "    - {name: kv, metric: kv-cache-usage, min: 5%, max: 95%}\n"
        )
        .policies[0]
        .policy
    )
    p99, errors, kv = policy.spec.checks
    metrics = ControllerMetrics()

    def limits() -> dict[tuple[str, str], float]:
        found = {}
        for family in metrics.registry.collect():
            for sample in family.samples:
                if sample.name == "kserve_canary_check_limit":
                    found[(sample.labels["check"], sample.labels["bound"])] = round(sample.value, 6)
        return found

    metrics.set_limits("ml", "m", p99, 0.5)
    metrics.set_limits("ml", "m", errors, 0.0004)  # stable below minStable: no relative limit
    metrics.set_limits("ml", "m", kv, None)
    assert limits() == {
        ("p99", "max"): 0.8,
        ("p99", "max-vs-stable"): 0.6,
        ("errors", "max"): 0.01,
        ("kv", "min"): 0.05,
        ("kv", "max"): 0.95,
    }
    metrics.set_limits("ml", "m", errors, 0.004)
    metrics.set_limits("ml", "m", p99, None)  # the stable value is gone: so is the relative limit
    assert limits()[("errors", "max-vs-stable")] == 0.006
    assert ("p99", "max-vs-stable") not in limits()
    metrics.forget("ml", "m")
    assert limits() == {}


def test_every_phase_of_the_core_is_exported_and_on_the_dashboard() -> None:
    """A phase the controller can be in but the metric leaves out reads as no phase at all."""
    from canary.rollout.state import Phase

    assert set(PHASES) == {str(phase) for phase in Phase}
