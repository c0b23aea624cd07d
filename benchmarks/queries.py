"""HTTP queries and wall time per evaluation, for 1, 10 and 100 concurrent rollouts, on a real Prometheus.

Run: ``.venv/bin/python -m benchmarks.queries [--rollouts 1,10,100] [--repeats 3]``

It backfills a real Prometheus (Debian's 2.42) with production-like metrics of N InferenceServices —
each a stable and a canary revision, Knative OpenCensus request metrics, kube-state-metrics, DCGM —
and evaluates one tick of every rollout (six checks each: p99 and error rate relative to the stable
revision, OOM kills, restarts, warm-up, GPU-memory peak with fraction) three ways, in the same run:

* ``per-revision`` — the naive baseline: one query per check per revision (what peers do);
* ``per-rollout``  — one grouped query per measure answers a rollout's canary and stable together;
* ``per-tick``     — one grouped query per measure answers every rollout of the tick.

HTTP queries are counted by Prometheus itself (``prometheus_http_requests_total``), not by our code.
All rollouts share the tick's window here (they entered their step together); rollouts whose windows
differ share a query only with those of the same window. Each strategy runs ``--repeats`` times and
the median wall time is reported; every strategy must give the same evidence values.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

import requests
from canary_sandbox.kserve_metrics import Pod, Restart, Revision, Simulation
from canary_sandbox.prometheus import PrometheusServer

from canary.evidence import Evidence, EvidenceRequest
from canary.metrics import PrometheusConfig, PrometheusEvidenceSource, QueryGrouping
from canary.policy.model import PromotionPolicy

STEP = 15.0
WINDOW = 600.0
CHECKS = [
    {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "2s", "maxIncrease": "20%"},
    {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%"},
    {"name": "oom", "metric": "oom-kills", "max": 0, "critical": True},
    {"name": "restarts", "metric": "restarts", "max": 0},
    {"name": "warmup", "metric": "warmup-time", "max": "5m"},
    {"name": "gpu", "metric": "gpu-memory-peak", "maxFraction": 0.9},
]


def _fleet(count: int, at: float) -> list[Revision]:
    revisions = []
    for index in range(count):
        namespace, name = f"team-{index:03d}", f"model-{index:03d}"
        for number, created, error_ratio in (
            (1, at - 86400, 0.01),
            (2, at - 900, 0.01 + 0.02 * (index % 3 == 0)),
        ):
            revision = f"{name}-predictor-{number:05d}"
            restarts = (
                (Restart(at - 120, "kserve-container", "OOMKilled"),)
                if number == 2 and index % 7 == 0
                else ()
            )
            pod = Pod(f"{revision}-deployment-6f7c9-0", created, created + 90, gpus=1, restarts=restarts)
            revisions.append(
                Revision(namespace, name, revision, (pod,), requests_per_second=1.0, error_ratio=error_ratio)
            )
    return revisions


def _policy(index: int) -> PromotionPolicy:
    return PromotionPolicy.model_validate(
        {
            "apiVersion": "kserve-canary.dev/v1alpha1",
            "kind": "PromotionPolicy",
            "metadata": {"name": f"model-{index:03d}", "namespace": f"team-{index:03d}"},
            "spec": {
                "target": {"inferenceService": f"model-{index:03d}"},
                "metrics": {"requests": "knative-opencensus", "gpuLabels": "pod"},
                "checks": CHECKS,
            },
        }
    )


def _rollouts(count: int, at: datetime) -> list[tuple[PromotionPolicy, EvidenceRequest]]:
    rollouts = []
    for index in range(count):
        policy = _policy(index)
        name = f"model-{index:03d}"
        request = EvidenceRequest(
            namespace=f"team-{index:03d}",
            inference_service=name,
            canary_revision=f"{name}-predictor-00002",
            stable_revision=f"{name}-predictor-00001",
            window_start=at - timedelta(seconds=WINDOW),
            at=at,
            checks=tuple(policy.spec.checks),
        )
        rollouts.append((policy, request))
    return rollouts


def _queries_answered(url: str) -> int:
    total = 0.0
    for line in requests.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("prometheus_http_requests_total{") and 'handler="/api/v1/query"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def _values(evidence: list[Evidence]) -> list[dict[str, tuple[str, float | None]]]:
    return [
        {
            f"{side}/{key}": (m.status.value, m.value)
            for side, ms in (("c", e.canary), ("s", e.stable))
            for key, m in ms.items()
        }
        for e in evidence
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", default="1,10,100", help="comma-separated rollout counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=4, help="queries in flight per evaluation")
    arguments = parser.parse_args()
    counts = [int(part) for part in arguments.rollouts.split(",")]

    end = float(int(time.time() // STEP * STEP) - 60)
    at = datetime.fromtimestamp(end + 1, UTC)
    started = time.monotonic()
    simulation = Simulation(_fleet(max(counts), end + 1), start=end - 1200, end=end, step=STEP, seed=3)
    text = simulation.openmetrics()
    print(f"backfill: {max(counts)} InferenceServices x 2 revisions, {text.count(chr(10)):,} samples, "
          f"generated in {time.monotonic() - started:.1f}s")  # fmt: skip

    with PrometheusServer(backfill=text) as prometheus:
        config = PrometheusConfig(url=prometheus.url)
        print(f"Prometheus 2.42 at {prometheus.url} (started after the backfill)\n")
        columns = ("rollouts", "strategy", "HTTP queries/eval", "wall ms/eval", "ms/rollout")
        header = f"{columns[0]:>8}  {columns[1]:<13}{columns[2]:>18}{columns[3]:>14}{columns[4]:>12}"
        print(header)
        print("-" * len(header))
        for count in counts:
            rollouts = _rollouts(count, at)
            results: dict[QueryGrouping, tuple[int, float]] = {}
            answers = {}
            for grouping in (QueryGrouping.PER_REVISION, QueryGrouping.PER_ROLLOUT, QueryGrouping.PER_TICK):
                with PrometheusEvidenceSource(
                    config, scrape_interval=STEP, grouping=grouping, max_parallel_queries=arguments.parallel
                ) as source:
                    source.collect_many(rollouts)  # warm Prometheus' caches and the connection pool
                    timings, queries = [], set()
                    for _ in range(arguments.repeats):
                        before = _queries_answered(prometheus.url)
                        clock = time.perf_counter()
                        evidence = source.collect_many(rollouts)
                        timings.append(time.perf_counter() - clock)
                        queries.add(_queries_answered(prometheus.url) - before)
                answers[grouping] = _values(evidence)
                assert len(queries) == 1, f"query count varied between runs: {queries}"
                wall = statistics.median(timings)
                results[grouping] = (queries.pop(), wall)
                print(f"{count:>8}  {grouping.value:<13}{results[grouping][0]:>18}{wall * 1000:>14.1f}"
                      f"{wall * 1000 / count:>12.2f}")  # fmt: skip
            if (
                not answers[QueryGrouping.PER_REVISION]
                == answers[QueryGrouping.PER_ROLLOUT]
                == answers[QueryGrouping.PER_TICK]
            ):
                raise SystemExit("the strategies disagree on the evidence: a bug")
            naive_queries, naive_wall = results[QueryGrouping.PER_REVISION]
            tick_queries, tick_wall = results[QueryGrouping.PER_TICK]
            rollout_queries, rollout_wall = results[QueryGrouping.PER_ROLLOUT]
            print(
                f"{'':>8}  ratio naive/per-rollout: {naive_queries / rollout_queries:.1f}x queries, "
                f"{naive_wall / rollout_wall:.1f}x time; "
                f"naive/per-tick: {naive_queries / tick_queries:.1f}x queries, "
                f"{naive_wall / tick_wall:.1f}x time"
            )
    print("\nSame evidence from all three strategies (checked). Queries counted by Prometheus' own "
          "prometheus_http_requests_total{handler=\"/api/v1/query\"}.")  # fmt: skip


if __name__ == "__main__":
    main()
