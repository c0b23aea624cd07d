"""A window counts evidence, not wall-clock time (issue 33, item 7).

Behind an ingestion lag (30 s scrape intervals, remote write, Thanos or Mimir) the counts a query
sees at ``at`` reach only ``at - lag``. The counts say how far they reach (``CountSeries.newest``,
the time of the canary's newest sample as Prometheus holds it), and a step's window runs over
evidence: it is held once the evidence reaches ``step start + window``, whatever the clock says.
"""

from __future__ import annotations

from datetime import timedelta

from canary.evidence import Evidence, EvidenceRequest
from canary.rollout import Action
from canary.rollout.horizon import evidence_until

from .counts import CountingWorld, Revision
from .helpers import Harness, make_policy, progressing

LAG = 30.0
WINDOW = timedelta(seconds=9)
LAG_TICKS = 35  # seconds into the first step: its evidence has begun to arrive
GOOD = Revision(rate=200.0, error_share=0.001)
BAD = Revision(rate=200.0, error_share=0.08)  # 8 % errors
ERRORS = {"name": "errors", "metric": "error-rate", "max": "1%"}


def _policy() -> object:
    return make_policy(
        steps=[10, 50, 100],
        window="9s",
        interval="3s",
        minRequests=20,
        checks=[ERRORS],
        onNoData={"after": "10m", "action": "hold"},
    )


def _drive(harness: Harness, world: CountingWorld) -> tuple[Action, list[tuple[timedelta, timedelta]]]:
    """Tick every second until a rollback, promotion or pause; per step left, how far its evidence
    reached past the step's start, and how long the clock had held it."""
    seen: list[Evidence] = []

    def answer(request: EvidenceRequest) -> Evidence:
        evidence = world(request)
        seen.append(evidence)
        return evidence

    left: list[tuple[timedelta, timedelta]] = []
    for _ in range(900):
        step = harness.state.step
        started = step.started_at if step is not None else None
        before = len(seen)
        decision = harness.tick(1, evidence=answer)
        if decision.action in (Action.ADVANCE, Action.PROMOTE) and started is not None and len(seen) > before:
            evidence = seen[-1]
            reach = evidence_until(evidence.counts.get("canary"), evidence.request.at)
            left.append((reach - started, harness.now - started))
        if decision.action in (Action.ROLLBACK, Action.PROMOTE, Action.PAUSE):
            return decision.action, left
    raise AssertionError(harness.timeline.render())


def test_a_step_never_advances_on_evidence_that_does_not_cover_its_window() -> None:
    harness = progressing(_policy())  # type: ignore[arg-type]
    world = CountingWorld(harness.sim, GOOD, GOOD, seed=3, scrape=1.0, lag=LAG)
    action, left = _drive(harness, world)
    assert action is Action.PROMOTE, harness.timeline.render()
    assert len(left) == 2
    for covered, held in left:
        assert covered >= WINDOW, harness.timeline.render()
        assert held >= WINDOW + timedelta(seconds=LAG), (covered, held)


def test_a_canary_failing_from_the_50_percent_step_behind_a_30s_lag_is_rolled_back() -> None:
    # The finding: 8 % errors from 50 % on, evidence 30 s late, 9 s windows.
    harness = progressing(_policy())  # type: ignore[arg-type]
    world = CountingWorld(
        harness.sim, GOOD, GOOD, seed=5, scrape=1.0, lag=LAG, canary_at=lambda w: BAD if w >= 50 else GOOD
    )
    action, _ = _drive(harness, world)
    assert action is Action.ROLLBACK, harness.timeline.render()
    assert harness.writes()[-1] == 0


def test_the_hold_says_how_old_the_evidence_is() -> None:
    harness = progressing(_policy())  # type: ignore[arg-type]
    world = CountingWorld(harness.sim, GOOD, GOOD, seed=3, scrape=1.0, lag=LAG)
    texts = []
    for _ in range(45):
        decision = harness.tick(1, evidence=world)
        texts.append(" ".join(decision.reasons))
    assert any("evidence 30s behind" in text for text in texts), texts
    assert any("evidence covering" in text for text in texts), texts


def test_evidence_that_stops_arriving_holds_the_step_with_a_warning_never_on_no_data() -> None:
    # Ingestion stalls (the counts never reach further) with onNoData rollback after 1 minute: the
    # canary is not silent, Prometheus' pipeline is. The step holds and says so; nothing is rolled back.
    policy = make_policy(
        steps=[10, 50, 100],
        window="9s",
        interval="3s",
        minRequests=20,
        checks=[ERRORS],
        onNoData={"after": "1m", "action": "rollback"},
    )
    harness = progressing(policy)
    world = CountingWorld(harness.sim, GOOD, GOOD, seed=3, scrape=1.0, lag=LAG)
    for _ in range(LAG_TICKS):
        harness.tick(1, evidence=world)
    world.stalled_at = harness.now - timedelta(seconds=LAG)  # from now on nothing new reaches Prometheus
    decisions = [harness.tick(3, evidence=world) for _ in range(60)]
    assert all(d.action is Action.WAIT for d in decisions), harness.timeline.render()
    assert any("may be stalled" in " ".join(d.reasons) for d in decisions)
