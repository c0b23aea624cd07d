"""Which state changes are written (canary.rollout.persistence): every one a restart needs, no other.

The property at the end is the reason the rule exists: replaying decide() from the state as last
stored — a restart at any tick — gives the same phases, steps and writes as a controller that
stores every state.
"""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canary.kserve.status_model import KServeSim
from canary.policy.units import format_duration
from canary.rollout import Decision, RolloutState, decide, evidence_request
from canary.rollout.persistence import (
    explain_change,
    explain_due,
    must_store,
    no_data_clock,
    restarted,
    store_reason,
    text_shape,
)
from canary.rollout.records import ExplainCheck, ExplainDocument
from canary.rollout.sampled import minutes_text
from canary.rollout.state import (
    CommandKind,
    EvaluationRecord,
    EvaluationVerdict,
    HistoryEntry,
    Pause,
    PauseKind,
    PendingCommand,
    Phase,
    RolledBackRevision,
    StepProgress,
    WeightRecord,
)
from tests.rollout.helpers import HEALTHY_EVIDENCE, T0, EvidenceMaker, make_policy, no_data, query_error

MINUTE = timedelta(minutes=1)
STEP = StepProgress(0, 10, started_at=T0)
HOLDING = RolloutState(
    phase=Phase.PROGRESSING,
    inference_service_uid="uid-1",
    revision="llama-predictor-00002",
    fingerprint="f1",
    stable_revision="llama-predictor-00001",
    started_at=T0,
    step=STEP,
    evaluation=EvaluationRecord(at=T0 + MINUTE, verdict=EvaluationVerdict.PASS, requests=50.0),
)

# One change of each field that must be stored, with the reason reported.
STORED_CHANGES = {
    "phase": (replace(HOLDING, phase=Phase.ROLLED_BACK), "phase"),
    "uid": (replace(HOLDING, inference_service_uid="uid-2"), "uid"),
    "revision": (replace(HOLDING, revision="llama-predictor-00003"), "revision"),
    "fingerprint": (replace(HOLDING, fingerprint="f2"), "revision"),
    "stable": (replace(HOLDING, stable_revision="llama-predictor-00000"), "stable-revision"),
    "rollout start": (replace(HOLDING, started_at=T0 + MINUTE), "rollout-start"),
    "step index": (replace(HOLDING, step=StepProgress(1, 30, started_at=T0)), "step"),
    "step weight": (replace(HOLDING, step=StepProgress(0, 20, started_at=T0)), "step"),
    "step started": (replace(HOLDING, step=replace(STEP, started_at=T0 + MINUTE)), "step"),
    "step passed": (replace(HOLDING, step=replace(STEP, passed_at=T0 + 3 * MINUTE)), "step"),
    "unready": (replace(HOLDING, unready_since=T0), "unready-clock"),
    "spec change": (replace(HOLDING, spec_change_seen_at=T0), "spec-change"),
    "bake": (replace(HOLDING, bake_started_at=T0), "bake"),
    "pause": (
        replace(HOLDING, pause=Pause(PauseKind.MANUAL, "paused", T0, Phase.PROGRESSING)),
        "pause",
    ),
    "command": (replace(HOLDING, command=PendingCommand(CommandKind.ABORT, T0, "ops")), "command"),
    "intent": (replace(HOLDING, intent=WeightRecord(10, "llama-predictor-00002", T0)), "intent"),
    "spec weight": (replace(HOLDING, spec_weight=WeightRecord(10, "llama-predictor-00002", T0)), "weights"),
    "unguarded": (replace(HOLDING, unguarded=True), "unguarded"),
    "approvals": (replace(HOLDING, approvals=(30,)), "approvals"),
    "rolled back": (
        replace(HOLDING, rolled_back=(RolledBackRevision("llama-predictor-00002", T0),)),
        "rolled-back",
    ),
    "history": (
        replace(HOLDING, history=(HistoryEntry(T0, "advance", 30, Phase.PROGRESSING, "e", "r", "id"),)),
        "history",
    ),
    "verdict": (
        replace(HOLDING, evaluation=replace(HOLDING.evaluation, verdict=EvaluationVerdict.INCONCLUSIVE)),
        "verdict",
    ),
    "query error": (
        replace(HOLDING, evaluation=replace(HOLDING.evaluation, query_error=True)),
        "query-error",
    ),
    "failure streak up": (
        replace(HOLDING, evaluation=replace(HOLDING.evaluation, failure_streak=1)),
        "failure-streak",
    ),
}


