"""The Prometheus evidence source: policies and evidence requests in, :class:`~canary.evidence.Evidence` out.

``PrometheusEvidenceSource(config).collect(policy, request)`` answers one rollout's evaluation;
``collect_many([(policy, request), ...])`` answers every rollout of a tick and shares each builtin
query among all of them whose window is the same. The evidence keys and their meaning are documented
in :mod:`canary.metrics.plan`; the PromQL in :mod:`canary.metrics.catalog`.

Guarantees:

* every query is an instant query at ``time=request.at`` over ``[request.window_start, request.at]``
  (``{{ window }}``: whole seconds, at least ``min_window`` — two scrape intervals by default);
  Prometheus' clock and ours are never read to decide *what* to measure;
* nothing raises: an unreachable, slow or failing Prometheus, a malformed custom query or an
  unexpected answer becomes an ``error`` measurement with its :class:`~canary.evidence.ErrorClass`;
* one builtin query answers the canary and the stable revision together; the number of HTTP round
  trips is reported in :attr:`Evidence.queries`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import structlog

from canary.evidence import ErrorClass, Evidence, EvidenceRequest, Measurement
from canary.metrics.catalog import Family, render_builtin
from canary.metrics.client import (
    PrometheusClient,
    PrometheusConfig,
    QueryFailure,
    QueryOutcome,
    redact_url,
)
from canary.metrics.detect import GPU_FAMILY, REQUESTS_FAMILY, Detection, DetectionReport, ProfileDetector
from canary.metrics.plan import (
    GroupedAnswer,
    GroupedAsk,
    Need,
    QueryGrouping,
    Resolution,
    Side,
    SingleAsk,
    families_needed,
    measurement_for,
    merge_asks,
    parse_grouped,
    parse_single,
    plan_rollout,
)
from canary.policy.model import GpuLabelStyle, PromotionPolicy, RequestsProfile

__all__ = ["PrometheusEvidenceSource"]

_log = structlog.get_logger("canary.metrics")

_AUTO_FAMILIES: dict[Family, str] = {Family.REQUESTS: REQUESTS_FAMILY, Family.DCGM: GPU_FAMILY}


class PrometheusEvidenceSource:
    """Answers evidence requests from one Prometheus-compatible server (an :class:`EvidenceSource`)."""

    def __init__(
        self,
        config: PrometheusConfig,
        *,
        scrape_interval: float = 30.0,
        min_window: float | None = None,
        min_requests: float = 1.0,
        max_parallel_queries: int = 4,
        grouping: QueryGrouping = QueryGrouping.PER_TICK,
        detection_ttl: float = 600.0,
        detection_lookback: float = 900.0,
        client: PrometheusClient | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """
        :param scrape_interval: the scrape interval of the metrics we read; the window is at least two.
        :param min_window: overrides ``2 * scrape_interval``.
        :param min_requests: a latency or error rate computed from fewer requests is no-data.
        :param max_parallel_queries: queries of one collect call in flight at once.
        :param grouping: how far queries are shared (``per-revision`` is the naive baseline).
        """
        if max_parallel_queries < 1:
            raise ValueError("max_parallel_queries must be at least 1")
        self.config = config
        self.client = client if client is not None else PrometheusClient(config)
        self.min_window = min_window if min_window is not None else 2 * scrape_interval
        self.min_requests = min_requests
        self.grouping = grouping
        self.detector = ProfileDetector(
            self.client, lookback=detection_lookback, ttl=detection_ttl, clock=clock or time.monotonic
        )
        self._max_parallel = max_parallel_queries
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    # -- the EvidenceSource protocol -------------------------------------------------------------

    def collect(self, policy: PromotionPolicy, request: EvidenceRequest) -> Evidence:
        return self.collect_many([(policy, request)])[0]

    def collect_many(self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]]) -> list[Evidence]:
        """Evidence for several rollouts at once, in order; equal builtin queries are asked once."""
        needs: list[Need] = []
        profiles: list[dict[str, str]] = []
        detection_cost = [0] * len(rollouts)
        for index, (policy, request) in enumerate(rollouts):
            resolutions, used, cost = self._resolve(policy, request)
            detection_cost[index] = cost
            profiles.append(used)
            needs.extend(
                plan_rollout(
                    index, policy, request, resolutions, min_window=self.min_window, grouping=self.grouping
                )
            )
        grouped, singles = merge_asks(needs)
        outcomes = self._run(grouped, singles)
        parsed: dict[GroupedAsk | SingleAsk, GroupedAnswer | float | QueryFailure | None] = {}
        for ask, outcome in outcomes.items():
            parsed[ask] = parse_grouped(outcome) if isinstance(ask, GroupedAsk) else parse_single(outcome)

        canary: list[dict[str, Measurement]] = [{} for _ in rollouts]
        stable: list[dict[str, Measurement]] = [{} for _ in rollouts]
        used_asks: list[set[GroupedAsk | SingleAsk]] = [set() for _ in rollouts]
        for need in needs:
            answered = outcomes.get(need.ask) if need.ask is not None else None
            result = parsed.get(need.ask) if need.ask is not None else None
            measurement = measurement_for(need, answered, result, min_requests=self.min_requests)
            (canary if need.side is Side.CANARY else stable)[need.rollout][need.key] = measurement
            if need.ask is not None:
                used_asks[need.rollout].add(need.ask)
        evidence = []
        for index, (_, request) in enumerate(rollouts):
            http_requests = detection_cost[index] + sum(
                outcomes[ask].http_requests for ask in used_asks[index]
            )
            evidence.append(
                Evidence(
                    request=request,
                    canary=canary[index],
                    stable=stable[index],
                    queries=http_requests,
                    profile=profiles[index],
                )
            )
            self._log_failures(request, canary[index], stable[index])
        return evidence

    # -- detection ------------------------------------------------------------------------------

    def detect(self, at: datetime) -> DetectionReport:
        """Detect every auto family now (e.g. at startup, which logs the choice) and report."""
        self.detector.requests_profile(at)
        self.detector.gpu_labels(at)
        return self.detector.report()

    def explain(self) -> dict[str, Any]:
        """The explain-ready picture: configuration (no secrets) and what detection found."""
        return {
            "prometheus": {
                "url": redact_url(self.config.url),  # scheme://host: no credentials, no path
                "headers": sorted(self.config.headers),  # names only: values may be credentials
                "timeout": self.config.timeout,
                "retryAttempts": self.config.retry.attempts,
            },
            "minWindowSeconds": self.min_window,
            "grouping": self.grouping.value,
            "detected": self.detector.report().as_dict(),
        }

    def close(self) -> None:
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool = None
        self.client.close()

    def __enter__(self) -> PrometheusEvidenceSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------

    def _resolve(
        self, policy: PromotionPolicy, request: EvidenceRequest
    ) -> tuple[dict[Family, Resolution], dict[str, str], int]:
        """Profiles per family for this policy: configured, or detected; and detection round trips."""
        metrics = policy.spec.metrics
        needed = families_needed(policy)
        resolutions: dict[Family, Resolution] = {}
        used: dict[str, str] = {}
        cost = 0
        configured = {Family.REQUESTS: metrics.requests.value, Family.DCGM: metrics.gpu_labels.value}
        auto = {Family.REQUESTS: RequestsProfile.AUTO.value, Family.DCGM: GpuLabelStyle.AUTO.value}
        for family, report_name in _AUTO_FAMILIES.items():
            if family not in needed:
                continue
            choice = configured[family]
            if choice != auto[family]:
                resolutions[family] = Resolution(choice)
                used[report_name] = choice
                continue
            detect = self.detector.requests_profile if family is Family.REQUESTS else self.detector.gpu_labels
            detection, spent = detect(request.at)
            cost += spent
            resolutions[family] = _resolution_from(detection)
            used[report_name] = detection.choice or "none"
        # The other families have one profile each; report them for explain all the same.
        for family in needed - set(_AUTO_FAMILIES):
            used[family.value] = "builtin"
        return resolutions, used, cost

    def _run(
        self, grouped: dict[GroupedAsk, set[Any]], singles: list[SingleAsk]
    ) -> dict[GroupedAsk | SingleAsk, QueryOutcome]:
        jobs: list[tuple[GroupedAsk | SingleAsk, str, datetime]] = []
        outcomes: dict[GroupedAsk | SingleAsk, QueryOutcome] = {}
        for grouped_ask, revisions in grouped.items():
            try:
                promql = render_builtin(grouped_ask.query, revisions)
            except ValueError as error:  # a catalog bug must not take the controller down
                failure = QueryFailure(ErrorClass.BAD_QUERY, f"cannot build the query: {error}")
                outcomes[grouped_ask] = QueryOutcome("", None, failure, 0, 0.0)
                continue
            jobs.append((grouped_ask, promql, grouped_ask.at))
        jobs.extend((single, single.promql, single.at) for single in singles)
        if len(jobs) <= 1 or self._max_parallel == 1:
            for ask, promql, at in jobs:
                outcomes[ask] = self._ask(promql, at)
            return outcomes
        pool = self._executor()
        futures = {ask: pool.submit(self._ask, promql, at) for ask, promql, at in jobs}
        for ask, future in futures.items():
            outcomes[ask] = future.result()
        return outcomes

    def _ask(self, promql: str, at: datetime) -> QueryOutcome:
        try:
            return self.client.instant(promql, at)
        except Exception as error:  # the last line of defence: a query never crashes an evaluation
            _log.exception("unexpected error while querying Prometheus", query=promql)
            failure = QueryFailure(ErrorClass.SERVER, f"internal error: {type(error).__name__}: {error}")
            return QueryOutcome(promql, None, failure, 1, 0.0)

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self._max_parallel, thread_name_prefix="prometheus-query"
                )
            return self._pool

    def _log_failures(
        self, request: EvidenceRequest, canary: dict[str, Measurement], stable: dict[str, Measurement]
    ) -> None:
        for side, measurements in (("canary", canary), ("stable", stable)):
            for key, measurement in measurements.items():
                if measurement.error_class is not None:
                    _log.warning(
                        "evidence query failed",
                        namespace=request.namespace,
                        inference_service=request.inference_service,
                        side=side,
                        key=key,
                        error_class=measurement.error_class.value,
                        detail=measurement.detail,
                        query=measurement.query,
                    )


def _resolution_from(detection: Detection) -> Resolution:
    if detection.failure is not None:
        return Resolution(
            unavailable=Measurement.error(
                detection.failure.error_class, f"metric profile detection failed: {detection.failure.detail}"
            )
        )
    if detection.choice is None:
        return Resolution(unavailable=Measurement.no_data(detection.detail))
    return Resolution(detection.choice)
