"""Self-contained HTML/SVG charts of rollouts over time: the renderer behind every report.

A chart is a list of :class:`Series` (stable and canary revisions side by side), the policy's
limits as dashed lines and every decision as a :class:`Marker`. Decisions come from notification
payloads (the webhook's versioned shape, ``docs/notification-payload.schema.json``), series from
Prometheus' range API (:class:`canary.metrics.ranges.RangeReader`). Nothing is fetched when the page
is opened: no script, no stylesheet, no font — the file opens anywhere, offline.

The demo's report (``canary_sandbox.demo.report``) and the report of a real rollout
(:mod:`canary.report.rollout`, ``kserve-canary report``) are built from these parts. A gap in a series
(no sample for longer than its ``gap``) is drawn as a gap, a lone sample as a dot, and a chart without
any sample says so: missing data is never drawn as zero.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "CANARY_COLOUR",
    "LIMIT_COLOUR",
    "MARKED_ACTIONS",
    "STABLE_COLOUR",
    "STYLE",
    "TABLED_ACTIONS",
    "Chart",
    "Marker",
    "Series",
    "by_revision",
    "decision_markers",
    "decision_rows",
    "since",
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
@dataclass(frozen=True)
class Series:
    label: str
    colour: str
    points: Sequence[tuple[float, float]]  # (seconds since the origin, value)
    step: bool = False  # a step function (traffic), not a sampled curve
    dashed: bool = False  # a limit that moves with the data (e.g. 1.5 x stable)
    gap: float = 3.0  # seconds without a sample that make a gap (missing data, not a line across it)


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
    empty_text: str = "no data"  # written across a chart that has no sample at all


def by_revision(
    results: Sequence[tuple[Mapping[str, str], Sequence[tuple[float, float]]]],
    label: str,
    origin: float = 0.0,
    *,
    skip_label: str | None = None,
) -> dict[str, list[tuple[float, float]]]:
    """A range query's answer grouped by revision: ``label`` names it (DCGM series name the pod,
    ``<revision>-deployment-<hash>``: the revision is what precedes ``-deployment-``); times become
    seconds since ``origin``. Series carrying ``skip_label`` (side series: sample counts) are left out."""
    grouped: dict[str, list[tuple[float, float]]] = {}
    for metric, points in results:
        if skip_label is not None and skip_label in metric:
            continue
        revision = metric.get(label, "").split("-deployment-")[0]
        grouped.setdefault(revision, []).extend((t - origin, v) for t, v in points)
    return {revision: sorted(points) for revision, points in grouped.items()}


def since(moment: str, origin: float) -> float:
    """Seconds from ``origin`` (epoch) to an RFC 3339 timestamp."""
    return datetime.fromisoformat(moment.replace("Z", "+00:00")).astimezone(UTC).timestamp() - origin


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


@dataclass(frozen=True)
class _Plot:
    """Where a chart draws: the plot area inside the chart's margins (pixels), and the time range and
    the axis top it maps onto that area."""

    left: int
    top: int
    width: int
    height: int
    x0: float
    x1: float
    y_top: float

    @property
    def span(self) -> float:
        return max(self.x1 - self.x0, 1e-9)

    def x(self, t: float) -> float:
        return self.left + (min(max(t, self.x0), self.x1) - self.x0) / self.span * self.width

    def y(self, v: float) -> float:
        return self.top + self.height - min(max(v, 0.0), self.y_top) / self.y_top * self.height


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
    observed = [v for s in chart.series for _, v in s.points] + [v for _, v in chart.limits]
    y_top = float(chart.y_max if chart.y_max is not None else _nice_ceiling(max(observed, default=1.0) * 1.1))
    plot = _Plot(left, top, width - left - right, height - top - bottom, x_range[0], x_range[1], y_top)
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(chart.title)}">',
        f'<text x="{left}" y="15" class="title">'
        f"{html.escape(chart.title)} ({html.escape(chart.unit)})</text>",
        *_value_grid(plot),
        *_time_ticks(plot, height),
        *_limit_lines(chart.limits, plot),
        *_series_lines(chart.series, plot),
    ]
    if not any(series.points for series in chart.series):
        parts.append(
            f'<text x="{left + plot.width / 2:.1f}" y="{top + plot.height / 2:.1f}" class="empty" '
            f'text-anchor="middle">{html.escape(chart.empty_text)}</text>'
        )
    parts.extend(_marker_lines(markers, plot))
    parts.append(f'<rect x="{left}" y="{top}" width="{plot.width}" height="{plot.height}" class="frame"/>')
    parts.extend(_legend(chart, left))
    parts.append("</svg>")
    return "".join(parts)


def _value_grid(plot: _Plot) -> list[str]:
    """The horizontal grid lines and their labels on the y axis."""
    parts = []
    divisions = _divisions(plot.y_top)
    for index in range(divisions + 1):
        value = plot.y_top * index / divisions
        parts.append(
            f'<line x1="{plot.left}" x2="{plot.left + plot.width}" y1="{plot.y(value):.1f}" '
            f'y2="{plot.y(value):.1f}" class="grid"/>'
            f'<text x="{plot.left - 6}" y="{plot.y(value) + 4:.1f}" class="tick" text-anchor="end">'
            f"{_format_tick(value)}</text>"
        )
    return parts


def _time_ticks(plot: _Plot, height: int) -> list[str]:
    """The labels of the time axis, under the plot (``height``: the whole chart's)."""
    # Seconds on a short chart (the demo's minute), minutes or hours on a real rollout's.
    span = plot.span
    divisor, suffix = (1.0, "s") if span <= 900 else (60.0, "m") if span <= 5 * 3600 else (3600.0, "h")
    tick_step = _nice_ceiling(span / divisor / 8) * divisor
    tick = math.ceil(plot.x0 / tick_step) * tick_step
    parts = []
    while tick <= plot.x1:
        parts.append(
            f'<text x="{plot.x(tick):.1f}" y="{height - 6}" class="tick" text-anchor="middle">'
            f"{tick / divisor:g}{suffix}</text>"
        )
        tick += tick_step
    return parts


def _limit_lines(limits: Sequence[tuple[str, float]], plot: _Plot) -> list[str]:
    """Each limit as a dashed horizontal line, labelled at the right end."""
    right = plot.left + plot.width
    return [
        f'<line x1="{plot.left}" x2="{right}" y1="{plot.y(value):.1f}" y2="{plot.y(value):.1f}" '
        f'class="limit" stroke="{LIMIT_COLOUR}"><title>{html.escape(label)}</title></line>'
        f'<text x="{right - 4}" y="{plot.y(value) - 4:.1f}" class="limit-label" '
        f'text-anchor="end" fill="{LIMIT_COLOUR}">{html.escape(label)}</text>'
        for label, value in limits
    ]


def _series_lines(all_series: Sequence[Series], plot: _Plot) -> list[str]:
    """Each series as lines broken at its gaps; a lone sample between gaps as a dot."""
    parts = []
    for series in all_series:
        for run in _runs(series.points, step=series.step, gap=series.gap):
            if len(run) == 1:  # a lone sample between gaps: a dot, not an invisible line
                parts.append(
                    f'<circle cx="{plot.x(run[0][0]):.1f}" cy="{plot.y(run[0][1]):.1f}" r="2.2" '
                    f'fill="{series.colour}" class="sample">'
                    f"<title>{html.escape(series.label)}</title></circle>"
                )
                continue
            path = " ".join(f"{plot.x(t):.1f},{plot.y(v):.1f}" for t, v in run)
            css = "series moving-limit" if series.dashed else "series"
            parts.append(
                f'<polyline points="{path}" fill="none" stroke="{series.colour}" class="{css}">'
                f"<title>{html.escape(series.label)}</title></polyline>"
            )
    return parts


def _marker_lines(markers: Sequence[Marker], plot: _Plot) -> list[str]:
    """Each decision inside the time range as a vertical line with its label (the reason on hover)."""
    parts = []
    for index, marker in enumerate(markers):
        if not plot.x0 <= marker.at <= plot.x1:
            continue
        colour = MARKER_COLOURS.get(marker.action, "#555")
        at = plot.x(marker.at)
        label_y = plot.top + 10 + (index % 2) * 11  # alternate rows so neighbouring labels do not collide
        # Near the right edge the label goes to the left of its line, inside the plot.
        at_edge = at > plot.left + plot.width - 80
        label_x, anchor = (at - 3, "end") if at_edge else (at + 3, "start")
        parts.append(
            f'<g class="marker {html.escape(marker.action)}"><title>{html.escape(marker.detail)}</title>'
            f'<line x1="{at:.1f}" x2="{at:.1f}" y1="{plot.top}" y2="{plot.top + plot.height}" '
            f'stroke="{colour}"/>'
            f'<text x="{label_x:.1f}" y="{label_y}" fill="{colour}" class="marker-label" '
            f'text-anchor="{anchor}">{html.escape(marker.label)}</text></g>'
        )
    return parts


def _legend(chart: Chart, left: int) -> list[str]:
    """A swatch and a label per series, after the title."""
    # The legend follows the title (about 8px per character of the bold 13px title font).
    legend_x = left + 8.0 * (len(chart.title) + len(chart.unit) + 3) + 16
    parts = []
    for series in chart.series:
        swatch = 'stroke-dasharray="4 3"' if series.dashed else ""
        parts.append(
            f'<line x1="{legend_x:.0f}" x2="{legend_x + 16:.0f}" y1="10" y2="10" stroke="{series.colour}" '
            f'stroke-width="3" {swatch}/>'
            f'<text x="{legend_x + 20:.0f}" y="14" class="legend">{html.escape(series.label)}</text>'
        )
        legend_x += 34 + 6.2 * len(series.label)
    return parts


def _runs(
    points: Sequence[tuple[float, float]], *, step: bool, gap: float = 3.0
) -> list[list[tuple[float, float]]]:
    """Split a series where samples are missing for more than ``gap`` seconds (so a gap is drawn as a
    gap); steps get corners."""
    runs: list[list[tuple[float, float]]] = []
    previous: tuple[float, float] | None = None
    for t, v in points:
        if previous is None or t - previous[0] > gap:
            runs.append([])
        elif step and v != previous[1]:
            runs[-1].append((t, previous[1]))
        runs[-1].append((t, v))
        previous = (t, v)
    return runs


# -- HTML parts ----------------------------------------------------------------------------------------

STYLE = """
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
svg .empty { font: italic 12px system-ui, sans-serif; fill: #999; }
"""


def decision_rows(notifications: Sequence[Mapping[str, Any]], origin: float) -> str:
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
