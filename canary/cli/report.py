"""``kserve-canary report NAMESPACE/NAME``: the HTML report of a real rollout, current or past.

The rollout comes from the state ConfigMap (``rollouts.json`` for a finished one, ``state.json`` and
``explain.json`` for the one under way; :func:`canary.report.rollout.choose_rollout`), the curves from
Prometheus range queries over the rollout, built from the policy's checks with the metric catalog the
controller uses (:func:`canary.metrics.catalog.render_builtin`; custom PromQL rendered per revision as
the controller renders it). The policy is the PromotionPolicy object targeting the InferenceService, or
the one in ``--policy FILE``; without one the report has the traffic chart and the tables, and says why
there are no check charts.

An unreachable Prometheus is one line and exit 3; ``--no-charts`` writes the report without asking it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import typer
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.cli.cluster import api_client, get_json
from canary.cli.help import EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, fail
from canary.cli.output import printable
from canary.cli.rollouts import _load, not_seen
from canary.cli.targets import resolve_target
from canary.metrics.catalog import (
    FIELD_LABEL,
    KIND_FAMILY,
    REVISION_LABEL,
    Family,
    RevisionKey,
    render_builtin,
)
from canary.metrics.client import PrometheusClient, PrometheusConfig
from canary.metrics.plan import builtin_query
from canary.metrics.promql import TemplateError, format_duration_seconds, render_template
from canary.metrics.ranges import RangeQueryError, RangeReader, probe
from canary.policy import PromotionPolicy, load_paths
from canary.policy.model import Check, GpuLabelStyle, RequestsProfile
from canary.policy.objects import load_object
from canary.report.charts import by_revision
from canary.report.rollout import CheckSeries, ReportedRollout, choose_rollout, render_report
from canary.rollout.past import PastRollouts
from canary.rollout.state import StateFormatError

__all__ = ["write_report"]

# A range query answers at most this many points per series: enough for a chart 900 pixels wide.
RANGE_POINTS = 300
# Before the rollout's start and after its end, so the stable revision's curve has a before.
MARGIN_FRACTION = 0.05
PROMETHEUS_TIMEOUT = 30.0


def write_report(
    target: str,
    *,
    selector: str | None,
    output: Path | None,
    prometheus_url: str | None,
    no_charts: bool,
    policy_paths: Sequence[Path],
    namespace: str | None,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    namespace, name = resolve_target(target, namespace, kubeconfig, context)
    if not no_charts and not prometheus_url:
        raise fail(
            "error: the report's charts need Prometheus: pass --prometheus-url URL (or PROMETHEUS_URL)",
            EXIT_USAGE,
            "or --no-charts for a report without check charts",
        )
    missing = [path for path in policy_paths if not path.exists()]
    if missing:
        raise fail(f"error: {', '.join(map(str, missing))}: no such file or directory", EXIT_USAGE)
    api = api_client(kubeconfig, context)
    rollout = _reported_rollout(api, namespace, name, selector)
    now = datetime.now(UTC)
    started = (rollout.started_at or now).timestamp()
    ended = (rollout.ended_at or now).timestamp()
    margin = max((ended - started) * MARGIN_FRACTION, 10.0)
    start, end = started - margin, min(ended + margin, now.timestamp())
    url = prometheus_url.rstrip("/") if prometheus_url and not no_charts else None
    if url is not None:
        series, note = _charted(url, api, policy_paths, rollout, start, end)
    else:
        series, note = None, "A report without check charts (--no-charts): Prometheus was not asked."
    shown = _shown(url) if url is not None else None
    page = render_report(
        rollout, series, start=start, end=end, generated_at=now, prometheus_url=shown, note=note
    )
    path = output or Path(f"{namespace}-{name}-{rollout.revision}.html")
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as error:
        raise fail(f"error: cannot write {path}: {error.strerror or error}", EXIT_REFUSED) from None
    typer.echo(printable(_written(path, rollout, series)))


def _reported_rollout(
    api: client.ApiClient, namespace: str, name: str, selector: str | None
) -> ReportedRollout:
    """The rollout ``selector`` names, from the state ConfigMap; a warning on stderr for what could not
    be read but is not needed."""
    stored = _load(api, namespace, name)
    if stored.state_json is None and stored.rollouts_json is None:
        raise fail(not_seen(api, namespace, name))
    try:
        state = stored.state() if stored.state_json else None
    except StateFormatError as error:
        raise fail(printable(f"{namespace}/{name}: {error}")) from None
    # An unreadable record (or evaluation) does not hide the rollout the state describes: that one is
    # reported, with one line saying what could not be read. A past rollout needs the record.
    unreadable_record = unreadable_explain = ""
    try:
        explain = stored.explain()
    except StateFormatError as error:
        explain, unreadable_explain = None, str(error)
    try:
        record = stored.past_rollouts()
    except StateFormatError as error:
        record, unreadable_record = PastRollouts(), str(error)
    try:
        rollout = choose_rollout(namespace, name, state, explain, record, selector)
    except LookupError as error:
        if unreadable_record:
            asked = f"; rollout {selector!r} is not the one in the state either" if selector else ""
            raise fail(printable(f"{namespace}/{name}: {unreadable_record}{asked}")) from None
        raise fail(printable(f"error: {error}")) from None
    for problem in (unreadable_record, unreadable_explain if rollout.number is None else ""):
        if problem:
            typer.echo(printable(f"warning: {namespace}/{name}: {problem}; reported without it"), err=True)
    return rollout


def _charted(
    url: str,
    api: client.ApiClient,
    policy_paths: Sequence[Path],
    rollout: ReportedRollout,
    start: float,
    end: float,
) -> tuple[list[CheckSeries], str]:
    """The check series from Prometheus at ``url``, and the page's note on where the checks came from."""
    _probe(url)
    policy, where = _policy(api, rollout.namespace, rollout.name, policy_paths)
    if policy is None:
        return [], f"No check charts: {where}."
    return _series(url, policy, rollout, start, end), f"Check charts from the checks of {where}."


