"""The demo's terminal: a live Rich view, or plain log lines for CI (``--no-ui``).

Both are fed the same :class:`~canary_sandbox.demo.monitor.ModelView` snapshots and webhook payloads; the
live view redraws them, the plain log prints what changed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from canary.notify.message import NotificationAction
from canary.notify.slack import ACTION_EMOJI
from canary.policy import Check, PromotionPolicy
from canary.report.charts import since
from canary.rollout.limits import limit_parts
from canary_sandbox.demo.monitor import CheckReading, ModelView
from canary_sandbox.demo.story import TRAFFIC_MOVES, ModelStory

__all__ = ["PlainLog", "limit_label", "live_view", "notification_line", "phase_weight", "weight_bar"]

PHASE_STYLE = {
    "Pending": "yellow",
    "Progressing": "cyan",
    "Promoting": "cyan",
    "Baking": "cyan",
    "Succeeded": "bold green",
    "RolledBack": "bold red",
    "Paused": "magenta",
}
VERDICT_MARK = {
    "pass": ("✓", "green"),
    "fail": ("✗", "bold red"),
    "no-data": ("·", "dim"),
    "error": ("!", "yellow"),
}
BAR_WIDTH = 12


def limit_label(check: Check) -> str:
    """A check's limits, one per line, for a column header: ``≤ 500ms`` / ``≤ +50% vs stable``.

    The same words as every decision's limit text; only the minStable condition is left out, on
    purpose: a column header stays narrow, and the condition is in the notifications' limits.
    """
    return "\n".join(limit_parts(check, with_floor=False))


def phase_weight(view: ModelView) -> float | None:
    """The share of traffic v2 has according to the controller's phase: 0% once rolled back, 100% once
    promoted, the step's weight while progressing or paused; None where the phase says nothing."""
    if view.phase == "RolledBack":
        return 0.0
    if view.phase in {"Promoting", "Baking", "Succeeded"}:
        return 100.0
    if view.phase in {"Progressing", "Paused"} and view.step_weight is not None:
        return float(view.step_weight)
    return None


def weight_bar(view: ModelView) -> Text:
    """The new version's share of traffic as the phase beside it says, so the two never contradict.

    The phase comes from the controller's state and KServe's traffic lags it by a reconcile: while
    they differ, the bar shows the phase's share and a line says what KServe reports and where it is
    going ("KServe status: 30%, rolling back"). While v2 is not Ready, the spec's percentage is said
    too: KServe routes nothing to a revision that is not Ready, whatever the spec says."""
    target = phase_weight(view)
    agrees = target is None or abs(view.canary_share - target) < 0.5
    shown = view.canary_share if agrees or target is None else target
    filled = round(shown / 100 * BAR_WIDTH)
    style = {"Succeeded": "green", "RolledBack": "red"}.get(view.phase, "cyan")
    bar = Text("█" * filled, style=style) + Text("░" * (BAR_WIDTH - filled), style="dim")
    bar.append(f" {shown:3.0f}%")
    if not agrees and target is not None:
        if view.phase == "RolledBack":
            heading = "rolling back"
        elif target > view.canary_share:
            heading = f"moving up to {target:.0f}%"
        else:
            heading = f"moving down to {target:.0f}%"
        bar.append(f"\nKServe status: {view.canary_share:.0f}%, {heading}", style="yellow")
    if view.canary_revision is not None and not view.canary_ready and view.spec_weight:
        bar.append(f"\nspec {view.spec_weight}%, v2 not Ready", style="yellow")
    return bar


def _timer(view: ModelView) -> Text:
    if view.timer is None:
        return Text("")
    elapsed, limit = view.timer
    style = "yellow" if view.timer_kind == "deadline" else ""
    return Text(f"{min(elapsed, 9999):4.0f}s / {limit:g}s\n{view.timer_kind}", style=style)


def _check_cell(reading: CheckReading | None) -> Text:
    if reading is None:
        return Text("")
    mark, style = VERDICT_MARK.get(reading.verdict, ("?", ""))
    text = Text(f"{mark} {reading.value or reading.verdict}", style=style)
    if reading.stable:
        text.append(f"\nstable {reading.stable}", style="dim")
    return text


def notification_line(payload: Mapping[str, Any], origin: float, *, with_checks: bool = False) -> str:
    """``+41.2s ⏩ sentiment advanced 10% → 30%: <summary>`` (failing checks appended for rollbacks)."""
    action = str(payload.get("action", ""))
    try:
        emoji = ACTION_EMOJI.get(NotificationAction(action), "•")
    except ValueError:
        emoji = "•"
    traffic = payload.get("traffic") or {}
    move = ""
    if action in TRAFFIC_MOVES:
        before = "—" if traffic.get("from") is None else f"{traffic['from']}%"
        after = "100% (promoted)" if traffic.get("to") is None else f"{traffic['to']}%"
        move = f" {before} → {after}"
    name = (payload.get("inferenceService") or {}).get("name", "?")
    at = since(str(payload.get("time")), origin)
    line = f"{at:+6.1f}s {emoji} {name} {action}{move}: {payload.get('summary', '')}"
    if with_checks:
        failing = [
            f"{c['name']} {c.get('value', '')} (limit {c.get('limit', '')}, stable {c.get('stable') or '—'})"
            for c in payload.get("checks", [])
            if c.get("verdict") == "fail"
        ]
        if failing:
            line += " [failed: " + "; ".join(failing) + "]"
    return line


