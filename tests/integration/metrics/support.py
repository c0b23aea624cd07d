"""Real-Prometheus fixtures for the evidence layer, and the truth computed from raw events.

The production-like scenario (backfilled before Prometheus starts, 20 minutes at a 5 s scrape
interval, evaluated at ``AT`` over the 10 minutes before it):

* ``kn118`` (Knative <= 1.18, OpenCensus, DCGM ``pod`` labels): ``llama`` — stable 00001 with three
  pods, two GPUs each, 2% 5xx, old vLLM metric names, and a queue-proxy restart (counter reset) on one
  pod inside the window; canary 00002 with two pods created before the window, *no 5xx at all*, an
  OOMKilled kserve-container and a queue-proxy restart inside the window, a GPU-memory spike, new vLLM
  names.
* ``kn119`` (Knative 1.19-1.20, ``kn_queueproxy_app_duration_seconds``, DCGM ``exported_pod``):
  ``bert`` — a canary with 6% 5xx against a 1% stable.
* ``kn121`` (Knative >= 1.21, ``kn_serving_invocation_duration_seconds``): ``resnet`` — canary pods
  created *inside* the window, one whose storage-initializer init container was OOMKilled.
* ``relabel``: ``gemma`` — OpenTelemetry series carrying a relabelled ``knative_revision`` label.
* ``idle``: ``quiet`` — a canary whose pods are Ready with request series but no requests; ``dark`` — a
  canary with pods and no request series at all.
* ``od\\d"ns``: revisions whose names carry quotes, backslashes and regex metacharacters, next to decoys
  that an unescaped regex would also match.

The expectations never use PromQL: they come from the individual simulated requests and samples.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
from canary_sandbox.k8s_names import revision_pod_name
from canary_sandbox.kserve_metrics import (
    OK_CODE,
    OPENCENSUS_BUCKETS_MS,
    OTEL_BUCKETS,
    Pod,
    RequestRecord,
    Restart,
    Revision,
    Simulation,
    bucket_bounds,
    empirical_quantile,
)
from canary_sandbox.prometheus import PrometheusServer

from canary.evidence import EvidenceRequest
from canary.metrics import PrometheusConfig, PrometheusEvidenceSource
from canary.policy.model import PromotionPolicy

STEP = 5.0  # the simulated scrape interval
WINDOW = 600.0
HISTORY = 1200.0
# The last sample lies a little before "now", so the blocks end before Prometheus' head begins.
END = float(int(time.time() // STEP * STEP) - 60)
AT_SECONDS = END + 0.5  # evaluation time T: off the sample grid, so no sample sits on a window edge
AT = datetime.fromtimestamp(AT_SECONDS, UTC)
REACH = datetime.fromtimestamp(END, UTC)  # how far the samples reach at AT: the last scrape's time
WINDOW_START = AT - timedelta(seconds=WINDOW)
START = END - HISTORY

# Names from the cluster are escaped before they enter PromQL. A Kubernetes name cannot hold these
# characters, but a template variable must be safe whatever its value.
ODD_NAMESPACE = 'od\\d"ns'
ODD_REVISION = 'odd"rev.x+(y)'
ODD_DECOY = 'odd"revZxxxy'  # matched by `odd"rev.x+(y)` used as an unescaped regex


def _pods(revision: str, count: int, created: float, *, ready_after: float = 60.0, spacing: float = 15.0,
          gpus: int = 0, restarts: dict[int, tuple[Restart, ...]] | None = None) -> tuple[Pod, ...]:  # fmt: skip
    return tuple(
        Pod(
            name=revision_pod_name(revision, index),
            created=created,
            ready=created + ready_after + spacing * index,
            gpus=gpus,
            restarts=(restarts or {}).get(index, ()),
        )
        for index in range(count)
    )


def production_revisions() -> list[Revision]:
    long_ago = START - 7200.0
    canary_created = AT_SECONDS - 900.0
    return [
        Revision(
            "kn118", "llama", "llama-predictor-00001",
            _pods("llama-predictor-00001", 3, long_ago, gpus=2,
                  restarts={2: (Restart(AT_SECONDS - 250.0, "queue-proxy", "Error"),)}),
            requests_per_second=2.0, error_ratio=0.02, latency_median=0.09,
            requests_profile="knative-opencensus", gpu_used_mib=41000.0, vllm=True, vllm_old_names=True,
            kv_cache_level=0.35,
        ),
        Revision(
            "kn118", "llama", "llama-predictor-00002",
            _pods("llama-predictor-00002", 2, canary_created, gpus=2,
                  restarts={0: (Restart(AT_SECONDS - 300.0, "kserve-container", "OOMKilled"),),
                            1: (Restart(AT_SECONDS - 200.0, "queue-proxy", "Error"),)}),
            requests_per_second=2.0, error_ratio=0.0, latency_median=0.13,
            requests_profile="knative-opencensus", gpu_used_mib=52000.0, gpu_spike_mib=20000.0, vllm=True,
            kv_cache_level=0.55,
        ),
        Revision(
            "kn119", "bert", "bert-predictor-00004",
            _pods("bert-predictor-00004", 2, long_ago, gpus=1),
            error_ratio=0.01, latency_median=0.04, requests_profile="knative-otel-queueproxy",
            gpu_labels="exported_pod", gpu_used_mib=12000.0,
        ),
        Revision(
            "kn119", "bert", "bert-predictor-00005",
            _pods("bert-predictor-00005", 2, AT_SECONDS - 1000.0, gpus=1),
            error_ratio=0.06, latency_median=0.05, requests_profile="knative-otel-queueproxy",
            gpu_labels="exported_pod", gpu_used_mib=15000.0,
        ),
        Revision(
            "kn121", "resnet", "resnet-predictor-00007",
            _pods("resnet-predictor-00007", 2, long_ago),
            error_ratio=0.01, latency_median=0.03, requests_profile="knative-otel-invocation",
        ),
        Revision(
            "kn121", "resnet", "resnet-predictor-00008",
            _pods("resnet-predictor-00008", 2, AT_SECONDS - 400.0, ready_after=45.0, spacing=5.0,
                  restarts={0: (Restart(AT_SECONDS - 380.0, "storage-initializer", "OOMKilled"),)}),
            error_ratio=0.0, latency_median=0.035, requests_profile="knative-otel-invocation",
        ),
        Revision(
            "relabel", "gemma", "gemma-predictor-00003", _pods("gemma-predictor-00003", 2, long_ago),
            error_ratio=0.03, requests_profile="knative-otel-invocation", revision_label="knative_revision",
        ),
        Revision(
            "idle", "quiet", "quiet-predictor-00002", _pods("quiet-predictor-00002", 1, long_ago),
            requests_per_second=0.0, requests_profile="knative-opencensus",
        ),
        Revision(
            "idle", "dark", "dark-predictor-00002", _pods("dark-predictor-00002", 1, long_ago),
            requests_profile=None,
        ),
        Revision(ODD_NAMESPACE, "odd", ODD_REVISION, _pods(ODD_REVISION, 1, long_ago), requests_per_second=1.0,
                 requests_profile="knative-otel-invocation"),
        Revision(ODD_NAMESPACE, "odd", ODD_DECOY, _pods(ODD_DECOY, 1, long_ago), requests_per_second=3.0,
                 requests_profile="knative-otel-invocation"),
    ]  # fmt: skip


def make_policy(checks: list[dict[str, Any]], *, namespace: str = "kn118", name: str = "llama",
                metrics: dict[str, Any] | None = None, interval: str = "30s") -> PromotionPolicy:  # fmt: skip
    """A valid policy with the given checks (as they would be written in YAML)."""
    return PromotionPolicy.model_validate(
        {
            "apiVersion": "kserve-canary.dev/v1alpha1",
            "kind": "PromotionPolicy",
            "metadata": {"name": "p", "namespace": namespace if namespace.isidentifier() else "odd"},
            "spec": {
                "target": {"inferenceService": name if name.isidentifier() else "odd"},
                "interval": interval,
                "metrics": metrics or {},
                "checks": checks,
            },
        }
    )


def make_request(policy: PromotionPolicy, namespace: str, canary: str, stable: str | None, *,
                 at: datetime = AT, window: float = WINDOW, compare_with_stable: bool = True,
                 inference_service: str = "llama") -> EvidenceRequest:  # fmt: skip
    return EvidenceRequest(
        namespace=namespace,
        inference_service=inference_service,
        canary_revision=canary,
        stable_revision=stable,
        window_start=at - timedelta(seconds=window),
        at=at,
        checks=tuple(policy.spec.checks),
        compare_with_stable=compare_with_stable,
    )


@dataclass(frozen=True)
class Scenario:
    simulation: Simulation
    prometheus: PrometheusServer

    @property
    def url(self) -> str:
        return self.prometheus.url

    def source(self, **options: Any) -> PrometheusEvidenceSource:
        """An evidence source on this Prometheus; the simulated scrape interval is 5 s."""
        config = options.pop("config", None) or PrometheusConfig(url=self.url)
        return PrometheusEvidenceSource(config, scrape_interval=STEP, **options)


def http_queries(url: str, handler: str = "/api/v1/query") -> int:
    """Queries Prometheus has answered so far on ``handler`` (instant by default; range queries are
    ``/api/v1/query_range``), from its own /metrics (not from our code)."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and f'handler="{handler}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def range_queries(url: str) -> int:
    return http_queries(url, "/api/v1/query_range")


