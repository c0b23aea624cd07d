"""Decision quality: kserve-canary's core against a Flagger-style rule, cell by cell, same worlds, same run.

Run: ``.venv/bin/python -m benchmarks.decision_quality [--rollouts N] [--budget SECONDS] [--seed S]
[--cells KEY=V,V ...] [--outage] [--jobs J] [--json PATH]``

A run has a wall-time budget (``--budget``, 300 s by default, shared by the cells: each gets what is
left divided by the cells left): a cell runs rollouts 0, 1, 2, ... until ``--rollouts`` (400) or its
share of the budget is spent, and never fewer than 2 — so a cell whose rollouts are slow (one the
judge leaves undecided for 240 simulated minutes costs seconds) has few of them, and the table says
how many (``n``) next to the standard error. ``--budget 0`` runs exactly ``--rollouts`` per cell
(deterministic for a seed).

**The worlds** (:mod:`canary_sandbox.worlds`): an InferenceService with a stable and a canary revision,
scraped every 15 s. Per interval each revision serves ``Poisson(rps × multiplier × share × 15 s)``
requests — the share read from the KServe simulator's status traffic, the multiplier 1 (Poisson) or
a Markov-modulated burst chain shared by both revisions (bursty: ×5 bursts, 10 % of intervals,
30 s long on average, mean rate kept); errors are binomial per request, in bursty worlds clustered
in error storms (×5, 10 % of intervals, shared by both revisions); latencies are lognormal per
revision (p50, p99), binned into Knative's real bucket layouts — OpenCensus (Knative ≤ 1.18) for
even-numbered rollouts, OpenTelemetry (≥ 1.19) for odd ones. ``--outage`` adds a Prometheus outage
(every query fails) of 5 minutes starting 1–10 minutes into every rollout.

The stable revision: p50 150 ms, p99 600 ms, 0.3 % errors. The canary, per scenario:

=============  ==================================================================  ============
scenario       canary (absolute limits / relative limits)                          truth
=============  ==================================================================  ============
healthy        as stable                                                           promote
inside         p99 +10 % vs stable (660 ms); errors at 60 % of the limit           promote
               (0.6 % / stable × 1.6 = 0.48 %)
tail           p99 1.4 × the limit (1.4 s / 1.4 × 750 ms = 1.05 s), same median    roll back
median         every request ×2 (p50 300 ms, p99 1.2 s)                            roll back
errors         errors 2.5 × the limit (2.5 % / 2.5 × 0.6 % = 1.5 %)                roll back
load           healthy below 50 % of the traffic, the tail regression from 50 %    roll back
=============  ==================================================================  ============

Limits: *absolute* — p99 ≤ 1 s, errors ≤ 1 %; *relative* — p99 ≤ +25 % vs stable, errors ≤ +100 %
vs stable (minStable 0.1 %). Policies: steps 10, 30, 50, 100; interval 1m; minRequests 100;
failureLimit 2; window 2m, or 10m.

**The deciders**, on worlds of the same spec and seed (the same bursts and storms at the same times):

* **kserve-canary**: the real :func:`canary.rollout.decide` (whatever judge is on main) driving
  :class:`canary.kserve.status_model.KServeSim`, ticking every 15 s; its evidence is the world's
  answer to :func:`canary.rollout.evidence_request` — count series of both revisions over the
  rollout so far and point measurements over the window (``--min-samples`` 20).
* **Flagger-style rule**: every minute, the last minute's p99 (``histogram_quantile`` over the
  minute's buckets) and error rate; an empty or NaN result or a query error is a failed check;
  one failed analysis is one failed check, failed checks are never reset, 5 of them roll back
  (Flagger's ``threshold``); a passing analysis advances a step (10 → 30 → 50 → promoted); the
  policy's limits, the relative ones against the stable revision's last-minute value (and its
  minStable). It does not depend on the window: its numbers differ between the two windows' cells
  only by the worlds drawn (the same seeds, possibly not as many).

**Per cell**: the share of right decisions (a promotion of a healthy/inside canary, a rollback of
a regressed one; undecided after 240 minutes is wrong) with its Monte-Carlo standard error, the
median minutes to the decision (undecided counted as 240), and promotions in which a held step
served fewer canary requests than minRequests.

**Targets** (each printed met / NOT met with its numbers):

1. ≥ 99 % right in every cell at ≥ 20 requests/s;
2. with a 2-minute window, the median time to the decision ≤ 2 × the Flagger-style rule's, in every
   cell;
3. at 2 requests/s, the mean share right over the cells no worse than the Flagger-style rule's (per
   window);
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
from typing import Any

from canary_sandbox.worlds import (
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
MAX_MINUTES = 240
STEPS = (10, 30, 50)
MIN_REQUESTS = 100
FLAGGER_THRESHOLD = 5
DEFAULT_ROLLOUTS = 400
DEFAULT_BUDGET = 300.0  # seconds for the whole run (0: no budget, exactly --rollouts per cell)
MIN_ROLLOUTS = 2

# The stable revision and the limits.
STABLE = Behaviour(Latency(0.15, 0.6), 0.003)
P99_MAX = 1.0
ERRORS_MAX = 0.01
P99_INCREASE = 0.25
ERRORS_INCREASE = 1.0
MIN_STABLE = 0.001

WINDOWS = ("2m", "10m")
LIMITS = ("absolute", "relative")
ARRIVALS = ("poisson", "bursty")
RATES = (2.0, 20.0, 200.0)
SCENARIOS = ("healthy", "inside", "tail", "median", "errors", "load")
PROMOTE = {"healthy", "inside"}


def policy(window: str, limits: str) -> PromotionPolicy:
    if limits == "absolute":
        checks: list[dict[str, Any]] = [
            {"name": "p99", "metric": "latency", "quantile": 0.99, "max": f"{P99_MAX:g}s"},
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
                "onNoData": {"after": "30m", "action": "hold"},
                "checks": checks,
            },
        }
    )


def canary_model(scenario: str, limits: str) -> RevisionModel:
    """The canary's truth in a scenario (see the module docstring's table)."""
    latency, errors = STABLE.latency, STABLE.error_rate
    absolute = limits == "absolute"
    p99_limit = P99_MAX if absolute else latency.p99 * (1 + P99_INCREASE)
    errors_limit = ERRORS_MAX if absolute else errors * (1 + ERRORS_INCREASE)
    tail = Behaviour(latency.with_p99(1.4 * p99_limit), errors)
    if scenario == "healthy":
        return RevisionModel(STABLE)
    if scenario == "inside":
        inside_errors = 0.6 * ERRORS_MAX if absolute else errors * (1 + 0.6 * ERRORS_INCREASE)
        return RevisionModel(Behaviour(latency.with_p99(latency.p99 * 1.1), inside_errors))
    if scenario == "tail":
        return RevisionModel(tail)
    if scenario == "median":
        return RevisionModel(Behaviour(latency.scaled(2.0), errors))
    if scenario == "errors":
        return RevisionModel(Behaviour(latency, 2.5 * errors_limit))
    if scenario == "load":
        return RevisionModel(STABLE, loaded=tail, load_share=0.5)
    raise ValueError(f"unknown scenario {scenario!r}")


@dataclass(frozen=True, slots=True)
class Cell:
    window: str
    limits: str
    arrivals: str
    rps: float
    scenario: str

    @property
    def truth(self) -> str:
        return "promoted" if self.scenario in PROMOTE else "rolled-back"

    @property
    def world_key(self) -> str:  # what the worlds depend on (not the window)
        return f"{self.limits}/{self.arrivals}/{self.rps:g}/{self.scenario}"


def world_spec(cell: Cell, index: int, *, outage: bool, rng: random.Random) -> WorldSpec:
    outages: tuple[tuple[float, float], ...] = ()
    if outage:
        start = rng.uniform(60.0, 600.0)
        outages = ((start, start + 300.0),)
    bursty = cell.arrivals == "bursty"
    return WorldSpec(
        rps=cell.rps,
        stable=RevisionModel(STABLE),
        canary=canary_model(cell.scenario, cell.limits),
        arrivals=Arrivals.BURSTY if bursty else Arrivals.POISSON,
        error_bursts=Bursts() if bursty else None,
        layout="opencensus" if index % 2 == 0 else "otel",
        outages=outages,
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    decision: str  # promoted | rolled-back | undecided
    minutes: float
    below_min_requests: bool  # promoted although a held step served < minRequests canary requests


def _outcome(decision: str, now: datetime, world: World) -> Outcome:
    minutes = (now - T0).total_seconds() / 60.0
    below = False
    if decision == "promoted":
        served: dict[float, int] = {}
        for tally, share in zip(world.tallies("canary"), world.shares("canary"), strict=True):
            served[share] = served.get(share, 0) + tally.requests
        below = any(served.get(step / 100, 0) < MIN_REQUESTS for step in STEPS)
    return Outcome(decision, minutes, below)


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
        if decision.action is Action.ROLLBACK:
            return _outcome("rolled-back", now, world)
        if decision.action is Action.PROMOTE:
            return _outcome("promoted", now, world)
    return _outcome("undecided", now, world)


# ---------------------------------------------------------------------------------------------
# The Flagger-style rule (baseline)


def run_flagger_rule(limits: str, spec: WorldSpec, seed: int) -> Outcome:
    world = World(spec, start=T0, seed=seed)
    step, failed = 0, 0
    minute = timedelta(minutes=1)
    now = T0
    for elapsed in range(1, MAX_MINUTES + 1):
        now = T0 + minute * elapsed
        world.advance(now, STEPS[step] / 100)
        if world.down(now) or not _flagger_checks_pass(world, limits, now - minute, now):
            failed += 1
            if failed >= FLAGGER_THRESHOLD:
                return _outcome("rolled-back", now, world)
            continue
        step += 1
        if step == len(STEPS):
            return _outcome("promoted", now, world)
    return _outcome("undecided", now, world)


def _flagger_checks_pass(world: World, limits: str, start: datetime, end: datetime) -> bool:
    canary = world.total("canary", start, end)
    p99 = histogram_quantile(0.99, canary.histograms["latency"])
    errors = canary.errors / canary.requests if canary.requests else math.nan
    if math.isnan(p99) or math.isnan(errors):
        return False
    if limits == "absolute":
        return p99 <= P99_MAX and errors <= ERRORS_MAX
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
    below_min_requests: int = 0
    minutes: list[float] = field(default_factory=list)

    def add(self, outcome: Outcome, truth: str) -> None:
        self.rollouts += 1
        self.right += outcome.decision == truth
        self.promoted += outcome.decision == "promoted"
        self.undecided += outcome.decision == "undecided"
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

    def summary(self) -> dict[str, Any]:
        return {
            "rollouts": self.rollouts,
            "right": self.right,
            "share_right": self.share,
            "standard_error": self.standard_error,
            "median_minutes": self.median,
            "promoted": self.promoted,
            "undecided": self.undecided,
            "promotions_below_min_requests": self.below_min_requests,
        }


def all_cells() -> list[Cell]:
    return [
        Cell(window, limits, arrivals, rps, scenario)
        for window in WINDOWS
        for limits in LIMITS
        for arrivals in ARRIVALS
        for rps in RATES
        for scenario in SCENARIOS
    ]


def select_cells(filters: Sequence[str]) -> list[Cell]:
    """``KEY=V[,V...]`` filters (window, limits, arrivals, rps, scenario), all of which must match."""
    wanted: dict[str, set[str]] = {}
    for item in filters:
        key, _, values = item.partition("=")
        if key not in {"window", "limits", "arrivals", "rps", "scenario"} or not values:
            raise SystemExit(
                f"--cells: {item!r} is not KEY=V[,V...] with KEY window|limits|arrivals|rps|scenario"
            )
        wanted.setdefault(key, set()).update(values.split(","))

    def matches(cell: Cell) -> bool:
        fields = {
            "window": cell.window,
            "limits": cell.limits,
            "arrivals": cell.arrivals,
            "rps": f"{cell.rps:g}",
            "scenario": cell.scenario,
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


def run_cell(cell: Cell, rollouts: int, seed: int, *, outage: bool, seconds: float | None) -> CellResult:
    """Up to ``rollouts`` rollouts of one cell; with ``seconds``, stop once they are spent (at least
    :data:`MIN_ROLLOUTS`). Both deciders run on the same worlds (rollout indexes 0, 1, ...)."""
    rollout_policy = policy(cell.window, cell.limits)
    ours, flagger = Score(), Score()
    started = time.perf_counter()
    for index in range(rollouts):
        if seconds is not None and index >= MIN_ROLLOUTS and time.perf_counter() - started >= seconds:
            break
        world_seed = rollout_seed(seed, cell, index)
        spec = world_spec(cell, index, outage=outage, rng=random.Random(world_seed))
        ours.add(run_kserve_canary(rollout_policy, spec, world_seed), cell.truth)
        flagger.add(run_flagger_rule(cell.limits, spec, world_seed), cell.truth)
    return CellResult(cell, ours, flagger, time.perf_counter() - started)


def run_cells(
    cells: Sequence[Cell],
    rollouts: int,
    seed: int,
    *,
    outage: bool,
    budget: float | None = None,
    jobs: int = 1,
    progress: bool = False,
) -> list[CellResult]:
    """Every cell; ``budget`` seconds of wall time in all, shared by the cells (see the loop)."""
    seconds = None if budget is None else budget * jobs / max(1, len(cells))
    if jobs <= 1:
        # One job: each cell gets what is left of the budget shared by the cells left, so a cell
        # that overran (its minimum of rollouts was slow) is paid for by the cells after it.
        results = []
        started = time.perf_counter()
        for number, cell in enumerate(cells, 1):
            if budget is not None:
                left = budget - (time.perf_counter() - started)
                seconds = max(0.0, left / (len(cells) - number + 1))
            results.append(run_cell(cell, rollouts, seed, outage=outage, seconds=seconds))
            if progress:
                done = results[-1]
                print(
                    f"[{number}/{len(cells)}] {_name(cell)}: {done.ours.rollouts} rollouts "
                    f"in {done.seconds:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )
        return results
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [
            pool.submit(run_cell, cell, rollouts, seed, outage=outage, seconds=seconds) for cell in cells
        ]
        return [future.result() for future in futures]


# ---------------------------------------------------------------------------------------------
# Targets


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    met: bool
    numbers: str


def targets(results: Sequence[CellResult]) -> list[Target]:
    found: list[Target] = []
    busy = [r for r in results if r.cell.rps >= 20]
    if busy:
        worst = min(busy, key=lambda r: r.ours.share)
        missed = [r for r in busy if r.ours.share < 0.99]
        found.append(
            Target(
                "≥ 99 % right in every cell at ≥ 20 requests/s",
                not missed,
                f"{len(missed)} of {len(busy)} cells below; worst {_pct(worst.ours)} in {_name(worst.cell)}; "
                f"fewest rollouts in a cell: {min(r.ours.rollouts for r in busy)} (a share of 99 % needs "
                "hundreds to be told apart from 97 %)",
            )
        )
    short = [r for r in results if r.cell.window == "2m"]
    if short:
        ratios = [(r.ours.median / r.flagger.median if r.flagger.median > 0 else math.inf, r) for r in short]
        broken = [(ratio, r) for ratio, r in ratios if ratio > 2.0]
        ratio, worst_result = max(ratios, key=lambda item: item[0])
        # The cells' medians, each cell once (cells have different numbers of rollouts).
        typical_ours = statistics.median(r.ours.median for r in short)
        typical_flagger = statistics.median(r.flagger.median for r in short)
        found.append(
            Target(
                "median time with a 2-minute window ≤ 2 × the Flagger-style rule's",
                not broken,
                f"{len(broken)} of {len(short)} cells above 2×; worst {ratio:.2f}× "
                f"({worst_result.ours.median:g} vs {worst_result.flagger.median:g} min) in "
                f"{_name(worst_result.cell)}; the median cell: {typical_ours:g} vs {typical_flagger:g} min",
            )
        )
    quiet = [r for r in results if r.cell.rps < 20]
    if quiet:
        parts, met = [], True
        for window in WINDOWS:
            cells = [r for r in quiet if r.cell.window == window]
            if not cells:
                continue
            ours_mean = statistics.fmean(r.ours.share for r in cells)
            flagger_mean = statistics.fmean(r.flagger.share for r in cells)
            met = met and ours_mean >= flagger_mean
            parts.append(
                f"window {window}: {100 * ours_mean:.1f} % vs {100 * flagger_mean:.1f} % "
                f"over {len(cells)} cells"
            )
        found.append(
            Target("at 2 requests/s mean over cells no worse than that rule's", met, "; ".join(parts))
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


def _pct(score: Score) -> str:
    return f"{100 * score.share:.1f} % ± {100 * score.standard_error:.1f}"


def _name(cell: Cell) -> str:
    return f"{cell.window}/{cell.limits}/{cell.arrivals}/{cell.rps:g} rps/{cell.scenario}"


# ---------------------------------------------------------------------------------------------
# Output


def table(results: Sequence[CellResult], title: str) -> Table:
    grid = Table(title=title, title_justify="left", show_lines=False, pad_edge=False)
    for name, justify in (
        ("window", "left"),
        ("limits", "left"),
        ("arrivals", "left"),
        ("req/s", "right"),
        ("scenario", "left"),
        ("truth", "left"),
        ("n", "right"),
        ("kserve-canary right", "right"),
        ("median min", "right"),
        ("undecided", "right"),
        ("Flagger-style right", "right"),
        ("median min ", "right"),
        ("s", "right"),
    ):
        grid.add_column(name, justify=justify)  # type: ignore[arg-type]
    for result in results:
        cell, ours, flagger = result.cell, result.ours, result.flagger
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
            f"{ours.undecided}",
            _pct(flagger),
            f"{flagger.median:g}",
            f"{result.seconds:.0f}",
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
    parser.add_argument(
        "--rollouts", type=int, default=DEFAULT_ROLLOUTS, help="rollouts per cell (at most, with --budget)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET,
        help="seconds of wall time for the whole run, shared equally by the cells; a cell stops "
        f"when its share is spent (after at least {MIN_ROLLOUTS} rollouts); 0: exactly --rollouts per cell",
    )
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (cells in parallel)")
    parser.add_argument("--progress", action="store_true", help="a line per cell on stderr (one job)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--cells",
        nargs="*",
        default=[],
        metavar="KEY=V[,V]",
        help="only the cells matching every filter: window=2m,10m limits=absolute,relative "
        "arrivals=poisson,bursty rps=2,20,200 scenario=healthy,inside,tail,median,errors,load",
    )
    parser.add_argument("--outage", action="store_true", help="a 5-minute Prometheus outage in every rollout")
    parser.add_argument("--json", type=Path, help="write the results there")
    args = parser.parse_args(argv)
    cells = select_cells(args.cells)
    started = time.perf_counter()
    budget = args.budget if args.budget > 0 else None
    results = run_cells(
        cells,
        args.rollouts,
        args.seed,
        outage=args.outage,
        budget=budget,
        jobs=args.jobs,
        progress=args.progress,
    )
    runtime = time.perf_counter() - started
    commit = _commit()
    console = Console(width=max(180, Console().width), highlight=False)
    total = sum(r.ours.rollouts for r in results)
    console.print(
        f"{len(cells)} cells, {total} rollouts per decider (at most {args.rollouts} per cell"
        + (f", budget {args.budget:g} s" if budget else "")
        + f"; seed {args.seed}; commit {commit}"
        + (", Prometheus outage in every rollout" if args.outage else "")
        + f") in {runtime:.0f} s with {args.jobs} job(s); n rollouts per cell; right share ± Monte-Carlo "
        f"standard error; median minutes to the decision (undecided = {MAX_MINUTES}); s: the cell's seconds"
    )
    console.print(table(results, "decision quality per cell"))
    found = targets(results)
    for target in found:
        console.print(f"{'met' if target.met else 'NOT met'}: {target.name} — {target.numbers}")
    if args.json is not None:
        document = {
            "meta": {
                "seed": args.seed,
                "max_rollouts_per_cell": args.rollouts,
                "budget_seconds": budget,
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
