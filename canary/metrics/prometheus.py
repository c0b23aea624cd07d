"""The Prometheus evidence source: policies and evidence requests in, :class:`~canary.evidence.Evidence` out.

``PrometheusEvidenceSource(config).collect(policy, request)`` answers one rollout's evaluation;
``collect_many([(policy, request), ...])`` answers several at once. The evidence keys and their
meaning are documented in :mod:`canary.metrics.plan`; the PromQL in :mod:`canary.metrics.catalog`.

Guarantees:

* ``request-count``, ``latency`` and ``error-rate`` (unless overridden) come from the **counter
  book** (:mod:`canary.metrics.counting`): one instant query per requests profile per tick samples
  the raw cumulative counters of every tracked revision together (:class:`CountsPipeline`; calls
  whose ``at`` is within half a scrape interval share a sample, single-flight), so the cost does not
  grow with the number of rollouts; a revision's past is filled once by range queries
  (``/api/v1/query_range`` at the scrape interval, within 11,000 points per series and
  ``backfill_sample_budget``) when it is first asked for with a start in the past (e.g. after a
  restart). Counts are integers, :attr:`Evidence.counts` carries them as
  :class:`~canary.evidence.CountSeries`;
* the other builtin families are instant queries at ``time=request.at`` over
  ``[request.window_start, request.at]`` (``{{ window }}``: whole seconds, at least ``min_window``),
  shared by the rollouts of one call whose window is the same; custom ``promql`` checks and
  overrides are asked per revision within ``max_single_queries_per_tick`` per tick, the rest are
  ``error``/``deferred`` this tick (fairly rotated);
* Prometheus' clock and ours are never read to decide *what* to measure;
* nothing raises: an unreachable, slow or failing Prometheus, a malformed custom query or an
  unexpected answer becomes an ``error`` measurement (and ``error`` counts) with its
  :class:`~canary.evidence.ErrorClass`; the HTTP round trips spent for a rollout (shared ones
  included, a reused sample not) are reported in :attr:`Evidence.queries`.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import msgspec
import structlog

from canary.evidence import CountSeries, ErrorClass, Evidence, EvidenceRequest, EvidenceStatus, Measurement
from canary.metrics.answers import GroupedAnswer, parse_grouped, parse_single
from canary.metrics.budget import (
    NamespaceQueryBudget,
    TickBudget,
    deferred_detail,
    namespace_deferred_detail,
)
from canary.metrics.catalog import BuiltinQuery, RevisionKey, render_builtin
from canary.metrics.client import (
    PrometheusClient,
    PrometheusConfig,
    QueryFailure,
    QueryOutcome,
    redact_url,
)
from canary.metrics.counting.counts import CountsPipeline
from canary.metrics.counting.decode import COUNTER_VECTOR
from canary.metrics.counting.peaks import PeaksPipeline
from canary.metrics.detect import (
    DetectionReport,
    ProfileDetector,
)
from canary.metrics.envelope import VectorEnvelope
from canary.metrics.explain_queries import canary_queries, stable_queries
from canary.metrics.plan import (
    COUNTED_MEASURES,
    CountsAsk,
    GroupedAsk,
    Need,
    PeaksAsk,
    QueryGrouping,
    Side,
    SingleAsk,
    measurement_for,
    merge_asks,
    plan_rollout,
)
from canary.metrics.resolve import FamilyResolver
from canary.metrics.split import Splitter
from canary.metrics.tenancy import Tenancy
from canary.policy.model import MetricKind, PromotionPolicy, RequestsProfile
from canary.repeats import Repeats

__all__ = ["PrometheusEvidenceSource"]

_log = structlog.get_logger("canary.metrics")

Parsed = GroupedAnswer | float | QueryFailure | None


class PrometheusEvidenceSource:
    """Answers evidence requests from one Prometheus-compatible server (an :class:`EvidenceSource`).

    :param scrape_interval: the scrape interval of the metrics we read; the window is at least two.
    :param min_window: overrides ``2 * scrape_interval``.
    :param min_requests: a latency or error rate computed from fewer requests is no-data.
    :param max_parallel_queries: queries of one collect call in flight at once.
    :param grouping: how far the other families' queries are shared (``per-revision`` is the
        naive baseline); the counted measures are always sampled once per tick.
    :param max_single_queries_per_tick: custom ``promql`` checks and overrides asked per tick (one
        query per revision each); the others are ``error``/``deferred`` until a later tick.
    :param backfill_sample_budget: series x points one backfill range query may touch (Prometheus'
        ``--query.max-samples`` is 50,000,000 by default). It also bounds the controller's
        memory: an answer decodes to about 150 bytes of Python objects per point while it is
        read, and the process' RSS keeps that peak; a smaller budget costs more queries.
    :param idle_revision_ttl: a revision nobody asked about for this long leaves the counter book.
    :param tenancy: how custom queries are scoped to their policy's namespace (default: every
        selector scoped, nothing admitted cluster-wide; :mod:`canary.metrics.tenancy`).
    :param namespace_query_seconds: Prometheus time the custom queries of one namespace may take
        per tick (:class:`~canary.metrics.budget.NamespaceQueryBudget`); None: no such budget.
    """

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
        max_single_queries_per_tick: int = 200,
        backfill_sample_budget: int = 200_000,
        idle_revision_ttl: float = 900.0,
        tenancy: Tenancy | None = None,
        namespace_query_seconds: float | None = None,
    ) -> None:
        if max_parallel_queries < 1:
            raise ValueError("max_parallel_queries must be at least 1")
        if max_single_queries_per_tick < 0:
            raise ValueError("max_single_queries_per_tick must not be negative")
        self.config = config
        self.tenancy = tenancy or Tenancy()
        self.client = client if client is not None else PrometheusClient(config)
        self.min_window = min_window if min_window is not None else 2 * scrape_interval
        self.min_requests = min_requests
        self.grouping = grouping
        self.detector = _detector(self.client, scrape_interval, detection_lookback, detection_ttl, clock)
        self._resolver = FamilyResolver(self.detector)
        self._max_parallel = max_parallel_queries
        self._repeats = Repeats()  # failing queries are logged once per change
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.scrape_interval = scrape_interval
        self.counts = CountsPipeline(
            functools.partial(self._ask, typed=COUNTER_VECTOR),  # typed series (decode.CounterSeries)
            self._ask_range,
            scrape_interval=scrape_interval,
            sample_budget=backfill_sample_budget,
            idle=idle_revision_ttl,
            min_requests=min_requests,
        )
        self.peaks = PeaksPipeline(
            self._ask,
            self._ask_range,
            scrape_interval=scrape_interval,
            min_window=self.min_window,
            idle=idle_revision_ttl,
            min_requests=min_requests,
            sample_budget=backfill_sample_budget,
        )
        self.max_single_queries_per_tick = max_single_queries_per_tick
        self._splitter = Splitter()  # a failed grouped query asked again by namespace, then rollout
        self._budget = TickBudget(max_single_queries_per_tick, timedelta(seconds=scrape_interval / 2))
        self._namespace_budget = (
            None if namespace_query_seconds is None else NamespaceQueryBudget(namespace_query_seconds)
        )

    # -- the EvidenceSource protocol -------------------------------------------------------------

    def collect(self, policy: PromotionPolicy, request: EvidenceRequest) -> Evidence:
        return self.collect_many([(policy, request)])[0]

    def collect_many(self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]]) -> list[Evidence]:
        """Evidence for several rollouts at once, in order.

        The counted measures come from the tick's counter sample (shared by every rollout of the
        tick, whatever its window); equal builtin queries of the other families are asked once; custom
        queries are asked within the per-tick budget.
        """
        needs, profiles, detection_cost = self._plan(rollouts)
        grouped, singles = merge_asks(needs)
        granted = self._budget.grant(rollouts, needs, singles)
        owners = {
            need.revision: (rollouts[need.rollout][1].namespace, rollouts[need.rollout][1].inference_service)
            for need in needs
        }
        # The counter and peak samples first: they carry the safety checks (error rate, OOM kills,
        # GPU memory), and no custom query may delay them.
        counted = self.counts.serve(rollouts, needs)
        peaked = self.peaks.serve(rollouts, needs)
        asked = [single for single in singles if single in granted]
        outcomes, parsed, deferred = self._run(grouped, asked, owners, _tenants(rollouts, needs))
        canary: list[dict[str, Measurement]] = [{} for _ in rollouts]
        stable: list[dict[str, Measurement]] = [{} for _ in rollouts]
        used_asks: list[set[GroupedAsk | SingleAsk]] = [set() for _ in rollouts]
        for need in needs:
            if isinstance(need.ask, CountsAsk | PeaksAsk):
                measurement = (counted if isinstance(need.ask, CountsAsk) else peaked).measurements[id(need)]
            else:
                measurement = self._measured(need, granted, outcomes, parsed, deferred)
                if isinstance(need.ask, GroupedAsk) or need.ask in outcomes:
                    used_asks[need.rollout].add(need.ask)
            (canary if need.side is Side.CANARY else stable)[need.rollout][need.key] = measurement
        evidence = []
        for index, (policy, request) in enumerate(rollouts):
            http_requests = (
                detection_cost[index]
                + sum(outcomes[ask].http_requests for ask in used_asks[index])
                + counted.http_requests.get(index, 0)
                + peaked.http_requests.get(index, 0)
            )
            shown = (policy, request, profiles[index])
            evidence.append(
                Evidence(
                    request=request,
                    canary=canary[index],
                    stable=stable[index],
                    queries=http_requests,
                    profile=profiles[index],
                    counts=_settled_counts(policy, needs, index) | counted.series.get(index, {}),
                    # For people only (kserve-canary explain): each check's canary value as one query.
                    canary_queries=canary_queries(*shown, min_window=self.min_window, tenancy=self.tenancy),
                    stable_queries=stable_queries(*shown, min_window=self.min_window, tenancy=self.tenancy),
                )
            )
            self._log_failures(request, canary[index], stable[index])
        return evidence

    def _plan(
        self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]]
    ) -> tuple[list[Need], list[dict[str, str]], list[int]]:
        """What the rollouts need, the profile each uses per family, and the detection round trips
        spent for each."""
        needs: list[Need] = []
        profiles: list[dict[str, str]] = []
        detection_cost = [0] * len(rollouts)
        for index, (policy, request) in enumerate(rollouts):
            resolutions, used, cost = self._resolver.resolve(policy, request.at)
            detection_cost[index] = cost
            profiles.append(used)
            needs.extend(
                plan_rollout(
                    index,
                    policy,
                    request,
                    resolutions,
                    min_window=self.min_window,
                    grouping=self.grouping,
                    tenancy=self.tenancy,
                )
            )
        return needs, profiles, detection_cost

    def _measured(
        self,
        need: Need,
        granted: set[SingleAsk],
        outcomes: dict[GroupedAsk | SingleAsk, QueryOutcome],
        parsed: dict[GroupedAsk | SingleAsk, GroupedAnswer | float | QueryFailure | None],
        deferred: dict[SingleAsk, str],
    ) -> Measurement:
        """The measurement of a need answered by a query of its own or a grouped one (or settled)."""
        ask = need.ask
        if isinstance(ask, SingleAsk) and ask not in granted:
            detail = deferred_detail(self.max_single_queries_per_tick)
            return Measurement.error(ErrorClass.DEFERRED, detail, need.unit, query=ask.promql)
        if isinstance(ask, SingleAsk) and ask in deferred:
            return Measurement.error(ErrorClass.DEFERRED, deferred[ask], need.unit, query=ask.promql)
        answered = outcomes.get(ask) if isinstance(ask, GroupedAsk | SingleAsk) else None
        result = parsed.get(ask) if isinstance(ask, GroupedAsk | SingleAsk) else None
        measurement = measurement_for(need, answered, result, min_requests=self.min_requests)
        if isinstance(ask, GroupedAsk) and measurement.query:
            measurement = replace(measurement, query=_builtin_for(ask.query, need.revision))
        return measurement

    # -- detection ------------------------------------------------------------------------------

    def watch_warm_up(self, policy: PromotionPolicy, revision: str, born: datetime, at: datetime) -> None:
        """``revision`` is ``policy``'s canary, warming up and not evaluated yet (Pending, or in its
        first step before its first evaluation): its restart counters join every tick's sample from
        now on, counted from its birth, so an OOM kill while it loads is an alarm (take_alarms)
        within a tick or two instead of waiting for an evaluation. Only for policies whose
        restarts or OOM kills come from the restart counters."""
        overrides = policy.spec.metrics.queries
        restarts = (MetricKind.RESTARTS, MetricKind.OOM_KILLS)
        if not any(
            check.metric in restarts and check.metric.value not in overrides for check in policy.spec.checks
        ):
            return
        namespace = policy.metadata.namespace
        who = (namespace, policy.spec.target.inference_service)
        self.counts.watch(
            RevisionKey(namespace, revision), who, born, at, self._resolver.restarts_counter(policy, at)
        )

    def sample_warm_up(self, at: datetime) -> None:
        """The tick's sample of the restart counters, if no collect has taken one within half a
        scrape interval of ``at``: the canaries watched while they warm up are sampled even when no
        rollout needs evidence in this tick (one query at most; none when nothing is tracked)."""
        self.counts.sample_restarts(at)

    def take_alarms(self) -> set[tuple[str, str]]:
        """``(namespace, revision)`` of the revisions whose containers were OOM-killed in a per-tick
        sample since the last call: the controller evaluates their rollouts now instead of at their
        next interval."""
        return {(key.namespace, key.revision) for key in self.counts.take_alarms()}

    def detect(self, at: datetime) -> DetectionReport:
        """Detect every auto family now (e.g. at startup, which logs the choice) and report."""
        profile = self.detector.requests_profile(at)[0].choice
        if profile is not None:
            self.detector.request_labels(RequestsProfile(profile), at)
        self.detector.gpu_labels(at)
        self.detector.kube_state_labels(at)
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
            "counts": self.counts.explain(),
            "maxSingleQueriesPerTick": self.max_single_queries_per_tick,
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

    def _run(
        self,
        grouped: dict[GroupedAsk, set[RevisionKey]],
        singles: list[SingleAsk],
        owners: Mapping[RevisionKey, Hashable],
        tenants: Mapping[SingleAsk, str],
    ) -> tuple[
        dict[GroupedAsk | SingleAsk, QueryOutcome], dict[GroupedAsk | SingleAsk, Parsed], dict[SingleAsk, str]
    ]:
        """Every ask's outcome and its parsed answer; a grouped ask that fails is split
        (:mod:`canary.metrics.split`): its answer then says which revisions' part failed, and why. The
        custom queries of one namespace run one after another within its budget of Prometheus time;
        those it had no time left for are deferred (returned, with why)."""
        jobs: list[tuple[GroupedAsk | SingleAsk, Callable[[], tuple[QueryOutcome, Parsed]]]] = []
        outcomes: dict[GroupedAsk | SingleAsk, QueryOutcome] = {}
        parsed: dict[GroupedAsk | SingleAsk, Parsed] = {}
        deferred: dict[SingleAsk, str] = {}
        for grouped_ask, revisions in grouped.items():
            try:
                render_builtin(grouped_ask.query, revisions)
            except ValueError as error:  # a catalog bug must not take the controller down
                failure = QueryFailure(ErrorClass.BAD_QUERY, f"cannot build the query: {error}")
                outcomes[grouped_ask] = QueryOutcome("", None, failure, 0, 0.0)
                parsed[grouped_ask] = failure
                continue
            ordered = sorted(revisions)
            jobs.append((grouped_ask, functools.partial(self._grouped, grouped_ask, ordered, owners)))
        by_namespace: dict[str, list[SingleAsk]] = {}
        for single in singles:
            if self._namespace_budget is None:
                jobs.append((single, functools.partial(self._single, single)))
            else:
                by_namespace.setdefault(tenants.get(single, ""), []).append(single)
        budgeted = [
            functools.partial(self._within_budget, namespace, asks, deferred)
            for namespace, asks in by_namespace.items()
        ]
        if len(jobs) + len(budgeted) <= 1 or self._max_parallel == 1:
            answered = [(ask, job()) for ask, job in jobs]
            answered += [pair for job in budgeted for pair in job()]
        else:
            pool = self._executor()
            futures = [(ask, pool.submit(job)) for ask, job in jobs]
            spent = [pool.submit(job) for job in budgeted]
            answered = [(ask, future.result()) for ask, future in futures]
            answered += [pair for future in spent for pair in future.result()]
        for ask, (outcome, answer) in answered:
            outcomes[ask], parsed[ask] = outcome, answer
        return outcomes, parsed, deferred

    def _within_budget(
        self, namespace: str, asks: list[SingleAsk], deferred: dict[SingleAsk, str]
    ) -> list[tuple[GroupedAsk | SingleAsk, tuple[QueryOutcome, Parsed]]]:
        """``namespace``'s custom queries, one after another, each within what is left of its budget."""
        budget = self._namespace_budget
        assert budget is not None
        why = namespace_deferred_detail(namespace, budget.seconds)
        answered: list[tuple[GroupedAsk | SingleAsk, tuple[QueryOutcome, Parsed]]] = []
        for ask in asks:
            left = budget.remaining(namespace, ask.at)
            if left <= 0:
                deferred[ask] = why
                continue
            cut = left < self.config.timeout
            outcome = self._ask(ask.promql, ask.at, within=left if cut else None)
            budget.charge(namespace, ask.at, outcome.duration)
            if cut and outcome.failure is not None and outcome.failure.error_class is ErrorClass.TIMEOUT:
                deferred[ask] = why  # cut at the budget: not the query's fault, not Prometheus' either
                continue
            answered.append((ask, (outcome, parse_single(outcome))))
        return answered

    def _single(self, single: SingleAsk) -> tuple[QueryOutcome, Parsed]:
        outcome = self._ask(single.promql, single.at)
        return outcome, parse_single(outcome)

    def _grouped(
        self, grouped: GroupedAsk, revisions: Sequence[RevisionKey], owners: Mapping[RevisionKey, Hashable]
    ) -> tuple[QueryOutcome, Parsed]:
        def ask(
            part: Sequence[RevisionKey],
        ) -> tuple[QueryOutcome, dict[RevisionKey, Mapping[str, float]] | QueryFailure]:
            outcome = self._ask(render_builtin(grouped.query, part), grouped.at)
            answer = parse_grouped(outcome)
            if isinstance(answer, QueryFailure):
                return outcome, answer
            return outcome, {revision: answer.values.get(revision, {}) for revision in part}

        split = self._splitter.ask(
            grouped.query, revisions, lambda revision: owners.get(revision, revision), ask
        )
        outcome = QueryOutcome(split.query, None, None, split.http_requests, split.duration)
        values = {revision: fields for revision, fields in split.answers.items() if fields}
        return outcome, GroupedAnswer(values, split.failures)

    def _ask_range(self, promql: str, start: datetime, end: datetime, step: float) -> QueryOutcome:
        return _guarded(promql, lambda: self.client.range_query(promql, start, end, step))

    def _ask(
        self,
        promql: str,
        at: datetime,
        typed: msgspec.json.Decoder[VectorEnvelope[Any]] | None = None,
        within: float | None = None,
    ) -> QueryOutcome:
        if within is not None:
            return _guarded(promql, lambda: self.client.instant(promql, at, typed=typed, within=within))
        return _guarded(promql, lambda: self.client.instant(promql, at, typed=typed))

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
        """Each failing query once per change of its failure, with how often it repeated."""
        for side, measurements in (("canary", canary), ("stable", stable)):
            for key, measurement in measurements.items():
                where = (request.namespace, request.inference_service, side, key)
                if measurement.error_class is None:
                    repeated = self._repeats.ended(where)
                    if repeated is not None:
                        times = repeated + 1
                        _log.info("evidence query answers again", side=side, key=key, failedTimes=times)
                    continue
                repeated = self._repeats.failed(where, f"{measurement.error_class}: {measurement.detail}")
                if repeated is not None:
                    _log.warning(
                        "evidence query failed",
                        namespace=request.namespace,
                        inference_service=request.inference_service,
                        side=side,
                        key=key,
                        error_class=measurement.error_class.value,
                        detail=measurement.detail,
                        query=measurement.query,
                        previousRepeated=repeated or None,
                    )