@pytest.mark.parametrize("name", sorted(STORED_CHANGES))
def test_every_change_a_restart_needs_is_stored_with_its_reason(name: str) -> None:
    changed, reason = STORED_CHANGES[name]
    assert must_store(HOLDING, changed)
    assert store_reason(HOLDING, changed).reason == reason
    assert must_store(changed, HOLDING)  # and back


def test_a_failure_streak_reset_is_stored() -> None:
    failing = replace(HOLDING, evaluation=replace(HOLDING.evaluation, failure_streak=1))
    assert store_reason(failing, HOLDING).reason == "failure-streak"


def test_the_same_state_is_not_stored() -> None:
    assert not must_store(HOLDING, HOLDING)
    assert store_reason(HOLDING, HOLDING).reason == ""
    assert not store_reason(HOLDING, HOLDING)


@given(
    at=st.integers(min_value=0, max_value=10_000),
    requests=st.none() | st.floats(min_value=0, max_value=1e9),
    failed=st.lists(st.sampled_from(["p99", "errors", "oom"]), max_size=3).map(tuple),
)
def test_an_evaluation_that_only_refreshes_numbers_is_not_stored(
    at: int, requests: float | None, failed: tuple[str, ...]
) -> None:
    """The same verdict again, with another time, request count or failed checks."""
    refreshed = replace(
        HOLDING,
        evaluation=replace(
            HOLDING.evaluation, at=T0 + timedelta(seconds=at), requests=requests, failed_checks=failed
        ),
    )
    assert not must_store(HOLDING, refreshed)


@given(
    conclusive=st.none() | st.integers(min_value=0, max_value=600),
    error=st.none() | st.integers(min_value=0, max_value=600),
    phase=st.sampled_from(list(Phase)),
)
def test_the_no_data_clock_is_not_stored_a_restart_starts_it_again(
    conclusive: int | None, error: int | None, phase: Phase
) -> None:
    base = replace(HOLDING, phase=phase)
    moved = replace(
        base,
        evaluation=replace(
            base.evaluation,
            last_conclusive_at=None if conclusive is None else T0 + timedelta(seconds=conclusive),
            no_data_clock_from=None if error is None else T0 + timedelta(seconds=error),
        ),
    )
    assert not must_store(base, moved)
    restart = T0 + timedelta(seconds=700)
    again = restarted(moved, restart)
    assert again.evaluation.no_data_clock_from == restart
    assert replace(again, evaluation=moved.evaluation) == moved, "nothing else changes"
    clock = no_data_clock(replace(again, phase=Phase.PROGRESSING))
    assert clock is not None and clock >= restart, "onNoData counts from the restart at the earliest"
    assert restarted(again, restart) == again


def _explain(
    verdict: str = "pass", reasons: tuple[str, ...] = ("held 8s of 10s",), **checks: str
) -> ExplainDocument:
    return ExplainDocument(
        at=T0,
        decision_id="d",
        revision="r2",
        stable_revision="r1",
        action="wait",
        verdict=verdict,
        reasons=reasons,
        checks=tuple(
            ExplainCheck(name=name, verdict=value) for name, value in (checks or {"p99": "pass"}).items()
        ),
    )


def test_explain_is_written_when_a_verdict_or_a_reason_changes_not_when_numbers_do() -> None:
    assert explain_change(None, _explain()) == "first"
    assert explain_change(_explain(), None) == ""
    assert explain_change(_explain(), _explain(reasons=("held 9s of 10s",))) == ""
    assert explain_change(_explain(), _explain(verdict="fail")) == "verdict"
    assert explain_change(_explain(p99="pass"), _explain(p99="fail")) == "check-verdict"
    assert explain_change(_explain(), _explain(reasons=("held 9s of 10s", "Prometheus queries failed"))) == (
        "reason"
    )
    assert explain_change(_explain(), replace(_explain(), revision="r3")) == "revision"


