"""The demo's report: one self-contained HTML page with SVG charts over time per model.

Per model: the new version's share of traffic, p99 latency, 5xx error rate and GPU memory — stable
and canary revision side by side, the policy's limits as dashed lines and every decision the
controller announced as a marker. The series come from Prometheus' range API (the same data the
controller judged), the traffic from KServe's status as the demo observed it, and the decisions from
the webhook notifications the loopback receiver got. No script, no stylesheet, no font is fetched:
the file opens anywhere, offline.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import requests

from canary.demo.monitor import ModelTimeline, since
from canary.demo.story import ModelStory, Outcome
from canary.policy import MetricKind, PromotionPolicy

__all__ = [
    "Chart",
    "Marker",
    "ModelReport",
    "Series",
    "collect_charts",
    "decision_markers",
    "render_html",
    "svg_chart",
]

STABLE_COLOUR = "#3b6ea8"
CANARY_COLOUR = "#e07b24"
LIMIT_COLOUR = "#c0392b"
# The decisions that move traffic or stop a rollout get a marker; "waiting" and "inconclusive" repeat
# every interval, and "succeeded" follows "promoted" at once: they would only hide the others.
MARKER_COLOURS = {
    "started": "#7f8c8d",
    "advanced": "#27ae60",
    "promoted": "#1e8449",
    "rolled-back": "#c0392b",
    "paused": "#8e44ad",
    "unguarded-rollout": "#d68910",
}
MARKED_ACTIONS = frozenset(MARKER_COLOURS)
TABLED_ACTIONS = MARKED_ACTIONS | {"succeeded", "resumed", "aborted"}
# Short enough to show a step's change within its window, long enough to be smooth. Errors are rare
# events: over 5s a 10% canary's two unlucky 5xx look like a 2% error rate, so they get longer.
LATENCY_RATE_WINDOW = "5s"
ERROR_RATE_WINDOW = "15s"
_MIB_PER_GIB = 1024.0


@dataclass(frozen=True)
class Series:
    label: str
    colour: str
    points: Sequence[tuple[float, float]]  # (seconds since the origin, value)
    step: bool = False  # a step function (traffic), not a sampled curve
    dashed: bool = False  # a limit that moves with the data (e.g. 1.5 x stable)


@dataclass(frozen=True)
class Marker:
    at: float  # seconds since the origin
    label: str
    action: str
    detail: str  # the tooltip: the decision's summary


@dataclass(frozen=True)
class Chart:
    title: str
    unit: str
    series: Sequence[Series]
    limits: Sequence[tuple[str, float]] = ()  # dashed horizontal lines: (label, value)
    y_max: float | None = None  # a fixed top (100 for percentages of traffic)


@dataclass
class ModelReport:
    story: ModelStory
    policy: PromotionPolicy
    outcome: Outcome
    problems: list[str]
    charts: list[Chart] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)


# -- data ----------------------------------------------------------------------------------------


class PrometheusRange:
    """``/api/v1/query_range`` over the demo's interval, one result per label set."""

    def __init__(self, url: str, start: float, end: float, step: float = 1.0) -> None:
        self._url = url
        self._params = {"start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}

    def query(self, promql: str) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        response = requests.get(
            f"{self._url}/api/v1/query_range", params={"query": promql, **self._params}, timeout=30
        )
        response.raise_for_status()
        results = []
        for item in response.json()["data"]["result"]:
            points = [(float(t), float(v)) for t, v in item["values"]]
            results.append((dict(item["metric"]), [(t, v) for t, v in points if math.isfinite(v)]))
        return results


def _by_revision(
    results: Iterable[tuple[dict[str, str], list[tuple[float, float]]]], label: str, origin: float
) -> dict[str, list[tuple[float, float]]]:
    grouped: dict[str, list[tuple[float, float]]] = {}
    for metric, points in results:
        # DCGM series name the pod (<revision>-deployment-<hash>); queue-proxy series the revision.
        revision = metric.get(label, "").split("-deployment-")[0]
        grouped.setdefault(revision, []).extend((t - origin, v) for t, v in points)
    return {revision: sorted(points) for revision, points in grouped.items()}


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


def _check(policy: PromotionPolicy, metric: MetricKind) -> Any:
    return next((check for check in policy.spec.checks if check.metric == metric), None)


def collect_charts(
    prometheus: PrometheusRange,
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
    # An absent 5xx series is zero errors, not a gap (DESIGN §3): fill it from the request rate.
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
    latency_series = _revision_series(_by_revision(p99, "revision_name", origin), stable, canary)
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
            _revision_series(_by_revision(errors, "revision_name", origin), stable, canary, 100.0),
            error_limits,
        ),
        Chart(
            "GPU memory used (DCGM framebuffer)",
            "GiB",
            _revision_series(_by_revision(gpu, "pod", origin), stable, canary, 1 / _MIB_PER_GIB),
            gpu_limits,
        ),
    ]