# ---------------------------------------------------------------------------------------------
# The truth, from raw events


def visible_requests(simulation: Simulation, revision: str, *, window: float = WINDOW) -> list[RequestRecord]:
    """The requests a counter-based query over [AT - window, AT] can see.

    A counter's first sample in the window is its baseline, so a request counts when it was first
    scraped after that: after the first in-window scrape, and after the scrape at which its series
    (pod x status code) was born — a 5xx series appears with its first 5xx, a success series when the
    pod starts serving.
    """
    first_in_window = simulation.first_tick_at_or_after(AT_SECONDS - window)
    births: dict[tuple[str, str], float] = {}
    for record in simulation.requests:
        if record.revision == revision:
            key = (record.pod, record.status)
            births[key] = min(births.get(key, math.inf), record.tick)
    serving_from = {
        pod.name: simulation.first_tick_at_or_after(max(pod.ready or math.inf, simulation.ticks[0]))
        for rev in simulation.revisions
        if rev.name == revision
        for pod in rev.pods
        if pod.ready is not None and pod.ready <= simulation.ticks[-1]
    }
    visible = []
    for record in simulation.requests:
        if record.revision != revision or record.tick > AT_SECONDS:
            continue
        born = births[(record.pod, record.status)]
        if record.status == OK_CODE:
            born = min(born, serving_from.get(record.pod, born))
        if record.tick > max(first_in_window, born):
            visible.append(record)
    return visible


