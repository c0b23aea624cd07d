"""A backtest for people (a Rich table, an HTML page) and for machines (JSON).

Every number is rounded and carries its unit (``format_value``); every statement carries its numbers;
and every output says what a replay cannot do (:data:`canary.backtest.runner.HONESTY`).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from canary.backtest.history import History
from canary.backtest.replay import CheckPoint, Replay, Tick
from canary.backtest.runner import HONESTY, Backtest
from canary.policy.units import format_value
from canary.report.charts import (
    CANARY_COLOUR,
    LIMIT_COLOUR,
    STABLE_COLOUR,
    STYLE,
    Chart,
    Marker,
    Series,
    svg_chart,
)

__all__ = ["render_html", "render_table", "to_json"]

_MARKS = {"pass": "✓", "fail": "✗"}
_MARKER_ACTIONS = {
    "start": "started",
    "advance": "advanced",
    "promote": "promoted",
    "rollback": "rolled-back",
    "pause": "paused",
}
POLICY_COLOUR = "#7f8c8d"


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _offset(tick: Tick, replay: Replay) -> str:
    seconds = round((tick.at - replay.period.start).total_seconds())
    sign = "-" if seconds < 0 else "+"
    minutes, secs = divmod(abs(seconds), 60)
    return f"{sign}{minutes}m{secs:02d}s"


def _actual(tick: Tick) -> str:
    if tick.missing:
        return "missing"
    requests = "no requests" if tick.actual_share is None else f"{tick.actual_share:.1f}% of requests"
    if tick.controller_weight is not None and tick.controller_weight >= 0:
        return f"{tick.controller_weight:.0f}% ({requests})"
    return requests


def _policy(tick: Tick) -> str:
    """The percentage the policy's own decisions set, and where it stands."""
    if tick.weight is None:
        promoted = tick.phase in ("Promoting", "Baking", "Succeeded")
        return f"100% {tick.phase}" if promoted else f"— {tick.phase}"
    if tick.step and tick.phase == "Progressing":
        return f"{tick.weight}% step {tick.step}"
    return f"{tick.weight}% {tick.phase}"


def _value(check: CheckPoint) -> str:
    return "no value" if check.value is None else format_value(check.value, check.unit)


def _bound(check: CheckPoint) -> str:
    if check.max_allowed is not None:
        return f"≤ {format_value(check.max_allowed, check.unit)}"
    if check.min_allowed is not None:
        return f"≥ {format_value(check.min_allowed, check.unit)}"
    return check.limit


def _check_cell(check: CheckPoint) -> str:
    mark = _MARKS.get(check.verdict, "·")
    text = f"{mark} {_value(check)} {_bound(check)}"
    if check.stable_value is not None:
        text += f" (stable {format_value(check.stable_value, check.unit)})"
    if check.verdict in ("no-data", "error"):
        text += f" {check.verdict}"
    return text


def _decision(tick: Tick) -> str:
    return tick.action if tick.action != "wait" else (tick.verdict or "wait")


def _rows(replay: Replay) -> list[Tick]:
    """Every evaluation and every write (the ticks a reader needs), in order."""
    return [tick for tick in replay.ticks if tick.checks or tick.action != "wait" or tick is replay.ticks[0]]


# -- JSON ----------------------------------------------------------------------------------------


def to_json(backtest: Backtest) -> dict[str, Any]:
    history = backtest.history
    return {
        "kind": "Backtest",
        "policy": backtest.policy.metadata.name,
        "inferenceService": f"{history.namespace}/{history.inference_service}",
        "from": _time(history.start),
        "to": _time(history.end),
        "whatIf": list(backtest.what_if),
        "note": HONESTY,
        "notes": list(backtest.notes),
        "history": {
            "requestsProfile": history.profile,
            "profileDetail": history.detail,
            "stepSeconds": history.step,
            "revisions": list(history.revisions),
            "controllerWeight": history.has_controller_weight,
            "recordedFrom": _time(history.recorded[0].at) if history.recorded else None,
            "recordedUntil": _time(history.recorded[-1].at) if history.recorded else None,
            "missingPoints": history.missing_points,
            "query": history.query,
        },
        "rollouts": [_replay_json(replay) for replay in backtest.replays],
    }


