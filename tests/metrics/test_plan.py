"""Planning: which measurements an evaluation needs and how few queries answer them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from canary.evidence import REQUESTS, ErrorClass, EvidenceRequest, EvidenceStatus, Measurement
from canary.metrics.catalog import FIELD_FRACTION, BuiltinQuery, Family, RevisionKey, render_builtin
from canary.metrics.client import QueryAnswer, QueryFailure, QueryOutcome
from canary.metrics.plan import (
    CountsAsk,
    GroupedAsk,
    PeaksAsk,
    QueryGrouping,
    Resolution,
    Side,
    SingleAsk,
    families_needed,
    fraction_key,
    measurement_for,
    merge_asks,
    parse_grouped,
    plan_rollout,
)
from canary.metrics.tick_queries import RESTARTS_COUNTER, CounterQuery, PeakQuery
from canary.policy.model import GpuLabelStyle, PromotionPolicy, RequestsProfile

AT = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
RESOLVED = {
    Family.REQUESTS: Resolution("knative-opencensus"),
    Family.DCGM: Resolution("exported_pod"),
}


def policy(checks: list[dict[str, Any]], **metrics: Any) -> PromotionPolicy:
    return PromotionPolicy.model_validate(
        {
            "apiVersion": "kserve-canary.dev/v1alpha1",
            "kind": "PromotionPolicy",
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"target": {"inferenceService": "llama"}, "metrics": metrics, "checks": checks},
        }
    )


def request(
    the_policy: PromotionPolicy,
    canary: str = "llama-predictor-00002",
    stable: str | None = "llama-predictor-00001",
    *,
    window: float = 600.0,
    compare: bool = True,
    namespace: str = "ml",
) -> EvidenceRequest:
    return EvidenceRequest(
        namespace,
        "llama",
        canary,
        stable,
        AT - timedelta(seconds=window),
        AT,
        tuple(the_policy.spec.checks),
        compare_with_stable=compare,
    )


ALL_BUILTINS = [
    {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "800ms", "maxIncrease": "20%"},
    {"name": "p50", "metric": "latency", "quantile": 0.5, "maxIncrease": "20%"},
    {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"},
    {"name": "oom", "metric": "oom-kills", "max": 0},
    {"name": "restarts", "metric": "restarts", "max": 0},
    {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9, "maxIncrease": "10%"},
    {"name": "kv", "metric": "kv-cache-usage", "max": "95%"},
    {"name": "warmup", "metric": "warmup-time", "max": "3m"},
    {"name": "ttft", "metric": "ttft", "quantile": 0.95, "max": "2s"},
    {"name": "e2e", "metric": "e2e-latency", "max": "30s"},
]


COUNTED = {"p99", "p50", "errors"}  # the checks answered from the counter book (and request-count)
PEAKS = {"gpu", "kv", "warmup"}  # the checks answered from the peak book
RESTARTS = {"restarts", "oom"}  # from the counter book of kube-state-metrics' restart counters
VLLM = {"ttft", "e2e"}  # vLLM's histograms, in the requests profile's counter sample
# Without a requests profile, vLLM's latencies fall back to a per-window query (as every builtin did).
NO_REQUESTS = {Family.DCGM: Resolution("exported_pod")}


def test_counted_measures_ask_no_query_of_their_own_and_the_rest_one_per_measure() -> None:
    the_policy = policy(ALL_BUILTINS)
    needs = plan_rollout(
        0, the_policy, request(the_policy), RESOLVED, min_window=10, grouping=QueryGrouping.PER_ROLLOUT
    )
    grouped, singles = merge_asks(needs)
    # every builtin is answered by a book: no per-window query at all
    assert grouped == {}
    assert singles == []
    assert not any(ask.query.measure in {REQUESTS, "latency", "error-rate"} for ask in grouped)
    counted = [need for need in needs if isinstance(need.ask, CountsAsk)]
    assert {(need.key, need.side) for need in counted} == {
        (key, side) for key in (REQUESTS, *COUNTED) for side in (Side.CANARY, Side.STABLE)
    } | {("restarts", Side.CANARY), ("oom", Side.CANARY), ("ttft", Side.CANARY), ("e2e", Side.CANARY)}
    assert {need.ask.counter for need in counted if isinstance(need.ask, CountsAsk)} == {
        CounterQuery(RequestsProfile.KNATIVE_OPENCENSUS),
        RESTARTS_COUNTER,
    }
    p99 = next(need for need in counted if need.key == "p99")
    assert isinstance(p99.ask, CountsAsk) and p99.ask.quantile == 0.99
    ttft = next(need for need in counted if need.key == "ttft")
    assert ttft.ask == CountsAsk(CounterQuery(RequestsProfile.KNATIVE_OPENCENSUS), 0.95)


def test_per_revision_baseline_asks_once_per_check_per_revision() -> None:
    the_policy = policy(ALL_BUILTINS)
    needs = plan_rollout(
        0, the_policy, request(the_policy), NO_REQUESTS, min_window=10, grouping=QueryGrouping.PER_REVISION
    )
    grouped, _ = merge_asks(needs)
    grouped = {
        ask: revisions for ask, revisions in grouped.items() if ask.query.measure in {"ttft", "e2e-latency"}
    }
    others = [check for check in ALL_BUILTINS if check["name"] in VLLM]
    with_stable = sum(1 for check in others if "maxIncrease" in check)
    # each check for the canary, those compared for the stable too
    assert len(grouped) == len(others) + with_stable
    assert all(len(revisions) == 1 for revisions in grouped.values())


def test_rollouts_share_queries_per_tick() -> None:
    the_policy = policy(ALL_BUILTINS)
    needs = []
    for index, (canary, stable) in enumerate(
        [("a-00002", "a-00001"), ("b-00009", "b-00008"), ("c-2", "c-1")]
    ):
        needs += plan_rollout(
            index,
            the_policy,
            request(the_policy, canary, stable, namespace=f"ns{index}", window=600 + index),
            RESOLVED,
            min_window=10,
            grouping=QueryGrouping.PER_TICK,
        )
    counters = {need.ask.counter for need in needs if isinstance(need.ask, CountsAsk)}
    assert counters == {CounterQuery(RequestsProfile.KNATIVE_OPENCENSUS), RESTARTS_COUNTER}  # for all windows
    revisions = {need.revision for need in needs if isinstance(need.ask, CountsAsk)}
    assert len(revisions) == 6


def test_gauge_peaks_come_from_the_peak_book_value_and_fraction_alike() -> None:
    the_policy = policy([ALL_BUILTINS[5], ALL_BUILTINS[6]])
    needs = plan_rollout(
        0, the_policy, request(the_policy), RESOLVED, min_window=10, grouping=QueryGrouping.PER_TICK
    )
    peaks = {(need.key, need.side): need.ask for need in needs if isinstance(need.ask, PeaksAsk)}
    gpu = PeaksAsk(PeakQuery("gpu-memory-peak", GpuLabelStyle.EXPORTED_POD))
    assert peaks == {
        ("gpu", Side.CANARY): gpu,
        ("gpu", Side.STABLE): gpu,
        (fraction_key("gpu"), Side.CANARY): gpu,
        (fraction_key("gpu"), Side.STABLE): gpu,
        ("kv", Side.CANARY): PeaksAsk(PeakQuery("kv-cache-usage")),
    }


def test_different_windows_do_not_share_the_per_window_queries() -> None:
    the_policy = policy([ALL_BUILTINS[0], ALL_BUILTINS[8]])
    needs = plan_rollout(
        0, the_policy, request(the_policy), NO_REQUESTS, min_window=10, grouping=QueryGrouping.PER_TICK
    )
    needs += plan_rollout(
        1,
        the_policy,
        request(the_policy, window=900),
        NO_REQUESTS,
        min_window=10,
        grouping=QueryGrouping.PER_TICK,
    )
    grouped, _ = merge_asks(needs)
    ttft = [ask for ask in grouped if ask.query.measure == "ttft"]
    assert len(ttft) == 2  # per window
    assert {ask.query.window for ask in ttft} == {"600s", "900s"}


def test_window_is_at_least_the_minimum() -> None:
    the_policy = policy(ALL_BUILTINS[8:9])
    needs = plan_rollout(
        0,
        the_policy,
        request(the_policy, window=3),
        NO_REQUESTS,
        min_window=60,
        grouping=QueryGrouping.PER_TICK,
    )
    assert {need.ask.query.window for need in needs if isinstance(need.ask, GroupedAsk)} == {"60s"}


def test_an_override_of_a_counted_measure_stays_a_per_revision_query() -> None:
    the_policy = policy(
        [ALL_BUILTINS[2]],
        queries={"error-rate": 'sum(rate(my_errors{revision="{{ revision }}"}[{{ window }}]))'},
    )
    needs = plan_rollout(
        0, the_policy, request(the_policy), RESOLVED, min_window=10, grouping=QueryGrouping.PER_TICK
    )
    errors = [need for need in needs if need.key == "errors"]
    assert all(isinstance(need.ask, SingleAsk) for need in errors)
    assert len(errors) == 2
    assert all(isinstance(need.ask, CountsAsk) for need in needs if need.key == REQUESTS)


def test_gpu_check_carries_a_fraction_measurement() -> None:
    the_policy = policy([ALL_BUILTINS[5]])
    needs = plan_rollout(
        0, the_policy, request(the_policy), RESOLVED, min_window=10, grouping=QueryGrouping.PER_TICK
    )
    keys = {(need.side, need.key, need.field) for need in needs}
    assert (Side.CANARY, "gpu", None) in keys
    assert (Side.CANARY, fraction_key("gpu"), FIELD_FRACTION) in keys
    assert (Side.STABLE, fraction_key("gpu"), FIELD_FRACTION) in keys
    assert fraction_key("gpu") == "gpu:fraction"


def test_no_stable_measurements_while_baking_or_without_stable() -> None:
    the_policy = policy(ALL_BUILTINS)
    for the_request in (request(the_policy, compare=False), request(the_policy, stable=None)):
        needs = plan_rollout(
            0, the_policy, the_request, RESOLVED, min_window=10, grouping=QueryGrouping.PER_TICK
        )
        assert {need.side for need in needs} == {Side.CANARY}


def test_overrides_run_per_revision_with_escaped_values() -> None:
    the_policy = policy(
        [{"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"}],
        queries={"error-rate": 'my_errors{ns="{{ namespace }}", rev=~"{{ revision }}"}[{{ window }}]'},
    )
    needs = plan_rollout(
        0,
        the_policy,
        request(the_policy, canary='c"a.1'),
        RESOLVED,
        min_window=10,
        grouping=QueryGrouping.PER_TICK,
    )
    singles = {need.side: need.ask for need in needs if isinstance(need.ask, SingleAsk)}
    # Escaped where they stand, then scoped to the policy's namespace (canary.metrics.tenancy).
    assert singles[Side.CANARY].promql == 'my_errors{namespace="ml",ns="ml",rev=~"c\\"a\\\\.1"}[10m]'
    assert (
        singles[Side.STABLE].promql == 'my_errors{namespace="ml",ns="ml",rev=~"llama-predictor-00001"}[10m]'
    )


def test_template_that_cannot_be_made_safe_is_a_bad_query_error() -> None:
    the_policy = policy([{"name": "c", "promql": "sum(x) by ({{ namespace }})", "max": 1}])
    needs = plan_rollout(
        0, the_policy, request(the_policy), RESOLVED, min_window=10, grouping=QueryGrouping.PER_TICK
    )
    settled = next(need.settled for need in needs if need.key == "c")
    assert settled is not None
    assert settled.status is EvidenceStatus.ERROR
    assert settled.error_class is ErrorClass.BAD_QUERY


def test_undetected_family_settles_its_needs_without_queries() -> None:
    the_policy = policy(ALL_BUILTINS[:3])
    nothing = {Family.REQUESTS: Resolution(unavailable=Measurement.no_data("no request metrics found"))}
    needs = plan_rollout(
        0, the_policy, request(the_policy), nothing, min_window=10, grouping=QueryGrouping.PER_TICK
    )
    assert all(need.ask is None for need in needs)
    measured = [measurement_for(need, None, None, min_requests=1) for need in needs]
    assert {m.status for m in measured} == {EvidenceStatus.NO_DATA}
    assert {m.detail for m in measured} == {"no request metrics found"}


def test_families_needed_skip_overridden_measures_but_keep_dcgm_for_the_fraction() -> None:
    overridden = policy(
        [{"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9}],
        queries={
            "request-count": 'sum(x{a="{{ revision }}"})',
            "gpu-memory-peak": 'max(y{a="{{ revision }}"})',
        },
    )
    assert families_needed(overridden) == {Family.DCGM}
    assert families_needed(policy(ALL_BUILTINS[3:5])) == {Family.REQUESTS, Family.KUBE_STATE}


def _outcome(series: list[dict[str, Any]]) -> QueryOutcome:
    return QueryOutcome("q", QueryAnswer("vector", series), None, 1, 0.01)


def test_grouped_answer_with_two_values_for_one_revision_is_an_unexpected_result() -> None:
    series = {"metric": {"kserve_canary_namespace": "ml", "kserve_canary_revision": "r"}, "value": [1, "1"]}
    parsed = parse_grouped(_outcome([series, series]))
    assert isinstance(parsed, QueryFailure)
    assert parsed.error_class is ErrorClass.UNEXPECTED_RESULT


def test_requests_below_the_minimum_are_no_data() -> None:
    the_policy = policy([ALL_BUILTINS[8]])  # ttft: a grouped request-based query
    needs = plan_rollout(
        0, the_policy, request(the_policy), RESOLVED, min_window=10, grouping=QueryGrouping.PER_TICK
    )
    need = next(n for n in needs if n.key == "ttft" and n.side is Side.CANARY)
    answer = parse_grouped(
        _outcome(
            [
                {
                    "metric": {
                        "kserve_canary_namespace": "ml",
                        "kserve_canary_revision": "llama-predictor-00002",
                    },
                    "value": [1, "0.5"],
                },
                {
                    "metric": {
                        "kserve_canary_namespace": "ml",
                        "kserve_canary_revision": "llama-predictor-00002",
                        "kserve_canary_field": "samples",
                    },
                    "value": [1, "4"],
                },
            ]
        )
    )
    few = measurement_for(need, _outcome([]), answer, min_requests=20)
    enough = measurement_for(need, _outcome([]), answer, min_requests=4)
    assert few.status is EvidenceStatus.NO_DATA
    assert "4 requests" in few.detail
    assert (enough.status, enough.value, enough.samples) == (EvidenceStatus.OK, 0.5, 4.0)


@pytest.mark.parametrize(
    "query",
    [
        BuiltinQuery("latency", "60s", 0.9, requests_profile=None),
        BuiltinQuery("gpu-memory-peak", "60s"),
    ],
)
def test_builtin_without_a_concrete_profile_is_refused(query: BuiltinQuery) -> None:
    with pytest.raises(ValueError, match="concrete"):
        render_builtin(query, [RevisionKey("ml", "r")])
