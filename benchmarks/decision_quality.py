"""Decision quality: kserve-canary's core against a Flagger-style rule, cell by cell, same worlds, same run.

Run: ``.venv/bin/python -m benchmarks.decision_quality [--rollouts N] [--seed S] [--cells KEY=V,V ...]
[--outage] [--jobs J] [--json PATH]``

Every cell runs exactly ``--rollouts`` rollouts (400 by default; deterministic for a seed).

**The worlds** (:mod:`canary_sandbox.worlds`): an InferenceService with a stable and a canary revision,
scraped every 15 s. Per interval each revision serves ``Poisson(rps × multiplier × share × 15 s)``
requests — the share read from the KServe simulator's status traffic, the multiplier 1 (Poisson) or
a Markov-modulated burst chain shared by both revisions (bursty: ×5 bursts, 10 % of intervals,
30 s long on average, mean rate kept); errors are binomial per request, in bursty worlds clustered
in error storms (×5, 10 % of intervals, shared by both revisions); latencies are lognormal per
revision (p50, p99), binned into Knative's real bucket layouts — OpenCensus (Knative ≤ 1.18) for
even-numbered rollouts, OpenTelemetry (≥ 1.19) for odd ones. ``--outage`` adds a Prometheus outage
(every query fails) of 5 minutes starting 1–10 minutes into every rollout.

**Placement** of the p99 limit ``L`` (1.25 × the stable p99, absolute or relative): ``edge`` — stable
p50 200 ms, p99 800 ms, ``L`` = 1 s, an edge of both layouts; ``wide`` — stable p50 300 ms, p99 1.2 s,
``L`` = 1.5 s inside the 1–2 s (OpenCensus) and 1–2.5 s (OpenTelemetry) buckets, where no edge lies
within the tolerance of the limit: there the tests cannot decide and the product follows its declared
horizon rule. The stable revision serves 0.3 % errors. The canary, per scenario:

=============  ===================================================================  ============
scenario       canary                                                               truth
=============  ===================================================================  ============
healthy        as stable                                                            promote
inside         p99 +10 % vs stable (inside the +25 % limit); errors at 60 % of      promote
               the limit (0.6 % / stable × 1.6 = 0.48 %)
tail           p99 40 % slower than stable (1.12 × ``L``), same median              roll back
median         every request ×2 (p99 1.6 × ``L``)                                  roll back
errors         errors 2.5 × the limit (2.5 % / 2.5 × 0.6 % = 1.5 %)                 roll back
load           healthy below 50 % of the traffic, the tail regression from 50 %     roll back
=============  ===================================================================  ============

Limits: *absolute* — p99 ≤ ``L``, errors ≤ 1 %; *relative* — p99 ≤ +25 % vs stable, errors ≤ +100 %
vs stable (minStable 0.1 %). Policies: steps 10, 30, 50, 100; interval 1m; minRequests 100;
failureLimit 2; window 2m, or 10m; the default horizon (each step's window and one more window).

**The deciders**, on worlds of the same spec and seed (the same bursts and storms at the same times):

* **kserve-canary**: the real :func:`canary.rollout.decide` driving
  :class:`canary.kserve.status_model.KServeSim`, ticking every 15 s; its evidence is the world's
  answer to :func:`canary.rollout.evidence_request`.
* **Flagger-style rule**: every minute, the last minute's p99 (``histogram_quantile`` over the
  minute's buckets) and error rate; an empty or NaN result or a query error is a failed check;
  failed checks are never reset, 5 of them roll back (Flagger's ``threshold``); a passing analysis
  advances a step (10 → 30 → 50 → promoted); the policy's limits, the relative ones against the stable
  revision's last-minute value (and its minStable).

**Per cell**: the share of right decisions (a promotion of a healthy/inside canary, a rollback of a
regressed one; undecided after 180 minutes is wrong) with its Monte-Carlo standard error, the median
and 95th-percentile minutes to the decision (undecided counted as 180), the share decided at a
horizon on the estimate, promotions in which a held step served fewer canary requests than
minRequests, and **the fixed-sample bound**: the canary requests a fixed-sample test of the same
hypotheses needs (one-sided, errors 1 − confidence each way: the canary's true share slower than
``L`` — or its true error rate — against the allowed one; for a promotion the slowest of the checks,
for a regression the fastest), in minutes at the last step's 50 % of the traffic.

**Targets** (in ``edge`` cells; each printed met / NOT met with its numbers):

1. at ≥ 20 requests/s: ≥ 99 % right in every cell; median minutes ≤ the larger of 2 × the
   Flagger-style rule's and 1.5 × the policy's hold floor (the sum of its windows);
2. at 2 requests/s: ≥ 90 % right in every cell with a median under 60 minutes; the mean share right
   no worse than the Flagger-style rule's;
3. no rollout undecided (past every horizon); a pause at a horizon counts as not right;
4. never a promotion below minRequests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from statistics import NormalDist
from typing import Any

from canary_sandbox.worlds import (
    LAYOUTS,
    SCRAPE_INTERVAL,
    Arrivals,
    Behaviour,
    Bursts,
    Latency,
    RevisionModel,
    World,
    WorldSpec,
    histogram_quantile,
)
from rich.console import Console
from rich.table import Table

from canary.kserve.status_model import KServeSim
from canary.policy.model import PromotionPolicy
from canary.rollout import Action, RolloutState, decide, evidence_request

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
TICK = timedelta(seconds=SCRAPE_INTERVAL)  # the controller's decision tick
MAX_MINUTES = 180
STEPS = (10, 30, 50)
MIN_REQUESTS = 100
FLAGGER_THRESHOLD = 5
DEFAULT_ROLLOUTS = 400
CONFIDENCE = 0.95

# The stable revision per placement of the p99 limit, and the limits.
STABLES = {
    "edge": Behaviour(Latency(0.2, 0.8), 0.003),  # L = 1 s: an edge of both layouts
    "wide": Behaviour(Latency(0.3, 1.2), 0.003),  # L = 1.5 s: inside 1–2 s / 1–2.5 s
}
P99_INCREASE = 0.25
ERRORS_MAX = 0.01
ERRORS_INCREASE = 1.0
MIN_STABLE = 0.001
TOLERANCE = 0.1

WINDOWS = ("2m", "10m")
LIMITS = ("absolute", "relative")
ARRIVALS = ("poisson", "bursty")
RATES = (2.0, 20.0, 200.0)
SCENARIOS = ("healthy", "inside", "tail", "median", "errors", "load")
PLACEMENTS = ("edge", "wide")
PROMOTE = {"healthy", "inside"}


def p99_limit(placement: str) -> float:
    return STABLES[placement].latency.p99 * (1 + P99_INCREASE)


def policy(window: str, limits: str, placement: str = "edge") -> PromotionPolicy:
    if limits == "absolute":
        checks: list[dict[str, Any]] = [
            {"name": "p99", "metric": "latency", "quantile": 0.99, "max": f"{p99_limit(placement):g}s"},
            {"name": "errors", "metric": "error-rate", "max": f"{ERRORS_MAX:.0%}"},
        ]
    else:
        checks = [
            {"name": "p99", "metric": "latency", "quantile": 0.99, "maxIncrease": f"{P99_INCREASE:.0%}"},
            {
                "name": "errors",
                "metric": "error-rate",
                "maxIncrease": f"{ERRORS_INCREASE:.0%}",
                "minStable": f"{MIN_STABLE:.1%}",
            },
        ]
    return PromotionPolicy.model_validate(
        {
            "apiVersion": "kserve-canary.dev/v1alpha1",
            "kind": "PromotionPolicy",
            "metadata": {"name": "bench", "namespace": "ml"},
            "spec": {
                "target": {"inferenceService": "llama"},
                "steps": [*STEPS, 100],
                "window": window,
                "interval": "1m",
                "minRequests": MIN_REQUESTS,
                "progressDeadline": "15m",
                "failureLimit": 2,
                "confidence": f"{CONFIDENCE:.0%}",
                "onNoData": {"after": "30m", "action": "hold"},
                "checks": checks,
            },
        }
    )


def _allowed_errors(limits: str, stable: Behaviour) -> float:
    return ERRORS_MAX if limits == "absolute" else stable.error_rate * (1 + ERRORS_INCREASE)


def canary_model(scenario: str, limits: str, placement: str = "edge") -> RevisionModel:
    """The canary's truth in a scenario (see the module docstring's table)."""
    stable = STABLES[placement]
    latency, errors = stable.latency, stable.error_rate
    allowed = _allowed_errors(limits, stable)
    tail = Behaviour(latency.with_p99(1.4 * latency.p99), errors)
    if scenario == "healthy":
        return RevisionModel(stable)
    if scenario == "inside":
        inside_errors = 0.6 * ERRORS_MAX if limits == "absolute" else errors * (1 + 0.6 * ERRORS_INCREASE)
        return RevisionModel(Behaviour(latency.with_p99(latency.p99 * 1.1), inside_errors))
    if scenario == "tail":
        return RevisionModel(tail)
    if scenario == "median":
        return RevisionModel(Behaviour(latency.scaled(2.0), errors))
    if scenario == "errors":
        return RevisionModel(Behaviour(latency, 2.5 * allowed))
    if scenario == "load":
        return RevisionModel(stable, loaded=tail, load_share=0.5)
    raise ValueError(f"unknown scenario {scenario!r}")


@dataclass(frozen=True, slots=True)
class Cell:
    window: str
    limits: str
    arrivals: str
    rps: float
    scenario: str
    placement: str = "edge"

    @property
    def truth(self) -> str:
        return "promoted" if self.scenario in PROMOTE else "rolled-back"

    @property
    def world_key(self) -> str:  # what the worlds depend on (not the window)
        return f"{self.limits}/{self.arrivals}/{self.rps:g}/{self.scenario}/{self.placement}"

    @property
    def resolvable(self) -> bool:
        """Whether an edge of every layout lies within the tolerance of the p99 limit."""
        limit = p99_limit(self.placement)
        return all(
            any(limit / (1 + TOLERANCE) <= edge <= limit * (1 + TOLERANCE) for edge in edges)
            for edges in LAYOUTS.values()
        )

    @property
    def hold_floor_minutes(self) -> float:
        return len(STEPS) * float(self.window.rstrip("m"))


def world_spec(cell: Cell, index: int, *, outage: bool, rng: random.Random) -> WorldSpec:
    outages: tuple[tuple[float, float], ...] = ()
    if outage:
        start = rng.uniform(60.0, 600.0)
        outages = ((start, start + 300.0),)
    bursty = cell.arrivals == "bursty"
    return WorldSpec(
        rps=cell.rps,
        stable=RevisionModel(STABLES[cell.placement]),
        canary=canary_model(cell.scenario, cell.limits, cell.placement),
        arrivals=Arrivals.BURSTY if bursty else Arrivals.POISSON,
        error_bursts=Bursts() if bursty else None,
        layout="opencensus" if index % 2 == 0 else "otel",
        outages=outages,
    )


def fixed_sample_requests(cell: Cell) -> float:
    """The canary requests a fixed-sample test of the same hypotheses needs (see the docstring)."""
    stable = STABLES[cell.placement]
    canary = canary_model(cell.scenario, cell.limits, cell.placement).at_share(0.5)
    limit = p99_limit(cell.placement)
    shares = (
        (1.0 - canary.latency.cdf(limit), 0.01),
        (canary.error_rate, _allowed_errors(cell.limits, stable)),
    )
    z = NormalDist().inv_cdf(CONFIDENCE)
    sizes = []
    for true, allowed in shares:
        if math.isclose(true, allowed):
            sizes.append(math.inf)
            continue
        spread = z * (math.sqrt(allowed * (1 - allowed)) + math.sqrt(true * (1 - true)))
        sizes.append((spread / (true - allowed)) ** 2)
    if cell.truth == "promoted":
        return max(sizes)
    return min(size for (true, allowed), size in zip(shares, sizes, strict=True) if true > allowed)


@dataclass(frozen=True, slots=True)
class Outcome:
    decision: str  # promoted | rolled-back | paused | undecided
    minutes: float
    below_min_requests: bool  # promoted although a held step served < minRequests canary requests
    at_horizon: bool = False  # decided on an estimate at a horizon


def _outcome(decision: str, now: datetime, world: World, *, at_horizon: bool = False) -> Outcome:
    minutes = (now - T0).total_seconds() / 60.0
    below = False
    if decision == "promoted":
        served: dict[float, int] = {}
        for tally, share in zip(world.tallies("canary"), world.shares("canary"), strict=True):
            served[share] = served.get(share, 0) + tally.requests
        below = any(served.get(step / 100, 0) < MIN_REQUESTS for step in STEPS)
    return Outcome(decision, minutes, below, at_horizon)


# ---------------------------------------------------------------------------------------------
# kserve-canary: the real core


def run_kserve_canary(rollout_policy: PromotionPolicy, spec: WorldSpec, seed: int) -> Outcome:
    world = World(spec, start=T0, seed=seed)
    sim = KServeSim.serving()
    state = decide(rollout_policy, sim.observe(), RolloutState(), None, T0 - TICK).new_state
    sim.change_model("s3://m/v2")
    sim.reconcile()
    canary = sim.latest_created
    ticks = int(MAX_MINUTES * 60 / TICK.total_seconds())
    now = T0
    for tick in range(ticks + 1):
        now = T0 + TICK * tick
        observed = sim.observe()
        world.advance(now, observed.weight_of(canary) / 100)
        request = evidence_request(rollout_policy, observed, state, now)
        evidence = world.evidence(request) if request is not None else None
        decision = decide(rollout_policy, observed, state, evidence, now)
        state = decision.new_state
        if decision.action.writes:
            sim.set_percent(decision.weight)
        sim.reconcile()
        if tick == 0:  # the canary becomes Ready at once: model loading is not what is measured here
            sim.make_ready()
            sim.reconcile()
        horizon = any("at the horizon" in reason for reason in decision.reasons)
        if decision.action is Action.ROLLBACK:
            return _outcome("rolled-back", now, world, at_horizon=horizon)
        if decision.action is Action.PROMOTE:
            return _outcome("promoted", now, world, at_horizon=horizon)
        if decision.action is Action.PAUSE:
            return _outcome("paused", now, world, at_horizon=horizon)
    return _outcome("undecided", now, world)


# ---------------------------------------------------------------------------------------------
# The Flagger-style rule (baseline)


def run_flagger_rule(cell: Cell, spec: WorldSpec, seed: int) -> Outcome:
    world = World(spec, start=T0, seed=seed)
    step, failed = 0, 0
    minute = timedelta(minutes=1)
    now = T0
    for elapsed in range(1, MAX_MINUTES + 1):
        now = T0 + minute * elapsed
        world.advance(now, STEPS[step] / 100)
        if world.down(now) or not _flagger_checks_pass(world, cell, now - minute, now):
            failed += 1
            if failed >= FLAGGER_THRESHOLD:
                return _outcome("rolled-back", now, world)
            continue
        step += 1
        if step == len(STEPS):
            return _outcome("promoted", now, world)
    return _outcome("undecided", now, world)


def _flagger_checks_pass(world: World, cell: Cell, start: datetime, end: datetime) -> bool:
    canary = world.total("canary", start, end)
    p99 = histogram_quantile(0.99, canary.histograms["latency"])
    errors = canary.errors / canary.requests if canary.requests else math.nan
    if math.isnan(p99) or math.isnan(errors):
        return False
    if cell.limits == "absolute":
        return p99 <= p99_limit(cell.placement) and errors <= ERRORS_MAX
    stable = world.total("stable", start, end)
    stable_p99 = histogram_quantile(0.99, stable.histograms["latency"])
    stable_errors = stable.errors / stable.requests if stable.requests else math.nan
    if math.isnan(stable_p99) or math.isnan(stable_errors):
        return False
    if p99 > stable_p99 * (1 + P99_INCREASE):
        return False
    return stable_errors < MIN_STABLE or errors <= stable_errors * (1 + ERRORS_INCREASE)


# ---------------------------------------------------------------------------------------------
# Cells


@dataclass
class Score:
    rollouts: int = 0
    right: int = 0
    promoted: int = 0
    undecided: int = 0
    paused: int = 0
    at_horizon: int = 0
    below_min_requests: int = 0
    minutes: list[float] = field(default_factory=list)

    def add(self, outcome: Outcome, truth: str) -> None:
        self.rollouts += 1
        self.right += outcome.decision == truth
        self.promoted += outcome.decision == "promoted"
        self.undecided += outcome.decision == "undecided"
        self.paused += outcome.decision == "paused"
        self.at_horizon += outcome.at_horizon
        self.below_min_requests += outcome.below_min_requests
        self.minutes.append(outcome.minutes)

    @property
    def share(self) -> float:
        return self.right / self.rollouts if self.rollouts else math.nan

    @property
    def standard_error(self) -> float:
        p = self.share
        return math.sqrt(p * (1 - p) / self.rollouts) if self.rollouts else math.nan

    @property
    def median(self) -> float:
        return statistics.median(self.minutes) if self.minutes else math.nan

    @property
    def p95(self) -> float:
        if not self.minutes:
            return math.nan
        ordered = sorted(self.minutes)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]

    def summary(self) -> dict[str, Any]:
        return {
            "rollouts": self.rollouts,
            "right": self.right,
            "share_right": self.share,
            "standard_error": self.standard_error,
            "median_minutes": self.median,
            "p95_minutes": self.p95,
            "promoted": self.promoted,
            "undecided": self.undecided,
            "paused": self.paused,
            "decided_at_horizon": self.at_horizon,
            "promotions_below_min_requests": self.below_min_requests,
        }


def all_cells() -> list[Cell]:
    return [
        Cell(window, limits, arrivals, rps, scenario, placement)
        for placement in PLACEMENTS
        for window in WINDOWS
        for limits in LIMITS
        for arrivals in ARRIVALS
        for rps in RATES
        for scenario in SCENARIOS
    ]


_FILTERS = ("window", "limits", "arrivals", "rps", "scenario", "placement")


def select_cells(filters: Sequence[str]) -> list[Cell]:
    """``KEY=V[,V...]`` filters (window, limits, arrivals, rps, scenario, placement), all of which must
    match."""
    wanted: dict[str, set[str]] = {}
    for item in filters:
        key, _, values = item.partition("=")
        if key not in _FILTERS or not values:
            raise SystemExit(f"--cells: {item!r} is not KEY=V[,V...] with KEY {'|'.join(_FILTERS)}")
        wanted.setdefault(key, set()).update(values.split(","))

    def matches(cell: Cell) -> bool:
        fields = {
            "window": cell.window,
            "limits": cell.limits,
            "arrivals": cell.arrivals,
            "rps": f"{cell.rps:g}",
            "scenario": cell.scenario,
            "placement": cell.placement,
        }
        return all(fields[key] in values for key, values in wanted.items())

    cells = [cell for cell in all_cells() if matches(cell)]
    if not cells:
        raise SystemExit(f"--cells {' '.join(filters)}: no cell matches")
    return cells


def rollout_seed(seed: int, cell: Cell, index: int) -> int:
    return random.Random(f"{seed}/{cell.world_key}/{index}").getrandbits(63)


@dataclass
class CellResult:
    cell: Cell
    ours: Score
    flagger: Score
    seconds: float = 0.0  # wall time the cell took


def run_cell(cell: Cell, rollouts: int, seed: int, *, outage: bool) -> CellResult:
    """``rollouts`` rollouts of one cell; both deciders run on the same worlds (indexes 0, 1, ...)."""
    rollout_policy = policy(cell.window, cell.limits, cell.placement)
    ours, flagger = Score(), Score()
    started = time.perf_counter()
    for index in range(rollouts):
        world_seed = rollout_seed(seed, cell, index)
        spec = world_spec(cell, index, outage=outage, rng=random.Random(world_seed))
        ours.add(run_kserve_canary(rollout_policy, spec, world_seed), cell.truth)
        flagger.add(run_flagger_rule(cell, spec, world_seed), cell.truth)
    return CellResult(cell, ours, flagger, time.perf_counter() - started)


def run_cells(
    cells: Sequence[Cell], rollouts: int, seed: int, *, outage: bool, jobs: int = 1, progress: bool = False
) -> list[CellResult]:
    if jobs <= 1:
        results = []
        for number, cell in enumerate(cells, 1):
            results.append(run_cell(cell, rollouts, seed, outage=outage))
            if progress:
                print(
                    f"[{number}/{len(cells)}] {_name(cell)}: {results[-1].seconds:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        return results
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_cell, cell, rollouts, seed, outage=outage) for cell in cells]
        return [future.result() for future in futures]


# ---------------------------------------------------------------------------------------------
# Targets


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    met: bool
    numbers: str


def targets(results: Sequence[CellResult]) -> list[Target]:
    resolvable = [r for r in results if r.cell.resolvable]
    found = _busy_targets([r for r in resolvable if r.cell.rps >= 20])
    found += _quiet_targets([r for r in resolvable if r.cell.rps < 20])
    undecided = sum(r.ours.undecided + r.ours.paused for r in results)
    found.append(
        Target(
            "no rollout undecided or paused (every cell)",
            undecided == 0,
            f"{undecided} of {sum(r.ours.rollouts for r in results)} rollouts",
        )
    )
    too_few = sum(r.ours.below_min_requests for r in results)
    promoted = sum(r.ours.promoted for r in results)
    flagger_below = sum(r.flagger.below_min_requests for r in results)
    flagger_promoted = sum(r.flagger.promoted for r in results)
    found.append(
        Target(
            "never a promotion below minRequests",
            too_few == 0,
            f"{too_few} of {promoted} promotions (the Flagger-style rule, which has no minRequests: "
            f"{flagger_below} of {flagger_promoted})",
        )
    )
    return found


def _busy_targets(busy: Sequence[CellResult]) -> list[Target]:
    if not busy:
        return []
    worst = min(busy, key=lambda r: r.ours.share)
    missed = [r for r in busy if r.ours.share < 0.99]
    slow = [r for r in busy if r.ours.median > _time_target(r)]
    slowest = max(busy, key=lambda r: r.ours.median / _time_target(r))
    return [
        Target(
            "≥ 20 requests/s, resolvable limits: ≥ 99 % right in every cell",
            not missed,
            f"{len(missed)} of {len(busy)} cells below; worst {_pct(worst.ours)} in {_name(worst.cell)}",
        ),
        Target(
            "≥ 20 requests/s: median ≤ max(2 × the Flagger-style rule's, 1.5 × the hold floor)",
            not slow,
            f"{len(slow)} of {len(busy)} cells above; worst {slowest.ours.median:g} min against "
            f"{_time_target(slowest):g} in {_name(slowest.cell)}",
        ),
    ]


def _time_target(result: CellResult) -> float:
    return max(2.0 * result.flagger.median, 1.5 * result.cell.hold_floor_minutes)


def _quiet_targets(quiet: Sequence[CellResult]) -> list[Target]:
    if not quiet:
        return []
    missed = [r for r in quiet if r.ours.share < 0.90 or r.ours.median >= 60]
    worst = min(quiet, key=lambda r: r.ours.share)
    parts, met = [], True
    for window in WINDOWS:
        cells = [r for r in quiet if r.cell.window == window]
        if cells:
            ours_mean = statistics.fmean(r.ours.share for r in cells)
            flagger_mean = statistics.fmean(r.flagger.share for r in cells)
            met = met and ours_mean >= flagger_mean
            parts.append(f"window {window}: {100 * ours_mean:.1f} % vs {100 * flagger_mean:.1f} %")
    return [
        Target(
            "2 requests/s: ≥ 90 % right with a median under 60 min in every cell",
            not missed,
            f"{len(missed)} of {len(quiet)} cells miss; worst {_pct(worst.ours)}, median "
            f"{worst.ours.median:g} min in {_name(worst.cell)}",
        ),
        Target(
            "2 requests/s: mean share right no worse than the Flagger-style rule's", met, "; ".join(parts)
        ),
    ]


def _pct(score: Score) -> str:
    return f"{100 * score.share:.1f} % ± {100 * score.standard_error:.1f}"


def _name(cell: Cell) -> str:
    return f"{cell.placement}/{cell.window}/{cell.limits}/{cell.arrivals}/{cell.rps:g} rps/{cell.scenario}"


# ---------------------------------------------------------------------------------------------
# Output


def table(results: Sequence[CellResult], title: str) -> Table:
    grid = Table(title=title, title_justify="left", show_lines=False, pad_edge=False)
    columns = ("window", "limits", "arrivals", "req/s", "scenario", "truth", "n", "kserve-canary right")
    columns += ("median", "p95", "horizon", "undecided", "bound min", "Flagger-style right", "median ")
    for name in columns:
        grid.add_column(
            name, justify="left" if name in ("window", "limits", "arrivals", "scenario") else "right"
        )
    for result in results:
        cell, ours, flagger = result.cell, result.ours, result.flagger
        bound = fixed_sample_requests(cell) / (cell.rps * 0.5) / 60.0
        grid.add_row(
            cell.window,
            cell.limits,
            cell.arrivals,
            f"{cell.rps:g}",
            cell.scenario,
            "promote" if cell.truth == "promoted" else "roll back",
            f"{ours.rollouts}",
            _pct(ours),
            f"{ours.median:g}",
            f"{ours.p95:g}",
            f"{ours.at_horizon / max(ours.rollouts, 1):.0%}",
            f"{ours.undecided + ours.paused}",
            f"{bound:.1f}" if math.isfinite(bound) else "∞",
            _pct(flagger),
            f"{flagger.median:g}",
        )
    return grid


def _commit() -> str:
    """The commit measured: ``git rev-parse`` where the code lives, else $KSERVE_CANARY_COMMIT."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("KSERVE_CANARY_COMMIT", "unknown")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=DEFAULT_ROLLOUTS, help="rollouts per cell")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (cells in parallel)")
    parser.add_argument("--progress", action="store_true", help="a line per cell on stderr (one job)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--cells",
        nargs="*",
        default=[],
        metavar="KEY=V[,V]",
        help="only the cells matching every filter: window=2m,10m limits=absolute,relative "
        "arrivals=poisson,bursty rps=2,20,200 scenario=healthy,inside,tail,median,errors,load "
        "placement=edge,wide",
    )
    parser.add_argument("--outage", action="store_true", help="a 5-minute Prometheus outage in every rollout")
    parser.add_argument("--json", type=Path, help="write the results there")
    args = parser.parse_args(argv)
    cells = select_cells(args.cells)
    started = time.perf_counter()
    results = run_cells(
        cells, args.rollouts, args.seed, outage=args.outage, jobs=args.jobs, progress=args.progress
    )
    runtime = time.perf_counter() - started
    commit = _commit()
    console = Console(width=max(200, Console().width), highlight=False)
    console.print(
        f"{len(cells)} cells × {args.rollouts} rollouts per decider (seed {args.seed}; commit {commit}"
        + (", Prometheus outage in every rollout" if args.outage else "")
        + f") in {runtime:.0f} s with {args.jobs} job(s); right share ± Monte-Carlo standard error; "
        f"median and p95 minutes to the decision (undecided = {MAX_MINUTES}); horizon: share decided on "
        "an estimate at a horizon; bound min: the fixed-sample test's requests at 50 % of the traffic"
    )
    for placement in PLACEMENTS:
        chosen = [r for r in results if r.cell.placement == placement]
        if chosen:
            title = (
                "limits at an edge" if placement == "edge" else "limits inside a wide bucket (unresolvable)"
            )
            console.print(table(chosen, f"decision quality per cell — {title}"))
    found = targets(results)
    for target in found:
        console.print(f"{'met' if target.met else 'NOT met'}: {target.name} — {target.numbers}")
    if args.json is not None:
        document = {
            "meta": {
                "seed": args.seed,
                "rollouts_per_cell": args.rollouts,
                "jobs": args.jobs,
                "outage": args.outage,
                "commit": commit,
                "runtime_seconds": runtime,
                "python": sys.version.split()[0],
            },
            "cells": [
                {
                    **asdict(r.cell),
                    "truth": r.cell.truth,
                    "resolvable": r.cell.resolvable,
                    "fixed_sample_requests": fixed_sample_requests(r.cell),
                    "kserve_canary": r.ours.summary(),
                    "flagger_rule": r.flagger.summary(),
                }
                for r in results
            ],
            "targets": [asdict(target) for target in found],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
