"""``python -m benchmarks.queries [--sizes 1,10,100]``: Prometheus requests per tick of the controller.

The controller's own path, not the evidence source alone: the real ``kserve-canary run`` process
against the sandbox stack, with N rollouts holding their first step (staggered starts), counted by
Prometheus itself (``prometheus_http_requests_total``). It is :mod:`benchmarks.scale` without the idle
run, printing the same table; read its column "Prometheus req/tick" and the ratio against the
smallest size. (It used to time ``PrometheusEvidenceSource.collect_many`` strategies on a backfilled
Prometheus; the tick now calls ``collect_many`` once per tick for every due rollout, which is what
is measured here.)
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import scale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="1,10,100")
    parser.add_argument("--interval", type=float, default=30.0)
    args = parser.parse_args(argv)
    return scale.main(["--sizes", args.sizes, "--idle", "0", "--interval", f"{args.interval:g}"])


if __name__ == "__main__":
    sys.exit(main())
