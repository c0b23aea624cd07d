"""Properties of the core over random worlds: evidence sequences, KServe lag, crashes, clock jumps.

Each example drives the real core against the KServe simulator through a random sequence of
events. An independent observer (this test) keeps its own record of what was written and what
KServe's status showed, and checks on every decision:

* weights stay within 0..100;
* per revision, the written weights follow the steps in order: the first step, then each next
  step, then the removal; 0 (a rollback) may end the sequence at any point; a repeated write is
  the same value again (a re-issue after a crash), never a skipped or a previous step;
* a promotion (not a re-issue) is decided on a passing evaluation of the last step, with enough
  requests, at least a window after status first showed that step — of the revision that is the
  latest created and latest Ready one, built from the spec that started its rollout;
* decide() is deterministic, and deciding again with the new state at the same ``now`` changes
  nothing more (and writes nothing else).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from canary.evidence import EvidenceRequest
from canary.kserve.status_model import KServeSim
from canary.rollout import Action, Decision, EvaluationVerdict, RolloutState, decide, evidence_request
from canary.rollout.judge import CheckVerdict

from .counts import SteadyCounts
from .helpers import HEALTHY_EVIDENCE, T0, EvidenceMaker, make_policy, no_data, query_error

POLICIES = [
    make_policy(window="3m", interval="1m", failureLimit=2, onNoData={"after": "5m", "action": "hold"}),
    make_policy(
        window="2m", interval="1m", failureLimit=1, bake="3m", onNoData={"after": "4m", "action": "rollback"}
    ),
    make_policy(
        steps=[5, 20, 100],
        window="4m",
        interval="1m",
        minRequests=500,
        failureLimit=3,
        onNoData={"after": "3m", "action": "pause"},
    ),
]

EVIDENCE: dict[str, EvidenceMaker] = {
    "healthy": HEALTHY_EVIDENCE,
    "slow": HEALTHY_EVIDENCE.failing(p99=0.95),
    "relatively-slow": HEALTHY_EVIDENCE.failing(p99=0.6),  # passes max, fails 1.2 x stable (0.38)
    "oom": HEALTHY_EVIDENCE.failing(oom=1),
    "silent": HEALTHY_EVIDENCE.failing(p99=no_data()),
    "down": HEALTHY_EVIDENCE.failing(p99=query_error(), errors=query_error()),
    "few-requests": EvidenceMaker(requests=40),
    # Counted checks judged on counts (tests/rollout/counts.py): healthy, a broken tail, a trickle.
    "counted-healthy": SteadyCounts(rate=20.0, measured=HEALTHY_EVIDENCE),
    "counted-slow": SteadyCounts(rate=20.0, slow_share=0.05, slow_above=1.0, measured=HEALTHY_EVIDENCE),
    "counted-trickle": SteadyCounts(rate=0.2, measured=HEALTHY_EVIDENCE),
}

CLOCK_STEPS = st.one_of(
    st.integers(min_value=5, max_value=90),  # ordinary ticks
    st.integers(min_value=-900, max_value=-1),  # the clock jumps backwards
    st.integers(min_value=1800, max_value=6 * 3600),  # a long pause (controller down)
)

TICK = st.tuples(
    st.just("tick"),
    st.fixed_dictionaries(
        {
            "dt": CLOCK_STEPS,
            "evidence": st.sampled_from(list(EVIDENCE)),
            "patch": st.booleans().map(lambda ok: ok or False) | st.just(True),  # crashes before patching
            "reconcile": st.booleans() | st.just(True),  # KServe lags when False
        }
    ),
)
WORLD = st.tuples(
    st.sampled_from(["ready", "crash", "recover", "fail", "new-spec", "reconcile"]), st.just({})
)
EVENTS = st.lists(st.one_of(TICK, TICK, TICK, TICK, WORLD), min_size=10, max_size=70)


@dataclass
class Observer:
    """What the test itself saw, independently of the core's bookkeeping."""

    writes: dict[str, list[int | None]] = field(default_factory=dict)
    shown_since: dict[tuple[str, int], Any] = field(default_factory=dict)
    fingerprint_at_start: dict[str, str | None] = field(default_factory=dict)