def _detector(
    client: PrometheusClient,
    scrape_interval: float,
    lookback: float,
    ttl: float,
    clock: Callable[[], float] | None,
) -> ProfileDetector:
    # "Nothing found" is stale as soon as the next scrape lands (a fresh install, or a controller
    # that started before Prometheus' first scrape): asking again after one scrape interval costs
    # one label look-up per interval for the whole controller, while a minute's negative cache held
    # every rollout's first step that long.
    return ProfileDetector(
        client, lookback=lookback, ttl=ttl, retry_missing_after=scrape_interval, clock=clock or time.monotonic
    )


def _guarded(promql: str, ask: Callable[[], QueryOutcome]) -> QueryOutcome:
    """``ask()``, or a failed outcome: the last line of defence, a query never crashes an evaluation."""
    try:
        return ask()
    except Exception as error:
        _log.exception("unexpected error while querying Prometheus", query=promql)
        failure = QueryFailure(ErrorClass.SERVER, f"internal error: {type(error).__name__}: {error}")
        return QueryOutcome(promql, None, failure, 1, 0.0)


def _tenants(
    rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]], needs: Sequence[Need]
) -> dict[SingleAsk, str]:
    """The namespace each custom query is charged to: the first rollout's that asks it."""
    owners: dict[SingleAsk, str] = {}
    for need in needs:
        if isinstance(need.ask, SingleAsk) and need.ask not in owners:
            owners[need.ask] = rollouts[need.rollout][1].namespace
    return owners


def _settled_counts(policy: PromotionPolicy, needs: Sequence[Need], rollout: int) -> dict[str, CountSeries]:
    """The counts of a rollout whose requests family is not available (not detected, detection failed)."""
    counts: dict[str, CountSeries] = {}
    overrides = policy.spec.metrics.queries
    for need in needs:
        if need.rollout != rollout or need.settled is None or need.measure not in COUNTED_MEASURES:
            continue
        if need.measure in overrides or need.side.value in counts:
            continue
        settled = need.settled
        status = settled.status if settled.status is EvidenceStatus.ERROR else EvidenceStatus.NO_DATA
        counts[need.side.value] = CountSeries(status, detail=settled.detail, error_class=settled.error_class)
    return counts


# The query a measurement shows (explain.json, status, notifications) is the grouped query narrowed
# to its own revision: what was asked for it, readable, and bounded. The grouped query itself lists
# every revision of the tick, and would be copied into every explain document and state write.
@functools.lru_cache(maxsize=8192)
def _builtin_for(query: BuiltinQuery, revision: RevisionKey) -> str:
    return render_builtin(query, [revision])
