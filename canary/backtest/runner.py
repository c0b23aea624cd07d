"""One backtest: read what happened over a range, and replay the policy over every period found."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from canary.backtest.history import History, Period, read_history
from canary.backtest.replay import Replay, replay_period
from canary.metrics.client import PrometheusClient, PrometheusConfig
from canary.metrics.prometheus import PrometheusEvidenceSource
from canary.policy.model import PromotionPolicy

__all__ = ["HONESTY", "Backtest", "BacktestOptions", "run_backtest"]

# Said in every output, table, JSON and HTML alike.
HONESTY = (
    "A replay cannot move traffic: the policy's decisions are judged on the traffic shares that "
    "actually served (the 'actual' column), not on the shares its own steps would have set. "
    "Missing data is reported as missing, never filled."
)


@dataclass(frozen=True)
class BacktestOptions:
    prometheus: PrometheusConfig
    start: datetime
    end: datetime
    scrape_interval: float = 30.0
    min_samples: float = 20.0
    rollout: str | None = None  # a period id (canary@start) to replay alone


@dataclass(frozen=True)
class Backtest:
    policy: PromotionPolicy
    history: History
    replays: tuple[Replay, ...]
    what_if: tuple[str, ...]
    notes: tuple[str, ...]


def run_backtest(
    policy: PromotionPolicy, options: BacktestOptions, *, what_if: tuple[str, ...] = ()
) -> Backtest:
    """Read the range, find the periods, replay each (raises HistoryError when Prometheus cannot say)."""
    notes: list[str] = []
    gates = policy.spec.gates
    if gates:
        # A gate is an HTTP call to a receiver now; its answer then cannot be recorded after the fact.
        policy = policy.model_copy(update={"spec": policy.spec.model_copy(update={"gates": []})})
        notes.append(f"{len(gates)} gate(s) of the policy are not replayed: the replay calls no webhook.")
    client = PrometheusClient(options.prometheus)
    try:
        history = read_history(
            client, policy, options.start, options.end, scrape_interval=options.scrape_interval
        )
    finally:
        client.close()
    periods: tuple[Period, ...] = history.periods
    if options.rollout is not None:
        periods = tuple(period for period in periods if period.id == options.rollout)
    replays = []
    for period in periods:
        # A fresh evidence source per period: its counter book starts empty, so the period's past is
        # filled by range queries once, then sampled at each evaluation, as after a controller restart.
        # Its counters are sampled once per evaluation (the policy's interval), like a live
        # controller evaluating this one rollout; the gauge windows keep the real scrape interval.
        with PrometheusEvidenceSource(
            options.prometheus,
            scrape_interval=policy.spec.interval,
            min_window=2 * options.scrape_interval,
            min_requests=options.min_samples,
        ) as source:
            replays.append(replay_period(policy, history, period, source, notes=notes))
    return Backtest(policy, history, tuple(replays), what_if, tuple(notes))
