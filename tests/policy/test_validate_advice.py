"""`kserve-canary validate` tells a policy author what the judge will need before the first rollout."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from canary.cli import app

POLICY = """\
apiVersion: kserve-canary.dev/v1alpha1
kind: PromotionPolicy
metadata: {{name: m, namespace: ml}}
spec:
  target: {{inferenceService: m}}
  metrics: {{requests: {profile}}}
  checks:
    - {{name: p99, metric: latency, quantile: 0.99, max: {limit}, tolerance: {tolerance}}}
    - {{name: errors, metric: error-rate, max: 1%}}
    - {{name: oom, metric: oom-kills, max: 0}}
"""


def _validate(tmp_path: Path, *, profile: str, limit: str, tolerance: str = "10%") -> list[dict[str, object]]:
    folder = tmp_path / "ml"
    folder.mkdir(exist_ok=True)
    (folder / "m.yaml").write_text(POLICY.format(profile=profile, limit=limit, tolerance=tolerance))
    result = CliRunner().invoke(app, ["validate", "--format", "json", str(tmp_path)])
    assert result.exit_code == 0, result.output
    policies: list[dict[str, object]] = json.loads(result.output)["policies"]
    return policies


def test_validate_prints_each_steps_horizon_and_what_a_horizon_estimate_rests_on(tmp_path: Path) -> None:
    (policy,) = _validate(tmp_path, profile="knative-opencensus", limit="800ms")
    # The default horizon: each step's window (10m) and one more window, in evidence time.
    assert policy["horizons"] == [{"weight": w, "horizon": 1200.0} for w in (10, 30, 50)]
    assert policy["atHorizon"] == "decide"
    sizes = policy["horizonRequests"]
    assert sizes == {"p99": 600, "errors": 600}  # oom-kills is measured, not counted
    text = CliRunner().invoke(app, ["validate", str(tmp_path)]).output
    assert "horizons: every step decided by its horizon of evidence time at the latest (10% by 20m" in text
    assert "p99: a horizon estimate rests on at least 600 canary requests of its step" in text


def test_a_limit_far_from_every_bucket_edge_is_warned_about(tmp_path: Path) -> None:
    # Knative >= 1.21 buckets: 250ms, 500ms — nothing within 10 % above 350ms.
    (far,) = _validate(tmp_path, profile="knative-otel-invocation", limit="350ms")
    assert far["warnings"] == [
        "p99: max 350ms has no knative-otel-invocation bucket edge within 10% above it (nearest edges "
        "250ms–500ms): the sequential tests cannot resolve it there; the step's horizon decides on the estimate, "
        "interpolated inside the bucket, and says so"
    ]
    # OpenCensus has 350ms, and 300ms within 10 % below 318ms: judged exactly.
    (exact,) = _validate(tmp_path, profile="knative-opencensus", limit="350ms")
    assert exact["warnings"] == []


def test_a_progress_deadline_beyond_knatives_default_is_warned_about(tmp_path: Path) -> None:
    # Knative fails a revision not Ready within its own deadline, 600 s unless annotated
    # (knative/serving pkg/deployment/config.go ProgressDeadlineDefault): a policy that waits 20m for
    # a model to load waits for a revision that Knative already failed at 10m.
    folder = tmp_path / "ml"
    folder.mkdir()
    text = POLICY.format(profile="knative-opencensus", limit="800ms", tolerance="10%")
    (folder / "m.yaml").write_text(text + "  progressDeadline: 20m\n")
    result = CliRunner().invoke(app, ["validate", "--format", "json", str(tmp_path)])
    (policy,) = json.loads(result.output)["policies"]
    assert policy["warnings"] == [
        "progressDeadline 20m is longer than Knative's default progress deadline (10m, progress-deadline in "
        "knative-serving/config-deployment): Knative fails a revision that is not Ready by its own deadline, "
        "and the rollout is rolled back then. Annotate the InferenceService serving.knative.dev/progress-deadline: "
        '"1200s" (or raise the cluster\'s default) for models that load this long.'
    ]
    text_output = CliRunner().invoke(app, ["validate", str(tmp_path)]).output
    assert "warning: progressDeadline 20m is longer than Knative's default progress deadline" in text_output
    (default,) = _validate(tmp_path, profile="knative-opencensus", limit="800ms")  # 10m: Knative's
    assert default["warnings"] == []