def quantile_band(values: list[float], quantile: float, bounds: tuple[float, ...]) -> tuple[float, float]:
    """Where a histogram quantile may land: the buckets of the empirical quantile ±0.5%."""
    low = empirical_quantile(values, max(0.0, quantile - 0.005))
    high = empirical_quantile(values, min(1.0, quantile + 0.005))
    return bucket_bounds(low, bounds)[0], bucket_bounds(high, bounds)[1]


def latency_bounds_seconds(profile: str | None) -> tuple[float, ...]:
    if profile == "knative-opencensus":
        return tuple(bound / 1000.0 for bound in OPENCENSUS_BUCKETS_MS)
    return OTEL_BUCKETS


def revision_of(simulation: Simulation, name: str) -> Revision:
    return next(revision for revision in simulation.revisions if revision.name == name)


def counted_requests(
    simulation: Simulation, revision: str, after: float, until: float
) -> list[RequestRecord]:
    """The requests a counter book whose snapshots stand at ``after`` and ``until`` counts exactly.

    A snapshot at ``t`` sees the last scrape at or before ``t``; every request first counted by a
    scrape after the first snapshot's and up to the last one's counts, whatever its series (a new
    pod, the first 5xx series, a queue-proxy restart in between).
    """
    return simulation.requests_between(revision, _scrape_at_or_before(simulation, after), until)


def _scrape_at_or_before(simulation: Simulation, moment: float) -> float:
    earlier = [tick for tick in simulation.ticks if tick <= moment]
    return earlier[-1] if earlier else -math.inf


def at_most(records: list[RequestRecord], bounds: tuple[float, ...]) -> tuple[int, ...]:
    """Requests at most each bound (seconds) took: the truth behind a latency Histogram."""
    return tuple(sum(1 for record in records if record.latency <= bound) for bound in bounds)
