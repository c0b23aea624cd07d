"""The latency bucket layouts Knative exports, for advice before a rollout (``kserve-canary validate``).

The judge never assumes a layout: it reads the edges from the series. But a limit far from every
edge of the layout its Knative exports cannot be judged exactly — the judge then interpolates inside
the bucket and says so — and a policy author should hear that before the first rollout.
"""

from __future__ import annotations

from collections.abc import Mapping

from canary.policy.model import MetricKind, PromotionPolicy, RequestsProfile
from canary.policy.units import Unit, format_value

__all__ = ["LATENCY_EDGES", "resolution_warnings"]

# Knative <= 1.18 (OpenCensus, milliseconds in the series, seconds here).
_OPENCENSUS = tuple(
    ms / 1000.0
    for ms in (5, 10, 20, 40, 60, 80, 100, 150, 200, 250, 300, 350, 400, 450, 500, 600, 700, 800, 900, 1000,
               2000, 5000, 10000, 20000, 50000, 100000)
)  # fmt: skip
# Knative >= 1.19 (OpenTelemetry): 5 ms to 10 s.
_OTEL = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)

LATENCY_EDGES: Mapping[RequestsProfile, tuple[float, ...]] = {
    RequestsProfile.KNATIVE_OPENCENSUS: _OPENCENSUS,
    RequestsProfile.KNATIVE_OTEL_QUEUEPROXY: _OTEL,
    RequestsProfile.KNATIVE_OTEL_INVOCATION: _OTEL,
}


def resolution_warnings(policy: PromotionPolicy) -> list[str]:
    """For each absolute latency limit, the layouts with no edge within one tolerance factor of it
    (where the fail test looks, at or above the limit) or of ``limit / (1 + tolerance)`` (where the
    pass test looks, at or below it)."""
    profile = policy.spec.metrics.requests
    layouts = (
        {profile: LATENCY_EDGES[profile]}
        if profile in LATENCY_EDGES
        else {RequestsProfile.KNATIVE_OPENCENSUS: _OPENCENSUS, RequestsProfile.KNATIVE_OTEL_INVOCATION: _OTEL}
    )
    warnings = []
    for check in policy.spec.checks:
        if check.metric is not MetricKind.LATENCY or check.max is None:
            continue
        factor = 1.0 + check.tolerance
        limit, target = check.max, check.max / factor
        for layout, edges in layouts.items():
            slack = 1e-9  # limits are parsed from text: 350ms is 0.35000000000000003 s
            fail_edge = any(limit * (1 - slack) <= edge <= limit * factor * (1 + slack) for edge in edges)
            pass_edge = any(target / factor * (1 - slack) <= edge <= target * (1 + slack) for edge in edges)
            if fail_edge and pass_edge:
                continue
            around = [edge for edge in edges if edge < limit][-1:] + [
                edge for edge in edges if edge >= limit
            ][:1]
            shown = "–".join(format_value(edge, Unit.SECONDS) for edge in around)
            warnings.append(
                f"{check.name}: max {format_value(limit, Unit.SECONDS)} has no {layout.value} bucket edge "
                f"within {round(check.tolerance * 100):g}% "
                + ("above it" if not fail_edge else f"below {format_value(target, Unit.SECONDS)}")
                + f" (nearest edges {shown}): the sequential tests cannot resolve it there; the step's "
                "horizon decides on the estimate, interpolated inside the bucket, and says so"
            )
    return warnings
