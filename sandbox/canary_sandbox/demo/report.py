"""The demo's report: one self-contained HTML page with SVG charts over time per model.

The charts are drawn by the product's renderer (:mod:`canary.report.charts`); this module picks the
demo's series and tells its story around them. Per model: the new version's share of traffic, p99
latency, 5xx error rate and GPU memory — stable and canary revision side by side, the policy's
limits as dashed lines and every decision the controller announced as a marker. The series come
from Prometheus' range API (the same data the controller judged), the traffic from KServe's status
as the demo observed it, and the decisions from the webhook notifications the loopback receiver got.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from canary.metrics.ranges import RangeReader
from canary.policy import Check, MetricKind, PromotionPolicy
from canary.report.charts import (
    CANARY_COLOUR,
    LIMIT_COLOUR,
    STABLE_COLOUR,
    STYLE,
    Chart,
    Marker,
    Series,
    by_revision,
    decision_rows,
    svg_chart,
)
from canary_sandbox.demo.monitor import ModelTimeline
from canary_sandbox.demo.story import ModelStory, Outcome

__all__ = ["ModelReport", "collect_charts", "render_html"]

# Short enough to show a step's change within its window, long enough to be smooth. Errors are rare
# events: over 5s a 10% canary's two unlucky 5xx look like a 2% error rate, so they get longer.
LATENCY_RATE_WINDOW = "5s"
ERROR_RATE_WINDOW = "15s"
_MIB_PER_GIB = 1024.0


@dataclass
class ModelReport:
    story: ModelStory
    policy: PromotionPolicy
    outcome: Outcome
    problems: list[str]
    charts: list[Chart] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)


# -- data ----------------------------------------------------------------------------------------


def _revision_series(
    values: Mapping[str, list[tuple[float, float]]],
    stable: str | None,
    canary: str | None,
    scale: float = 1.0,
) -> list[Series]:
    series = []
    for revision, version, colour in ((stable, "v1", STABLE_COLOUR), (canary, "v2", CANARY_COLOUR)):
        # A revision that served nothing (never Ready) has series of zeros and NaN quantiles: no line.
        if revision is None or not values.get(revision):
            continue
        points = [(t, v * scale) for t, v in values[revision]]
        series.append(Series(f"{version} · {revision}", colour, points))
    return series


def _check(policy: PromotionPolicy, metric: MetricKind) -> Check | None:
    return next((check for check in policy.spec.checks if check.metric == metric), None)


def collect_charts(
    prometheus: RangeReader,
    policy: PromotionPolicy,
    timeline: ModelTimeline,
    *,
    stable: str | None,
    canary: str | None,
    origin: float,
) -> list[Chart]:
    """The four charts of one model."""
    namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
    queue = f'namespace_name="{namespace}", configuration_name="{name}-predictor"'
    p99 = prometheus.query(
        "histogram_quantile(0.99, sum by (revision_name, le) "
        f"(rate(revision_request_latencies_bucket{{{queue}}}[{LATENCY_RATE_WINDOW}])))"
    )
    # An absent 5xx series is zero errors, not a gap (docs/design.md §3): fill it from the request rate.
    requests_rate = f"sum by (revision_name) (rate(revision_request_count{{{queue}}}[{ERROR_RATE_WINDOW}]))"
    errors_rate = (
        "sum by (revision_name) "
        f'(rate(revision_request_count{{{queue}, response_code_class="5xx"}}[{ERROR_RATE_WINDOW}]))'
    )
    errors = prometheus.query(f"({errors_rate} or 0 * {requests_rate}) / {requests_rate}")
    gpu_selector = f'namespace="{namespace}", pod=~"{name}-predictor-.*"'
    gpu = prometheus.query(f"max by (pod) (DCGM_FI_DEV_FB_USED{{{gpu_selector}}})")
    gpu_total = prometheus.query(
        f"max(DCGM_FI_DEV_FB_USED{{{gpu_selector}}} + DCGM_FI_DEV_FB_FREE{{{gpu_selector}}}"
        f" + DCGM_FI_DEV_FB_RESERVED{{{gpu_selector}}})"
    )

    latency_check = _check(policy, MetricKind.LATENCY)
    error_check = _check(policy, MetricKind.ERROR_RATE)
    gpu_check = _check(policy, MetricKind.GPU_MEMORY_PEAK)
    latency_limits = (
        []
        if latency_check is None or latency_check.max is None
        else [(f"max {latency_check.max * 1000:g} ms", latency_check.max * 1000)]
    )
    error_limits = (
        []
        if error_check is None or error_check.max is None
        else [(f"max {error_check.max * 100:g}%", error_check.max * 100)]
    )
    gpu_limits: list[tuple[str, float]] = []
    totals = [v for _, points in gpu_total for _, v in points]
    if gpu_check is not None and gpu_check.max_fraction is not None and totals:
        gpu_limits.append(
            (f"maxFraction {gpu_check.max_fraction:.0%}", gpu_check.max_fraction * max(totals) / _MIB_PER_GIB)
        )

    traffic = Series(
        "v2 share (KServe status.traffic)",
        CANARY_COLOUR,
        [(sample.at - origin, sample.canary_share) for sample in timeline.samples],
        step=True,
    )
    # Knative reports latency in milliseconds already.
    latency_series = _revision_series(by_revision(p99, "revision_name", origin), stable, canary)
    if latency_check is not None and latency_check.max_increase is not None and latency_series:
        # The relative limit moves with the stable revision: draw it from stable's own curve.
        factor = 1 + latency_check.max_increase
        stable_points = latency_series[0].points if latency_series[0].label.startswith("v1") else []
        latency_series.append(
            Series(f"{factor:g} × v1", LIMIT_COLOUR, [(t, v * factor) for t, v in stable_points], dashed=True)
        )
    return [
        Chart("Traffic to the new version", "%", [traffic], y_max=100),
        Chart("p99 latency", "ms", latency_series, latency_limits),
        Chart(
            "5xx error rate",
            "%",
            _revision_series(by_revision(errors, "revision_name", origin), stable, canary, 100.0),
            error_limits,
        ),
        Chart(
            "GPU memory used (DCGM framebuffer)",
            "GiB",
            _revision_series(by_revision(gpu, "pod", origin), stable, canary, 1 / _MIB_PER_GIB),
            gpu_limits,
        ),
    ]


# -- HTML ----------------------------------------------------------------------------------------


def render_html(
    models: Sequence[ModelReport],
    *,
    title: str,
    facts: Sequence[tuple[str, str]],
    origin: float,
    x_range: tuple[float, float],
    policies_text: Mapping[str, str],
) -> str:
    """The whole report page."""
    summary_rows = []
    for model in models:
        verdict = (
            "<span class='ok'>as expected</span>"
            if not model.problems
            else "<span class='bad'>" + html.escape("; ".join(model.problems)) + "</span>"
        )
        summary_rows.append(
            f"<tr><td><b>{model.story.letter}</b> {html.escape(model.story.name)}</td>"
            f"<td>{html.escape(model.story.plot)}</td><td>{html.escape(model.story.expected)}</td>"
            f"<td>{html.escape(str(model.outcome.phase))}</td><td>{verdict}</td></tr>"
        )
    sections = []
    for model in models:
        charts = "".join(svg_chart(chart, model.markers, x_range) for chart in model.charts)
        sections.append(
            f"<h2 id='{html.escape(model.story.name)}'>{model.story.letter} · "
            f"{html.escape(model.policy.key)} — {html.escape(str(model.outcome.phase))}</h2>"
            f"<p>The new version (v2): {html.escape(model.story.plot)}. "
            f"Expected: {html.escape(model.story.expected)}.<br>"
            f"<b>Decisive reason:</b> {html.escape(model.outcome.decisive_reason())}</p>"
            f"{charts}<h3>Decisions (webhook notifications)</h3>"
            f"{decision_rows(model.outcome.notifications, origin)}"
        )
    policies = "".join(
        f"<details><summary><code>{html.escape(name)}</code></summary><pre>{html.escape(text)}</pre></details>"
        for name, text in policies_text.items()
    )
    fact_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><table>{fact_rows}</table>"
        "<table><tr><th>model</th><th>new version</th><th>expected</th><th>phase</th><th>result</th></tr>"
        + "".join(summary_rows)
        + "</table><p class='muted'>Time is in seconds from the moment the new versions were applied. "
        "Dashed red lines are the policy's absolute limits; vertical lines are the controller's decisions "
        "(hover for the reason). Latency, errors and GPU memory are Prometheus range queries "
        f"({LATENCY_RATE_WINDOW} rates for latency, {ERROR_RATE_WINDOW} for errors): the controller judges "
        "each step over the whole step instead. Traffic is KServe's status as the demo observed it.</p>"
        + "".join(sections)
        + f"<h2>Policies</h2>{policies}</body></html>\n"
    )
