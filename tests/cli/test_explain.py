"""`kserve-canary explain` for people: whole requests, three significant digits with units, times to
the second, each check's PromQL on a line of its own and, with --prometheus-external-url, a graph
link that opens it in Prometheus."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, urlsplit

from canary.policy.units import Unit
from canary.rollout.records import ExplainCheck, ExplainDocument, ExplainWindow
from tests.cli.support import Cluster, progressing, run, state_files

AT = datetime(2026, 3, 1, 12, 0, 7, 123456, tzinfo=UTC)
QUERY = 'sum by (revision) (increase(revision_request_count{namespace_name="ml"}[600s]))'
CANARY_QUERY = (
    "histogram_quantile(0.99, sum by (le) (increase(revision_request_latencies_bucket"
    '{namespace_name="ml", revision_name="llama-predictor-00002"}[10m]))) / 1000'
)
NOTE = "histogram_quantile() interpolates within a bucket"


def document() -> ExplainDocument:
    return ExplainDocument(
        at=AT,
        decision_id="d-1",
        revision="llama-predictor-00002",
        stable_revision="llama-predictor-00001",
        action="wait",
        verdict="pass",
        requests=832.1299500192233,
        reasons=("holding step 1 (10%) for 10m",),
        window=ExplainWindow(AT - timedelta(minutes=10, microseconds=4321), AT),
        checks=(
            ExplainCheck(
                name="p99",
                verdict="pass",
                value=0.41234567891,
                unit=Unit.SECONDS,
                limit="max 800ms",
                stable=0.39999999999,
                samples=832.1299500192233,
                query=QUERY,
                canary_query=CANARY_QUERY,
                canary_query_note=NOTE,
            ),
            ExplainCheck(
                name="errors",
                verdict="pass",
                value=0.0012345678,
                unit=Unit.RATIO,
                limit="max 1%",
                samples=7.6,
            ),
            ExplainCheck(name="score", verdict="no-data", value=1234.56789, unit=Unit.NONE),
            # Written before canary queries existed: the query the controller ran is shown.
            ExplainCheck(name="gpu", verdict="pass", value=2.0**34, unit=Unit.BYTES, query="max(gpu)"),
        ),
    )


def explain(cluster: Cluster, *arguments: str, stored: ExplainDocument | None = None, **env: str) -> str:
    written = (stored or document()).to_json()
    cluster.save("ml", "llama", state_files(progressing("llama-predictor-00002"), explain=written))
    completed = run(
        "explain", "ml/llama", *arguments, home=cluster.home, KUBECONFIG=str(cluster.kubeconfig), **env
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def test_numbers_are_rounded_and_times_are_to_the_second(cluster: Cluster) -> None:
    shown = explain(cluster)
    assert "832 canary requests" in shown
    assert re.search(r"\d\.\d{4,}", shown) is None, f"float noise in: {shown}"
    assert "2026-03-01T12:00:07Z" in shown
    assert "2026-03-01T11:50:07Z to 2026-03-01T12:00:07Z (10m)" in shown
    assert re.search(r"\d\d:\d\d:\d\d\.\d", shown) is None, "no microseconds"
    rows = {
        line.split()[0]: line.split()
        for line in shown.splitlines()
        if line.split()[:1] in (["p99"], ["errors"], ["score"])
    }
    assert rows["p99"][2:] == ["412ms", "max", "800ms", "400ms", "<none>", "832"]  # no judged bound recorded
    assert rows["errors"][2:] == ["0.123%", "max", "1%", "<none>", "<none>", "8"]
    assert rows["score"][2:4] == ["1,235", "<none>"]
    assert "graph:" not in shown


def test_each_check_shows_the_query_for_the_canarys_value_alone(cluster: Cluster) -> None:
    lines = explain(cluster).splitlines()
    start = lines.index(
        "PromQL for the canary's value alone (instant queries: evaluate at 2026-03-01T12:00:07Z):"
    )
    assert lines[start + 1 : start + 3] == [f"[p99] {CANARY_QUERY}", f"  # in seconds; {NOTE}"]
    assert f"[p99] {QUERY}" not in lines  # the long grouped query is left to -o json
    # A check whose record has no canary query shows the query the controller ran, labelled so.
    ran = lines.index("PromQL as the controller ran it:")
    assert ran > start and lines[ran + 1 :] == ["[gpu] max(gpu)"]


def test_json_has_both_queries_and_a_too_long_one_is_said(cluster: Cluster) -> None:
    shown = json.loads(explain(cluster, "-o", "json"))
    p99 = shown["latestEvaluation"]["checks"][0]
    assert (p99["query"], p99["canaryQuery"], p99["canaryQueryNote"]) == (QUERY, CANARY_QUERY, NOTE)
    assert shown["latestEvaluation"]["checks"][3]["canaryQuery"] is None
    dropped = ExplainCheck(
        name="custom",
        verdict="pass",
        query="sum(x)",
        canary_query_note="the canary's query is not kept: 5,000 characters, over 4,096",
    )
    lines = explain(cluster, stored=replace(document(), checks=(dropped,))).splitlines()
    assert lines[-2:] == [
        "[custom] sum(x)",
        "  # the canary's query is not kept: 5,000 characters, over 4,096",
    ]


def test_a_graph_link_per_query_with_the_external_url(cluster: Cluster) -> None:
    shown = explain(cluster, PROMETHEUS_EXTERNAL_URL="https://prometheus.example.com/")
    link, ran = [line.split("graph: ", 1)[1] for line in shown.splitlines() if "graph: " in line]
    parts = urlsplit(link)
    assert (parts.scheme, parts.netloc, parts.path) == ("https", "prometheus.example.com", "/graph")
    query = parse_qs(parts.query)
    assert query["g0.expr"] == [CANARY_QUERY]  # the canary's query, not the grouped one
    assert parse_qs(urlsplit(ran).query)["g0.expr"] == ["max(gpu)"]
    assert query["g0.tab"] == ["0"]
    assert query["g0.range_input"] == ["600s"]
    assert query["g0.end_input"] == ["2026-03-01 12:00:07"]
    flag = run(
        "explain",
        "ml/llama",
        "--prometheus-external-url",
        "http://localhost:9090",
        home=cluster.home,
        KUBECONFIG=str(cluster.kubeconfig),
    )
    assert "graph: http://localhost:9090/graph?g0.expr=" in flag.stdout


def test_no_state_is_refused_in_one_line(cluster: Cluster) -> None:
    completed = run("explain", "ml/ghost", home=cluster.home, KUBECONFIG=str(cluster.kubeconfig))
    assert completed.returncode == 1
    assert completed.stderr == "no rollout state for ml/ghost: kserve-canary has not seen it\n"


def test_the_limit_the_stable_estimate_and_the_judged_bound_each_once_and_each_reason_once(
    cluster: Cluster,
) -> None:
    broken = "p99 ≤ +50% vs stable (≤ 481ms; stable's p99 ≤ 321ms) broken"
    p99 = ExplainCheck(
        name="p99", verdict="fail", value=0.6, unit=Unit.SECONDS, limit="≤ +50% vs stable", stable=0.25,
        samples=900, detail=broken, max_allowed=0.4815,
    )  # fmt: skip
    stored = replace(document(), verdict="fail", reasons=(broken, broken, broken), checks=(p99,))
    shown = explain(cluster, stored=stored)
    header = next(line for line in shown.splitlines() if line.startswith("CHECK"))
    assert header.split() == [
        "CHECK",
        "VERDICT",
        "CANARY",
        "LIMIT",
        "STABLE",
        "ESTIMATE",
        "JUDGED",
        "BOUND",
        "SAMPLES",
    ]
    row = next(line for line in shown.splitlines() if line.startswith("p99 "))
    assert "≤ +50% vs stable" in row and "250ms" in row and "≤ 482ms" in row
    assert "375ms" not in shown  # 1.5 × the estimate is no limit the judge used
    assert shown.count(broken) == 1, shown
