"""explain's canary-only queries without Prometheus: the window each uses, templates rendered exactly as
the evidence source renders them, no query where the metrics are unknown, and how the explain record
keeps them (``canaryQuery``, bounded; older records still read). Their answers on a real Prometheus:
tests/integration/metrics/test_explain_queries.py."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from canary.evidence import CanaryQuery, Evidence, EvidenceRequest
from canary.metrics.catalog import (
    KSM_INIT_LAST_TERMINATED,
    KSM_INIT_RESTARTS,
    KSM_LAST_TERMINATED,
    KSM_RESTARTS,
    Family,
    RevisionKey,
)
from canary.metrics.explain_queries import (
    LAST_TERMINATED_METRICS,
    QUANTILE_NOTE,
    RESTARTS_METRICS,
    canary_queries,
    duration,
    render_canary_query,
)
from canary.metrics.plan import QueryGrouping, Resolution, Side, SingleAsk, plan_rollout
from canary.policy.model import PromotionPolicy
from canary.rollout import Decision
from canary.rollout.records import MAX_CANARY_QUERY_CHARS, ExplainDocument
from canary.rollout.vocabulary import Action
from tests.rollout.helpers import HEALTHY_EVIDENCE, Harness, make_policy, progressing

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
PROFILE = {"requests": "knative-otel-invocation", "gpuLabels": "exported_pod"}
CHECKS: list[dict[str, Any]] = [
    {"name": "p99", "metric": "latency", "max": "800ms"},
    {"name": "errors", "metric": "error-rate", "max": "1%"},
    {"name": "oom", "metric": "oom-kills", "max": 0},
    {"name": "restarts", "metric": "restarts", "max": 0},
    {"name": "warmup", "metric": "warmup-time", "max": "3m"},
    {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9},
    {"name": "kv", "metric": "kv-cache-usage", "max": "95%"},
    {"name": "ttft", "metric": "ttft", "quantile": 0.9, "max": "2s"},
    {"name": "e2e", "metric": "e2e-latency", "max": "60s"},
    {
        "name": "score",
        "promql": 'avg(avg_over_time(score{ns="{{ namespace }}", rev="{{ revision }}", '
        'isvc="{{ inferenceService }}"}[{{ window }}]))',
        "max": 1,
    },
]


def request(
    policy_window: float, *, checks: list[dict[str, Any]] = CHECKS, **policy: Any
) -> tuple[PromotionPolicy, EvidenceRequest]:
    built = make_policy(checks=checks, **policy)
    asked = EvidenceRequest(
        namespace="ml",
        inference_service="llama",
        canary_revision="llama-predictor-00002",
        stable_revision="llama-predictor-00001",
        window_start=AT - timedelta(seconds=policy_window),
        at=AT,
        checks=tuple(built.spec.checks),
    )
    return built, asked


def test_ranges_read_as_people_write_them() -> None:
    assert [duration(s) for s in (600, 123, 3600, 5400, 0.2, 59.6)] == [
        "10m",
        "123s",
        "1h",
        "90m",
        "1s",
        "1m",
    ]


def test_counted_measures_use_the_evaluated_window_and_gauges_at_least_the_minimum() -> None:
    policy, asked = request(123.0)
    queries = canary_queries(policy, asked, PROFILE, min_window=300.0)
    assert set(queries) == {check["name"] for check in CHECKS}
    for name in ("p99", "errors", "oom", "restarts", "ttft", "e2e"):
        assert "[123s]" in queries[name].promql and "[5m]" not in queries[name].promql, name
    for name in ("warmup", "gpu", "kv"):
        assert "[5m]" in queries[name].promql and "[123s]" not in queries[name].promql, name
    for query in queries.values():
        assert "llama-predictor-00001" not in query.promql  # the canary alone
        assert "label_replace" not in query.promql and "evidence_field" not in query.promql
    assert queries["ttft"].promql.startswith("histogram_quantile(0.9, ")
    assert queries["p99"].promql.startswith("histogram_quantile(0.99, ")  # the default quantile
    assert queries["p99"].note == QUANTILE_NOTE
    assert queries["restarts"].note == queries["gpu"].note == ""  # not extrapolated


def test_templates_are_the_text_the_evidence_source_runs_for_the_canary() -> None:
    override = 'max(max_over_time(my_latency{pod=~"{{ revision }}-.*", ns="{{ namespace }}"}[{{ window }}]))'
    policy, asked = request(123.0, metrics={"queries": {"latency": override}})
    queries = canary_queries(policy, asked, PROFILE, min_window=300.0)
    resolved = {
        Family.REQUESTS: Resolution("knative-otel-invocation"),
        Family.DCGM: Resolution("exported_pod"),
    }
    needs = plan_rollout(0, policy, asked, resolved, min_window=300.0, grouping=QueryGrouping.PER_TICK)
    ran = {
        need.key: need.ask.promql
        for need in needs
        if need.side is Side.CANARY and isinstance(need.ask, SingleAsk)
    }
    assert set(ran) == {"p99", "score"}
    for name, promql in ran.items():
        assert queries[name] == CanaryQuery(promql), name
    # Asked and shown scoped to the policy's namespace (canary.metrics.tenancy).
    assert queries["score"].promql == (
        'avg(avg_over_time(score{isvc="llama",namespace="ml",ns="ml",rev="llama-predictor-00002"}[5m]))'
    )
    assert all(need.revision == RevisionKey("ml", "llama-predictor-00002") for need in needs
               if need.side is Side.CANARY)  # fmt: skip


def test_no_query_where_the_metrics_were_not_found_or_the_template_cannot_be_rendered() -> None:
    # A name outside quotes cannot be escaped: the controller reports a bad query, explain has none.
    checks = [*CHECKS, {"name": "bad", "promql": "sum(x{pod={{ revision }}})", "max": 1}]
    policy, asked = request(600.0, checks=checks)
    known = canary_queries(policy, asked, PROFILE, min_window=60.0)
    assert set(known) == {check["name"] for check in CHECKS}
    unknown = canary_queries(policy, asked, {"requests": "none", "gpuLabels": "none"}, min_window=60.0)
    assert set(unknown) == {"oom", "restarts", "warmup", "kv", "ttft", "e2e", "score"}
    assert canary_queries(policy, asked, {}, min_window=60.0).keys() == unknown.keys()


def test_the_name_patterns_match_exactly_the_catalogs_metrics() -> None:
    for pattern, names in (
        (RESTARTS_METRICS, (KSM_RESTARTS, KSM_INIT_RESTARTS)),
        (LAST_TERMINATED_METRICS, (KSM_LAST_TERMINATED, KSM_INIT_LAST_TERMINATED)),
    ):
        assert all(re.fullmatch(pattern, name) for name in names)
        assert not re.fullmatch(pattern, "kube_pod_container_status_restarts_total_x")


def _decision_and_evidence(
    extra: dict[str, CanaryQuery] | None = None,
) -> tuple[Harness, Decision, Evidence]:
    harness = progressing()
    seen: list[Evidence] = []

    def evidence(asked: EvidenceRequest) -> Evidence:
        made = HEALTHY_EVIDENCE(asked)
        queries = canary_queries(harness.policy, asked, PROFILE, min_window=60.0) | (extra or {})
        seen.append(replace(made, canary_queries=queries))
        return seen[-1]

    decision = harness.run(lambda d: d.action is Action.ADVANCE, evidence=evidence)
    return harness, decision, seen[-1]


def test_the_explain_record_keeps_each_checks_canary_query_and_reads_older_records() -> None:
    harness, decision, evidence = _decision_and_evidence()
    record = ExplainDocument.of(decision, evidence, harness.now)
    by_name = {check.name: check for check in record.checks}
    for name, query in evidence.canary_queries.items():
        assert (by_name[name].canary_query, by_name[name].canary_query_note) == (query.promql, query.note)
    assert by_name["p99"].canary_query != by_name["p99"].query  # the controller's query is kept too
    document = json.loads(record.to_json())
    p99 = next(check for check in document["checks"] if check["name"] == "p99")
    assert p99["canaryQuery"].startswith("histogram_quantile(0.99, ")
    assert p99["canaryQueryNote"] == QUANTILE_NOTE
    assert ExplainDocument.from_json(record.to_json()) == record
    for check in document["checks"]:  # a record written before the field existed
        del check["canaryQuery"], check["canaryQueryNote"]
    older = ExplainDocument.from_json(json.dumps(document))
    assert all(check.canary_query is None and check.canary_query_note == "" for check in older.checks)
    assert ExplainDocument.of(decision, None, harness.now).checks[0].canary_query is None


def test_an_overlong_canary_query_is_not_kept_and_says_so() -> None:
    long = CanaryQuery("sum(x)" + " " * MAX_CANARY_QUERY_CHARS, "")
    harness, decision, evidence = _decision_and_evidence({"ttft-p95": long})
    record = ExplainDocument.of(decision, evidence, harness.now)
    ttft = next(check for check in record.checks if check.name == "ttft-p95")
    assert ttft.canary_query is None
    assert ttft.canary_query_note == "the canary's query is not kept: 4,102 characters, over 4,096"
    assert ttft.query  # the query the controller ran stays


def test_memoised_shapes_take_each_evaluations_window_and_each_policys_checks() -> None:
    policy, first = request(600.0)
    later = replace(first, window_start=AT - timedelta(seconds=123))
    assert canary_queries(policy, first, PROFILE, min_window=60.0)["errors"].promql.endswith("[10m]))")
    again = canary_queries(policy, later, PROFILE, min_window=60.0)
    assert again["errors"].promql.endswith("[123s]))")
    assert again == {
        check.name: render_canary_query(check, policy, later, PROFILE, min_window=60.0)
        for check in later.checks
    }
    changed = [{**check, "quantile": 0.5} if check["name"] == "p99" else check for check in CHECKS]
    reloaded, asked = request(600.0, checks=changed)  # a new policy object, the same names
    assert canary_queries(reloaded, asked, PROFILE, min_window=60.0)["p99"].promql.startswith(
        "histogram_quantile(0.5, "
    )
    other = canary_queries(
        policy, replace(first, canary_revision="llama-predictor-00003"), PROFILE, min_window=60.0
    )
    assert "llama-predictor-00003" in other["p99"].promql
