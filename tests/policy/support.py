"""Policy texts shared by the policy, controller and integration tests."""

from __future__ import annotations

import textwrap

VALID_POLICY = """\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata:
  name: {name}
  namespace: ml
spec:
  target:
    inferenceService: {target}
  steps: [10, 30, 50, 100]
  checks:
    - {{name: p99, metric: latency, quantile: 0.99, max: 800ms, maxIncrease: 20%}}
"""


def valid_policy(name: str = "good", target: str | None = None) -> str:
    return VALID_POLICY.format(name=name, target=target or name)


def policy_with(spec_lines: str, *, name: str = "broken", head: str | None = None) -> str:
    """A policy whose spec is ``spec_lines`` (indented by the helper)."""
    header = head or (
        "apiVersion: kserve-canary.dev/v1alpha1\n"
        "kind: PromotionPolicy\n"
        f"metadata:\n  name: {name}\n  namespace: ml\n"
    )
    return header + "spec:\n" + textwrap.indent(textwrap.dedent(spec_lines), "  ")