def _replay_json(replay: Replay) -> dict[str, Any]:
    period = replay.period
    return {
        "id": period.id,
        "canary": period.canary,
        "stable": period.stable,
        "servedFrom": _time(period.start),
        "servedUntil": _time(period.end),
        "actualOutcome": period.outcome,
        "actual": replay.actual,
        "comparison": replay.comparison,
        "recorded": replay.recorded,
        "missingPoints": period.missing_steps,
        "policyOutcome": replay.outcome,
        "policyDecidedAt": _time(replay.decided_at),
        "summary": replay.summary,
        "intervalSeconds": replay.interval,
        "policyWrites": [{"at": _time(at), "weight": weight} for at, weight in replay.weights],
        "evaluations": [
            {
                "at": _time(tick.at),
                "action": tick.action,
                "phase": tick.phase,
                "step": tick.step or None,
                "policyWeight": tick.weight,
                "actualSharePercent": None if tick.actual_share is None else round(tick.actual_share, 2),
                "controllerWeight": tick.controller_weight,
                "missing": tick.missing,
                "verdict": tick.verdict,
                "canaryRequests": tick.requests,
                "event": tick.event,
                "reason": tick.reason,
                "checks": [
                    {
                        "name": check.name,
                        "verdict": check.verdict,
                        "value": check.value,
                        "unit": check.unit,
                        "shown": _value(check),
                        "limit": check.limit,
                        "maxAllowed": check.max_allowed,
                        "minAllowed": check.min_allowed,
                        "stable": check.stable_value,
                        "samples": check.samples,
                        "counted": check.counted,
                        "detail": check.detail,
                    }
                    for check in tick.checks
                ],
            }
            for tick in _rows(replay)
        ],
    }


# -- Table ---------------------------------------------------------------------------------------


def render_table(backtest: Backtest, console: Any) -> None:
    """Print the backtest with Rich (``console`` is a ``rich.console.Console``)."""
    from rich.table import Table  # noqa: PLC0415 - Rich only when a table is printed
    from rich.text import Text  # noqa: PLC0415

    history = backtest.history
    console.print(
        Text(
            f"Backtest of policy {backtest.policy.metadata.name} on {history.namespace}/"
            f"{history.inference_service}, {_time(history.start)} to {_time(history.end)}",
            style="bold",
        )
    )
    if backtest.what_if:
        console.print(Text(f"what if: {', '.join(backtest.what_if)}"))
    weight = "recorded" if history.has_controller_weight else "not recorded"
    recorded = history.recorded
    span = f"{_time(recorded[0].at)} to {_time(recorded[-1].at)}" if recorded else "nothing recorded"
    console.print(
        Text(
            f"requests from {history.profile}, a point every {history.step:g}s: {span}, "
            f"{history.missing_points} missing in between; controller weight {weight}; "
            f"{len(backtest.replays)} rollout(s) found",
            style="dim",
        )
    )
    console.print(Text(HONESTY, style="italic"))
    for note in backtest.notes:
        console.print(Text(f"note: {note}", style="yellow"))
    if not backtest.replays:
        console.print(
            "No period in which two revisions served traffic was found in this range "
            f"(revisions seen: {', '.join(history.revisions) or 'none'})."
        )
    for replay in backtest.replays:
        console.print()
        console.print(Text(f"Rollout {replay.period.id}", style="bold"))
        console.print(Text(f"policy: {replay.summary}"))
        console.print(Text(f"actual: {replay.actual}"))
        console.print(Text(f"difference: {replay.comparison}"))
        if replay.recorded:
            console.print(Text(f"{replay.recorded}", style="dim"))
        names = [check.name for tick in replay.ticks for check in tick.checks]
        checks = list(dict.fromkeys(names))
        table = Table(show_edge=False, pad_edge=False, header_style="bold")
        table.add_column("time", no_wrap=True)
        table.add_column("policy", no_wrap=True)
        table.add_column("actual", no_wrap=True)
        table.add_column("decision", no_wrap=True)
        for name in checks:
            table.add_column(name)
        for tick in _rows(replay):
            cells = {check.name: _check_cell(check) for check in tick.checks}
            table.add_row(
                f"{_offset(tick, replay)} {tick.at.strftime('%H:%M:%S')}",
                _policy(tick),
                _actual(tick),
                _decision(tick),
                *(cells.get(name, "") for name in checks),
            )
        console.print(table)
        console.print(
            Text(
                "✓ met, ✗ broken (at the policy's confidence), · neither shown yet; ≤ the bound in force "
                "(the tightest of max and maxIncrease × stable); policy: the step its own decisions set",
                style="dim",
            )
        )


