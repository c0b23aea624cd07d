"""``python -m benchmarks``: every benchmark, each printing ratios against a baseline from the same run."""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = ("benchmarks.cli_start", "benchmarks.decide", "benchmarks.decision_quality", "benchmarks.scale")


def main() -> int:
    status = 0
    for module in BENCHMARKS:
        print(f"\n=== {module} ===", flush=True)
        status |= subprocess.call([sys.executable, "-m", module])
    return status


if __name__ == "__main__":
    raise SystemExit(main())
