"""Recorded rollout history as OpenMetrics, for backtests against a real, backfilled Prometheus.

A :class:`RolloutHistory` describes what happened to one InferenceService: the stable revision
serving alone, then a canary revision receiving the traffic shares of :attr:`RolloutHistory.traffic`
over time (as a controller or a person moved ``canaryTrafficPercent``), each revision with its own
error ratio and latency. :meth:`RolloutHistory.openmetrics` renders what the exporters would have
written, one sample per scrape, with timestamps, for ``promtool tsdb create-blocks-from openmetrics``
(``PrometheusServer(backfill=...)``):

* the Knative queue-proxy request histograms of one requests profile — ``knative-otel-invocation``
  (``kn_serving_invocation_duration_seconds`` inside the breaker and otelhttp's
  ``http_server_request_duration_seconds`` around it, each with its ``otel_scope_name``; seconds,
  ``http_response_status_code``, revision known from the pod name, as the cluster names pods) or
  ``knative-opencensus`` (``revision_request_count`` and ``revision_request_latencies``,
  milliseconds, ``revision_name``, ``response_code_class``): cumulative counters per pod, the 5xx
  series appearing only with the first 5xx, as the exporters do;
* optionally the controller's own ``kserve_canary_rollout_weight`` gauge (the percentage status
  showed; -1 while there is no canary), as a scraped controller would have exported it.

Every request is drawn from a seeded random source and kept per scrape (:meth:`RolloutHistory.scrapes`),
so a test can compute what a judge should conclude from the very counts Prometheus holds.
"""

from __future__ import annotations

import bisect
import math
import random
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.kserve_metrics import (
    OPENCENSUS_BUCKETS_MS,
    OTEL_BUCKETS,
    OTELHTTP_SCOPE,
    OUTER_HISTOGRAM,
    QUEUE_PROXY_SCOPE,
    escape_label,
    format_number,
    otel_request_labels,
    poisson,
)

__all__ = [
    "EXAMPLE_POLICY",
    "EXAMPLE_START",
    "HEALTHY",
    "REGRESSION",
    "Behaviour",
    "RolloutHistory",
    "Scrape",
    "combined_openmetrics",
    "example_policy",
    "serve_examples",
]

_Families = dict[str, tuple[str, dict[tuple[tuple[str, str], ...], list[tuple[float, float]]]]]

OK_CODE = "200"
ERROR_CODE = "503"


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How a revision answers: the share of requests that get a 5xx, and log-normal latencies."""

    error_ratio: float = 0.002
    latency_median: float = 0.08  # seconds
    latency_sigma: float = 0.5


@dataclass(frozen=True, slots=True)
class Scrape:
    """What one revision's queue-proxy counted in ``(at - scrape_interval, at]``."""

    at: float  # epoch seconds of the scrape
    revision: str
    requests: int
    errors: int
    latencies: tuple[float, ...]  # seconds, one per request


