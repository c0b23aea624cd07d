"""Decision quality: kserve-canary's core against Flagger's analysis semantics, same rollouts, same run.

Run: ``.venv/bin/python -m benchmarks.decision_quality [--rollouts 400] [--seed 7]``

Each simulated rollout has a ground truth — a healthy canary, or one that regresses (p99 +60 %, or
5xx ×8) — and lives through what production throws at a canary: request counts that vary per
minute (a low-traffic model gets a handful of requests at 10 %), quiet periods with no traffic at
all, and Prometheus outages where every query fails. Minute by minute, both deciders see the same
world:

* **kserve-canary**: the real pure core (:func:`canary.rollout.decide`) driving a KServe status
  simulator; evidence over ``[step start, now]`` — the noise of a p99 shrinks as the window grows;
  no data and query errors are inconclusive; the canary is compared with the stable revision.
* **Flagger semantics** (from its source; the peers are compared in docs/design.md §10): each
  tick evaluates the last ``interval`` (1 min) only; an empty result or a query error is a *failed*
  check; failed checks accumulate over the whole run (never reset) and roll back at ``threshold``; a
  step is held for one passing tick; limits are absolute (there is no variable for the stable
  revision), set at the stable revision's typical value × 1.2.

Reported per decider: healthy canaries rolled back (false rollbacks), regressed canaries promoted
(missed regressions), and the median time to the final decision; then the ratios between them.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from canary.evidence import REQUESTS, ErrorClass, Evidence, EvidenceRequest, Measurement
from canary.kserve.status_model import KServeSim
from canary.policy.model import PromotionPolicy
from canary.policy.units import Unit
from canary.rollout import Action, RolloutState, decide, evidence_request

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
TICK = 60.0  # seconds
STEPS = (10, 30, 50)
MAX_MINUTES = 240
MIN_SAMPLES = 20  # the controller's --min-samples default

POLICY = PromotionPolicy.model_validate(
    {
        "apiVersion": "kserve-canary.dev/v1alpha1",
        "kind": "PromotionPolicy",
        "metadata": {"name": "bench", "namespace": "ml"},
        "spec": {
            "target": {"inferenceService": "llama"},
            "steps": [*STEPS, 100],
            "window": "10m",
            "interval": "1m",
            "minRequests": 100,
            "progressDeadline": "15m",
            "failureLimit": 2,
            "onNoData": {"after": "30m", "action": "hold"},
            "checks": [
                {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "2s", "maxIncrease": "20%"},
                {
                    "name": "errors",
                    "metric": "error-rate",
                    "max": "1%",
                    "maxIncrease": "100%",
                    "minStable": "0.2%",
                },
            ],
        },
    }
)


@dataclass
class World:
    """One rollout's ground truth and circumstances, drawn from the seed."""

    regression: str | None  # None (healthy), "latency" or "errors"
    stable_p99: float  # seconds; differs per model and drifts a little per minute
    error_rate: float
    rps: float  # requests per second to the whole model
    quiet: tuple[int, int] | None  # minutes [from, to) without any traffic
    outage: tuple[int, int] | None  # minutes [from, to) with Prometheus down
    rng: random.Random = field(repr=False, default_factory=random.Random)

    @classmethod
    def draw(cls, rng: random.Random) -> World:
        regression = rng.choices([None, "latency", "errors"], weights=[6, 2, 2])[0]
        quiet = None
        if rng.random() < 0.3:
            start = rng.randint(3, 40)
            quiet = (start, start + rng.randint(5, 25))
        outage = None
        if rng.random() < 0.3:
            start = rng.randint(3, 40)
            outage = (start, start + rng.randint(2, 10))
        return cls(
            regression=regression,
            stable_p99=rng.uniform(0.2, 0.8),
            error_rate=rng.uniform(0.0005, 0.004),
            rps=rng.choice([0.5, 2.0, 5.0, 20.0]),  # low-traffic models are where semantics matter
            quiet=quiet,
            outage=outage,
            rng=random.Random(rng.random()),
        )

    def traffic(self, minute: int) -> float:
        if self.quiet and self.quiet[0] <= minute < self.quiet[1]:
            return 0.0
        # Diurnal-ish wobble.
        return self.rps * (0.6 + 0.8 * self.rng.random())

    def down(self, minute: int) -> bool:
        return bool(self.outage and self.outage[0] <= minute < self.outage[1])

    def canary_truth(self) -> tuple[float, float]:
        p99 = self.stable_p99 * (1.6 if self.regression == "latency" else 1.0)
        errors = self.error_rate * (8.0 if self.regression == "errors" else 1.0)
        return p99, errors


