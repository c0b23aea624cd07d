"""Custom PromQL scoped to its namespace (canary.metrics.tenancy), checked on the parsed tree: every
selector of the scoped query carries its tenancy matcher, nothing else changed, values escaped."""

from __future__ import annotations

from typing import Any

import promql_parser
import pytest
from hypothesis import given
from hypothesis import strategies as st

from canary.metrics.tenancy import Tenancy, TenancyError, parse_allow, parse_labels
from canary.policy import PromotionPolicy
from canary.policy.model import GpuLabelStyle
from canary.policy.objects import ObjectRules, load_object


def _selectors(promql: str) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)

    promql_parser.walk(promql_parser.parse(promql), visit)
    return found


def _matchers(selector: promql_parser.VectorSelector) -> dict[str, tuple[str, str]]:
    return {matcher.name: (str(matcher.op), matcher.value) for matcher in selector.matchers.matchers}


EQUAL = str(promql_parser.MatchOp.Equal)


@pytest.mark.parametrize(
    ("query", "labels"),
    [
        ("count(kube_secret_info)", {"kube_secret_info": "namespace"}),
        (
            'sum(rate(revision_request_count{revision_name="x"}[5m])) / '
            "sum(rate(kn_serving_invocation_duration_seconds_count[5m] offset 1m))",
            {
                "revision_request_count": "namespace_name",
                "kn_serving_invocation_duration_seconds_count": "namespace",
            },
        ),
        (
            "max(DCGM_FI_DEV_FB_USED) + on (gpu) group_left () max_over_time(vllm:num_requests_running[10m:1m])",
            {"DCGM_FI_DEV_FB_USED": "exported_namespace", "vllm:num_requests_running": "namespace"},
        ),
        ('{__name__="up", job="x"} @ 100', {"": "namespace"}),
    ],
)
def test_every_selector_of_the_scoped_query_carries_its_namespace(query: str, labels: dict[str, str]) -> None:
    scoped = Tenancy().scope(query, "team-a", GpuLabelStyle.EXPORTED_POD)
    before, after = _selectors(query), _selectors(scoped)
    assert len(after) == len(before)
    for original, selector in zip(before, after, strict=True):
        label = labels[original.name or ""]
        assert _matchers(selector)[label] == (EQUAL, "team-a")
        # Nothing else changed: the other matchers, the offset and @ are the original's.
        assert {k: v for k, v in _matchers(selector).items() if k != label} == _matchers(original)
        assert (selector.offset, str(selector.at)) == (original.offset, str(original.at))


def test_a_matcher_on_the_own_namespace_is_kept_and_not_doubled() -> None:
    scoped = Tenancy().scope('sum(up{namespace="team-a"})', "team-a", None)
    (selector,) = _selectors(scoped)
    assert [matcher.name for matcher in selector.matchers.matchers] == ["namespace"]


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        (
            'count(kube_secret_info{namespace="team-b", secret=~"stripe.*"})',
            'namespace="team-b" names another namespace',
        ),
        ('up{namespace=~"team-a|team-b"}', "with =~"),
        ('up{namespace!="team-a"}', "with !="),
        ('up{exported_namespace="team-b"}', "names another namespace"),  # any tenancy label
        ('rate(revision_request_count{namespace_name="team-b"}[5m])', "names another namespace"),
        ('{__name__=~"kube_.+"}', "name the metric"),
        ("sum(rate(x[5m]) @ start()", "does not parse"),
        ("max(DCGM_FI_DEV_FB_USED)", "set spec.metrics.gpuLabels"),  # style unknown: nothing detected
    ],
)
def test_a_selector_that_cannot_be_scoped_is_refused_with_its_reason(query: str, reason: str) -> None:
    with pytest.raises(TenancyError) as refused:
        Tenancy().scope(query, "team-a", None)
    assert reason in str(refused.value)


