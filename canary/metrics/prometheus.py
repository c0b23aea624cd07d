"""The Prometheus evidence source: policies and evidence requests in, :class:`~canary.evidence.Evidence` out.

``PrometheusEvidenceSource(config).collect(policy, request)`` answers one rollout's evaluation;
``collect_many([(policy, request), ...])`` answers several at once. The evidence keys and their
meaning are documented in :mod:`canary.metrics.plan`; the PromQL in :mod:`canary.metrics.catalog`.

Guarantees:

* ``request-count``, ``latency`` and ``error-rate`` (unless overridden) come from the **counter
  book** (:mod:`canary.metrics.counters`): one instant query per requests profile per tick samples
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
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgspec
import structlog

from canary.evidence import (
    REQUESTS,
    CountSeries,
    ErrorClass,
    Evidence,
    EvidenceRequest,
    EvidenceStatus,
    Measurement,
    Tally,
)
from canary.metrics.catalog import (
    FIELD_SAMPLES,
    PEAK_FIELD,
    RESTARTS_COUNTER,
    BuiltinQuery,
    CounterQuery,
    Family,
    PeakQuery,
    RevisionKey,
    render_builtin,
    render_counters,
    render_peaks,
)
from canary.metrics.client import (
    PrometheusClient,
    PrometheusConfig,
    QueryFailure,
    QueryOutcome,
    VectorEnvelope,
    redact_url,
)
from canary.metrics.counters import (
    COUNTER_VECTOR,
    BackfillChunk,
    CounterBook,
    PeakBook,
    PeakSample,
    RevisionSample,
    Snapshot,
    count_measurement,
    parse_counter_matrix,
    parse_counter_vector,
    parse_peak_matrix,
    parse_peaks,
    plan_backfill,
)
from canary.metrics.detect import GPU_FAMILY, REQUESTS_FAMILY, Detection, DetectionReport, ProfileDetector
from canary.metrics.explain_queries import canary_queries
from canary.metrics.heap import collector_paused
from canary.metrics.plan import (
    COUNTED_MEASURES,
    VALUE_FIELD,
    CountsAsk,
    GroupedAnswer,
    GroupedAsk,
    Need,
    PeaksAsk,
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
from canary.policy.model import GpuLabelStyle, MetricKind, PromotionPolicy, RequestsProfile

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
        max_single_queries_per_tick: int = 200,
        backfill_sample_budget: int = 200_000,
        idle_revision_ttl: float = 900.0,
    ) -> None:
        """
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
            memory: an answer decodes to about 150 bytes of Python objects per point, so one of a
            million points held 165 MiB at its peak (memray, 1,000 rollouts starting at once), and
            that peak stayed in the process' RSS; 200,000 keep it near 30 MiB, in more queries.
        :param idle_revision_ttl: a revision nobody asked about for this long leaves the counter book.
        """
        if max_parallel_queries < 1:
            raise ValueError("max_parallel_queries must be at least 1")
        if max_single_queries_per_tick < 0:
            raise ValueError("max_single_queries_per_tick must not be negative")
        self.config = config
        self.client = client if client is not None else PrometheusClient(config)
        self.min_window = min_window if min_window is not None else 2 * scrape_interval
        self.min_requests = min_requests
        self.grouping = grouping
        # "Nothing found" is stale as soon as the next scrape lands (a fresh install, or a controller
        # that started before Prometheus' first scrape): asking again after one scrape interval costs
        # one label look-up per interval for the whole controller, while a minute's negative cache held
        # every rollout's first step that long.
        self.detector = ProfileDetector(
            self.client,
            lookback=detection_lookback,
            ttl=detection_ttl,
            retry_missing_after=scrape_interval,
            clock=clock or time.monotonic,
        )
        self._max_parallel = max_parallel_queries
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.scrape_interval = scrape_interval
        self.counts = CountsPipeline(
            functools.partial(self._ask, typed=COUNTER_VECTOR),  # typed series (counters.CounterSeries)
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
        self._budget = _TickBudget(max_single_queries_per_tick, timedelta(seconds=scrape_interval / 2))

    # -- the EvidenceSource protocol -------------------------------------------------------------

    def collect(self, policy: PromotionPolicy, request: EvidenceRequest) -> Evidence:
        return self.collect_many([(policy, request)])[0]

    def collect_many(self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]]) -> list[Evidence]:
        """Evidence for several rollouts at once, in order.

        The counted measures come from the tick's counter sample (shared by every rollout of the
        tick, whatever its window); equal builtin queries of the other families are asked once; custom
        queries are asked within the per-tick budget.
        """
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
        granted = self._budget.grant(rollouts, needs, singles)
        outcomes = self._run(grouped, [single for single in singles if single in granted])
        parsed: dict[GroupedAsk | SingleAsk, GroupedAnswer | float | QueryFailure | None] = {}
        for ask, outcome in outcomes.items():
            parsed[ask] = parse_grouped(outcome) if isinstance(ask, GroupedAsk) else parse_single(outcome)
        counted = self.counts.serve(rollouts, needs)
        peaked = self.peaks.serve(rollouts, needs)

        canary: list[dict[str, Measurement]] = [{} for _ in rollouts]
        stable: list[dict[str, Measurement]] = [{} for _ in rollouts]
        used_asks: list[set[GroupedAsk | SingleAsk]] = [set() for _ in rollouts]
        deferred = _deferred_detail(self.max_single_queries_per_tick)
        for need in needs:
            if isinstance(need.ask, CountsAsk):
                measurement = counted.measurements[id(need)]
            elif isinstance(need.ask, PeaksAsk):
                measurement = peaked.measurements[id(need)]
            elif isinstance(need.ask, SingleAsk) and need.ask not in granted:
                measurement = Measurement.error(
                    ErrorClass.DEFERRED, deferred, need.unit, query=need.ask.promql
                )
            else:
                answered = outcomes.get(need.ask) if need.ask is not None else None
                result = parsed.get(need.ask) if need.ask is not None else None
                measurement = measurement_for(need, answered, result, min_requests=self.min_requests)
                if isinstance(need.ask, GroupedAsk) and measurement.query:
                    measurement = replace(measurement, query=_builtin_for(need.ask.query, need.revision))
                if need.ask is not None:
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
            evidence.append(
                Evidence(
                    request=request,
                    canary=canary[index],
                    stable=stable[index],
                    queries=http_requests,
                    profile=profiles[index],
                    counts=_settled_counts(policy, needs, index) | counted.series.get(index, {}),
                    # For people only (kserve-canary explain): each check's canary value as one query.
                    canary_queries=canary_queries(
                        policy, request, profiles[index], min_window=self.min_window
                    ),
                )
            )
            self._log_failures(request, canary[index], stable[index])
        return evidence

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
        self.counts.watch(
            RevisionKey(namespace, revision), (namespace, policy.spec.target.inference_service), born, at
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

    def _ask_range(self, promql: str, start: datetime, end: datetime, step: float) -> QueryOutcome:
        try:
            return self.client.range_query(promql, start, end, step)
        except Exception as error:  # as _ask: a backfill never crashes an evaluation
            _log.exception("unexpected error while querying Prometheus", query=promql)
            failure = QueryFailure(ErrorClass.SERVER, f"internal error: {type(error).__name__}: {error}")
            return QueryOutcome(promql, None, failure, 1, 0.0)

    def _ask(
        self, promql: str, at: datetime, typed: msgspec.json.Decoder[VectorEnvelope[Any]] | None = None
    ) -> QueryOutcome:
        try:
            return self.client.instant(promql, at, typed=typed)
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


# ---------------------------------------------------------------------------------------------
# The counted measures: one counter sample per requests profile per tick, and the book


@dataclass(slots=True)
class _Refresh:
    """One tick's counter sample of one requests profile, and what it cost the call that took it."""

    at: datetime
    revisions: set[RevisionKey]
    failures: dict[RevisionKey, QueryFailure]
    query: str
    http_requests: int = 0
    duration: float = 0.0


