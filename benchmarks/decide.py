"""decide() calls per second for a six-check policy, on one core, with baselines from the same run.

Run: ``.venv/bin/python -m benchmarks.decide [--seconds 1.0] [--repeats 5]``

The inputs are real: the policy is docs/design.md §5's six checks (p99 and error rate relative to the
stable revision, OOM kills (critical), restarts, GPU-memory fraction, a custom PromQL), the
InferenceService view is parsed from KServe-shaped JSON, the state comes from a rollout driven
through the core to the point measured. Each scenario calls the pure function in a tight loop with
the same inputs (it is pure, so every call does the full work) and reports the median of
``--repeats`` runs.

Baselines, measured in the same run so the machine's speed cancels out of the ratios:

* ``build the evidence`` — constructing the :class:`Evidence` input for one evaluation (13
  measurements): work the evidence layer must do for every evaluated rollout anyway;
* ``decide(), no-op`` — decide() for a policy whose InferenceService does not exist: the fixed
  cost of a call (argument checks, building a Decision, its id).

The goal (issue #4): >= 10,000 decide()/s with evidence judged, so a tick of 1,000 rollouts
costs under 0.1 s of CPU in the core.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from canary.evidence import (
    REQUESTS,
    CountSeries,
    Evidence,
    EvidenceRequest,
    EvidenceStatus,
    Histogram,
    Measurement,
    Tally,
)
from canary.kserve.view import observe
from canary.policy.model import PromotionPolicy
from canary.policy.units import Unit
from canary.rollout import Action, ObservedInferenceService, RolloutState, decide, evidence_request
from canary.rollout.judge import fraction_key

GOAL_PER_SECOND = 10_000
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GIB = 1024.0**3

POLICY = PromotionPolicy.model_validate(
    {
        "apiVersion": "kserve-canary.dev/v1alpha1",
        "kind": "PromotionPolicy",
        "metadata": {"name": "llama-chat", "namespace": "ml"},
        "spec": {
            "target": {"inferenceService": "llama"},
            "steps": [10, 30, 50, 100],
            "window": "10m",
            "interval": "1m",
            "checks": [
                {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "800ms", "maxIncrease": "20%"},
                {
                    "name": "errors",
                    "metric": "error-rate",
                    "max": "1%",
                    "maxIncrease": "50%",
                    "minStable": "0.1%",
                },
                {"name": "oom", "metric": "oom-kills", "max": 0, "critical": True},
                {"name": "restarts", "metric": "restarts", "max": 0},
                {"name": "gpu-memory", "metric": "gpu-memory-peak", "maxFraction": 0.9},
                {
                    "name": "ttft-p95",
                    "promql": (
                        "histogram_quantile(0.95, rate(ttft_bucket{pod=~'{{ revision }}-.*'}[{{ window }}]))"
                    ),
                    "unit": "seconds",
                    "max": 2,
                },
            ],
        },
    }
)

CANARY_VALUES = {
    "p99": 0.41,
    "errors": 0.002,
    "oom": 0.0,
    "restarts": 0.0,
    "gpu-memory": 40 * GIB,
    "ttft-p95": 0.5,
}
STABLE_VALUES = {"p99": 0.39, "errors": 0.002, "gpu-memory": 39 * GIB, "ttft-p95": 0.49}


def isvc_json(percent: int) -> dict[str, Any]:
    """A KServe InferenceService with llama-predictor-00002 Ready at ``percent``."""
    return {
        "metadata": {"name": "llama", "namespace": "ml", "generation": 3},
        "spec": {
            "predictor": {
                "canaryTrafficPercent": percent,
                "model": {"modelFormat": {"name": "vllm"}, "storageUri": "s3://models/llama/v2"},
            }
        },
        "status": {
            "deploymentMode": "Serverless",
            "conditions": [{"type": "PredictorReady", "status": "True"}, {"type": "Ready", "status": "True"}],
            "components": {
                "predictor": {
                    "latestCreatedRevision": "llama-predictor-00002",
                    "latestReadyRevision": "llama-predictor-00002",
                    "latestRolledoutRevision": "llama-predictor-00001",
                    "traffic": [
                        {"latestRevision": True, "percent": percent, "revisionName": "llama-predictor-00002"},
                        {
                            "latestRevision": False,
                            "percent": 100 - percent,
                            "revisionName": "llama-predictor-00001",
                            "tag": "prev",
                        },
                    ],
                }
            },
        },
    }


# Knative >= 1.19 bucket edges and a healthy profile: the share of requests slower than each edge.
EDGES = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
SLOWER = (1.0, 0.95, 0.85, 0.6, 0.4, 0.25, 0.06, 0.004, 0.0005, 0.0, 0.0, 0.0, 0.0, 0.0)


def _tallies(request: EvidenceRequest, per_tally: int, errors: int) -> CountSeries:
    """What the pipeline delivers: one tally per 15 s scrape from counts_start to the evaluation."""
    tallies = []
    start = request.counts_start
    at_most = tuple(per_tally - round(per_tally * share) for share in SLOWER)
    while start + timedelta(seconds=15) <= request.at:
        histogram = Histogram(EDGES, at_most, per_tally)
        tallies.append(
            Tally(start, start + timedelta(seconds=15), per_tally, errors, 0, {"latency": histogram})
        )
        start += timedelta(seconds=15)
    return CountSeries(EvidenceStatus.OK, tuple(tallies), query="counters")


def build_evidence(request: EvidenceRequest) -> Evidence:
    """What the evidence layer hands the core for one evaluation of the six checks: the counted
    ones (p99, error rate) judged on 15 s tallies of both revisions, the others on values."""
    canary: dict[str, Measurement] = {REQUESTS: Measurement.ok(4321.0, Unit.COUNT)}
    stable: dict[str, Measurement] = {}
    for check in request.checks:
        canary[check.name] = Measurement.ok(CANARY_VALUES[check.name], check.value_unit, samples=4321.0)
        if check.max_fraction is not None:
            canary[fraction_key(check)] = Measurement.ok(0.52, Unit.RATIO)
        if request.compare_with_stable and check.comparable_to_stable:
            stable[check.name] = Measurement.ok(STABLE_VALUES[check.name], check.value_unit, samples=38000.0)
    counts = {"canary": _tallies(request, 300, 1), "stable": _tallies(request, 2700, 5)}
    return Evidence(request=request, canary=canary, stable=stable, counts=counts)


def state_in_step(observed: ObservedInferenceService) -> tuple[RolloutState, datetime]:
    """Drive the core from a fresh state to the first step, started; returns the state and its time."""
    state = RolloutState()
    now = T0
    # Adopt the stable revision, then the canary appears at 10% (as Git set it), Ready.
    for _ in range(3):
        decision = decide(POLICY, observed, state, None, now)
        state = decision.new_state
        now += timedelta(seconds=1)
    step = state.step
    if step is None or step.started_at is None:
        raise SystemExit(f"the benchmark's rollout did not reach its first step: {state}")
    return state, step.started_at


def measure(call: Callable[[], object], seconds: float, repeats: int) -> list[float]:
    """Calls per second of ``call`` in each of ``repeats`` runs of about ``seconds`` each."""
    batch = 200
    rates = []
    for _ in range(repeats):
        calls = 0
        started = time.perf_counter()
        deadline = started + seconds
        while True:
            for _ in range(batch):
                call()
            calls += batch
            elapsed = time.perf_counter() - started
            if time.perf_counter() >= deadline:
                break
        rates.append(calls / elapsed)
    return rates


def pin_to_one_core() -> str:
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return f"pinned to CPU {cpu}"
    return "not pinned (no sched_setaffinity)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="duration of one measurement run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per scenario (median reported)")
    arguments = parser.parse_args(argv)

    pinning = pin_to_one_core()
    observed = observe(isvc_json(10))
    state, step_start = state_in_step(observed)
    due_at = step_start + timedelta(minutes=3)
    request = evidence_request(POLICY, observed, state, due_at)
    if request is None:
        raise SystemExit("no evaluation is due: the benchmark would measure nothing")
    evidence = build_evidence(request)
    judged = decide(POLICY, observed, state, evidence, due_at)
    if judged.action is not Action.WAIT or judged.verdict is None or len(judged.judgements) != 6:
        raise SystemExit(f"the measured decision is not a six-check evaluation: {judged}")

    # The evaluation that passes the first step: advance.
    passing_at = step_start + timedelta(minutes=10)
    late_state = judged.new_state
    for minute in range(4, 10):
        at = step_start + timedelta(minutes=minute)
        late_request = evidence_request(POLICY, observed, late_state, at)
        if late_request is None:
            raise SystemExit(f"no evaluation due at minute {minute} of the step")
        late_state = decide(POLICY, observed, late_state, build_evidence(late_request), at).new_state
    passing_request = evidence_request(POLICY, observed, late_state, passing_at)
    if passing_request is None:
        raise SystemExit("no evaluation due at the end of the step")
    passing_evidence = build_evidence(passing_request)
    advance = decide(POLICY, observed, late_state, passing_evidence, passing_at)
    if advance.action is not Action.ADVANCE:
        raise SystemExit(f"the step did not pass: {advance.reasons}")

    between_at = due_at + timedelta(seconds=20)
    between_state = judged.new_state
    missing = ObservedInferenceService.missing("ml", "llama")

    scenarios: list[tuple[str, Callable[[], object]]] = [
        ("baseline: build the evidence (13 measurements)", lambda: build_evidence(request)),
        (
            "baseline: decide(), no-op (InferenceService missing)",
            lambda: decide(POLICY, missing, state, None, due_at),
        ),
        (
            "decide(): evaluation due, 6 checks judged -> wait",
            lambda: decide(POLICY, observed, state, evidence, due_at),
        ),
        (
            "decide(): step passes -> advance",
            lambda: decide(POLICY, observed, late_state, passing_evidence, passing_at),
        ),
        (
            "decide(): between evaluations (no evidence)",
            lambda: decide(POLICY, observed, between_state, None, between_at),
        ),
        ("evidence_request(), evaluation due", lambda: evidence_request(POLICY, observed, state, due_at)),
    ]
    print(f"decide() throughput, six-check policy, one core ({pinning}); Python {platform.python_version()}")
    print(f"median of {arguments.repeats} runs x {arguments.seconds:.1f}s each\n")
    rates: dict[str, float] = {}
    print(f"  {'scenario':<58} {'median':>12} {'per call':>9}   range of the runs")
    for name, call in scenarios:
        runs = measure(call, arguments.seconds, arguments.repeats)
        rate = rates[name] = statistics.median(runs)
        print(f"  {name:<58} {rate:>10,.0f}/s {1e6 / rate:>7.1f} µs   {min(runs):,.0f}-{max(runs):,.0f}/s")

    judge_rate = rates[scenarios[2][0]]
    request_rate = rates[scenarios[5][0]]
    per_tick = 1 / judge_rate + 1 / request_rate
    print()
    print(
        f"  decide() with 6 checks judged costs {rates[scenarios[0][0]] / judge_rate:.1f}x "
        "building its evidence"
    )
    print(
        f"  decide() with 6 checks judged costs {rates[scenarios[1][0]] / judge_rate:.1f}x a no-op decide()"
    )
    print(
        f"  1,000-rollout tick, every rollout evaluated (evidence_request + decide): "
        f"{1000 * per_tick * 1000:.1f} ms of CPU"
    )
    met = judge_rate >= GOAL_PER_SECOND
    print(f"  goal >= {GOAL_PER_SECOND:,} decide()/s with evidence judged: {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
