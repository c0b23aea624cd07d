"""The per-tick budget of custom queries: custom ``promql`` checks and overrides are asked per revision,
within ``max_single_queries_per_tick`` per tick; the others are ``error``/``deferred`` until a later
tick, and rollouts take turns."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta

from canary.evidence import EvidenceRequest
from canary.metrics.plan import Need, SingleAsk
from canary.policy.model import PromotionPolicy

__all__ = ["NamespaceQueryBudget", "TickBudget", "deferred_detail", "namespace_deferred_detail"]


def deferred_detail(budget: int) -> str:
    return f"not asked this tick: the per-tick budget of {budget} custom queries is spent; asked next tick"


class TickBudget:
    """How many custom (per-revision) queries a tick may ask, shared fairly between rollouts.

    A tick is every call whose ``at`` is within half a scrape interval of the tick's first one. The
    rollouts whose queries were deferred longest go first, so nobody is starved tick after tick.
    """

    def __init__(self, budget: int, tolerance: timedelta) -> None:
        self.budget = budget
        self.tolerance = tolerance
        self._lock = threading.Lock()
        self._tick_at: datetime | None = None
        self._tick = 0
        self._spent = 0
        self._served: dict[tuple[str, str], int] = {}  # rollout -> the tick it was last fully served

    def grant(
        self,
        rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]],
        needs: Sequence[Need],
        singles: Sequence[SingleAsk],
    ) -> set[SingleAsk]:
        if not singles:
            return set()
        wanted: dict[int, list[SingleAsk]] = {}
        for need in needs:
            if isinstance(need.ask, SingleAsk) and need.ask not in wanted.setdefault(need.rollout, []):
                wanted[need.rollout].append(need.ask)
        at = max(rollouts[index][1].at for index in wanted)
        granted: set[SingleAsk] = set()
        with self._lock:
            if self._tick_at is None or abs(at - self._tick_at) > self.tolerance:
                self._tick_at, self._tick, self._spent = at, self._tick + 1, 0

            def key(index: int) -> tuple[str, str]:
                request = rollouts[index][1]
                return (request.namespace, request.inference_service)

            for index in sorted(wanted, key=lambda index: (self._served.get(key(index), -1), index)):
                asks = [ask for ask in wanted[index] if ask not in granted]
                fitting = asks[: max(0, self.budget - self._spent)]
                granted.update(fitting)
                self._spent += len(fitting)
                if len(fitting) == len(asks):
                    self._served[key(index)] = self._tick
            if len(self._served) > 10_000:  # rollouts long gone
                oldest = sorted(self._served.items(), key=lambda item: item[1])[: len(self._served) - 10_000]
                for gone, _ in oldest:
                    del self._served[gone]
        return granted


def namespace_deferred_detail(namespace: str, budget: float) -> str:
    return (
        f"deferred: namespace {namespace} spent its budget of {budget:g}s of Prometheus query time for "
        "custom queries this tick (--namespace-query-budget); asked next tick. A deferred check is not "
        "judged: the step holds, and its horizon clock is paused while a check is deferred"
    )


class NamespaceQueryBudget:
    """Seconds of Prometheus time the custom queries of one namespace may take per tick.

    A tick is every call with the same evaluation time (the controller's tick evaluates every due
    rollout at one ``at``). A namespace's custom queries are asked one after another, each with what
    is left of its budget as its deadline; once nothing is left, the rest are deferred. Builtin
    queries are never charged: they are shared by every namespace and carry the safety checks.
    """

    def __init__(self, seconds: float) -> None:
        if seconds <= 0:
            raise ValueError("the per-namespace query budget must be positive")
        self.seconds = seconds
        self._lock = threading.Lock()
        self._at: datetime | None = None
        self._spent: dict[str, float] = {}

    def remaining(self, namespace: str, at: datetime) -> float:
        with self._lock:
            if self._at is None or at > self._at:
                self._at, self._spent = at, {}
            if at < self._at:  # a late call of an earlier tick: that tick's budget is gone
                return 0.0
            return max(0.0, self.seconds - self._spent.get(namespace, 0.0))

    def charge(self, namespace: str, at: datetime, seconds: float) -> None:
        with self._lock:
            if self._at == at:
                self._spent[namespace] = self._spent.get(namespace, 0.0) + seconds
