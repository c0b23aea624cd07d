"""Custom PromQL, scoped to its policy's namespace.

A custom ``promql`` check or a ``spec.metrics.queries`` override runs with the controller's
Prometheus credentials, which read every namespace. Before it is asked, every query is parsed with
``promql-parser`` (Python bindings to the Rust ``promql-parser`` crate GreptimeDB maintains: a real
PromQL grammar, an AST with every vector and matrix selector, and a printer that escapes label
values), and each selector is scoped:

* a matcher on a **tenancy label** (any label a metric profile names a namespace by:
  :data:`TENANCY_LABELS`, and those the operator configures) must be ``="<policy namespace>"``: a
  selector naming another namespace, or matching the label with ``!=``, ``=~`` or ``!~``, is refused;
* the selector's own tenancy label (:meth:`Tenancy.label_for`, from the metric profiles of
  :mod:`canary.metrics.catalog`: ``namespace_name`` for Knative's OpenCensus metrics, the DCGM label
  style's namespace label, ``namespace`` otherwise, or the operator's ``METRIC_GLOB=LABEL``) gets
  ``="<policy namespace>"`` added when it is not there;
* the metric must be named literally (``name{...}`` or ``{__name__="name"}``): a regex on
  ``__name__`` could not be told which label scopes it;
* a metric the operator admits (``--custom-promql-allow-metric [NAMESPACE=]GLOB``) is asked as
  written: a cluster-wide series (node capacity, a shared gateway) opened on purpose.

The scoped query is the parsed tree printed again, so what Prometheus runs is exactly what was
checked. Values are escaped by :func:`canary.metrics.promql.string_literal`.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import promql_parser

from canary.metrics.catalog import DCGM_LABELS, REQUESTS_PROFILES, RequestsMetrics
from canary.metrics.promql import TemplateError, render_template, string_literal
from canary.policy.model import GpuLabelStyle, PromotionPolicy
from canary.policy.scope import option_items

__all__ = [
    "TENANCY_LABELS",
    "Tenancy",
    "TenancyError",
    "parse_allow",
    "parse_labels",
    "profile_metrics",
]

_NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DCGM_PREFIX = "DCGM_"
_HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def profile_metrics(metrics: RequestsMetrics) -> set[str]:
    """The metric names of a requests profile (its histogram's ``_sum`` too)."""
    names = {metrics.count_metric, metrics.bucket_metric, metrics.histogram_count_metric}
    for name in list(names):
        for suffix in _HISTOGRAM_SUFFIXES:
            if name.endswith(suffix):
                names.add(name.removesuffix(suffix) + "_sum")
    return names


def _profile_labels() -> dict[str, str]:
    """Metric name -> the label that names its namespace, from the requests profiles (the others use
    ``namespace``, DCGM its label style's)."""
    return {
        name: metrics.namespace_label
        for metrics in REQUESTS_PROFILES.values()
        for name in profile_metrics(metrics)
    }


_PROFILE_LABELS = _profile_labels()
# Every label a metric profile names a namespace by, and OpenTelemetry's resource attribute as an
# OTLP receiver promotes it.
TENANCY_LABELS = frozenset(
    {"namespace", "exported_namespace", "k8s_namespace_name"}
    | set(_PROFILE_LABELS.values())
    | {labels.namespace_label for labels in DCGM_LABELS.values()}
)


class TenancyError(ValueError):
    """A custom query that cannot be scoped to its namespace: the reason and the fix."""


def parse_allow(values: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """``["up", "team-a=kube_node_*"]`` (also comma-separated) -> namespace (``*``: every) -> globs."""
    allowed: dict[str, list[str]] = {}
    for item in option_items(values):
        namespace, separator, pattern = item.rpartition("=")
        namespace = namespace.strip() if separator else "*"
        pattern = pattern.strip()
        if (namespace != "*" and not _NAMESPACE.match(namespace)) or not pattern:
            raise ValueError(f"expected METRIC or NAMESPACE=METRIC (globs allowed), got {item!r}")
        allowed.setdefault(namespace, []).append(pattern)
    return {namespace: tuple(patterns) for namespace, patterns in allowed.items()}


def parse_labels(values: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``["job:*=namespace", "kn_*=k8s_namespace_name"]`` -> (metric glob, tenancy label) pairs."""
    pairs: list[tuple[str, str]] = []
    for item in option_items(values):
        pattern, separator, label = item.rpartition("=")
        if not separator or not pattern.strip() or not _LABEL.match(label.strip()):
            raise ValueError(f"expected METRIC_GLOB=LABEL (e.g. job:*=namespace), got {item!r}")
        pairs.append((pattern.strip(), label.strip()))
    return tuple(pairs)


@dataclass(frozen=True, slots=True)
class Tenancy:
    """The operator's rules for custom PromQL: series admitted cluster-wide, and tenancy labels of
    sources the profiles do not know (recording rules, OTLP). The default admits nothing."""

    allow: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def checked_labels(self) -> frozenset[str]:
        return TENANCY_LABELS | {label for _, label in self.labels}

    def admits(self, metric: str, namespace: str) -> bool:
        patterns = (*self.allow.get("*", ()), *self.allow.get(namespace, ()))
        return any(fnmatch.fnmatchcase(metric, pattern) for pattern in patterns)

    def label_for(
        self, metric: str, gpu: GpuLabelStyle | None, resolved: tuple[tuple[str, str], ...] = ()
    ) -> str | None:
        """The label naming ``metric``'s namespace: the operator's, the label style detected for its
        family (``resolved``: OTLP's ``k8s_namespace_name``, kube-state-metrics' ``exported_namespace``),
        the profiles'; None for a DCGM metric whose label style is unknown."""
        for pattern, label in (*self.labels, *resolved):
            if fnmatch.fnmatchcase(metric, pattern):
                return label
        if metric.startswith(_DCGM_PREFIX):
            labels = DCGM_LABELS.get(gpu) if gpu is not None else None
            return labels.namespace_label if labels is not None else None
        return _PROFILE_LABELS.get(metric, "namespace")

    def scope(
        self,
        promql: str,
        namespace: str,
        gpu: GpuLabelStyle | None,
        resolved: tuple[tuple[str, str], ...] = (),
    ) -> str:
        """``promql`` with every selector scoped to ``namespace``; raises :class:`TenancyError`."""
        try:
            tree = promql_parser.parse(promql)
        except ValueError as error:
            raise TenancyError(
                f"the query does not parse as PromQL ({error}); write it as Prometheus 2.45 reads it"
            ) from None
        scoper = _Scoper(self, namespace, gpu, resolved)
        scoped = promql_parser.transform(tree, post_visit=scoper.visit)
        if scoper.refusal is not None:
            raise TenancyError(scoper.refusal)
        return scoped.prettify().strip()

    def refusals(self, policy: PromotionPolicy) -> list[tuple[tuple[str | int, ...], str]]:
        """Each custom query of ``policy`` that cannot be scoped to its namespace: where, and why.

        Checked as the controller will run it, rendered with example names (a DCGM metric under
        ``gpuLabels: auto`` is scoped by the label style detected when it runs)."""
        spec = policy.spec
        gpu = None if spec.metrics.gpu_labels is GpuLabelStyle.AUTO else spec.metrics.gpu_labels
        templates: list[tuple[tuple[str | int, ...], str]] = [
            (("spec", "checks", index, "promql"), check.promql)
            for index, check in enumerate(spec.checks)
            if check.promql is not None
        ]
        templates += [
            (("spec", "metrics", "queries", name), spec.metrics.queries[name])
            for name in sorted(spec.metrics.queries)
        ]
        found = []
        for loc, template in templates:
            try:
                self.scope(_example(template, policy), policy.metadata.namespace, gpu or _ANY_STYLE)
            except TenancyError as error:
                found.append((loc, str(error)))
            except TemplateError:
                continue  # the model's validation reports it
        return found


_ANY_STYLE = GpuLabelStyle.AUTO  # at load time: a DCGM metric under auto is checked, not refused


def _example(template: str, policy: PromotionPolicy) -> str:
    name = policy.spec.target.inference_service
    return render_template(
        template,
        {
            "namespace": policy.metadata.namespace,
            "inferenceService": name,
            "revision": f"{name}-predictor-00002",
            "stableRevision": f"{name}-predictor-00001",
            "window": "300s",
            "interval": "60s",
        },
    )


class _Scoper:
    """The post-visit of :func:`promql_parser.transform`: each vector selector checked and scoped; the
    first refusal is kept (the callback cannot raise through the Rust walk)."""

    def __init__(
        self,
        tenancy: Tenancy,
        namespace: str,
        gpu: GpuLabelStyle | None,
        resolved: tuple[tuple[str, str], ...],
    ) -> None:
        self.tenancy = tenancy
        self.namespace = namespace
        self.gpu = gpu
        self.resolved = resolved
        self.refusal: str | None = None

    def visit(self, node: promql_parser.Expr) -> promql_parser.Expr | None:
        if not isinstance(node, promql_parser.VectorSelector) or self.refusal is not None:
            return None
        try:
            text = self._scoped(node)
        except TenancyError as error:
            self.refusal = str(error)
            return None
        return None if text is None else promql_parser.parse(text)

    def _scoped(self, node: promql_parser.VectorSelector) -> str | None:
        """The selector's text with its tenancy matcher (None: unchanged)."""
        matchers = list(node.matchers.matchers)
        shown = str(node)
        if node.matchers.or_matchers:
            raise TenancyError(
                f"{shown}: 'or' inside a selector is not Prometheus' PromQL; write two selectors"
            )
        metric = _metric_name(node, matchers, shown)
        if self.tenancy.admits(metric, self.namespace):
            return None
        for matcher in matchers:
            if matcher.name in self.tenancy.checked_labels:
                self._check(matcher, metric)
        label = self.tenancy.label_for(metric, self.gpu, self.resolved)
        if label is None:
            if self.gpu is GpuLabelStyle.AUTO:
                return None  # checked at load time; the detected style scopes it when it runs
            raise TenancyError(
                f"{metric}: the DCGM label style is not known (nothing detected), so the label naming "
                "its namespace is not known either; set spec.metrics.gpuLabels"
            )
        if any(matcher.name == label for matcher in matchers):
            return None  # checked above: ="<namespace>"
        name = node.name or ""
        prefix = name + str(node.matchers)
        suffix = shown[len(prefix) :] if shown.startswith(prefix) else None
        if suffix is None or "{" in suffix or '"' in suffix:
            raise TenancyError(f"{metric}: the selector cannot be scoped; write it without modifiers")
        written = [f'{m.name}{_op(m.op)}"{string_literal(m.value)}"' for m in matchers]
        written.append(f'{label}="{string_literal(self.namespace)}"')
        return f"{name}{{{','.join(written)}}}{suffix}"

    def _check(self, matcher: promql_parser.Matcher, metric: str) -> None:
        own = f'{matcher.name}="{self.namespace}"'
        fix = (
            f"drop the matcher (the controller adds {own}) or write {own}; a series of all namespaces "
            f"needs the operator's --custom-promql-allow-metric {self.namespace}={metric}"
        )
        if matcher.op != promql_parser.MatchOp.Equal:
            raise TenancyError(
                f"{metric}: {matcher} matches the tenancy label {matcher.name} with {_op(matcher.op)}: "
                f"a policy of namespace {self.namespace} reads only its own series; {fix}"
            )
        if matcher.value != self.namespace:
            raise TenancyError(
                f'{metric}: {matcher.name}="{string_literal(matcher.value)}" names another namespace: '
                f"a policy of namespace {self.namespace} reads only its own series; {fix}"
            )


def _metric_name(
    node: promql_parser.VectorSelector, matchers: list[promql_parser.Matcher], shown: str
) -> str:
    if node.name:
        return node.name
    for matcher in matchers:
        if matcher.name == "__name__":
            if matcher.op == promql_parser.MatchOp.Equal:
                return matcher.value
            break
    raise TenancyError(
        f'{shown}: name the metric (name{{...}} or __name__="name"); a selector over several '
        "metrics cannot be told which label names their namespace"
    )


def _op(op: promql_parser.MatchOp) -> str:
    if op == promql_parser.MatchOp.Equal:
        return "="
    if op == promql_parser.MatchOp.NotEqual:
        return "!="
    return "=~" if op == promql_parser.MatchOp.Re else "!~"
