"""The report of one real rollout (``kserve-canary report``): one self-contained HTML page.

What it shows comes from two places. The rollout itself — revisions, start and end, outcome, steps,
decisions with their reasons and numbers, the checks of its last evaluation — from the state ConfigMap:
the record of past rollouts (``rollouts.json``, :mod:`canary.rollout.past`) for a finished one, the state
(``state.json``, ``explain.json``) for the one under way. The curves from Prometheus range queries over
the rollout (:class:`CheckSeries`, fetched by the CLI): per check, the canary and the stable revision
side by side with the check's limits; the traffic from the steps the controller wrote.

Missing data is missing: a range query answers no sample where Prometheus had none, and the chart
draws a gap there (a lone sample is a dot); a check with no data at all says so in its chart, and a
query that failed says why — nothing is drawn as zero that was not measured as zero.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from canary.policy.units import Unit, format_duration, format_value, parse_in_unit
from canary.report.charts import (
    CANARY_COLOUR,
    STABLE_COLOUR,
    STYLE,
    Chart,
    Marker,
    Series,
    svg_chart,
)
from canary.rollout.artefact import Artefact, describe_artefact
from canary.rollout.past import PastRollout, PastRollouts, StepRecord
from canary.rollout.records import ExplainCheck, ExplainDocument
from canary.rollout.state import GateProgress, HistoryEntry, RolloutState, describe_time

__all__ = [
    "CheckSeries",
    "ReportedRollout",
    "choose_rollout",
    "display_unit",
    "judged_limits",
    "limit_values",
    "render_report",
    "traffic_points",
]


@dataclass(frozen=True)
class ReportedRollout:
    """One rollout as the report tells it, finished (from the record) or under way (from the state)."""

    namespace: str
    name: str
    revision: str
    stable_revision: str | None
    started_at: datetime | None
    ended_at: datetime | None  # None: under way
    outcome: str  # promoted, rolled-back, aborted, superseded; the phase while under way
    reason: str
    steps: tuple[StepRecord, ...]
    decisions: tuple[HistoryEntry, ...]
    checks: tuple[ExplainCheck, ...]
    source: str  # where it was read from, for the page
    number: int | None = None  # 1 = the latest finished rollout
    decisions_dropped: int = 0
    gates: tuple[GateProgress, ...] = ()  # spec.gates reached (from the state; the record keeps none)
    artefact: Artefact | None = None  # what the canary revision served (None: unknown)
    stable_artefact: Artefact | None = None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def finished(self) -> bool:
        return self.ended_at is not None

    @classmethod
    def of_record(cls, namespace: str, name: str, entry: PastRollout, number: int) -> ReportedRollout:
        return cls(
            namespace,
            name,
            entry.revision,
            entry.stable_revision,
            entry.started_at,
            entry.ended_at,
            str(entry.outcome),
            entry.reason,
            entry.steps,
            entry.decisions,
            entry.checks,
            f"the record of past rollouts (rollouts.json), rollout {number} ({entry.id})",
            number,
            entry.decisions_dropped,
            artefact=entry.artefact,
            stable_artefact=entry.stable_artefact,
        )

    @classmethod
    def of_state(
        cls, namespace: str, name: str, state: RolloutState, explain: ExplainDocument | None
    ) -> ReportedRollout | None:
        """The rollout the state describes (under way, or the last one when the record lacks it)."""
        if state.revision is None or state.started_at is None:
            return None
        started = state.started_at
        decisions = tuple(entry for entry in state.history if entry.at >= started)
        ended = None if state.rollout_active else (decisions[-1].at if decisions else None)
        steps = _steps_of(decisions, ended)
        checks = explain.checks if explain is not None and explain.revision == state.revision else ()
        return cls(
            namespace,
            name,
            state.revision,
            state.stable_revision,
            started,
            ended,
            str(state.phase),
            decisions[-1].reason if decisions else "",
            steps,
            decisions,
            checks,
            "the rollout state (state.json, explain.json)",
            gates=state.gates,
            artefact=state.artefact_of(state.revision),
            stable_artefact=state.artefact_of(state.stable_revision),
        )


def _steps_of(decisions: Sequence[HistoryEntry], end: datetime | None) -> tuple[StepRecord, ...]:
    steps: list[StepRecord] = []
    for entry in decisions:
        if entry.action in ("start", "advance") and entry.weight is not None:
            if steps and steps[-1].weight == entry.weight:
                continue
            if steps:
                steps[-1] = StepRecord(steps[-1].index, steps[-1].weight, steps[-1].at, entry.at)
            steps.append(StepRecord(len(steps), entry.weight, entry.at))
        elif entry.action in ("promote", "rollback") and steps and steps[-1].until is None:
            steps[-1] = StepRecord(steps[-1].index, steps[-1].weight, steps[-1].at, entry.at)
    if steps and steps[-1].until is None and end is not None:
        last = steps[-1]
        steps[-1] = StepRecord(last.index, last.weight, last.at, end)
    return tuple(steps)


def choose_rollout(
    namespace: str,
    name: str,
    state: RolloutState | None,
    explain: ExplainDocument | None,
    record: PastRollouts,
    selector: str | None,
) -> ReportedRollout:
    """The rollout ``selector`` names: ``None`` the one under way, else the latest finished one; a
    number (1 = the latest finished rollout), a revision or a rollout id. Raises :class:`LookupError`
    saying what there is."""
    current = ReportedRollout.of_state(namespace, name, state, explain) if state is not None else None
    active = current is not None and state is not None and state.rollout_active
    if selector is None:
        if active and current is not None:
            return current
        if record.rollouts:
            return ReportedRollout.of_record(namespace, name, record.rollouts[-1], 1)
        if current is not None:
            return current
        raise LookupError(f"{namespace}/{name} has had no rollout yet")
    if active and current is not None and selector == current.revision:
        return current
    entry = record.select(selector)
    if entry is not None:
        number = len(record.rollouts) - record.rollouts.index(entry)
        return ReportedRollout.of_record(namespace, name, entry, number)
    if current is not None and selector == current.revision:
        return current
    known = ", ".join(
        f"{len(record.rollouts) - index} {entry.revision} ({entry.outcome})"
        for index, entry in enumerate(record.rollouts)
    )
    under_way = f"; under way: {current.revision}" if active and current is not None else ""
    raise LookupError(
        f"{namespace}/{name} has no rollout {selector!r}; recorded: {known or 'none'}{under_way}"
    )


# -- units and limits ------------------------------------------------------------------------------


def display_unit(unit: Unit | str) -> tuple[str, float]:
    """The unit a chart shows a canonical value in, and the factor to get there."""
    try:
        known = Unit(unit)
    except ValueError:
        return "", 1.0
    return {
        Unit.SECONDS: ("ms", 1000.0),
        Unit.RATIO: ("%", 100.0),
        Unit.BYTES: ("GiB", 1 / 1024.0**3),
        Unit.MEBIBYTES: ("GiB", 1 / 1024.0),
        Unit.COUNT: ("count", 1.0),
        Unit.NONE: ("", 1.0),
    }[known]


_ABSOLUTE = re.compile(r"^(≤|≥) (\S+)$")
_RELATIVE = re.compile(r"^≤ \+(\S+) vs stable")


def judged_limits(check: ExplainCheck) -> list[tuple[str, float]]:
    """The limit lines of a chart: the bound the judge compared the canary with, when the evaluation
    recorded it (``judged bound ≤ 481ms``), else the limits read from the judge's text."""
    bounds = check.bounds()
    if bounds:
        return [(f"judged bound {label}", value) for label, value in bounds]
    return limit_values(check.limit, check.unit, check.stable)


