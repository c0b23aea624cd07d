"""The demo's promotion policies, embedded so ``kserve-canary demo`` works from an installed package.

The same text (rendered at speed 1) is committed under ``policies/demo/demo/`` (a policy root holds one
directory per namespace) for people to read and for ``kserve-canary validate policies/demo/``; a test
keeps the two identical. The timing fields are
placeholders: ``--speed`` scales them, because Prometheus scrapes in real time and the only honest
way to make the story shorter is shorter windows, not a faster clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from string import Template

from canary.policy import PromotionPolicy, load_text
from canary.policy.units import format_duration

__all__ = [
    "DEMO_NAMESPACE",
    "POLICY_TEMPLATES",
    "WEBHOOK_ENV",
    "DemoTiming",
    "render_policies",
    "render_policy",
    "write_policy_files",
]

DEMO_NAMESPACE = "demo"
WEBHOOK_ENV = "DEMO_WEBHOOK_URL"

# One template for the three models: the demo is about what the evidence says, so every model is
# judged by the same checks and only the model versions differ. The absolute p99 limit is generous;
# the relative one (canary <= 1.5 x stable, over the same window) is what catches a regression.
_TEMPLATE = """\
# yaml-language-server: $$schema=../../schema.json
# The `kserve-canary demo` policy for $name ($story).
# Generated from canary_sandbox/demo/policies.py (speed 1); a test keeps this file and the package identical.
# Windows are seconds long because the demo's Prometheus scrapes every second: in production, hold
# each step for minutes (see policies/examples/).
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata:
  name: $name
  namespace: $namespace
spec:
  target:
    inferenceService: $name
  steps: [10, 30, 50, 100]
  window: $window
  interval: $interval
  minRequests: $min_requests
  progressDeadline: $progress_deadline
  failureLimit: 2
  metrics: {requests: knative-opencensus, gpuLabels: pod}
  checks:
    - {name: p99, metric: latency, quantile: 0.99, max: 500ms, maxIncrease: 50%}
    - {name: errors, metric: error-rate, max: 2%, maxIncrease: 100%, minStable: 0.5%}
    - {name: oom, metric: oom-kills, max: 0, critical: true}
    - {name: gpu-memory, metric: gpu-memory-peak, maxFraction: 0.9}
  notify:
    - webhook: {urlFrom: {env: $webhook_env}}
"""

# InferenceService name -> what its new version does in the story (shown in the file's header).
POLICY_TEMPLATES: dict[str, str] = {
    "sentiment": "model A: a healthy new version, promoted",
    "llm-chat": "model B: a new version whose p99 grows with its traffic share, rolled back",
    "image-classifier": "model C: a new version that never becomes Ready, rolled back at its deadline",
}


@dataclass(frozen=True)
class DemoTiming:
    """The policies' timing at a given ``--speed`` (speed 2 halves every duration).

    Floors keep the evidence meaningful at any speed: Prometheus scrapes every second, so an
    evaluation interval below 1 s would re-read the same samples, and a window needs at least two
    scrapes for a rate.
    """

    speed: float = 1.0

    def __post_init__(self) -> None:
        if not 0.1 <= self.speed <= 10:
            raise ValueError(f"speed must be between 0.1 and 10, got {self.speed:g}")

    def _scaled(self, seconds: float, floor: float) -> float:
        # Whole seconds: the policy language's durations are written for people.
        return float(max(floor, round(seconds / self.speed)))

    @property
    def window(self) -> float:
        return self._scaled(10, 2)

    @property
    def interval(self) -> float:
        return min(self._scaled(2, 1), self.window)

    @property
    def progress_deadline(self) -> float:
        return self._scaled(20, 6)

    @property
    def min_requests(self) -> int:
        # Traffic is real-time too: a shorter window sees proportionally fewer canary requests.
        return max(20, math.ceil(100 / self.speed))


def render_policy(name: str, timing: DemoTiming | None = None) -> str:
    """The YAML text of one demo policy at ``timing`` (speed 1 when omitted)."""
    timing = timing or DemoTiming()
    return Template(_TEMPLATE).substitute(
        name=name,
        story=POLICY_TEMPLATES[name],
        namespace=DEMO_NAMESPACE,
        window=format_duration(timing.window),
        interval=format_duration(timing.interval),
        min_requests=timing.min_requests,
        progress_deadline=format_duration(timing.progress_deadline),
        webhook_env=WEBHOOK_ENV,
    )


def render_policies(timing: DemoTiming | None = None) -> dict[str, str]:
    """File name -> YAML text for every demo policy."""
    return {f"{name}.yaml": render_policy(name, timing) for name in POLICY_TEMPLATES}


def parse_policy(text: str, path: str) -> PromotionPolicy:
    """Load a rendered policy with the controller's own loader (a broken template fails loudly here)."""
    result = load_text(text, path)
    if not result.ok or len(result.policies) != 1:
        raise ValueError(f"demo policy {path} is invalid: {[str(error) for error in result.errors]}")
    return result.policies[0].policy


def write_policy_files(root: Path) -> list[Path]:
    """Write the speed-1 policies into the policy root ``root`` (``root/demo/*.yaml``, what
    ``policies/demo/`` holds); returns the paths written."""
    directory = root / DEMO_NAMESPACE
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, text in render_policies().items():
        path = directory / file_name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # python -m canary_sandbox.demo.policies: regenerate policies/demo/demo/
    for written_path in write_policy_files(Path("policies/demo")):
        print(written_path)