def _written(path: Path, rollout: ReportedRollout, series: Sequence[CheckSeries] | None) -> str:
    """The line saying what was written."""
    drawn = sum(1 for s in series or () if any(s.revisions.values()))
    charts = "no check charts" if series is None else f"{drawn} of {len(series)} check charts with data"
    return (
        f"{path}: {rollout.key} rollout of {rollout.revision} "
        f"({'finished: ' if rollout.finished else 'under way: '}{rollout.outcome}), "
        f"{_count(len(rollout.steps), 'step')}, {_count(len(rollout.decisions), 'decision')}, {charts}"
    )


def _probe(url: str) -> None:
    """One cheap query: an unreachable Prometheus is one line and exit 3, not a page of errors."""
    failure = probe(_client(url), datetime.now(UTC))
    if failure is not None:
        raise fail(
            f"error: cannot reach Prometheus: {failure.detail} ({failure.error_class})",
            EXIT_UNREACHABLE,
            "Check --prometheus-url, or pass --no-charts for a report without check charts.",
        )


def _client(url: str) -> PrometheusClient:
    """The controller's Prometheus client (bounded answers, no redirects, its error classes)."""
    return PrometheusClient(PrometheusConfig(url=url, timeout=PROMETHEUS_TIMEOUT))


def _shown(url: str) -> str:
    """``url`` without credentials or a query, for the page and messages."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, "", ""))


def _policy(
    api: client.ApiClient, namespace: str, name: str, paths: Sequence[Path]
) -> tuple[PromotionPolicy | None, str]:
    """The policy targeting ``namespace/name`` and where it came from (or why there is none)."""
    key = f"{namespace}/{name}"
    if paths:
        loaded = load_paths(list(paths))
        for policy in loaded.policies:
            if policy.policy.key == key:
                return policy.policy, f"policy {policy.policy.metadata.name} ({policy.origin})"
        return None, f"no valid policy in {', '.join(map(str, paths))} targets {key}"
    try:
        listed = get_json(
            api, f"/apis/kserve-canary.dev/v1alpha1/namespaces/{quote(namespace)}/promotionpolicies"
        )
    except ApiException as error:
        if error.status in (403, 404):
            why = "not allowed to read" if error.status == 403 else "the cluster serves no"
            return None, f"{why} PromotionPolicy objects in {namespace}; pass --policy FILE for them"
        raise
    for item in listed.get("items") or ():
        loaded_object, _ = load_object(item)
        if loaded_object is not None and loaded_object.policy.key == key:
            return loaded_object.policy, f"PromotionPolicy {namespace}/{loaded_object.policy.metadata.name}"
    return None, f"no PromotionPolicy in {namespace} targets {name}; pass --policy FILE for check charts"


def _window(start: float, end: float, step: float) -> str:
    """The rate window of the range queries: a few samples' worth, at least 15 s, at most 5 min."""
    return format_duration_seconds(min(max(step * 4, 15.0, (end - start) / 60), 300.0))