@settings(max_examples=300, deadline=None)
@given(st.floats(0, 10 * 86400), st.floats(0, 10 * 86400), st.integers(0, 10**6), st.integers(0, 10**6))
def test_a_reason_reads_alike_whatever_its_durations_and_counts(
    held: float, window: float, requests: int, needed: int
) -> None:
    """ "held 1m30s of 10m" and "held 2m of 10m" are the same reason: masking digits alone left
    "#m#s" and "#m", a new reason every other interval (an explain write every five, at 1,000
    rollouts 7 writes a second) and a log line at info for every hold."""

    def reason(seconds: float, of: float, count: int, of_count: int) -> str:
        return (
            f"Holding r at 10% (step 1 of 3): held {format_duration(seconds)} of {format_duration(of)}, "
            f"{count} of {of_count} canary requests, latest evaluation pass."
        )

    assert text_shape(reason(held, window, requests, needed)) == text_shape(reason(60, 600, 5, 100))
    assert explain_change(_explain(reasons=(reason(held, window, requests, needed),)), _explain(
        reasons=(reason(90, 600, 7, 100),)
    )) == ""  # fmt: skip


@given(st.floats(0.1, 1e6), st.floats(0.1, 1e6))
def test_a_not_yet_estimate_reads_alike_whatever_its_unit(first: float, second: float) -> None:
    """ "~84 min at this rate" and "~2.5 h at this rate" say the same thing with other numbers: a
    check's time to go crossing 90 minutes is not a new reason (a log line at info, an explain
    write)."""

    def statement(seconds: float) -> str:
        return f"p99: not-yet — about 832 more needed (~{minutes_text(seconds)} at this rate)"

    assert text_shape(statement(first)) == text_shape(statement(second))


def test_a_reason_with_other_words_is_another_reason() -> None:
    assert text_shape("held 2m of 10m") != text_shape("paused 2m of 10m")
    assert text_shape("2xx") == "#xx" and text_shape("5 seconds") == "# seconds"


# The masking pattern as it was first written, three alternatives each starting with a digit; the
# product's factors the digit out (faster), and must mask exactly the same.
_UNFACTORED = re.compile(r"\d[\d,.]*\s(?:min|h)\b|(?:\d[\d,.]*(?:ms|[smhd])(?![A-Za-z]))+|\d[\d,.]*")


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.sampled_from(["1", "23", "4.5", "6,7", " ", "min", "h", "ms", "m", "s", "d", "x", "~", "%", "of"]),
        max_size=20,
    ).map("".join)
)
def test_the_factored_mask_masks_what_the_three_alternatives_mask(text: str) -> None:
    assert text_shape(text) == _UNFACTORED.sub("#", text)


def test_explain_writes_are_rate_limited_per_rollout() -> None:
    changed = _explain(verdict="fail")
    kwargs = {"interval": MINUTE, "every_intervals": 5.0}
    assert explain_due(_explain(), changed, last_written=None, now=T0, **kwargs) == "verdict"
    assert explain_due(_explain(), changed, last_written=T0, now=T0 + 4 * MINUTE, **kwargs) == ""
    assert explain_due(_explain(), changed, last_written=T0, now=T0 + 5 * MINUTE, **kwargs) == "verdict"
    assert explain_due(_explain(), _explain(), last_written=None, now=T0, **kwargs) == ""


# -- the property: a restart from the stored state decides as if every state was stored --
#
# Request counts are cumulative over a step (they never go down within one). The one difference a
# restart may make: the onNoData clock starts again at the restart (restarted()), and the evaluation
# time and request count are not stored, so the first evaluation after a restart may count as
# conclusive where the controller that kept running would not: onNoData acts later, never earlier
# (where it acted, the restarted one waits, or leaves a step both judged passed), and nothing else
# — a failure, a streak, a step's clock — changes.

HEALTHY = HEALTHY_EVIDENCE
SLOW = HEALTHY_EVIDENCE.failing(p99=0.95)
KINDS = ("healthy", "slow", "quiet", "down")
POLICIES = [
    make_policy(window="3m", interval="1m", failureLimit=2, onNoData={"after": "4m", "action": "hold"}),
    make_policy(
        window="2m", interval="1m", failureLimit=1, bake="3m", onNoData={"after": "3m", "action": "rollback"}
    ),
    make_policy(window="5m", interval="1m", failureLimit=3, onNoData={"after": "3m", "action": "pause"}),
]


def _answer(kind: str, requests: float) -> EvidenceMaker:
    if kind == "quiet":
        return EvidenceMaker(requests=no_data())
    if kind == "down":
        return EvidenceMaker(requests=query_error(), canary={"p99": query_error()})
    base = SLOW if kind == "slow" else HEALTHY
    return EvidenceMaker(requests, dict(base.canary), dict(base.stable), base.gpu_fraction)