def test_the_operators_rules_admit_named_series_and_name_other_tenancy_labels() -> None:
    tenancy = Tenancy(
        allow=parse_allow(["kube_node_*", "team-a=istio_requests_total"]),
        labels=parse_labels(["job:*=tenant"]),
    )
    scoped = tenancy.scope(
        "sum(kube_node_info) + sum(istio_requests_total) + sum(job:rps:rate5m)", "team-a", None
    )
    nodes, istio, rule = _selectors(scoped)
    assert _matchers(nodes) == {} and _matchers(istio) == {}  # admitted cluster-wide, as written
    assert _matchers(rule) == {"tenant": (EQUAL, "team-a")}  # the recording rule's tenancy label
    # istio is admitted for team-a only: team-b's query of it is scoped.
    (istio_b,) = _selectors(tenancy.scope("sum(istio_requests_total)", "team-b", None))
    assert _matchers(istio_b) == {"namespace": (EQUAL, "team-b")}
    with pytest.raises(TenancyError, match="names another namespace"):  # a configured label is checked
        tenancy.scope('sum(job:rps:rate5m{tenant="team-b"})', "team-a", None)
    with pytest.raises(ValueError, match="NAMESPACE=METRIC"):
        parse_allow(["Team_A=up"])
    with pytest.raises(ValueError, match="METRIC_GLOB=LABEL"):
        parse_labels(["job:*=not-a-label"])


_VALUE = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@given(value=_VALUE, regex=st.booleans())
def test_label_values_survive_scoping_escaped(value: str, regex: bool) -> None:
    """Whatever a label value holds (quotes, backslashes, newlines, braces), the scoped query parses
    back to the same value: it cannot change the query's shape."""
    op = "=~" if regex else "="
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    query = f'sum(foo{{a{op}"{escaped}"}})'
    try:
        original = _selectors(query)
    except ValueError:
        return  # not PromQL to begin with (an invalid regex, a control character)
    (selector,) = _selectors(Tenancy().scope(query, "team-a", None))
    assert _matchers(selector)["a"] == _matchers(original[0])["a"]
    assert _matchers(selector)["namespace"] == (EQUAL, "team-a")


def _policy(namespace: str, promql: str) -> dict[str, Any]:
    return {
        "apiVersion": "kserve-canary.dev/v1alpha1",
        "kind": "PromotionPolicy",
        "metadata": {"name": "fraud", "namespace": namespace, "uid": "u1", "generation": 1},
        "spec": {
            "target": {"inferenceService": "fraud"},
            "checks": [{"name": "peek", "promql": promql, "max": 1}],
        },
    }


def test_a_promotionpolicy_object_is_refused_as_a_file_is() -> None:
    rules = ObjectRules(allow_custom_promql=True, promql=Tenancy().refusals)
    peek = 'count(kube_secret_info{namespace="team-b"})'
    loaded, errors = load_object(_policy("team-a", peek), rules=rules)
    assert loaded is None
    (error,) = errors
    assert (error.path, error.field) == ("promotionpolicy/team-a/fraud", "spec.checks[0].promql")
    assert 'namespace="team-b" names another namespace' in error.message
    loaded, errors = load_object(
        _policy("team-a", 'count(kube_secret_info{secret="{{ revision }}"})'), rules=rules
    )
    assert errors == [] and isinstance(loaded.policy if loaded else None, PromotionPolicy)


def test_the_detected_label_style_names_the_tenancy_label_of_its_family() -> None:
    """Knative's queue-proxy pushed over OTLP names the namespace k8s_namespace_name, a ServiceMonitor
    without honorLabels kube-state-metrics' exported_namespace: the custom query is scoped by those."""
    from canary.metrics.catalog import Family
    from canary.metrics.labels import KSM_EXPORTED, JoinLabels
    from canary.metrics.plan import QueryGrouping, Resolution, SingleAsk, plan_rollout
    from tests.metrics.test_plan import policy, request

    query = "sum(rate(http_server_request_duration_seconds_count[5m])) + count(kube_pod_info)"
    the_policy = policy([{"name": "c", "promql": query, "max": 1}])
    resolved = {
        Family.REQUESTS: Resolution(
            "knative-otel-invocation", labels=JoinLabels("k8s_namespace_name", "instance")
        ),
        Family.KUBE_STATE: Resolution(labels=KSM_EXPORTED),
    }
    needs = plan_rollout(
        0, the_policy, request(the_policy), resolved, min_window=10, grouping=QueryGrouping.PER_TICK
    )
    (ask,) = {need.ask for need in needs if need.key == "c" and isinstance(need.ask, SingleAsk)}
    requests, pods = _selectors(ask.promql)
    assert _matchers(requests) == {"k8s_namespace_name": (EQUAL, "ml")}
    assert _matchers(pods) == {"exported_namespace": (EQUAL, "ml")}