@dataclass(frozen=True)
class RolloutHistory:
    """One InferenceService from ``start`` to ``end`` (epoch seconds), sampled every ``scrape_interval``.

    ``traffic`` is the canary's share over time: ``[(t, percent), ...]`` sorted by ``t``; before the
    first entry the canary does not exist (its pod appears one scrape before its first share), and a
    share of 0 after a positive one leaves the canary pod alive but idle (a rollback). When the canary
    reaches 100 the stable pod keeps serving nothing for ``stable_linger`` seconds and is then gone
    (Knative scales the unrouted revision down).
    """

    namespace: str
    inference_service: str
    start: float
    end: float
    traffic: Sequence[tuple[float, int]]
    stable_revision: str = ""
    canary_revision: str = ""
    scrape_interval: float = 15.0
    requests_per_second: float = 20.0
    stable: Behaviour = field(default_factory=Behaviour)
    canary: Behaviour = field(default_factory=Behaviour)
    profile: str = "knative-otel-invocation"  # or "knative-opencensus"
    controller_weight: bool = False  # also export kserve_canary_rollout_weight
    stable_linger: float = 60.0
    seed: int = 16
    # (start, end) spans in which Prometheus recorded nothing (an outage of the scrape): the exporters
    # kept counting, so the first sample after a gap holds everything counted during it.
    gaps: Sequence[tuple[float, float]] = ()

    def __post_init__(self) -> None:
        if self.profile not in ("knative-otel-invocation", "knative-opencensus"):
            raise ValueError(f"unsupported requests profile {self.profile!r}")
        if self.end <= self.start or self.scrape_interval <= 0:
            raise ValueError("need start < end and a positive scrape interval")
        moments = [moment for moment, _ in self.traffic]
        if moments != sorted(moments) or not moments:
            raise ValueError("traffic must be a non-empty list of (time, percent) sorted by time")

    # -- names ------------------------------------------------------------------------------------

    @property
    def stable_name(self) -> str:
        return self.stable_revision or f"{self.inference_service}-predictor-00001"

    @property
    def canary_name(self) -> str:
        return self.canary_revision or f"{self.inference_service}-predictor-00002"

    def pod(self, revision: str) -> str:
        return revision_pod_name(revision)

    # -- the raw truth ------------------------------------------------------------------------------

    @property
    def ticks(self) -> list[float]:
        count = int((self.end - self.start) // self.scrape_interval) + 1
        return [self.start + index * self.scrape_interval for index in range(count)]

    def canary_percent(self, moment: float) -> int | None:
        """The canary's share at ``moment`` (None: the canary does not exist yet)."""
        index = bisect.bisect_right([t for t, _ in self.traffic], moment) - 1
        return None if index < 0 else self.traffic[index][1]

    def _alive(self, revision: str, moment: float) -> bool:
        first = self.traffic[0][0]
        if revision == self.canary_name:
            return moment >= first - self.scrape_interval
        promoted = [t for t, percent in self.traffic if percent >= 100]
        return not promoted or moment < promoted[0] + self.stable_linger

    @cached_property
    def _played(self) -> dict[str, list[Scrape]]:
        rng = random.Random(self.seed)  # noqa: S311 - reproducible test data, not secrets
        played: dict[str, list[Scrape]] = {self.stable_name: [], self.canary_name: []}
        for moment in self.ticks:
            # What arrived in (moment - scrape, moment] is split as the traffic was at its start.
            percent = self.canary_percent(moment - self.scrape_interval / 2) or 0
            total = _poisson(rng, self.requests_per_second * self.scrape_interval)
            to_canary = sum(1 for _ in range(total) if rng.random() * 100 < percent)
            for revision, behaviour, count in (
                (self.stable_name, self.stable, total - to_canary),
                (self.canary_name, self.canary, to_canary),
            ):
                if not self._alive(revision, moment):
                    continue
                latencies = tuple(
                    behaviour.latency_median * math.exp(behaviour.latency_sigma * rng.gauss(0.0, 1.0))
                    for _ in range(count)
                )
                errors = sum(1 for _ in range(count) if rng.random() < behaviour.error_ratio)
                played[revision].append(Scrape(moment, revision, count, errors, latencies))
        return played

    def scrapes(self, revision: str) -> list[Scrape]:
        """Every scrape of ``revision``'s pod, oldest first (absent while the pod does not exist)."""
        return list(self._played[revision])

    def recorded(self, moment: float) -> bool:
        """Whether Prometheus has the samples of ``moment`` (not inside a gap)."""
        return not any(start <= moment < end for start, end in self.gaps)

    def counted(self, revision: str, after: float, until: float) -> list[Scrape]:
        """The scrapes of ``revision`` in ``(after, until]``: what a counter difference between two
        samples at those times holds."""
        return [scrape for scrape in self._played[revision] if after < scrape.at <= until]

    # -- rendering ----------------------------------------------------------------------------------

    def openmetrics(self) -> str:
        return combined_openmetrics([self])

    def families(self) -> _Families:
        """Every series of the history by metric family: ``{family: (type, {labels: samples})}``."""
        families: _Families = {}

        def sample(
            family: str, kind: str, name: str, labels: dict[str, str], at: float, value: float
        ) -> None:
            if not self.recorded(at):
                return
            series = families.setdefault(family, (kind, {}))[1]
            series.setdefault((("__name__", name), *sorted(labels.items())), []).append((at, value))

        opencensus = self.profile == "knative-opencensus"
        bounds = OPENCENSUS_BUCKETS_MS if opencensus else OTEL_BUCKETS
        scale = 1000.0 if opencensus else 1.0
        for revision in (self.stable_name, self.canary_name):
            counts: dict[str, int] = {}
            sums: dict[str, float] = {}
            buckets: dict[str, list[int]] = {}
            for scrape in self._played[revision]:
                counts.setdefault(OK_CODE, 0)
                sums.setdefault(OK_CODE, 0.0)
                buckets.setdefault(OK_CODE, [0] * len(bounds))
                for index, latency in enumerate(scrape.latencies):
                    code = ERROR_CODE if index < scrape.errors else OK_CODE
                    counts[code] = counts.get(code, 0) + 1
                    sums[code] = sums.get(code, 0.0) + latency * scale
                    per = buckets.setdefault(code, [0] * len(bounds))
                    for bucket, bound in enumerate(bounds):
                        if latency * scale <= bound:
                            per[bucket] += 1
                for code, count in counts.items():
                    for histogram, base in self._histograms(revision, code):
                        if opencensus:
                            sample(
                                "revision_request_count",
                                "counter",
                                "revision_request_count",
                                base,
                                scrape.at,
                                count,
                            )
                        for bucket, bound in enumerate(bounds):
                            labels = {**base, "le": format_number(bound)}
                            sample(
                                histogram,
                                "histogram",
                                f"{histogram}_bucket",
                                labels,
                                scrape.at,
                                buckets[code][bucket],
                            )
                        sample(
                            histogram,
                            "histogram",
                            f"{histogram}_bucket",
                            {**base, "le": "+Inf"},
                            scrape.at,
                            count,
                        )
                        sample(histogram, "histogram", f"{histogram}_count", base, scrape.at, count)
                        sample(histogram, "histogram", f"{histogram}_sum", base, scrape.at, sums[code])
        if self.controller_weight:
            labels = {"namespace": self.namespace, "inference_service": self.inference_service}
            for moment in self.ticks:
                percent = self.canary_percent(moment)
                weight = -1 if percent is None or percent >= 100 else percent
                sample(
                    "kserve_canary_rollout_weight",
                    "gauge",
                    "kserve_canary_rollout_weight",
                    labels,
                    moment,
                    weight,
                )
        return families

    def _histograms(self, revision: str, code: str) -> list[tuple[str, dict[str, str]]]:
        """The request histograms a queue-proxy writes, with their labels. On OpenTelemetry (>= 1.19)
        its own, inside the breaker, and otelhttp's around it: equal here, no load is ever shed."""
        base = self._labels(revision, code)
        if self.profile == "knative-opencensus":
            return [("revision_request_latencies", base)]
        return [
            (histogram, {**base, **otel_request_labels(scope, code)})
            for histogram, scope in (
                ("kn_serving_invocation_duration_seconds", QUEUE_PROXY_SCOPE),
                (OUTER_HISTOGRAM, OTELHTTP_SCOPE),
            )
        ]

    def _labels(self, revision: str, code: str) -> dict[str, str]:
        pod = self.pod(revision)
        if self.profile == "knative-opencensus":
            return {
                "namespace_name": self.namespace,
                "configuration_name": f"{self.inference_service}-predictor",
                "revision_name": revision,
                "service_name": f"{self.inference_service}-predictor",
                "pod_name": pod,
                "container_name": "queue-proxy",
                "response_code": code,
                "response_code_class": code[0] + "xx",
                "namespace": self.namespace,
                "pod": pod,
                "job": "queue-proxy",
            }
        return {
            "namespace": self.namespace,
            "pod": pod,
            "container": "queue-proxy",
            "job": "queue-proxy",
        }


def combined_openmetrics(histories: Sequence[RolloutHistory]) -> str:
    """The OpenMetrics text of several histories in one (each family once, as promtool wants it)."""
    merged: _Families = {}
    for history in histories:
        for family, (kind, series) in history.families().items():
            merged.setdefault(family, (kind, {}))[1].update(series)
    lines: list[str] = []
    for family, (kind, series) in merged.items():
        lines.append(f"# TYPE {family} {kind}\n")
        for key, samples in series.items():
            name = key[0][1]
            text = ",".join(f'{label}="{escape_label(value)}"' for label, value in key[1:])
            lines.extend(f"{name}{{{text}}} {format_number(value)} {at:.3f}\n" for at, value in samples)
    return "".join(lines) + "# EOF\n"


def _poisson(rng: random.Random, mean: float) -> int:
    # Knuth's method (the fleet simulation's) for small means; a normal approximation above (a
    # scrape of a busy model).
    if mean > 200:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    return poisson(rng, mean)


# -- Examples: the walkthrough of docs/backtest.md and tests/backtest --------------------------------

EXAMPLE_START = 1_795_168_800.0  # 2026-11-20T10:00:00Z
_MINUTE = 60.0

EXAMPLE_POLICY = """\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {name}, namespace: {namespace}}}
spec:
  target: {{inferenceService: {name}}}
  steps: [10, 30, 50, 100]
  window: 4m
  interval: 30s
  minRequests: 100
  checks:
    - {{name: errors, metric: error-rate, max: 2%, maxIncrease: 100%, minStable: 0.1%}}
    - {{name: p99, metric: latency, quantile: 0.99, max: 1s}}
"""


def example_policy(history: RolloutHistory) -> str:
    """The example policy file for ``history``'s InferenceService."""
    return EXAMPLE_POLICY.format(name=history.inference_service, namespace=history.namespace)


def _stepped(start: float, promoted_after: float) -> list[tuple[float, int]]:
    return [
        (start + 5 * _MINUTE, 10),
        (start + 9 * _MINUTE, 30),
        (start + 13 * _MINUTE, 50),
        (start + promoted_after * _MINUTE, 100),
    ]


# A regression pushed to 100% by hand, step by step: 5% errors against the stable revision's 0.4%.
REGRESSION = RolloutHistory(
    "payments",
    "fraud",
    EXAMPLE_START,
    EXAMPLE_START + 40 * _MINUTE,
    traffic=_stepped(EXAMPLE_START, 17),
    canary=Behaviour(error_ratio=0.05),
    stable=Behaviour(error_ratio=0.004),
    seed=3,
)
# A healthy release a controller drove 10 -> 30 -> 50 -> 100, its weight gauge scraped too.
HEALTHY = RolloutHistory(
    "ml",
    "sentiment",
    EXAMPLE_START,
    EXAMPLE_START + 40 * _MINUTE,
    traffic=_stepped(EXAMPLE_START, 21),
    canary=Behaviour(error_ratio=0.004),
    stable=Behaviour(error_ratio=0.004),
    controller_weight=True,
    seed=5,
)


def serve_examples(directory: str) -> None:  # pragma: no cover - an interactive helper
    """Write the example policies into ``directory``, start a real Prometheus on the examples'
    backfilled blocks and wait until SIGINT or SIGTERM: ``python -m canary_sandbox.history [DIR]``."""
    from canary_sandbox.prometheus import PrometheusServer  # noqa: PLC0415 - not for the generator alone

    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for history in (REGRESSION, HEALTHY):
        (root / f"{history.inference_service}.yaml").write_text(example_policy(history), encoding="utf-8")
    with PrometheusServer(backfill=combined_openmetrics([REGRESSION, HEALTHY])) as prometheus:
        print(f"Prometheus on the examples' history: {prometheus.url}", flush=True)
        print(
            f"policies: {root}/fraud.yaml (payments/fraud), {root}/sentiment.yaml (ml/sentiment)", flush=True
        )
        print(
            f"try: kserve-canary backtest {root}/fraud.yaml --from 2026-11-20T10:00:00Z "
            f"--to 2026-11-20T10:40:00Z --prometheus-url {prometheus.url} --scrape-interval 15",
            flush=True,
        )
        signal.sigwait(stop)


if __name__ == "__main__":  # pragma: no cover
    serve_examples(sys.argv[1] if len(sys.argv) > 1 else "backtest-examples")