@dataclass
class Minute:
    """What one revision served in one minute: its requests, errors, and its p99's sampling noise."""

    requests: float
    errors: int
    p99_noise: float  # standard normal; a p99 from n requests has a log-sd of about 1.3/sqrt(n)


def serve(world: World, requests: float, error_rate: float) -> Minute:
    return Minute(requests, _poisson(world.rng, error_rate * requests), world.rng.gauss(0.0, 1.0))


def window_p99(truth: float, minutes: list[Minute]) -> float:
    """The p99 over several minutes: the minutes' sampling noises average out, weighted by requests."""
    total = sum(m.requests for m in minutes)
    noise = sum(m.p99_noise * math.sqrt(m.requests) for m in minutes) / math.sqrt(total)
    return truth * math.exp(1.3 * noise / math.sqrt(total))


def window_rate(minutes: list[Minute]) -> float:
    total = sum(m.requests for m in minutes)
    return sum(m.errors for m in minutes) / total


def _poisson(rng: random.Random, mean: float) -> int:
    if mean > 50:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    threshold, count, product = math.exp(-mean), 0, rng.random()
    while product > threshold:
        count += 1
        product *= rng.random()
    return count


# ---------------------------------------------------------------------------------------------
# kserve-canary: the real core


def run_kserve_canary(world: World) -> tuple[str, int]:
    sim = KServeSim.serving()
    state = RolloutState()
    now = T0
    state = decide(POLICY, sim.observe(), state, None, now).new_state
    sim.change_model("s3://m/v2")
    sim.reconcile()
    sim.make_ready()
    truth_p99, truth_errors = world.canary_truth()
    canary: list[Minute] = []
    stable: list[Minute] = []
    for minute in range(MAX_MINUTES):
        now = T0 + timedelta(seconds=TICK * (minute + 1))
        observed = sim.observe()
        share = observed.weight_of(observed.latest_ready_revision) / 100
        traffic = world.traffic(minute) * 60
        canary.append(serve(world, traffic * share, truth_errors))
        stable.append(serve(world, traffic * (1 - share), world.error_rate))
        request = evidence_request(POLICY, observed, state, now)
        evidence = None
        if request is not None:
            evidence = _evidence(world, request, canary, stable, truth_p99, down=world.down(minute))
        decision = decide(POLICY, observed, state, evidence, now)
        state = decision.new_state
        if decision.action.writes:
            sim.set_percent(decision.weight)
        sim.reconcile()
        if decision.action is Action.ROLLBACK:
            return "rolled-back", minute + 1
        if decision.action is Action.PROMOTE:
            return "promoted", minute + 1
    return "undecided", MAX_MINUTES


def _evidence(
    world: World,
    request: EvidenceRequest,
    canary_minutes: list[Minute],
    stable_minutes: list[Minute],
    truth_p99: float,
    *,
    down: bool,
) -> Evidence:
    """What the evidence layer would answer: values over [step start, now], honest no-data."""
    if down:
        failure = Measurement.error(ErrorClass.UNREACHABLE, "connection refused")
        return Evidence(request, {REQUESTS: failure, **{c.name: failure for c in request.checks}})
    span = max(1, round(request.window_seconds / 60))
    window, stable_window = canary_minutes[-span:], stable_minutes[-span:]
    requests = sum(m.requests for m in window)
    stable_requests = sum(m.requests for m in stable_window)
    canary: dict[str, Measurement] = {REQUESTS: Measurement.ok(requests, Unit.COUNT)}
    stable: dict[str, Measurement] = {}
    for check in request.checks:
        for side, minutes, count, truth in (
            (canary, window, requests, truth_p99),
            (stable, stable_window, stable_requests, world.stable_p99),
        ):
            if side is stable and not (request.compare_with_stable and check.comparable_to_stable):
                continue
            if count < MIN_SAMPLES:  # the evidence layer's --min-samples: too few requests is no data
                side[check.name] = Measurement.no_data("too few requests", check.value_unit, samples=count)
            elif check.name == "p99":
                side[check.name] = Measurement.ok(window_p99(truth, minutes), Unit.SECONDS, samples=count)
            else:
                side[check.name] = Measurement.ok(window_rate(minutes), Unit.RATIO, samples=count)
    return Evidence(request, canary, stable)


