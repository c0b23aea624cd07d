"""How a simulated model revision behaves under traffic: latency, errors, GPU memory, OOM kills.

Pure and deterministic for a seed: :class:`PodSimulator` advances by ``dt`` seconds given the number
of requests routed to it, and accumulates exactly the counters a real queue-proxy, kube-state-metrics
and DCGM exporter would expose for that pod.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

__all__ = [
    "BREAKER_REJECT_MS",
    "KNATIVE_LATENCY_BUCKETS_MS",
    "CodeHistogram",
    "PodSimulator",
    "RevisionBehaviour",
]

# Knative's queue-proxy request latency distribution (OpenCensus view, milliseconds).
KNATIVE_LATENCY_BUCKETS_MS: tuple[float, ...] = (
    5, 10, 20, 40, 60, 80, 100, 150, 200, 250, 300, 350, 400, 450, 500, 600, 700, 800, 900,
    1000, 2000, 5000, 10000, 20000, 50000, 100000,
)  # fmt: skip
BREAKER_REJECT_MS = 0.4  # the breaker answers ErrRequestQueueFull at once, without waiting


@dataclass(frozen=True)
class RevisionBehaviour:
    """A model version's character. Latency is log-normal around ``median_ms``."""

    median_ms: float = 80.0
    sigma: float = 0.35  # log-normal spread; p99 ~ median * exp(2.33 * sigma)
    error_rate: float = 0.002  # fraction of requests answered 5xx
    # An overload that appears only at a higher share: from ``loaded_from_share`` of the traffic on,
    # this fraction of requests is answered 5xx instead of ``error_rate``.
    loaded_error_rate: float | None = None
    loaded_from_share: float = 0.5
    # Latency grows with the revision's traffic share: median * (1 + load_sensitivity * share).
    load_sensitivity: float = 0.0
    # Overload with containerConcurrency set: the share of requests the queue-proxy's breaker answers
    # 503 at once (its queue is full), and the mean time an admitted request waits for a slot.
    shed_ratio: float = 0.0
    queue_ms: float = 0.0
    gpu_total_mib: float = 81920.0  # an 80 GiB card
    gpu_reserved_mib: float = 512.0
    gpu_base_mib: float = 30000.0  # after the model is loaded
    gpu_mib_per_request: float = 0.0  # memory that leaks (or grows) per request served
    oom_at_mib: float | None = None  # the container is OOM-killed above this
    ready_after_s: float | None = 3.0  # None: never becomes Ready
    # A model that does not fit its GPU: the container is OOM-killed this many seconds into loading
    # its weights, every time it starts (with ready_after_s=None it never becomes Ready).
    oom_while_loading_s: float | None = None


@dataclass
class CodeHistogram:
    """One latency histogram (milliseconds) per status class, cumulative as an exporter keeps it."""

    bounds_ms: tuple[float, ...]
    counts: dict[str, float] = field(default_factory=lambda: {"2xx": 0.0})  # success from the start
    buckets: dict[str, list[float]] = field(default_factory=dict)
    sums_ms: dict[str, float] = field(default_factory=dict)

    def observe(self, code: str, latency_ms: float) -> None:
        self.counts[code] = self.counts.get(code, 0.0) + 1
        self.sums_ms[code] = self.sums_ms.get(code, 0.0) + latency_ms
        per_bucket = self.buckets.setdefault(code, [0.0] * len(self.bounds_ms))
        for index, bound in enumerate(self.bounds_ms):
            if latency_ms <= bound:
                per_bucket[index] += 1

    def bucket_counts(self, code: str) -> list[float]:
        return self.buckets.get(code, [0.0] * len(self.bounds_ms))

    @property
    def total(self) -> float:
        return sum(self.counts.values())