class _Ask(NamedTuple):
    """A rollout's ask for a revision's counts: from ``start`` (and ``step_start``) to ``at``."""

    revision: RevisionKey
    who: Hashable
    start: datetime
    at: datetime
    step_start: datetime
    interval: float  # the policy's evaluation interval, seconds
    born: bool = False  # a canary's restart counters in its first step: counted from birth


@dataclass(slots=True)
class Counted:
    """What :meth:`CountsPipeline.serve` gives one collect call."""

    measurements: dict[int, Measurement] = field(default_factory=dict)  # id(need) -> measurement
    series: dict[int, dict[str, CountSeries]] = field(default_factory=dict)  # rollout -> side -> counts
    http_requests: dict[int, int] = field(default_factory=dict)  # rollout -> round trips spent for it


def _from_birth(need: Need, request: EvidenceRequest) -> bool:
    """Whether ``need`` reads a canary's restart counters from its birth (Pending, the first step)."""
    assert isinstance(need.ask, CountsAsk)
    canary = need.side is Side.CANARY and request.canary_born is not None
    return canary and need.ask.counter == RESTARTS_COUNTER


class CountsPipeline:
    """Samples the raw request counters once per tick for every tracked revision, keeps the
    :class:`~canary.metrics.counters.CounterBook` per requests profile, backfills a revision's past
    once, and answers the counted measures (single-flight: safe from worker threads).

    A sample taken at ``t`` serves every collect call whose ``at`` is within half a scrape interval
    of ``t``; a revision new in that tick is sampled on its own at ``t``.
    """

    def __init__(
        self,
        instant: Callable[[str, datetime], QueryOutcome],
        range_query: Callable[[str, datetime, datetime, float], QueryOutcome],
        *,
        scrape_interval: float,
        sample_budget: int,
        idle: float,
        min_requests: float = 1.0,
    ) -> None:
        if scrape_interval <= 0:
            raise ValueError("scrape_interval must be positive")
        self._instant = instant
        self._range = range_query
        self.step = scrape_interval
        self.tolerance = timedelta(seconds=scrape_interval / 2)
        self.sample_budget = sample_budget
        self.min_requests = min_requests
        self._idle = timedelta(seconds=idle)
        self._lock = threading.Lock()
        self.books: dict[CounterQuery, CounterBook] = {}
        self._last: dict[CounterQuery, _Refresh] = {}
        self._alarms: set[RevisionKey] = set()

    def explain(self) -> dict[str, Any]:
        with self._lock:
            return {
                "scrapeIntervalSeconds": self.step,
                "backfillSampleBudget": self.sample_budget,
                "trackedRevisions": dict(
                    sorted((counter.name, len(book.tracked())) for counter, book in self.books.items())
                ),
            }

    def book(self, counter: CounterQuery) -> CounterBook:
        book = self.books.get(counter)
        if book is None:
            # Only the requests family is judged tick by tick (count_series); the restart counters
            # are read over whole ranges, and their book keeps nothing per tick.
            book = self.books[counter] = CounterBook(
                tolerance=self.tolerance, idle=self._idle, per_tick=counter.profile is not None
            )
        return book

    def serve(
        self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]], needs: Sequence[Need]
    ) -> Counted:
        counted = Counted()
        # Per (profile, tick): the revisions wanted and the earliest start each must cover.
        wanted: dict[tuple[CounterQuery, datetime], dict[RevisionKey, datetime]] = {}
        askers: dict[CounterQuery, list[_Ask]] = {}
        for need in needs:
            if not isinstance(need.ask, CountsAsk):
                continue
            policy, request = rollouts[need.rollout]
            counter = need.ask.counter
            starts = wanted.setdefault((counter, request.at), {})
            start = request.counts_start
            starts[need.revision] = min(start, starts.get(need.revision, start))
            who = (request.namespace, request.inference_service)
            askers.setdefault(counter, []).append(
                _Ask(
                    need.revision,
                    who,
                    start,
                    request.at,
                    request.window_start,
                    policy.spec.interval,
                    born=_from_birth(need, request),
                )
            )
        refreshes: dict[tuple[CounterQuery, datetime], tuple[_Refresh, bool]] = {}
        for counter, at in sorted(wanted, key=lambda item: item[1]):
            refreshes[(counter, at)] = self._refresh(counter, wanted[(counter, at)], askers[counter], at)
        charged: set[tuple[int, CounterQuery, datetime]] = set()
        tallies: dict[tuple[object, ...], tuple[tuple[Tally | None, Snapshot | None], int, int]] = {}
        with self._lock:
            for need in needs:
                if not isinstance(need.ask, CountsAsk):
                    continue
                request = rollouts[need.rollout][1]
                refresh, paid = refreshes[(need.ask.counter, request.at)]
                charge = (need.rollout, need.ask.counter, request.at)
                if paid and charge not in charged:
                    charged.add(charge)
                    counted.http_requests[need.rollout] = (
                        counted.http_requests.get(need.rollout, 0) + refresh.http_requests
                    )
                self._answer(counted, need, request, refresh, tallies)
        return counted

    def _answer(
        self,
        counted: Counted,
        need: Need,
        request: EvidenceRequest,
        refresh: _Refresh,
        tallies: dict[tuple[object, ...], tuple[tuple[Tally | None, Snapshot | None], int, int]],
    ) -> None:
        """``tallies``: the ranges already added up in this call (a rollout's checks read the same
        revision over the same range: p99 and error rate of one canary)."""
        assert isinstance(need.ask, CountsAsk)
        book = self.book(need.ask.counter)
        failure = refresh.failures.get(need.revision)
        shown = _counters_for(need.ask.counter, need.revision) if refresh.query else ""
        side = counted.series.setdefault(need.rollout, {})
        if need.side.value not in side and need.ask.counter.profile is not None:  # requests only
            if failure is not None:
                side[need.side.value] = CountSeries(
                    EvidenceStatus.ERROR,
                    detail=failure.detail,
                    error_class=failure.error_class,
                    query=shown,
                )
            else:
                side[need.side.value] = book.count_series(
                    need.revision, request.counts_start, request.at, query=shown
                )
        counts: tuple[Tally | None, Snapshot | None] | QueryFailure
        pods = oom_kills = 0
        if failure is not None:
            counts = failure
        else:
            born = _from_birth(need, request)
            start = request.restarts_start(born)
            key = (need.ask.counter, need.revision, start, request.at, born)
            known = tallies.get(key)
            if known is None:
                known = tallies[key] = (
                    book.tally(need.revision, start, request.at, from_birth=born),
                    book.pods_seen(need.revision, start, request.at),
                    book.oom_kills(need.revision, start, request.at, from_birth=born),
                )
            counts, pods, oom_kills = known
        counted.measurements[id(need)] = count_measurement(
            need.measure or REQUESTS,
            need.unit,
            need.revision,
            need.ask.quantile,
            counts,
            min_requests=self.min_requests,
            query=shown,
            duration=refresh.duration,
            pods=pods,
            oom_kills=oom_kills,
        )

    def _refresh(
        self,
        counter: CounterQuery,
        wanted: Mapping[RevisionKey, datetime],
        askers: Sequence[_Ask],
        at: datetime,
    ) -> tuple[_Refresh, bool]:
        """The sample standing for tick ``at`` (taken now unless one within tolerance exists); and
        whether this call paid for a query."""
        with self._lock:
            book = self.book(counter)
            for ask in askers:
                book.asked(
                    ask.revision,
                    ask.who,
                    ask.start,
                    ask.at,
                    starts=(ask.step_start,),
                    interval=ask.interval,
                    born=ask.born,
                )
            last = self._last.get(counter)
            if last is not None and abs(last.at - at) <= self.tolerance:
                missing = {
                    revision: start for revision, start in wanted.items() if revision not in last.revisions
                }
                if not missing:
                    return last, False
                fresh = self._sample(counter, book, missing, last.at)
                last.revisions |= fresh.revisions
                last.failures.update(fresh.failures)
                return _Refresh(
                    last.at, last.revisions, last.failures, fresh.query, fresh.http_requests, fresh.duration
                ), True
            starts: dict[RevisionKey, datetime | None] = dict.fromkeys(book.tracked())
            starts.update(wanted)
            refresh = self._sample(counter, book, starts, at)
            self._last[counter] = refresh
            book.prune(at)
            # Every tracked revision was sampled: one whose containers were OOM-killed since the last
            # sample is an alarm (take_alarms), whoever is due now.
            self._alarms.update(
                revision
                for revision in refresh.revisions
                if revision not in refresh.failures and book.new_oom_kills(revision) > 0
            )
            return refresh, True

    def sample_restarts(self, at: datetime) -> None:
        """Sample every revision the restart book tracks at ``at`` unless a sample within the
        tolerance exists (see :meth:`watch`)."""
        book = self.books.get(RESTARTS_COUNTER)
        if book is None or not book.tracked():
            return
        self._refresh(RESTARTS_COUNTER, {}, [], at)

    def watch(self, revision: RevisionKey, who: Hashable, born: datetime, at: datetime) -> None:
        """Sample ``revision``'s restart counters in every tick from now on, counted from birth (a
        canary warming up, not evaluated yet): an OOM kill then raises an alarm within a tick
        instead of waiting for the first evaluation. Once the revision is tracked (asked for, or
        watched before), nothing changes."""
        with self._lock:
            book = self.book(RESTARTS_COUNTER)
            if not book.is_tracked(revision):
                book.asked(revision, who, born, at, born=True)

    def take_alarms(self) -> set[RevisionKey]:
        """The revisions OOM-killed in a sample since the last call (each reported once)."""
        with self._lock:
            alarms, self._alarms = self._alarms, set()
        return alarms

    def _sample(
        self,
        counter: CounterQuery,
        book: CounterBook,
        starts: Mapping[RevisionKey, datetime | None],
        at: datetime,
    ) -> _Refresh:
        # The answer lives only until it is recorded; the collector waits (canary.metrics.heap).
        with collector_paused():
            return self._sample_and_record(counter, book, starts, at)

    def _sample_and_record(
        self,
        counter: CounterQuery,
        book: CounterBook,
        starts: Mapping[RevisionKey, datetime | None],
        at: datetime,
    ) -> _Refresh:
        revisions = sorted(starts)
        try:
            promql = render_counters(counter, revisions)
        except ValueError as error:  # a catalog bug must not take the controller down
            failure = QueryFailure(ErrorClass.BAD_QUERY, f"cannot build the query: {error}")
            return _Refresh(at, set(revisions), dict.fromkeys(revisions, failure), "")
        outcome = self._instant(promql, at)
        refresh = _Refresh(at, set(revisions), {}, promql, outcome.http_requests, outcome.duration)
        parsed = parse_counter_vector(outcome, revisions, divisor=counter.divisor, metric=counter.metric_name)
        if isinstance(parsed, QueryFailure):
            refresh.failures = dict.fromkeys(revisions, parsed)
            return refresh
        backfill = {
            revision: start
            for revision, start in starts.items()
            if start is not None and start < at - self.tolerance and book.needs_backfill(revision, start)
        }
        filled = self._backfill(counter, book, backfill, parsed, at, refresh) if backfill else set()
        for revision in revisions:
            if revision not in filled:
                book.record(revision, at, parsed[revision])
        return refresh

    def _backfill(
        self,
        counter: CounterQuery,
        book: CounterBook,
        starts: Mapping[RevisionKey, datetime],
        live: Mapping[RevisionKey, RevisionSample],
        at: datetime,
        refresh: _Refresh,
    ) -> set[RevisionKey]:
        """Fill the revisions' past from [earliest start, at] with range queries; the ones filled."""
        start = min(starts.values())
        estimate = {
            revision: max(_MIN_SERIES_ESTIMATE, 2 * len(live[revision].values)) for revision in starts
        }
        chunks = plan_backfill(estimate, start, at, self.step, sample_budget=self.sample_budget)
        history: dict[RevisionKey, list[tuple[datetime, RevisionSample]]] = {
            revision: [] for revision in starts
        }
        failed: set[RevisionKey] = set()
        pending = [(chunk, False) for chunk in chunks]
        while pending:
            chunk, halved = pending.pop(0)
            promql = render_counters(counter, chunk.revisions)
            outcome = self._range(promql, chunk.start, chunk.end, self.step)
            refresh.http_requests += outcome.http_requests
            refresh.duration += outcome.duration
            matrix = parse_counter_matrix(
                outcome, chunk.revisions, divisor=counter.divisor, metric=counter.metric_name
            )
            if _halve(matrix, chunk, halved, pending):
                continue
            if isinstance(matrix, QueryFailure):
                for revision in chunk.revisions:
                    failed.add(revision)
                    refresh.failures[revision] = QueryFailure(
                        matrix.error_class, f"backfill of the counters: {matrix.detail}", matrix.http_status
                    )
                continue
            by_time = {round(moment, 3): samples for moment, samples in matrix.items()}
            points = round((chunk.end - chunk.start).total_seconds() / self.step)
            for index in range(points + 1):
                moment = chunk.start + timedelta(seconds=index * self.step)
                at_moment = by_time.get(round(moment.timestamp(), 3), {})
                for revision in chunk.revisions:
                    # A grid point without series is an empty sample, as a live tick without series.
                    history[revision].append((moment, at_moment.get(revision, RevisionSample({}))))
        filled = set()
        for revision in starts:
            if revision in failed:
                continue
            samples = [item for item in history[revision] if item[0] < at] + [(at, live[revision])]
            book.replay(revision, samples)
            book.mark_backfilled(revision, start)
            filled.add(revision)
        return filled