def limit_values(limit: str, unit: Unit | str, stable: float | None) -> list[tuple[str, float]]:
    """The limits in the judge's text (``≤ 800ms and ≤ +20% vs stable``) as canonical numbers: absolute
    ones as written, a relative one from the stable value it was judged against; what cannot be drawn
    (a fraction of GPU memory) is left to the text."""
    try:
        known = Unit(unit)
    except ValueError:
        known = Unit.NONE
    lines: list[tuple[str, float]] = []
    for raw in limit.split(" and "):
        part = raw.strip()
        absolute = _ABSOLUTE.match(part)
        relative = _RELATIVE.match(part)
        try:
            if absolute is not None:
                text = absolute.group(2)
                if known is Unit.MEBIBYTES and text.endswith("MiB"):
                    text = text[:-3]
                lines.append((part, parse_in_unit(text, known)))
            elif relative is not None and stable is not None:
                increase = parse_in_unit(relative.group(1), Unit.RATIO)
                lines.append(
                    (f"{1 + increase:.3g} × stable {format_value(stable, known)}", stable * (1 + increase))
                )
        except ValueError:
            continue
    return lines


# -- the charts ------------------------------------------------------------------------------------


# A limit more than this many times the highest sample is named in the chart's title, not drawn.
OFF_SCALE_FACTOR = 4.0