@dataclass
class PodSimulator:
    """Counters of one pod, as the exporters would publish them.

    The queue-proxy records requests twice: ``outer`` around its breaker (what the client got: the
    breaker's 503s and the time queued included) and ``inner`` inside it (what reached the model, as
    Knative >= 1.19's own histogram records it; whole seconds when ``inner_whole_seconds``, as
    1.19-1.20's handler converts).
    """

    name: str
    revision: str
    namespace: str
    behaviour: RevisionBehaviour
    seed: int
    bounds_ms: tuple[float, ...] = KNATIVE_LATENCY_BUCKETS_MS
    keeps_inner: bool = False  # the inner histogram is exported (Knative >= 1.19): keep it
    inner_whole_seconds: bool = False
    restarts: int = 0
    last_terminated_reason: str | None = None
    gpu_used_mib: float = 0.0
    served_since_start: int = 0
    loading_s: float = 0.0  # how long the container has been loading (not Ready yet)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)  # noqa: S311 - a reproducible simulation, not crypto
        self.gpu_used_mib = self.behaviour.gpu_base_mib
        self.outer = CodeHistogram(self.bounds_ms)
        self.inner = CodeHistogram(self.bounds_ms)

    @property
    def requests(self) -> dict[str, float]:
        """Requests per status class as the client saw them (the outer histogram)."""
        return {"2xx": 0.0, "5xx": 0.0, **self.outer.counts}

    @property
    def buckets(self) -> list[float]:
        """The outer histogram's cumulative buckets, every status class together."""
        return [sum(column) for column in zip(*map(self.outer.bucket_counts, ("2xx", "5xx")), strict=True)]

    @property
    def latency_count(self) -> float:
        return self.outer.total

    @property
    def latency_sum_ms(self) -> float:
        return sum(self.outer.sums_ms.values())

    def serve(self, count: int, traffic_share: float) -> None:
        """Answer ``count`` requests while the revision holds ``traffic_share`` (0..1) of the traffic."""
        behaviour = self.behaviour
        median = behaviour.median_ms * (1.0 + behaviour.load_sensitivity * traffic_share)
        mu = math.log(median)
        error_rate = behaviour.error_rate
        if behaviour.loaded_error_rate is not None and traffic_share >= behaviour.loaded_from_share:
            error_rate = behaviour.loaded_error_rate
        served = 0
        for _ in range(count):
            # The overload draws are made only for a behaviour that overloads: every other pod's
            # requests stay what its seed made them.
            if behaviour.shed_ratio > 0.0 and self._random.random() < behaviour.shed_ratio:
                self.outer.observe("5xx", BREAKER_REJECT_MS)  # never reaches the model
                continue
            latency = self._random.lognormvariate(mu, behaviour.sigma)
            code = "5xx" if self._random.random() < error_rate else "2xx"
            queued = self._random.expovariate(1.0 / behaviour.queue_ms) if behaviour.queue_ms > 0.0 else 0.0
            self.outer.observe(code, latency + queued)
            if self.keeps_inner:
                whole = math.floor(latency / 1000.0) * 1000.0
                self.inner.observe(code, whole if self.inner_whole_seconds else latency)
            served += 1
        self.served_since_start += served
        self.gpu_used_mib = min(
            behaviour.gpu_total_mib - behaviour.gpu_reserved_mib,
            behaviour.gpu_base_mib + behaviour.gpu_mib_per_request * self.served_since_start,
        )
        if behaviour.oom_at_mib is not None and self.gpu_used_mib >= behaviour.oom_at_mib:
            # The kernel kills the container; kubelet restarts it; the model loads again from scratch.
            self.restarts += 1
            self.last_terminated_reason = "OOMKilled"
            self.served_since_start = 0
            self.gpu_used_mib = behaviour.gpu_base_mib

    def load(self, dt: float) -> None:
        """``dt`` more seconds of loading (the pod is not Ready): a model that does not fit is
        OOM-killed, and kubelet starts it loading again."""
        limit = self.behaviour.oom_while_loading_s
        if limit is None:
            return
        self.loading_s += dt
        if self.loading_s >= limit:
            self.restarts += 1
            self.last_terminated_reason = "OOMKilled"
            self.loading_s = 0.0

    @property
    def gpu_free_mib(self) -> float:
        return max(0.0, self.behaviour.gpu_total_mib - self.behaviour.gpu_reserved_mib - self.gpu_used_mib)
