"""What the controller's tick asks of its evidence source, and an adapter for a source that can only
``collect``.

:class:`TickEvidenceSource` is the one interface the tick (:mod:`canary.controller.tick`) uses: it
never looks for a capability on the object it is given. A source with less — a backtest's recorded
data, a simulation, a third-party source that answers one request at a time — is wrapped in
:class:`CollectEach`, which gives the answers a source without those capabilities would.

To give the tick a new capability (a per-namespace query budget, say), add the method here with
what it means, and to :class:`CollectEach` with its neutral answer; never a ``getattr`` in the tick.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Protocol

import structlog

from canary.evidence import Evidence, EvidenceRequest, EvidenceSource
from canary.policy import PromotionPolicy

__all__ = ["CollectEach", "TickEvidenceSource"]

log = structlog.get_logger("kserve_canary.tick")


class TickEvidenceSource(EvidenceSource, Protocol):
    """An evidence source as the tick uses it (``collect`` as well: the reconciler's one-rollout path).

    :class:`canary.metrics.prometheus.PrometheusEvidenceSource` is one; :class:`CollectEach` makes one
    of any :class:`~canary.evidence.EvidenceSource`.
    """

    def collect_many(
        self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]]
    ) -> Sequence[Evidence | None]:
        """The evidence of every rollout due in a tick, in their order; None where there is none.

        Asked once per tick. It should not raise (what could not be measured is a measurement with
        status ``error``): if it does, no rollout of the tick has evidence.
        """
        ...

    def take_alarms(self) -> Collection[tuple[str, str]]:
        """``(namespace, revision)`` of the canaries a sample since the last call saw OOM-killed:
        their rollouts are evaluated now, not at their next interval."""
        ...

    def watch_warm_up(self, policy: PromotionPolicy, revision: str, born: datetime, at: datetime) -> None:
        """``revision``, ``policy``'s canary born at ``born``, is warming up and not evaluated yet:
        sample it every tick from now on, so a kill while it loads is an alarm."""
        ...

    def sample_warm_up(self, at: datetime) -> None:
        """Sample the canaries warming up, in a tick where no ``collect_many`` did."""
        ...


class CollectEach:
    """A :class:`TickEvidenceSource` from a source that can only ``collect``: each rollout is collected
    on its own (one failing is that rollout's missing evidence, not the others'); it raises no alarms
    and watches nothing warming up (the first evaluation still comes)."""

    def __init__(self, source: EvidenceSource) -> None:
        self.source = source

    def collect(self, policy: PromotionPolicy, request: EvidenceRequest) -> Evidence:
        return self.source.collect(policy, request)

    def collect_many(
        self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]]
    ) -> list[Evidence | None]:
        return [self._collect_one(policy, request) for policy, request in rollouts]

    def _collect_one(self, policy: PromotionPolicy, request: EvidenceRequest) -> Evidence | None:
        try:
            return self.source.collect(policy, request)
        except Exception as error:
            log.exception("evidence collection failed", key=policy.key, error=str(error))
            return None

    def take_alarms(self) -> Collection[tuple[str, str]]:
        return ()

    def watch_warm_up(self, policy: PromotionPolicy, revision: str, born: datetime, at: datetime) -> None:
        return None

    def sample_warm_up(self, at: datetime) -> None:
        return None
