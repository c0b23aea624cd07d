"""A timeline of decisions: what happened when, at which weight, and why.

Tests use it to state a rollout's story in one assertion; the demo, simulations and backtests use it
to print and compare runs. It only records what it is handed (no clock, no I/O); rendering is
relative to the first entry so two runs at different wall-clock times compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from canary.policy.units import format_duration
from canary.rollout.decision import Action, Decision, EventReason, Severity
from canary.rollout.state import EvaluationVerdict, Phase

__all__ = ["Timeline", "TimelineEntry"]


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    at: datetime
    action: Action
    weight: int | None  # the value written (start/advance/rollback); None for promote and non-writes
    spec_weight: int | None  # canaryTrafficPercent in the spec when the decision was made
    phase: Phase
    event: EventReason
    severity: Severity
    verdict: EvaluationVerdict | None
    reasons: tuple[str, ...]
    decision_id: str

    @property
    def headline(self) -> str:
        return self.reasons[0] if self.reasons else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at.isoformat(),
            "action": self.action.value,
            "weight": self.weight,
            "specWeight": self.spec_weight,
            "phase": self.phase.value,
            "event": self.event.value,
            "severity": self.severity.value,
            "verdict": self.verdict.value if self.verdict else None,
            "reasons": list(self.reasons),
            "id": self.decision_id,
        }


class Timeline:
    """Records decisions in order. ``record_waits=False`` keeps only writes, pauses and phase changes."""

    def __init__(self, *, record_waits: bool = True) -> None:
        self._entries: list[TimelineEntry] = []
        self._record_waits = record_waits
        self._last_phase: Phase | None = None

    def record(self, decision: Decision, at: datetime) -> TimelineEntry | None:
        phase = decision.new_state.phase
        changed = phase is not self._last_phase
        self._last_phase = phase
        if decision.action is Action.WAIT and not changed and not self._record_waits:
            return None
        entry = TimelineEntry(
            at=at,
            action=decision.action,
            weight=decision.weight,
            spec_weight=decision.previous_weight,
            phase=phase,
            event=decision.event_reason,
            severity=decision.severity,
            verdict=decision.verdict,
            reasons=decision.reasons,
            decision_id=decision.id,
        )
        self._entries.append(entry)
        return entry

    @property
    def entries(self) -> tuple[TimelineEntry, ...]:
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def writes(self) -> list[TimelineEntry]:
        """The decisions that change the InferenceService."""
        return [entry for entry in self._entries if entry.action.writes]

    def written_weights(self) -> list[int | None]:
        """The percentages written, in order; None is the field removed (a promotion)."""
        return [entry.weight for entry in self.writes()]

    def actions(self, *, include_waits: bool = False) -> list[Action]:
        return [entry.action for entry in self._entries if include_waits or entry.action is not Action.WAIT]

    def phases(self) -> list[Phase]:
        """The phases the rollout went through, consecutive repeats collapsed."""
        phases: list[Phase] = []
        for entry in self._entries:
            if not phases or phases[-1] is not entry.phase:
                phases.append(entry.phase)
        return phases

    def render(self) -> str:
        """One line per entry, time relative to the first: ``+10m0s advance 30% Progressing ...``."""
        if not self._entries:
            return "(no decisions)"
        origin = self._entries[0].at
        lines = []
        for entry in self._entries:
            offset = (entry.at - origin).total_seconds()
            sign = "-" if offset < 0 else "+"
            weight = (
                "" if not entry.action.writes else ("remove" if entry.weight is None else f"{entry.weight}%")
            )
            lines.append(
                f"{sign}{format_duration(abs(offset)):>8} {entry.action.value:<8} {weight:>6} "
                f"{entry.phase.value:<11} {entry.event.value:<24} {entry.headline}"
            )
        return "\n".join(lines)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [entry.to_dict() for entry in self._entries]