def decision_markers(notifications: Sequence[Mapping[str, Any]], origin: float) -> list[Marker]:
    markers = []
    for payload in notifications:
        action = str(payload.get("action", ""))
        if action not in MARKED_ACTIONS:
            continue
        to = (payload.get("traffic") or {}).get("to")
        label = {
            "started": f"start {to}%",
            "advanced": f"{to}%",
            "promoted": "promoted",
            "rolled-back": "rolled back",
        }.get(action, action)
        markers.append(
            Marker(since(str(payload["time"]), origin), label, action, str(payload.get("summary", "")))
        )
    return markers


# -- SVG -----------------------------------------------------------------------------------------


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^n at or above ``value``: an axis top."""
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    for factor in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10):
        if factor * magnitude >= value:
            return factor * magnitude
    return 10 * magnitude


def _divisions(top: float) -> int:
    """How many grid intervals make round tick values for an axis top from :func:`_nice_ceiling`."""
    leading = round(top / 10.0 ** math.floor(math.log10(top)), 1) if top > 0 else 1.0
    return {1.5: 3, 2.5: 5, 3.0: 3, 5.0: 5, 6.0: 3}.get(leading, 4)


def _format_tick(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1 or value == 0 else f"{value:.2g}"


def svg_chart(
    chart: Chart,
    markers: Sequence[Marker],
    x_range: tuple[float, float],
    *,
    width: int = 900,
    height: int = 170,
) -> str:
    """One chart as an inline ``<svg>``: axes, series, dashed limits, decision markers."""
    left, right, top, bottom = 58, 12, 26, 24
    plot_w, plot_h = width - left - right, height - top - bottom
    x0, x1 = x_range
    span = max(x1 - x0, 1e-9)
    observed = [v for s in chart.series for _, v in s.points] + [v for _, v in chart.limits]
    y_top = float(chart.y_max if chart.y_max is not None else _nice_ceiling(max(observed, default=1.0) * 1.1))

    def x(t: float) -> float:
        return left + (min(max(t, x0), x1) - x0) / span * plot_w

    def y(v: float) -> float:
        return top + plot_h - min(max(v, 0.0), y_top) / y_top * plot_h

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(chart.title)}">',
        f'<text x="{left}" y="15" class="title">'
        f"{html.escape(chart.title)} ({html.escape(chart.unit)})</text>",
    ]
    divisions = _divisions(y_top)
    for index in range(divisions + 1):  # horizontal grid and y labels
        value = y_top * index / divisions
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" class="grid"/>'
            f'<text x="{left - 6}" y="{y(value) + 4:.1f}" class="tick" text-anchor="end">'
            f"{_format_tick(value)}</text>"
        )
    tick_step = _nice_ceiling(span / 8)
    tick = math.ceil(x0 / tick_step) * tick_step
    while tick <= x1:
        parts.append(
            f'<text x="{x(tick):.1f}" y="{height - 6}" class="tick" text-anchor="middle">{tick:g}s</text>'
        )
        tick += tick_step
    for label, value in chart.limits:
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'class="limit" stroke="{LIMIT_COLOUR}"><title>{html.escape(label)}</title></line>'
            f'<text x="{left + plot_w - 4}" y="{y(value) - 4:.1f}" class="limit-label" '
            f'text-anchor="end" fill="{LIMIT_COLOUR}">{html.escape(label)}</text>'
        )
    for series in chart.series:
        for run in _runs(series.points, step=series.step):
            path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in run)
            css = "series moving-limit" if series.dashed else "series"
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{series.colour}" class="{css}">'
                f"<title>{html.escape(series.label)}</title></polyline>"
            )
    for index, marker in enumerate(markers):
        if not x0 <= marker.at <= x1:
            continue
        colour = MARKER_COLOURS.get(marker.action, "#555")
        label_y = top + 10 + (index % 2) * 11  # alternate rows so neighbouring labels do not collide
        # Near the right edge the label goes to the left of its line, inside the plot.
        at_edge = x(marker.at) > left + plot_w - 80
        label_x, anchor = (x(marker.at) - 3, "end") if at_edge else (x(marker.at) + 3, "start")
        parts.append(
            f'<g class="marker {html.escape(marker.action)}"><title>{html.escape(marker.detail)}</title>'
            f'<line x1="{x(marker.at):.1f}" x2="{x(marker.at):.1f}" y1="{top}" y2="{top + plot_h}" '
            f'stroke="{colour}"/>'
            f'<text x="{label_x:.1f}" y="{label_y}" fill="{colour}" class="marker-label" '
            f'text-anchor="{anchor}">{html.escape(marker.label)}</text></g>'
        )
    parts.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>')
    # The legend follows the title (about 8px per character of the bold 13px title font).
    legend_x = left + 8.0 * (len(chart.title) + len(chart.unit) + 3) + 16
    for series in chart.series:
        swatch = 'stroke-dasharray="4 3"' if series.dashed else ""
        parts.append(
            f'<line x1="{legend_x:.0f}" x2="{legend_x + 16:.0f}" y1="10" y2="10" stroke="{series.colour}" '
            f'stroke-width="3" {swatch}/>'
            f'<text x="{legend_x + 20:.0f}" y="14" class="legend">{html.escape(series.label)}</text>'
        )
        legend_x += 34 + 6.2 * len(series.label)
    parts.append("</svg>")
    return "".join(parts)


def _runs(points: Sequence[tuple[float, float]], *, step: bool) -> list[list[tuple[float, float]]]:
    """Split a series where samples are missing (so a gap is drawn as a gap); steps get corners."""
    runs: list[list[tuple[float, float]]] = []
    previous: tuple[float, float] | None = None
    for t, v in points:
        if previous is None or t - previous[0] > 3.0:
            runs.append([])
        elif step and v != previous[1]:
            runs[-1].append((t, previous[1]))
        runs[-1].append((t, v))
        previous = (t, v)
    return runs


# -- HTML ----------------------------------------------------------------------------------------

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; margin: 24px auto;
       max-width: 940px; padding: 0 12px; }
h1 { font-size: 22px; }
h2 { font-size: 18px; margin-top: 36px; border-top: 1px solid #ddd; padding-top: 18px; }
table { border-collapse: collapse; margin: 8px 0 16px; } td, th { padding: 3px 10px 3px 0; text-align: left;
       vertical-align: top; } th { border-bottom: 1px solid #ccc; }
.ok { color: #1e8449; font-weight: 600; } .bad { color: #c0392b; font-weight: 600; }
.muted { color: #777; } code, pre { font: 12px/1.4 ui-monospace, monospace; }
pre { background: #f6f6f6; padding: 10px; overflow-x: auto; }
svg.chart { display: block; margin: 4px 0 10px; }
svg .title { font: 600 13px system-ui, sans-serif; fill: #222; }
svg .tick, svg .legend, svg .limit-label, svg .marker-label { font: 11px system-ui, sans-serif; fill: #555; }
svg .marker-label { font-weight: 600; }
svg .grid { stroke: #eee; } svg .frame { fill: none; stroke: #bbb; }
svg .series { stroke-width: 1.8; } svg .limit { stroke-dasharray: 6 4; stroke-width: 1.2; }
svg .moving-limit { stroke-dasharray: 4 3; stroke-width: 1.2; }
svg .marker line { stroke-dasharray: 2 3; stroke-width: 1.3; }
"""