@dataclass(frozen=True)
class CheckSeries:
    """One check over the rollout, as Prometheus answered a range query (canonical units).

    ``revisions`` maps a revision to its samples (epoch seconds, value); ``error`` is why there is
    none (the query failed, or it cannot be built); ``query`` is the PromQL asked.
    """

    name: str
    unit: Unit
    title: str
    revisions: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    error: str | None = None
    query: str = ""
    step: float = 1.0  # seconds between the samples asked for (a longer gap is missing data)


def traffic_points(rollout: ReportedRollout, start: float, end: float) -> list[tuple[float, float]]:
    """The canary's share of traffic (epoch seconds, %) from the steps the controller wrote: 0 before
    the first, 100 after a promotion, 0 after a rollback."""
    points: list[tuple[float, float]] = [(start, 0.0)]
    for step in rollout.steps:
        points.append((step.at.timestamp(), float(step.weight)))
    final = next((d for d in reversed(rollout.decisions) if d.action in ("promote", "rollback")), None)
    if final is not None:
        points.append((final.at.timestamp(), 100.0 if final.action == "promote" else 0.0))
    points.append((end, points[-1][1]))
    return sorted(points)


def _markers(rollout: ReportedRollout, origin: float) -> list[Marker]:
    names = {"start": "started", "advance": "advanced", "promote": "promoted", "rollback": "rolled-back"}
    markers = []
    for entry in rollout.decisions:
        action = names.get(entry.action) or ("paused" if entry.action == "pause" else None)
        if action is None:
            continue
        label = {"started": f"start {entry.weight}%", "advanced": f"{entry.weight}%"}.get(
            action, action.replace("-", " ")
        )
        markers.append(Marker(entry.at.timestamp() - origin, label, action, entry.reason))
    return markers


def _check_chart(series: CheckSeries, rollout: ReportedRollout, origin: float) -> Chart:
    unit, factor = display_unit(series.unit)
    check = next((c for c in rollout.checks if c.name == series.name), None)
    drawn = []
    for revision, role, colour in (
        (rollout.stable_revision, "stable", STABLE_COLOUR),
        (rollout.revision, "canary", CANARY_COLOUR),
    ):
        points = series.revisions.get(revision or "")
        if revision is None or not points:
            continue
        drawn.append(
            Series(
                f"{role} · {revision}",
                colour,
                [(t - origin, v * factor) for t, v in points],
                gap=series.step * 2.5,
            )
        )
    limits = [(label, value * factor) for label, value in judged_limits(check)] if check is not None else []
    empty = series.error or "Prometheus has no samples of this check for either revision over the rollout"
    # A limit far above every sample (2 s over a 140 ms curve) would flatten the curves to the floor:
    # it is named in the title instead of drawn.
    highest = max((v for item in drawn for _, v in item.points), default=0.0)
    off_scale = [label for label, value in limits if highest > 0 and value > OFF_SCALE_FACTOR * highest]
    title = series.title + (f" — {', '.join(off_scale)} far above the curves" if off_scale else "")
    kept = [(label, value) for label, value in limits if label not in off_scale]
    return Chart(title, unit, drawn, kept, empty_text=empty)


def _held(step: StepRecord) -> str:
    return _fmt_offset((step.until - step.at).total_seconds()) if step.until else ""


