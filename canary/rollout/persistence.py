"""Which changes of a rollout's state must be stored, and which explain documents are worth a write.

Pure, for the shell (``canary.controller``): every evaluation gives a new :class:`RolloutState`, but
most evaluations only refresh numbers — the evaluation time, the request count, a verdict that
repeats. Those are recomputable after a restart (the evidence is Prometheus', and the pipeline
backfills its counts), so writing them is an apiserver write per rollout per interval for nothing.

:func:`must_store` says whether the change from the state *as last stored* to the new one matters
for safety or for the next decision after a restart, and why. Stored, always:

* the phase, the InferenceService uid, the revisions (canary, stable) and their artefacts, the spec
  fingerprint;
* the step (index, weight, started_at, passed_at), the rollout's start, the un-Ready, spec-change
  and bake clocks;
* the write-ahead intent and the weight known to be in the spec, the unguarded flag;
* pauses, approvals, gates (each attempt), pending commands, the rolled-back list, the decision history;
* the failure streak (any change of it: a failure counts towards ``failureLimit``, a pass resets it);
* a change of the latest verdict or of whether Prometheus answered (what ``kserve-canary status``
  shows people) — not a verdict that repeats.

Not stored on their own: the evaluation time, its request count and failed checks, and the
``onNoData`` clock (the last conclusive evaluation, the last query error).
A state read back after a restart is :func:`restarted`: its ``onNoData`` clock starts again at the
restart, as it does after a query error or a resume — the evaluations in between were not stored,
so a canary is never paused or rolled back for silence it was not seen to keep. The invariant,
checked by a property test in ``tests/controller/test_persistence.py``: replaying
:func:`canary.rollout.core.decide` from the state as last stored (a restart, at any tick) reaches
the same phases, steps, streaks and writes as replaying it from every state — except that
``onNoData`` may act later after a restart, never earlier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from canary.rollout.bookkeeping import no_data_clock_from
from canary.rollout.records import ExplainDocument
from canary.rollout.state import Phase, RolloutState

__all__ = [
    "DEFAULT_EXPLAIN_EVERY_INTERVALS",
    "StoreReason",
    "explain_change",
    "explain_due",
    "must_store",
    "no_data_clock",
    "restarted",
    "store_reason",
    "text_shape",
]

# explain.json, when it changes in a way that matters, at most once per this many policy intervals.
DEFAULT_EXPLAIN_EVERY_INTERVALS = 5.0

# The fields of a state stored whenever they change, by the reason reported.
_FIELDS: tuple[tuple[str, str], ...] = (
    ("phase", "phase"),
    ("inference_service_uid", "uid"),
    ("revision", "revision"),
    ("fingerprint", "revision"),
    ("artefact", "revision"),
    ("stable_revision", "stable-revision"),
    ("stable_artefact", "stable-revision"),
    ("started_at", "rollout-start"),
    ("evidence_since", "rollout-start"),
    ("step", "step"),
    ("counted_requests", "step"),
    ("unready_since", "unready-clock"),
    ("spec_change_seen_at", "spec-change"),
    ("bake_started_at", "bake"),
    ("pause", "pause"),
    ("command", "command"),
    ("intent", "intent"),
    ("spec_weight", "weights"),
    ("unguarded", "unguarded"),
    ("approvals", "approvals"),
    ("gates", "gates"),
    ("rolled_back", "rolled-back"),
    ("history", "history"),
)


@dataclass(frozen=True, slots=True)
class StoreReason:
    """The answer of :func:`store_reason`: whether to store, and the first reason found (for logs
    and the ``kserve_canary_state_writes`` metric); ``reason`` is ``""`` when nothing matters."""

    store: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.store


def no_data_clock(state: RolloutState) -> datetime | None:
    """Where ``onNoData`` counts from while a step is held (None when no step has started)."""
    step = state.step
    if step is None or step.started_at is None or state.underlying_phase is not Phase.PROGRESSING:
        return None
    return no_data_clock_from(step.started_at, state.evaluation)


def store_reason(previous: RolloutState, new: RolloutState) -> StoreReason:
    """Whether going from ``previous`` (as last stored) to ``new`` must be stored, and why."""
    for name, reason in _FIELDS:
        if getattr(previous, name) != getattr(new, name):
            return StoreReason(True, reason)
    if previous.evaluation.failure_streak != new.evaluation.failure_streak:
        return StoreReason(True, "failure-streak")
    # What `kserve-canary status` shows people: the latest verdict and whether Prometheus answered —
    # stored when they change, not when they repeat.
    if previous.evaluation.verdict != new.evaluation.verdict:
        return StoreReason(True, "verdict")
    if previous.evaluation.query_error != new.evaluation.query_error:
        return StoreReason(True, "query-error")
    return StoreReason(False)


def restarted(state: RolloutState, at: datetime) -> RolloutState:
    """A state as stored, read by a controller that did not see the evaluations since it was stored
    (a restart, a takeover): ``onNoData`` counts again from ``at``, nothing else changes."""
    evaluation = state.evaluation
    since = evaluation.no_data_clock_from
    if since is not None and since >= at:
        return state
    return replace(state, evaluation=replace(evaluation, no_data_clock_from=at))


def must_store(previous: RolloutState, new: RolloutState) -> bool:
    """Whether the change from ``previous`` (the state as last stored) to ``new`` must be written."""
    return store_reason(previous, new).store


def explain_change(previous: ExplainDocument | None, new: ExplainDocument | None) -> str:
    """How ``new`` differs from ``previous`` in a way a reader of ``explain`` cares about — ``""``
    when it only refreshes numbers: another revision or action, a check's verdict, a new reason
    (reasons are compared without their digits, so "held 8s of 10s" repeating is not new)."""
    if new is None:
        return ""
    if previous is None:
        return "first"
    if (previous.revision, previous.stable_revision) != (new.revision, new.stable_revision):
        return "revision"
    if previous.action != new.action or previous.verdict != new.verdict:
        return "verdict"
    if {c.name: c.verdict for c in previous.checks} != {c.name: c.verdict for c in new.checks}:
        return "check-verdict"
    if {text_shape(reason) for reason in new.reasons} - {text_shape(reason) for reason in previous.reasons}:
        return "reason"
    return ""


def explain_due(
    previous: ExplainDocument | None,
    new: ExplainDocument | None,
    *,
    last_written: datetime | None,
    now: datetime,
    interval: timedelta,
    every_intervals: float = DEFAULT_EXPLAIN_EVERY_INTERVALS,
) -> str:
    """The reason to write ``new`` now on its own (the state being unchanged), or ``""``: it changed
    in a way that matters (:func:`explain_change`) and the last explain write of this rollout is at
    least ``every_intervals`` × ``interval`` old (or unknown)."""
    change = explain_change(previous, new)
    if not change:
        return ""
    if last_written is not None and now - last_written < interval * every_intervals:
        return ""
    return change


# A number, or a duration written by format_duration ("1m30s", "761ms") or as an estimate ("~84 min",
# "~2.5 h"): one "#" each, so that "held 1m30s of 10m" and "held 2m of 10m" read alike (masking
# digits alone left "#m#s" and "#m": a new "reason" every other interval, and an explain write every
# five), and so do "~84 min" and "~2.5 h" (a not-yet check's time to go crossed 90 minutes: a new
# log line at info for every rollout waiting on a slow canary, every interval).
# The leading digit is factored out of the three alternatives (an estimate, durations, a number):
# the same matches, found about 2.7 times faster (every evaluation masks its reasons).
_NUMBER = re.compile(
    r"\d(?:[\d,.]*\s(?:min|h)\b"
    r"|[\d,.]*(?:ms|[smhd])(?![A-Za-z])(?:\d[\d,.]*(?:ms|[smhd])(?![A-Za-z]))*"
    r"|[\d,.]*)"
)


def text_shape(text: str) -> str:
    """``text`` with its numbers and durations masked: what stays when only values change."""
    return _NUMBER.sub("#", text)