# -- HTML ----------------------------------------------------------------------------------------


def render_html(backtest: Backtest) -> str:
    history = backtest.history
    title = f"Backtest: {backtest.policy.metadata.name} on {history.namespace}/{history.inference_service}"
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(_time(history.start) or '')} to {html.escape(_time(history.end) or '')}; "
        f"requests from {html.escape(history.profile)}, every {history.step:g}s; "
        f"{len(backtest.replays)} rollout(s) found.</p>",
        f"<p><em>{html.escape(HONESTY)}</em></p>",
    ]
    if backtest.what_if:
        parts.append(f"<p>What if: <code>{html.escape(', '.join(backtest.what_if))}</code></p>")
    parts.extend(f"<p class='muted'>note: {html.escape(note)}</p>" for note in backtest.notes)
    for replay in backtest.replays:
        parts.append(_replay_html(replay, history))
    parts.append("</body></html>")
    return "".join(parts)


def _replay_html(replay: Replay, history: History) -> str:
    origin = replay.period.start.timestamp()
    ticks = replay.ticks
    markers = [
        Marker(_since(tick.at, origin), _marker_label(tick), _MARKER_ACTIONS[tick.action], tick.reason)
        for tick in ticks
        if tick.action in _MARKER_ACTIONS
    ]
    # What happened is drawn over the whole period, also after the policy would have decided.
    until = max(ticks[-1].at, replay.period.end) + timedelta(seconds=replay.interval)
    first = _since(ticks[0].at, origin)
    span = (first, max(until.timestamp() - origin, first + 1))
    charts = [_traffic_chart(replay, history, origin, until, span), *_check_charts(replay, history, origin)]
    return (
        _replay_summary(replay)
        + "".join(svg_chart(chart, markers, span) for chart in charts)
        + _replay_table(replay)
    )


def _since(moment: datetime, origin: float) -> float:
    return moment.timestamp() - origin


def _traffic_chart(
    replay: Replay, history: History, origin: float, until: datetime, span: tuple[float, float]
) -> Chart:
    """The policy's steps, the share of requests the canary actually got, and the recorded weight."""
    ticks = replay.ticks
    points = history.between(ticks[0].at, until)
    policy_line = [(_since(t.at, origin), float(t.weight or 0)) for t in ticks]
    policy_line.append((span[1], policy_line[-1][1]))
    shares = [
        (_since(point.at, origin), share)
        for point in points
        if (share := point.share(replay.period.canary, replay.period.stable)) is not None
    ]
    weights = [
        (_since(point.at, origin), point.controller_weight)
        for point in points
        if point.controller_weight is not None and point.controller_weight >= 0
    ]
    return Chart(
        "traffic to the canary",
        "%",
        _drawn(
            [
                _series("policy's step", POLICY_COLOUR, policy_line, step=True, gap=span[1] - span[0] + 1),
                _series("actual share of requests", CANARY_COLOUR, shares, gap=history.step * 1.5),
                _series(
                    "controller weight (recorded)", STABLE_COLOUR, weights, step=True, gap=history.step * 1.5
                ),
            ]
        ),
        y_max=100,
    )