def check_writes_follow_the_steps(sequence: list[int | None], steps: list[int]) -> None:
    collapsed: list[int | None] = []
    for weight in sequence:
        if not collapsed or collapsed[-1] != weight:
            collapsed.append(weight)
    if 0 in collapsed:
        assert collapsed.index(0) == len(collapsed) - 1, f"a write after a rollback: {sequence}"
        collapsed = collapsed[:-1]
    allowed: list[int | None] = [*steps, None]
    assert collapsed == allowed[: len(collapsed)], f"writes {sequence} do not follow the steps {steps}"


def check_decision(
    decision: Decision,
    previous: RolloutState,
    observed: Any,
    observer: Observer,
    steps: list[int],
    policy: Any,
) -> None:
    revision = decision.new_state.revision
    if revision and revision not in observer.writes and observed.canary_traffic_percent == steps[0]:
        # The first step was already in the spec when this revision's rollout began (set with
        # the spec, or left from the previous rollout): accepted in place of a write.
        observer.writes[revision] = [steps[0]]
    if decision.action.writes:
        assert decision.weight is None or 0 <= decision.weight <= 100
        assert decision.revision is not None
        revision_writes = observer.writes.setdefault(decision.revision, [])
        reissue = previous.intent is not None and previous.intent.weight == decision.weight
        if decision.action is Action.PROMOTE and not reissue:
            assert revision_writes and revision_writes[-1] == steps[-1], revision_writes
            assert decision.verdict is EvaluationVerdict.PASS
            assert all(judgement.verdict is CheckVerdict.PASS for judgement in decision.judgements)
            last_step = policy.spec.canary_steps[-1]
            assert decision.requests is not None
            assert decision.requests >= policy.spec.step_min_requests(last_step)
            shown = observer.shown_since[(decision.revision, steps[-1])]
            assert decision.evaluated_at is not None
            assert decision.evaluated_at - shown >= timedelta(seconds=policy.spec.step_window(last_step))
            assert observed.latest_created_revision == decision.revision
            assert observed.latest_ready_revision == decision.revision
            assert observed.predictor_fingerprint == observer.fingerprint_at_start[decision.revision]
        revision_writes.append(decision.weight)
        check_writes_follow_the_steps(revision_writes, steps)
    if decision.action is Action.START:
        observer.fingerprint_at_start.setdefault(
            decision.new_state.revision or "", observed.predictor_fingerprint
        )
    if decision.new_state.revision and decision.new_state.revision not in observer.fingerprint_at_start:
        observer.fingerprint_at_start[decision.new_state.revision] = observed.predictor_fingerprint


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(policy_index=st.integers(0, len(POLICIES) - 1), events=EVENTS)
def test_rollout_invariants_hold_in_random_worlds(
    policy_index: int, events: list[tuple[str, dict[str, Any]]]
) -> None:
    policy = POLICIES[policy_index]
    steps = [step.weight for step in policy.spec.canary_steps]
    sim = KServeSim.serving()
    state = RolloutState()
    now = T0
    observer = Observer()
    version = 1
    for kind, arguments in events:
        if kind != "tick":
            if kind == "new-spec":
                version += 1
                sim.change_model(f"s3://m/v{version}")
            elif kind == "reconcile":
                sim.reconcile()
            elif sim.latest_created is not None:
                {"ready": sim.make_ready, "crash": sim.crash, "recover": sim.recover, "fail": sim.fail}[
                    kind
                ]()
            continue
        now += timedelta(seconds=arguments["dt"])
        observed = sim.observe()
        for revision, weight in {(observed.latest_created_revision, w) for w in steps}:
            if revision and observed.weight_of(revision) == weight and sim.percent == weight:
                observer.shown_since.setdefault((revision, weight), now)
        request = evidence_request(policy, observed, state, now)
        evidence = EVIDENCE[arguments["evidence"]](request) if request is not None else None
        if request is not None:
            check_request(request, observed, policy)
        decision = decide(policy, observed, state, evidence, now)
        # Deterministic: the same inputs give the same decision.
        assert decide(policy, observed, state, evidence, now) == decision
        # Applying it twice at the same now changes nothing more.
        again = decide(policy, observed, decision.new_state, evidence, now)
        assert again.new_state == decision.new_state
        if again.action.writes:
            assert (again.action, again.weight) == (decision.action, decision.weight)
        check_decision(decision, state, observed, observer, steps, policy)
        # Store (the JSON round trip is a restart), then perhaps crash before patching.
        state = RolloutState.from_json(decision.new_state.to_json())
        assert state == decision.new_state
        if decision.action.writes and arguments["patch"]:
            sim.set_percent(decision.weight)
        if arguments["reconcile"]:
            sim.reconcile()
        assert sim.percent is None or 0 <= sim.percent <= 100