def _fmt_offset(seconds: float) -> str:
    return format_duration(seconds) if seconds >= 1 else f"{seconds:.1f}s"


def render_report(
    rollout: ReportedRollout,
    series: Sequence[CheckSeries] | None,
    *,
    start: float,
    end: float,
    generated_at: datetime,
    prometheus_url: str | None,
    note: str = "",
) -> str:
    """The whole page. ``series`` None: no Prometheus (a report without check charts)."""
    # Time 0 is the rollout's start; the charts begin a little before it (the stable revision alone).
    origin = rollout.started_at.timestamp() if rollout.started_at is not None else start
    charts = _charts(rollout, series, origin, start, end)
    facts = _facts(rollout, generated_at, prometheus_url)
    steps = _steps(rollout)
    checks = _table(
        ("check", "verdict", "canary", "stable estimate", "limit", "judged bound", "samples"),
        "".join(_check_row(check) for check in rollout.checks),
        "No evaluation of this rollout is recorded.",
    )
    decisions = _decisions(rollout, origin)
    gate_rows = "".join(_gate_row(gate) for gate in rollout.gates)
    gates = "<h2>Gates</h2>" + _table(_GATE_COLUMNS, gate_rows, "") if gate_rows else ""
    queries = "".join(
        f"<details><summary><code>{html.escape(s.name)}</code></summary><pre>{html.escape(s.query)}</pre>"
        "</details>"
        for s in series or ()
        if s.query
    )
    title = f"kserve-canary report · {rollout.key} · {rollout.revision}"
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><table>{facts}</table>"
        f"<p><b>{'Outcome' if rollout.finished else 'Now'}:</b> {html.escape(rollout.reason)}</p>"
        + (f"<p class='muted'>{html.escape(note)}</p>" if note else "")
        + f"<p class='muted'>{_EXPLANATION}</p>"
        + charts
        + f"<h2>Steps</h2>{steps}{gates}<h2>Last evaluation</h2>{checks}<h2>Decisions</h2>{decisions}"
        + (f"<h2>Queries</h2>{queries}" if queries else "")
        + "</body></html>\n"
    )


_EXPLANATION = (
    "Time is from the rollout's start. Dashed red lines are the bounds the judge compared the canary "
    "with in the last evaluation (a relative limit from the stable revision's bound, not its estimate; "
    "in records without it, the limits read from the judge's text); vertical lines are the "
    "controller's decisions (hover for the reason). Check curves are Prometheus range queries; "
    "where Prometheus has no sample, the curve has a gap — nothing is drawn as zero that was not "
    "measured. The controller judges each step over the whole step instead of a moving window."
)
_GATE_COLUMNS = ("gate", "at", "step", "first called", "result", "failed attempts", "latest attempt")


def _charts(
    rollout: ReportedRollout, series: Sequence[CheckSeries] | None, origin: float, start: float, end: float
) -> str:
    """The traffic chart, then one chart per check, all over the same time range."""
    x_range = (start - origin, max(end - origin, start - origin + 1.0))
    markers = _markers(rollout, origin)
    traffic = Chart(
        "Traffic to the canary (the steps the controller wrote)",
        "%",
        [
            Series(
                f"canary · {rollout.revision}",
                CANARY_COLOUR,
                [(t - origin, v) for t, v in traffic_points(rollout, start, end)],
                step=True,
                gap=math.inf,
            )
        ],
        y_max=100,
    )
    charts = [traffic, *(_check_chart(check_series, rollout, origin) for check_series in series or ())]
    return "".join(svg_chart(chart, markers, x_range) for chart in charts)


def _facts(rollout: ReportedRollout, generated_at: datetime, prometheus_url: str | None) -> str:
    """The rows of the table at the top: what, when, from where."""
    duration = (
        _fmt_offset(((rollout.ended_at or generated_at) - rollout.started_at).total_seconds())
        if rollout.started_at
        else "unknown"
    )
    facts = [
        ("InferenceService", rollout.key),
        ("canary revision", rollout.revision),
        ("canary serves", describe_artefact(rollout.artefact)),
        ("stable revision", rollout.stable_revision or "unknown"),
        (
            "stable serves",
            describe_artefact(rollout.stable_artefact) if rollout.stable_revision else "unknown",
        ),
        ("started", describe_time(rollout.started_at)),
        ("ended", describe_time(rollout.ended_at) if rollout.ended_at else "under way"),
        ("duration", duration),
        ("outcome" if rollout.finished else "phase", rollout.outcome),
        ("read from", rollout.source),
        ("Prometheus", prometheus_url or "not asked (--no-charts)"),
        ("generated", describe_time(generated_at)),
    ]
    return "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)