class Run:
    """A controller's shell around the core against the KServe simulator: stores every state, or
    only what :func:`must_store` says and, at a restart, starts again from the state as stored."""

    def __init__(self, policy_index: int, *, skip: bool) -> None:
        self.policy = POLICIES[policy_index]
        self.sim = KServeSim.serving()
        self.skip = skip
        self.memory = RolloutState()
        self.stored = RolloutState()
        self.now = T0
        self.writes = 0
        self.requests = 0.0
        self.step: object = None

    def tick(
        self, after: float, kind: str | None, arrived: float = 0.0, *, restart: bool = False
    ) -> Decision:
        self.now += timedelta(seconds=after)
        if restart:
            self.memory = restarted(RolloutState.from_json(self.stored.to_json()), self.now)
        step = self.memory.step
        if step is None or (step.index, step.started_at) != self.step:  # counts are per step
            self.requests = 0.0
            self.step = None if step is None else (step.index, step.started_at)
        self.requests += arrived
        observed = self.sim.observe()
        request = evidence_request(self.policy, observed, self.memory, self.now)
        evidence = _answer(kind, self.requests)(request) if request is not None and kind is not None else None
        decision = decide(self.policy, observed, self.memory, evidence, self.now)
        if not self.skip or must_store(self.stored, decision.new_state):
            self.stored = RolloutState.from_json(decision.new_state.to_json())
            self.writes += 1
        self.memory = decision.new_state
        if decision.action.writes:
            self.sim.set_percent(decision.weight)
        self.sim.reconcile()
        return decision

    def start(self) -> None:
        self.tick(0, None)
        self.sim.change_model("s3://m/v2")
        self.sim.reconcile()
        self.tick(1, None)
        self.sim.make_ready()
        self.sim.reconcile()
        self.tick(59, None)


def _outcome(decision: Decision) -> tuple[object, ...]:
    state = decision.new_state
    step = state.step
    return (
        decision.action,
        decision.weight,
        state.phase,
        None if step is None else (step.index, step.weight, step.started_at, step.passed_at),
        state.evaluation.failure_streak,
        None if state.pause is None else state.pause.kind,
    )


def _by_no_data(decision: Decision) -> bool:
    return any("No conclusive evidence" in reason for reason in decision.reasons[:1])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.integers(min_value=0, max_value=len(POLICIES) - 1),
    ticks=st.lists(
        st.tuples(st.sampled_from(KINDS), st.sampled_from([0.0, 30.0, 400.0]), st.booleans()),
        min_size=5,
        max_size=30,
    ),
)
def test_a_restart_from_the_stored_state_reaches_the_same_decisions(
    policy: int, ticks: list[tuple[str, float, bool]]
) -> None:
    always, skipping = Run(policy, skip=False), Run(policy, skip=True)
    always.start()
    skipping.start()
    for kind, arrived, restart in ticks:
        expected = always.tick(60, kind, arrived)
        got = skipping.tick(60, kind, arrived, restart=restart)
        if _outcome(got) != _outcome(expected):
            # The one difference allowed: onNoData acted in the controller that kept running and
            # not (yet) in the restarted one — which waits, or leaves a step both judged passed.
            assert _by_no_data(expected) and not _by_no_data(got), (kind, arrived, restart)
            assert got.action.value in ("wait", "advance", "promote"), (kind, arrived, restart)
            if got.action.value != "wait":
                step = expected.new_state.step
                assert step is not None and step.passed_at is not None, (kind, arrived, restart)
            return
    assert skipping.writes <= always.writes


def test_a_hold_writes_only_when_its_verdict_changes() -> None:
    run = Run(2, skip=True)
    run.start()
    first = run.tick(60, "healthy", 400.0)  # the first verdict of the step
    before = run.writes
    for _ in range(2):
        again = run.tick(60, "healthy", 400.0)
        assert again.action.value == "wait" and again.verdict == first.verdict
    assert run.writes == before, "a verdict that repeats is not written"
    changed = run.tick(60, "down")
    assert changed.verdict != first.verdict or changed.new_state.evaluation.query_error
    assert run.writes == before + 1, "a verdict (or Prometheus failing) that changes is"
    run.tick(60, "down")
    assert run.writes == before + 1