def _decision_rows(notifications: Sequence[Mapping[str, Any]], origin: float) -> str:
    rows = []
    for payload in notifications:
        if payload.get("action") not in TABLED_ACTIONS:
            continue
        traffic = payload.get("traffic") or {}
        before = "—" if traffic.get("from") is None else f"{traffic['from']}%"
        after = "100% (promoted)" if traffic.get("to") is None else f"{traffic['to']}%"
        checks = "<br>".join(
            html.escape(
                f"{'✓' if c.get('verdict') == 'pass' else '✗' if c.get('verdict') == 'fail' else '·'} "
                f"{c['name']}: {c.get('value') or c.get('verdict')} (limit {c.get('limit', '')}"
                + (f", stable {c['stable']}" if c.get("stable") else "")
                + ")"
            )
            for c in payload.get("checks", [])
        )
        rows.append(
            f"<tr><td>{since(str(payload['time']), origin):+.1f}s</td>"
            f"<td>{html.escape(str(payload.get('action')))}</td><td>{before} → {after}</td>"
            f"<td>{html.escape(str(payload.get('summary', '')))}<br>"
            f"<span class='muted'>{checks}</span></td></tr>"
        )
    if not rows:
        return "<p class='muted'>No decisions were announced.</p>"
    return (
        "<table><tr><th>time</th><th>decision</th><th>traffic</th><th>why</th></tr>"
        + "".join(rows)
        + "</table>"
    )


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
            f"{_decision_rows(model.outcome.notifications, origin)}"
        )
    policies = "".join(
        f"<details><summary><code>{html.escape(name)}</code></summary><pre>{html.escape(text)}</pre></details>"
        for name, text in policies_text.items()
    )
    fact_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
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