def _steps(rollout: ReportedRollout) -> str:
    rows = "".join(
        f"<tr><td>{step.index + 1}</td><td>{step.weight}%</td><td>{html.escape(describe_time(step.at))}</td>"
        f"<td>{html.escape(describe_time(step.until) if step.until else 'now')}</td>"
        f"<td>{html.escape(_held(step))}</td></tr>"
        for step in rollout.steps
    )
    return _table(("step", "weight", "written", "left", "held"), rows, "No step was written.")


def _decisions(rollout: ReportedRollout, origin: float) -> str:
    """The decisions table, with a line on those dropped from the record; or a line saying there is none."""
    rows = "".join(
        f"<tr><td>{html.escape(describe_time(entry.at))}</td>"
        f"<td>{'+' + _fmt_offset(entry.at.timestamp() - origin)}</td>"
        f"<td>{html.escape(entry.action)}</td>"
        f"<td>{'' if entry.weight is None else f'{entry.weight}%'}</td>"
        f"<td>{html.escape(str(entry.phase))}</td><td>{html.escape(entry.reason)}</td></tr>"
        for entry in rollout.decisions
    )
    if not rows:
        return "<p class='muted'>No decision is recorded.</p>"
    dropped = (
        f"<p class='muted'>{rollout.decisions_dropped} older decisions that wrote no weight were "
        "dropped to keep the record within its size.</p>"
        if rollout.decisions_dropped
        else ""
    )
    return _table(("time", "since start", "action", "weight", "phase", "reason"), rows, "") + dropped


def _gate_row(gate: GateProgress) -> str:
    if gate.passed_at is not None:
        result, css = f"passed {describe_time(gate.passed_at)}", "ok"
    elif gate.deadline_passed_at is not None:
        result, css = f"deadline passed {describe_time(gate.deadline_passed_at)}, holding", "bad"
    else:
        result, css = "waiting", "muted"
    step = "—" if gate.weight is None else f"{gate.weight}%"
    return (
        f"<tr><td>{html.escape(gate.name)}</td><td>{html.escape(gate.stage.value)}</td><td>{step}</td>"
        f"<td>{html.escape(describe_time(gate.since))}</td><td class='{css}'>{html.escape(result)}</td>"
        f"<td>{gate.attempts:,}</td><td>{html.escape(gate.describe_last())}</td></tr>"
    )


def _table(columns: Sequence[str], rows: str, empty: str) -> str:
    """A table with a header of ``columns`` over ``rows`` (HTML already escaped), or ``empty`` as a muted
    line when there are none."""
    if not rows:
        return f"<p class='muted'>{empty}</p>"
    header = "".join(f"<th>{html.escape(column)}</th>" for column in columns)
    return f"<table><tr>{header}</tr>{rows}</table>"


def _bound(check: ExplainCheck) -> str:
    return " and ".join(label for label, _ in check.bounds()) or "—"


def _check_row(check: ExplainCheck) -> str:
    def shown(value: float | None) -> str:
        return "—" if value is None or not math.isfinite(value) else format_value(value, check.unit)

    samples = "—" if check.samples is None else f"{check.samples:,.0f}"
    css = "ok" if check.verdict == "pass" else "bad" if check.verdict == "fail" else "muted"
    return (
        f"<tr><td>{html.escape(check.name)}</td><td class='{css}'>{html.escape(check.verdict)}</td>"
        f"<td>{html.escape(shown(check.value))}</td><td>{html.escape(shown(check.stable))}</td>"
        f"<td>{html.escape(check.limit)}</td><td>{html.escape(_bound(check))}</td><td>{samples}</td></tr>"
    )