_MIN_SERIES_ESTIMATE = 64  # a revision's series in the past: pods come and go (the live count x 2)
_PEAK_SERIES_ESTIMATE = 64  # GPUs (x4 series in the fraction) or vLLM engines of a revision


def _halve(
    answer: object, chunk: BackfillChunk, halved: bool, pending: list[tuple[BackfillChunk, bool]]
) -> bool:
    """A backfill chunk Prometheus timed out on is asked again once, as two halves of its revisions
    (the same query re-run would time out again; two smaller ones may not). True when halved."""
    if halved or not isinstance(answer, QueryFailure) or answer.error_class is not ErrorClass.TIMEOUT:
        return False
    if len(chunk.revisions) < 2:
        return False
    middle = len(chunk.revisions) // 2
    pending[:0] = [
        (BackfillChunk(chunk.revisions[:middle], chunk.start, chunk.end), True),
        (BackfillChunk(chunk.revisions[middle:], chunk.start, chunk.end), True),
    ]
    return True


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


def _deferred_detail(budget: int) -> str:
    return f"not asked this tick: the per-tick budget of {budget} custom queries is spent; asked next tick"


class _TickBudget:
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


# ---------------------------------------------------------------------------------------------
# Gauge peaks: one peak query per family per tick, and the peak book


