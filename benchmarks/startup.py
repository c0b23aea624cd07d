"""``python -m benchmarks.startup``: from ``kserve-canary run`` starting to its first decision.

Against the sandbox stack (the API emulator over HTTP, a real Prometheus scraping the simulated
fleet) with one InferenceService and one policy: the controller is started as its own process, and
the clock runs from just before the process is spawned to the first decision it logs (the line with
a ``decisionId``), with the intermediate marks (the "starting" log line, ``/readyz`` answering 200).
Measured, not optimised: the number to watch when startup work is added.
"""

from __future__ import annotations

import statistics
import sys
import time

from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic
from canary_sandbox.stack import Stack, inference_service, wait_until

NS, NAME = "bench", "llama"
POLICY = f"""\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: {NAME}, namespace: {NS}}}
spec:
  target: {{inferenceService: {NAME}}}
  steps: [10, 50, 100]
  window: 4s
  interval: 1s
  checks:
    - {{name: p99, metric: latency, quantile: 0.99, max: 2s}}
"""


def _first(lines: list[dict[str, object]], key: str, value: object = None) -> bool:
    return any(key in line and (value is None or line[key] == value) for line in lines)


def measure(runs: int = 3) -> dict[str, list[float]]:
    marks: dict[str, list[float]] = {"starting": [], "ready": [], "first decision": [], "exit code": []}
    models = [ModelTraffic(NS, NAME, 20.0, {"s3://m/v1": RevisionBehaviour(median_ms=80)})]
    with Stack(models, {f"{NAME}.yaml": POLICY}) as stack:
        stack.apply(inference_service(NS, NAME, "s3://m/v1"))
        if not wait_until(lambda: bool(stack.predictor_status(NS, NAME).get("latestRolledoutRevision")), 30):
            raise RuntimeError("the InferenceService never became Ready")
        for run in range(runs):
            started = time.monotonic()
            controller = stack.start_controller(f"bench-{run}", wait_ready=False)
            seen: dict[str, float] = {}
            deadline = started + 60
            while len(seen) < 3 and time.monotonic() < deadline:
                lines = controller.log_lines()
                now = time.monotonic() - started
                if "starting" not in seen and _first(lines, "event", "kserve-canary starting"):
                    seen["starting"] = now
                if "ready" not in seen and controller.ready():
                    seen["ready"] = now
                if "first decision" not in seen and _first(lines, "decisionId"):
                    seen["first decision"] = now
                time.sleep(0.02)
            if len(seen) < 3:
                raise RuntimeError(f"run {run}: only {sorted(seen)} within 60 s:\n{controller.log()[-3000:]}")
            for mark, seconds in seen.items():
                marks[mark].append(seconds)
            marks["exit code"].append(float(controller.terminate()))
    return marks


def main() -> int:
    marks = measure()
    for mark, values in marks.items():
        if mark == "exit code":
            print(f"{mark:>15}: {sorted(set(int(v) for v in values))} after SIGTERM")
            continue
        shown = ", ".join(f"{value:.2f}" for value in values)
        print(f"{mark:>15}: median {statistics.median(values):.2f} s  ({shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