def _check_charts(replay: Replay, history: History, origin: float) -> list[Chart]:
    """One chart per check, in the order the checks first appear."""
    gap = max(replay.interval, history.step) * 1.5
    ticks = replay.ticks
    names = list(dict.fromkeys(check.name for tick in ticks for check in tick.checks))
    return [
        _check_chart(
            name,
            [(tick, check) for tick in ticks for check in tick.checks if check.name == name],
            origin,
            gap,
        )
        for name in names
    ]


def _check_chart(name: str, found: list[tuple[Tick, CheckPoint]], origin: float, gap: float) -> Chart:
    """The canary, the stable revision and the limit over the replay, in the unit a person reads."""
    unit = found[0][1].unit
    scale = 100.0 if unit == "ratio" else 1000.0 if unit == "seconds" else 1.0
    shown_unit = {"ratio": "%", "seconds": "ms"}.get(unit, unit)

    def line(value: Callable[[CheckPoint], float | None]) -> list[tuple[float, float]]:
        return [(_since(t.at, origin), v * scale) for t, c in found if (v := value(c)) is not None]

    series = [
        _series("canary", CANARY_COLOUR, line(lambda c: c.value), gap=gap),
        _series("stable", STABLE_COLOUR, line(lambda c: c.stable_value), gap=gap),
        _series("limit", LIMIT_COLOUR, line(lambda c: c.max_allowed), dashed=True, gap=gap),
    ]
    return Chart(f"{name}: {found[0][1].limit}", shown_unit, _drawn(series))


def _replay_summary(replay: Replay) -> str:
    return (
        f"<h2>Rollout {html.escape(replay.period.id)}</h2>"
        f"<p><b>Policy:</b> {html.escape(replay.summary)}</p>"
        f"<p><b>Actual:</b> {html.escape(replay.actual)}</p>"
        f"<p><b>Difference:</b> {html.escape(replay.comparison)}</p>"
        + (f"<p class='muted'>{html.escape(replay.recorded)}</p>" if replay.recorded else "")
    )


def _replay_table(replay: Replay) -> str:
    rows = "".join(
        f"<tr><td>{html.escape(_offset(tick, replay))}</td><td>{html.escape(_policy(tick))}</td>"
        f"<td>{html.escape(_actual(tick))}</td><td>{html.escape(_decision(tick))}</td>"
        f"<td>{'<br>'.join(html.escape(f'{c.name}: ' + _check_cell(c)) for c in tick.checks)}"
        f"<br><span class='muted'>{html.escape(tick.reason)}</span></td></tr>"
        for tick in _rows(replay)
    )
    return (
        "<table><tr><th>time</th><th>policy</th><th>actual</th><th>decision</th><th>checks</th></tr>"
        + rows
        + "</table>"
    )


def _drawn(series: list[Series]) -> list[Series]:
    """The series that have points (a legend entry for a curve that is not there would mislead)."""
    return [one for one in series if one.points]


def _series(
    label: str, colour: str, points: list[tuple[float, float]], *, gap: float, **options: Any
) -> Series:
    """A series whose line breaks only where samples are missing for longer than ``gap`` seconds."""
    if "gap" in Series.__dataclass_fields__:
        options["gap"] = gap
    return Series(label, colour, points, **options)


def _marker_label(tick: Tick) -> str:
    return {
        "start": f"start {tick.weight}%",
        "advance": f"{tick.weight}%",
        "promote": "promoted",
        "rollback": "rolled back",
        "pause": "paused",
    }[tick.action]