def _series(
    url: str, policy: PromotionPolicy, rollout: ReportedRollout, start: float, end: float
) -> list[CheckSeries]:
    step = max(math.ceil((end - start) / RANGE_POINTS), 1)
    window = _window(start, end, step)
    prometheus = RangeReader(_client(url), start, end, step)
    revisions = [RevisionKey(rollout.namespace, r) for r in (rollout.stable_revision, rollout.revision) if r]
    profiles = _profiles(url, policy, end)
    answer = []
    for check in policy.spec.checks:
        unit = check.value_unit
        title = f"{check.name} ({_describe(check)})"
        try:
            queries = _queries(policy, check, revisions, window, profiles)
        except (ValueError, TemplateError) as error:
            answer.append(CheckSeries(check.name, unit, title, error=f"no chart: {error}", step=step))
            continue
        grouped: dict[str, list[tuple[float, float]]] = {}
        error_text = None
        for revision, promql in queries:
            try:
                results = prometheus.query(promql)
            except RangeQueryError as error:
                error_text = f"the range query failed: {error}"
                continue
            if revision is None:  # the catalog's queries label each series with its revision
                for owner, points in by_revision(results, REVISION_LABEL, skip_label=FIELD_LABEL).items():
                    grouped.setdefault(owner, []).extend(points)
            else:  # a custom query rendered for this one revision
                grouped.setdefault(revision, []).extend(p for _, ps in results for p in ps)
        answer.append(
            CheckSeries(
                check.name,
                unit,
                title,
                {revision: sorted(points) for revision, points in grouped.items()},
                error=error_text,
                query="\n\n".join(promql for _, promql in queries),
                step=step,
            )
        )
    return answer


def _describe(check: Check) -> str:
    if check.metric is None:
        return "custom PromQL"
    quantile = check.effective_quantile
    return f"{check.metric.value}" + (f" p{quantile * 100:g}" if quantile is not None else "")


def _profiles(url: str, policy: PromotionPolicy, end: float) -> dict[Family, str | None]:
    """The request-metric profile and DCGM label style: the policy's, else detected as the controller
    detects them (at the rollout's end)."""
    metrics = policy.spec.metrics
    requests_profile: str | None = metrics.requests.value
    gpu_labels: str | None = metrics.gpu_labels.value
    if (
        RequestsProfile(metrics.requests) is RequestsProfile.AUTO
        or GpuLabelStyle(metrics.gpu_labels) is GpuLabelStyle.AUTO
    ):
        from canary.metrics.detect import ProfileDetector  # noqa: PLC0415

        detector = ProfileDetector(_client(url))
        at = datetime.fromtimestamp(end, UTC)
        if RequestsProfile(metrics.requests) is RequestsProfile.AUTO:
            requests_profile = detector.requests_profile(at)[0].choice
        if GpuLabelStyle(metrics.gpu_labels) is GpuLabelStyle.AUTO:
            gpu_labels = detector.gpu_labels(at)[0].choice
    return {Family.REQUESTS: requests_profile, Family.DCGM: gpu_labels}


def _queries(
    policy: PromotionPolicy,
    check: Check,
    revisions: Sequence[RevisionKey],
    window: str,
    profiles: dict[Family, str | None],
) -> list[tuple[str | None, str]]:
    """(revision, PromQL) pairs answering ``check`` over a moving ``window``; revision None: one query
    for all, grouped by its ``revision`` label."""
    if not revisions:
        raise ValueError("the rollout names no revision")
    metrics = policy.spec.metrics
    template = check.promql
    if check.metric is not None:
        template = metrics.queries.get(check.metric.value, template)
    if template is not None:
        base = {
            "namespace": revisions[0].namespace,
            "inferenceService": policy.spec.target.inference_service,
            "stableRevision": revisions[0].revision if len(revisions) > 1 else "",
            "window": window,
            "interval": format_duration_seconds(policy.spec.interval),
        }
        return [
            (key.revision, render_template(template, {**base, "revision": key.revision})) for key in revisions
        ]
    assert check.metric is not None
    family = KIND_FAMILY[check.metric.value]
    choice = profiles.get(family)
    if family in (Family.REQUESTS, Family.DCGM) and choice is None:
        raise ValueError(f"no {family.value} metrics found in Prometheus (profile detection found none)")
    query = builtin_query(
        check.metric.value, window, check.effective_quantile, choice, metrics.revision_label
    )
    return [(None, render_builtin(query, revisions))]


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")