def check_request(request: EvidenceRequest, observed: Any, policy: Any) -> None:
    assert request.canary_revision == observed.latest_created_revision
    assert request.window_start < request.at
    assert request.checks
    if request.compare_with_stable:
        assert request.stable_revision != request.canary_revision
    assert request.namespace == policy.metadata.namespace


def test_the_step_sequence_checker_can_fail() -> None:
    # The observer's own rule, checked on the sequences it must refuse and accept.
    steps = [10, 30, 50]
    for bad in ([30], [10, 50], [10, 30, 10], [10, 0, 10], [10, None], [None]):
        try:
            check_writes_follow_the_steps(list(bad), steps)
        except AssertionError:
            continue
        raise AssertionError(f"{bad} was accepted")
    for good in ([10], [10, 10, 30], [10, 30, 50, None], [10, 30, 50, None, 0], [0], [10, 0, 0]):
        check_writes_follow_the_steps(list(good), steps)


COMMANDS = st.tuples(
    st.just("command"),
    st.fixed_dictionaries({"name": st.sampled_from(["pause", "resume", "approve", "abort", "promote"])}),
)
EXTERNAL = st.tuples(
    st.just("external"), st.fixed_dictionaries({"percent": st.sampled_from([None, 0, 25, 40, 100])})
)
BUSY_EVENTS = st.lists(st.one_of(TICK, TICK, TICK, WORLD, COMMANDS, EXTERNAL), min_size=10, max_size=60)
APPROVALS = make_policy(
    steps=[{"weight": 10, "approval": "manual"}, 40, 100], window="2m", interval="1m", bake="2m"
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(events=BUSY_EVENTS)
def test_commands_and_external_edits_never_break_determinism_idempotence_or_bounds(
    events: list[tuple[str, dict[str, Any]]],
) -> None:
    from canary.rollout import apply_command

    policy = APPROVALS
    sim = KServeSim.serving()
    state = RolloutState()
    now = T0
    version = 1
    for kind, arguments in events:
        if kind == "command":
            state = apply_command(state, arguments["name"], now, by="prop").state
            continue
        if kind == "external":
            sim.set_percent(arguments["percent"])
            continue
        if kind != "tick":
            if kind == "new-spec":
                version += 1
                sim.change_model(f"s3://m/v{version}")
            elif kind == "reconcile":
                sim.reconcile()
            else:
                {"ready": sim.make_ready, "crash": sim.crash, "recover": sim.recover, "fail": sim.fail}[
                    kind
                ]()
            continue
        now += timedelta(seconds=arguments["dt"])
        observed = sim.observe()
        request = evidence_request(policy, observed, state, now)
        evidence = EVIDENCE[arguments["evidence"]](request) if request is not None else None
        decision = decide(policy, observed, state, evidence, now)
        assert decide(policy, observed, state, evidence, now) == decision
        again = decide(policy, observed, decision.new_state, evidence, now)
        assert again.new_state == decision.new_state
        if decision.action.writes:
            assert decision.weight is None or 0 <= decision.weight <= 100
            if decision.action is Action.PROMOTE:
                assert observed.latest_ready_revision == decision.revision == observed.latest_created_revision
        if again.action.writes:
            assert (again.action, again.weight) == (decision.action, decision.weight)
        state = RolloutState.from_json(decision.new_state.to_json())
        if decision.action.writes and arguments["patch"]:
            sim.set_percent(decision.weight)
        if arguments["reconcile"]:
            sim.reconcile()


LOSSES = st.tuples(
    st.just("lose-state"),
    st.fixed_dictionaries({"how": st.sampled_from(["deleted", "empty", "restored-copy"])}),
)
LEDGER_TICK = st.tuples(
    st.just("tick"),
    st.fixed_dictionaries(
        {
            "dt": CLOCK_STEPS,
            "evidence": st.sampled_from(list(EVIDENCE)),
            "save": st.booleans() | st.just(True),  # crashes after the ledger, before the state
            "patch": st.booleans() | st.just(True),  # crashes before patching
            "reconcile": st.booleans() | st.just(True),
        }
    ),
)
LOSSY_EVENTS = st.lists(
    st.one_of(LEDGER_TICK, LEDGER_TICK, LEDGER_TICK, WORLD, LOSSES, COMMANDS, EXTERNAL),
    min_size=10,
    max_size=70,
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(policy_index=st.integers(0, len(POLICIES) - 1), events=LOSSY_EVENTS, data=st.data())
def test_a_rolled_back_revision_is_never_written_to_again_whatever_the_state_loss(
    policy_index: int, events: list[tuple[str, dict[str, Any]]], data: st.DataObject
) -> None:
    """The shell keeps the rollback ledger (written before the rollback's patch); the state may be
    deleted, emptied or restored from any earlier copy at any moment, commands and other writers
    may act: once a rollback of a revision was recorded, no decision starts, advances or promotes
    that revision again."""
    from dataclasses import replace

    from canary.rollout import RollbackLedger, apply_command, ledger_after

    policy = POLICIES[policy_index]
    sim = KServeSim.serving()
    uid = "uid-of-llama"
    state, ledger = RolloutState(), RollbackLedger()
    copies: list[RolloutState] = [state]
    now = T0
    version = 1
    rolled_back: set[str] = set()
    ok = {"save": True, "patch": True, "reconcile": True}
    tick = {"dt": 60, "evidence": "healthy", **ok}
    # Every example begins with a rollout rolled back (a critical OOM at its first step); what
    # follows is drawn.
    rollback_first: list[tuple[str, dict[str, Any]]] = [
        ("tick", tick),
        ("new-spec", {}),
        ("reconcile", {}),
        ("tick", tick),
        ("ready", {}),
        ("reconcile", {}),
        ("tick", tick),
        ("tick", {**tick, "evidence": "oom"}),
    ]
    for kind, arguments in [*rollback_first, *events]:
        if kind == "lose-state":
            how = arguments["how"]
            state = data.draw(st.sampled_from(copies)) if how == "restored-copy" else RolloutState()
            continue
        if kind == "command":
            state = apply_command(state, arguments["name"], now, by="prop").state
            continue
        if kind == "external":
            sim.set_percent(arguments["percent"])
            continue
        if kind != "tick":
            if kind == "new-spec":
                version += 1
                sim.change_model(f"s3://m/v{version}")
            elif kind == "reconcile":
                sim.reconcile()
            else:
                {"ready": sim.make_ready, "crash": sim.crash, "recover": sim.recover, "fail": sim.fail}[
                    kind
                ]()
            continue
        now += timedelta(seconds=arguments["dt"])
        observed = replace(sim.observe(), uid=uid)
        request = evidence_request(policy, observed, state, now, ledger=ledger)
        evidence = EVIDENCE[arguments["evidence"]](request) if request is not None else None
        decision = decide(policy, observed, state, evidence, now, ledger=ledger)
        assert decide(policy, observed, state, evidence, now, ledger=ledger) == decision
        if decision.action.writes and decision.revision in rolled_back:
            assert decision.action is Action.ROLLBACK and decision.weight == 0, (
                f"{decision.action} {decision.weight} written to rolled-back {decision.revision}: "
                f"{decision.reasons}"
            )
        # Write-ahead: the ledger first, then the state, then the patch (each may be the last).
        recorded = ledger_after(decision, ledger, uid)
        if recorded is not None:
            ledger = RollbackLedger.from_json(recorded.to_json())
            assert decision.revision is not None
            rolled_back.add(decision.revision)
        if not arguments["save"]:
            continue
        state = RolloutState.from_json(decision.new_state.to_json())
        copies.append(state)
        if decision.action.writes and arguments["patch"]:
            sim.set_percent(decision.weight)
        if arguments["reconcile"]:
            sim.reconcile()
    assert "llama-predictor-00002" in rolled_back