def live_view(
    views: Sequence[ModelView],
    stories: Mapping[str, ModelStory],
    policies: Mapping[str, PromotionPolicy],
    notifications: Sequence[Mapping[str, Any]],
    *,
    origin: float,
    elapsed: float,
    title: str,
) -> RenderableType:
    """One frame of the live terminal view."""
    check_names: list[str] = []
    for policy in policies.values():
        for check in policy.spec.checks:
            if check.name not in check_names:
                check_names.append(check.name)
    # The demo's policies share their checks; a column header names each check's limits.
    first_policy = next(iter(policies.values()))
    limits = {check.name: limit_label(check) for check in first_policy.spec.checks}

    table = Table(box=None, pad_edge=False, expand=False, header_style="bold")
    table.add_column("MODEL", no_wrap=True)
    table.add_column("PHASE", no_wrap=True)
    table.add_column("TRAFFIC TO v2", no_wrap=True, min_width=BAR_WIDTH + 5)
    table.add_column("STEP", no_wrap=True)
    for name in check_names:
        table.add_column(Text(f"{name}\n", style="bold") + Text(limits.get(name, ""), style="dim"))
    for view in views:
        story = stories[view.name]
        model = Text(f"{story.letter} {view.name}", style="bold")
        if view.canary_revision:
            model.append(f"\nv2 {view.canary_revision.rsplit('-', 1)[-1]}", style="dim")
            model.append(" Ready" if view.canary_ready else " not Ready", style="dim")
        phase = Text(view.phase, style=PHASE_STYLE.get(view.phase, ""))
        if view.step:
            phase.append(f"\n{view.step}", style="dim")
        by_name = {reading.name: reading for reading in view.checks}
        table.add_row(
            model,
            phase,
            weight_bar(view),
            _timer(view),
            *(_check_cell(by_name.get(name)) for name in check_names),
        )

    decisions = Table(box=None, pad_edge=False, show_header=False)
    decisions.add_column(style="bold", no_wrap=True)
    decisions.add_column()
    for view in views:
        last = view.last_decision
        text = (
            Text("—", style="dim")
            if last is None
            else Text(f"{last.get('action')}: {last.get('reason', '')}")
        )
        if view.latest and not view.finished and (last is None or view.latest != last.get("reason")):
            # Between decisions, the latest evaluation says what the step is waiting for.
            text.append(f"\nnow: {view.latest}", style="dim")
        decisions.add_row(view.name, text)

    recent = [notification_line(payload, origin) for payload in notifications[-8:]]
    hooks = Text("\n".join(recent) if recent else "(none yet)", overflow="fold")
    minutes, seconds = divmod(int(elapsed), 60)
    return Group(
        Panel(table, title=f"{title} · {minutes:02d}:{seconds:02d}", title_align="left"),
        Panel(decisions, title="last decision · latest evaluation (state ConfigMap)", title_align="left"),
        Panel(hooks, title=f"notifications received ({len(notifications)})", title_align="left"),
    )


class PlainLog:
    """``--no-ui``: one line per change — a phase, v2 becoming Ready, a notification."""

    def __init__(self, console: Console, origin: float) -> None:
        self._console = console
        self._origin = origin
        self._seen_phase: dict[str, str] = {}
        self._seen_ready: dict[str, bool] = {}
        self._notifications_printed = 0

    def line(self, at: float, text: str) -> None:
        self._print(f"{at - self._origin:+6.1f}s {text}")

    def _print(self, text: str) -> None:
        # One event, one line, however long: CI logs are read with grep, not in a terminal.
        self._console.print(text, markup=False, highlight=False, soft_wrap=True)

    def update(self, views: Sequence[ModelView], notifications: Sequence[Mapping[str, Any]]) -> None:
        # Notifications first: a decision is announced before the demo's next poll sees its effect.
        for payload in notifications[self._notifications_printed :]:
            self._print(notification_line(payload, self._origin, with_checks=True))
        self._notifications_printed = len(notifications)
        for view in views:
            if self._seen_phase.get(view.name) != view.phase:
                self._seen_phase[view.name] = view.phase
                weight = "absent" if view.spec_weight is None else f"{view.spec_weight}%"
                self.line(view.at, f"   {view.name}: phase {view.phase} (canaryTrafficPercent {weight})")
            if view.canary_revision and self._seen_ready.get(view.name) != view.canary_ready:
                self._seen_ready[view.name] = view.canary_ready
                state = "Ready" if view.canary_ready else "created, not Ready"
                self.line(view.at, f"   {view.name}: revision {view.canary_revision} {state}")