@dataclass(slots=True)
class _PeakRefresh:
    at: datetime
    revisions: set[RevisionKey]
    failures: dict[RevisionKey, QueryFailure]
    query: str
    http_requests: int = 0
    duration: float = 0.0
    span: str = ""  # the peak query's range (one scrape interval in a backfill)


@dataclass(slots=True)
class Peaked:
    """What :meth:`PeaksPipeline.serve` gives one collect call."""

    measurements: dict[int, Measurement] = field(default_factory=dict)  # id(need) -> measurement
    http_requests: dict[int, int] = field(default_factory=dict)


class PeaksPipeline:
    """gpu-memory-peak (bytes and fraction) and kv-cache-usage: each tick, one query per family asks
    every tracked revision's per-series peak since the previous tick (``max_over_time`` over that
    span only); a window's value is the maximum of its ticks' peaks. A revision first asked for with
    a window reaching into the past gets it filled once by a range query (one peak per scrape
    interval). Single-flight as :class:`CountsPipeline`."""

    def __init__(
        self,
        instant: Callable[[str, datetime], QueryOutcome],
        range_query: Callable[[str, datetime, datetime, float], QueryOutcome],
        *,
        scrape_interval: float,
        min_window: float,
        idle: float,
        min_requests: float,
        sample_budget: int,
    ) -> None:
        self._instant = instant
        self._range = range_query
        self.step = scrape_interval
        self.tolerance = timedelta(seconds=scrape_interval / 2)
        self.min_window = timedelta(seconds=min_window)
        self.min_requests = min_requests
        self.sample_budget = sample_budget
        self._idle = timedelta(seconds=idle)
        self._lock = threading.Lock()
        self.books: dict[PeakQuery, PeakBook] = {}
        self._last: dict[PeakQuery, _PeakRefresh] = {}

    def book(self, query: PeakQuery) -> PeakBook:
        book = self.books.get(query)
        if book is None:
            book = self.books[query] = PeakBook(tolerance=self.tolerance, idle=self._idle)
        return book

    def _start(self, request: EvidenceRequest) -> datetime:
        """The window the peaks must cover: at least ``min_window``, as the per-window queries were."""
        return min(request.window_start, request.at - self.min_window)

    def serve(
        self, rollouts: Sequence[tuple[PromotionPolicy, EvidenceRequest]], needs: Sequence[Need]
    ) -> Peaked:
        peaked = Peaked()
        wanted: dict[tuple[PeakQuery, datetime], dict[RevisionKey, datetime]] = {}
        askers: dict[PeakQuery, list[tuple[RevisionKey, Hashable, datetime, datetime]]] = {}
        for need in needs:
            if not isinstance(need.ask, PeaksAsk):
                continue
            request = rollouts[need.rollout][1]
            start = self._start(request)
            starts = wanted.setdefault((need.ask.peaks, request.at), {})
            starts[need.revision] = min(start, starts.get(need.revision, start))
            who = (request.namespace, request.inference_service)
            askers.setdefault(need.ask.peaks, []).append((need.revision, who, start, request.at))
        refreshes: dict[tuple[PeakQuery, datetime], tuple[_PeakRefresh, bool]] = {}
        for query, at in sorted(wanted, key=lambda item: item[1]):
            refreshes[(query, at)] = self._refresh(query, wanted[(query, at)], askers[query], at)
        charged: set[tuple[int, PeakQuery, datetime]] = set()
        with self._lock:
            for need in needs:
                if not isinstance(need.ask, PeaksAsk):
                    continue
                request = rollouts[need.rollout][1]
                refresh, paid = refreshes[(need.ask.peaks, request.at)]
                charge = (need.rollout, need.ask.peaks, request.at)
                if paid and charge not in charged:
                    charged.add(charge)
                    peaked.http_requests[need.rollout] = (
                        peaked.http_requests.get(need.rollout, 0) + refresh.http_requests
                    )
                shown = _peaks_for(need.ask.peaks, need.revision, refresh.span) if refresh.query else ""
                outcome = QueryOutcome(shown, None, None, 0, refresh.duration)
                failure = refresh.failures.get(need.revision)
                parsed: GroupedAnswer | QueryFailure
                if failure is not None:
                    parsed = failure
                else:
                    maxima, series = self.book(need.ask.peaks).window(
                        need.revision, self._start(request), request.at
                    )
                    fields = {
                        (VALUE_FIELD if name == PEAK_FIELD else name): value for name, value in maxima.items()
                    }
                    if fields:
                        fields[FIELD_SAMPLES] = float(series)
                    parsed = GroupedAnswer({need.revision: fields})
                peaked.measurements[id(need)] = measurement_for(
                    need, outcome, parsed, min_requests=self.min_requests
                )
        return peaked

    def _refresh(
        self,
        query: PeakQuery,
        wanted: Mapping[RevisionKey, datetime],
        askers: Sequence[tuple[RevisionKey, Hashable, datetime, datetime]],
        at: datetime,
    ) -> tuple[_PeakRefresh, bool]:
        with self._lock:
            book = self.book(query)
            for revision, who, start, asked_at in askers:
                book.asked(revision, who, start, asked_at)
            last = self._last.get(query)
            if last is not None and abs(last.at - at) <= self.tolerance:
                missing = {
                    revision: start for revision, start in wanted.items() if revision not in last.revisions
                }
                if not missing:
                    return last, False
                fresh = self._sample(query, book, missing, last.at)
                last.revisions |= fresh.revisions
                last.failures.update(fresh.failures)
                merged = _PeakRefresh(
                    last.at, last.revisions, last.failures, fresh.query, fresh.http_requests, fresh.duration
                )
                return merged, True
            starts: dict[RevisionKey, datetime | None] = dict.fromkeys(book.tracked())
            starts.update(wanted)
            refresh = self._sample(query, book, starts, at)
            self._last[query] = refresh
            book.prune(at)
            return refresh, True

    def _sample(
        self, query: PeakQuery, book: PeakBook, starts: Mapping[RevisionKey, datetime | None], at: datetime
    ) -> _PeakRefresh:
        with collector_paused():  # as CountsPipeline._sample
            return self._sample_and_record(query, book, starts, at)

    def _sample_and_record(
        self, query: PeakQuery, book: PeakBook, starts: Mapping[RevisionKey, datetime | None], at: datetime
    ) -> _PeakRefresh:
        revisions = sorted(starts)
        backfill = {
            revision: start
            for revision, start in starts.items()
            if start is not None and start < at - self.tolerance and book.needs_backfill(revision, start)
        }
        ends = {revision: book.last_end(revision) for revision in revisions if revision not in backfill}
        known = [end for end in ends.values() if end is not None and end < at]
        span_start = min(known) if known else at - timedelta(seconds=self.step)
        live = [revision for revision in revisions if revision not in backfill]
        refresh = _PeakRefresh(at, set(revisions), {}, "")
        if live:
            span = f"{max(1, round((at - span_start).total_seconds() * 1000))}ms"
            try:
                promql = render_peaks(query, live, span)
            except ValueError as error:
                failure = QueryFailure(ErrorClass.BAD_QUERY, f"cannot build the query: {error}")
                refresh.failures.update(dict.fromkeys(revisions, failure))
                return refresh
            outcome = self._instant(promql, at)
            refresh.span = span
            refresh.query, refresh.http_requests, refresh.duration = (
                promql,
                outcome.http_requests,
                outcome.duration,
            )
            parsed = parse_peaks(outcome, live)
            if isinstance(parsed, QueryFailure):
                refresh.failures.update(dict.fromkeys(live, parsed))
            else:
                for revision in live:
                    book.record(revision, ends.get(revision) or span_start, at, parsed[revision])
        if backfill:
            self._backfill(query, book, backfill, at, refresh)
        return refresh

    def _backfill(
        self,
        query: PeakQuery,
        book: PeakBook,
        starts: Mapping[RevisionKey, datetime],
        at: datetime,
        refresh: _PeakRefresh,
    ) -> None:
        """One peak per scrape interval, on a grid ending at ``at``, back to the earliest start."""
        start = min(starts.values())
        intervals = max(1, round((at - start).total_seconds() / self.step))
        first_point = at - timedelta(seconds=(intervals - 1) * self.step)
        revisions = sorted(starts)
        span = f"{round(self.step * 1000)}ms"
        estimate = dict.fromkeys(revisions, _PEAK_SERIES_ESTIMATE)
        chunks = plan_backfill(estimate, first_point, at, self.step, sample_budget=self.sample_budget)
        history: dict[RevisionKey, list[tuple[datetime, datetime, PeakSample]]] = {r: [] for r in revisions}
        failed: QueryFailure | None = None
        pending = [(chunk, False) for chunk in chunks]
        while pending and failed is None:
            chunk, halved = pending.pop(0)
            promql = render_peaks(query, chunk.revisions, span)
            if not refresh.query:
                refresh.query, refresh.span = promql, span
            outcome = self._range(promql, chunk.start, chunk.end, self.step)
            refresh.http_requests += outcome.http_requests
            refresh.duration += outcome.duration
            matrix = parse_peak_matrix(outcome, chunk.revisions)
            if _halve(matrix, chunk, halved, pending):
                continue
            if isinstance(matrix, QueryFailure):
                failed = QueryFailure(
                    matrix.error_class, f"backfill of the peaks: {matrix.detail}", matrix.http_status
                )
                break
            points = round((chunk.end - chunk.start).total_seconds() / self.step)
            for index in range(points + 1):
                moment = chunk.start + timedelta(seconds=index * self.step)
                per = matrix.get(round(moment.timestamp(), 3), {})
                for revision in chunk.revisions:
                    sample = per.get(revision, PeakSample({}))
                    history[revision].append((moment - timedelta(seconds=self.step), moment, sample))
        if failed is not None:
            refresh.failures.update(dict.fromkeys(revisions, failed))
            return
        for revision in revisions:
            book.replay(revision, history[revision], start)


# The query a measurement shows (explain.json, status, notifications) is the grouped query narrowed
# to its own revision: what was asked for it, readable, and bounded. The grouped query itself lists
# every revision of the tick — at 1,000 rollouts about 100 kB, three copies in every explain
# document, and the state ConfigMaps' bulk in the watch caches and in every write.


@functools.lru_cache(maxsize=8192)
def _counters_for(counter: CounterQuery, revision: RevisionKey) -> str:
    return render_counters(counter, [revision])


@functools.lru_cache(maxsize=8192)
def _peaks_for(query: PeakQuery, revision: RevisionKey, span: str) -> str:
    return render_peaks(query, [revision], span or "1ms")


@functools.lru_cache(maxsize=8192)
def _builtin_for(query: BuiltinQuery, revision: RevisionKey) -> str:
    return render_builtin(query, [revision])