# ---------------------------------------------------------------------------------------------
# Flagger's semantics (baseline)


def run_flagger_semantics(world: World, threshold: int) -> tuple[str, int]:
    failed_checks = 0
    step = -1  # the first tick applies the first weight without analysis
    truth_p99, truth_errors = world.canary_truth()
    p99_limit = world.stable_p99 * 1.2  # a fixed threshold: there is no stable revision to compare with
    for minute in range(MAX_MINUTES):
        if failed_checks >= threshold:
            return "rolled-back", minute + 1
        if step < 0:
            step = 0
            continue
        served = serve(world, world.traffic(minute) * 60 * STEPS[step] / 100, truth_errors)
        passed = True
        if world.down(minute) or served.requests < 1:  # query error or empty result: a failed check
            failed_checks += 1
            passed = False
        else:
            if window_p99(truth_p99, [served]) > p99_limit:
                failed_checks += 1
                passed = False
            if window_rate([served]) > 0.01:
                failed_checks += 1
                passed = False
        if passed:
            step += 1
            if step == len(STEPS):
                return "promoted", minute + 1
    return "undecided", MAX_MINUTES


# ---------------------------------------------------------------------------------------------


@dataclass
class Tally:
    false_rollbacks: int = 0
    healthy: int = 0
    missed: int = 0
    regressed: int = 0
    undecided: int = 0
    minutes: list[int] = field(default_factory=list)

    def add(self, world: World, outcome: str, minutes: int) -> None:
        self.minutes.append(minutes)
        if outcome == "undecided":
            self.undecided += 1
        if world.regression is None:
            self.healthy += 1
            self.false_rollbacks += outcome == "rolled-back"
        else:
            self.regressed += 1
            self.missed += outcome == "promoted"

    def row(self, name: str) -> str:
        return (
            f"{name:<34} {100 * self.false_rollbacks / max(self.healthy, 1):>7.1f}% "
            f"{100 * self.missed / max(self.regressed, 1):>7.1f}% {statistics.median(self.minutes):>8.0f} "
            f"{self.undecided:>9}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=400)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    worlds = [World.draw(rng) for _ in range(args.rollouts)]
    deciders: list[tuple[str, Callable[[World], tuple[str, int]]]] = [
        ("kserve-canary (this project)", run_kserve_canary),
        ("Flagger semantics, threshold 2", lambda w: run_flagger_semantics(w, 2)),
        ("Flagger semantics, threshold 5", lambda w: run_flagger_semantics(w, 5)),
    ]
    tallies: dict[str, Tally] = {}
    for name, run in deciders:
        tally = Tally()
        for world in worlds:
            # Each decider sees the same world, with the same random draws.
            replay = World(**{**world.__dict__, "rng": random.Random(world.rng.random())})
            outcome, minutes = run(replay)
            tally.add(world, outcome, minutes)
        tallies[name] = tally
    healthy = sum(w.regression is None for w in worlds)
    print(
        f"{args.rollouts} simulated rollouts (seed {args.seed}): "
        f"{healthy} healthy, {args.rollouts - healthy} regressed;"
    )
    print(
        f"{sum(w.quiet is not None for w in worlds)} with a quiet period, "
        f"{sum(w.outage is not None for w in worlds)} with a Prometheus outage\n"
    )
    print(f"{'decider':<34} {'false rollbacks':>8} {'missed':>8} {'median min':>10} {'undecided':>9}")
    for name, tally in tallies.items():
        print(tally.row(name))
    ours = tallies["kserve-canary (this project)"]
    for name in list(tallies)[1:]:
        base = tallies[name]
        fr = (base.false_rollbacks / max(base.healthy, 1)) / max(
            ours.false_rollbacks / max(ours.healthy, 1), 1e-9
        )
        print(
            f"\nvs {name}: false-rollback rate {base.false_rollbacks}/{base.healthy} vs "
            f"{ours.false_rollbacks}/{ours.healthy}"
            + (f" ({fr:.1f}x fewer)" if ours.false_rollbacks else " (none here)")
            + f"; missed regressions {base.missed}/{base.regressed} vs {ours.missed}/{ours.regressed}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
