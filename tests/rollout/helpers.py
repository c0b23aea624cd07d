"""Builders shared by the rollout tests: a policy, evidence, and a harness that plays controller."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from canary.evidence import REQUESTS, ErrorClass, Evidence, EvidenceRequest, Measurement
from canary.kserve.status_model import KServeSim
from canary.policy.model import Check, PromotionPolicy
from canary.policy.units import Unit
from canary.rollout import Decision, RolloutState, Timeline, decide, evidence_request
from canary.rollout.judge import fraction_key

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GIB = 1024.0**3

SIX_CHECKS: list[dict[str, Any]] = [
    {"name": "p99", "metric": "latency", "quantile": 0.99, "max": "800ms", "maxIncrease": "20%"},
    {"name": "errors", "metric": "error-rate", "max": "1%", "maxIncrease": "50%", "minStable": "0.1%"},
    {"name": "oom", "metric": "oom-kills", "max": 0, "critical": True},
    {"name": "restarts", "metric": "restarts", "max": 0},
    {"name": "gpu-memory", "metric": "gpu-memory-peak", "maxFraction": 0.9},
    {
        "name": "ttft-p95",
        "promql": 'histogram_quantile(0.95, rate(ttft_bucket{pod=~"{{ revision }}-.*"}[{{ window }}]))',
        "unit": "seconds",
        "max": 2,
    },
]


def make_policy(**spec: Any) -> PromotionPolicy:
    """The policy of docs/design.md §5 with six checks; keyword arguments override ``spec`` fields (camelCase)."""
    body: dict[str, Any] = {
        "target": {"inferenceService": "llama"},
        "steps": [10, 30, 50, 100],
        "window": "10m",
        "interval": "1m",
        "minRequests": 100,
        "progressDeadline": "15m",
        "failureLimit": 2,
        "onNoData": {"after": "15m", "action": "hold"},
        "checks": SIX_CHECKS,
    }
    body.update(spec)
    return PromotionPolicy.model_validate(
        {
            "apiVersion": "kserve-canary.dev/v1alpha1",
            "kind": "PromotionPolicy",
            "metadata": {"name": "llama-chat", "namespace": "ml"},
            "spec": body,
        }
    )


# Healthy values per check, canonical units; the stable revision is a little better.
HEALTHY: dict[str, float] = {
    "p99": 0.40,
    "errors": 0.002,
    "oom": 0.0,
    "restarts": 0.0,
    "gpu-memory": 40 * GIB,
    "ttft-p95": 0.5,
}
HEALTHY_STABLE: dict[str, float] = {"p99": 0.38, "errors": 0.002, "gpu-memory": 40 * GIB, "ttft-p95": 0.5}


@dataclass
class EvidenceMaker:
    """Answers an :class:`EvidenceRequest` like the evidence layer would, with chosen values.

    ``canary`` / ``stable`` override values by check name; a :class:`Measurement` given as an
    override is used as is (for no-data and errors).
    """

    requests: float | Measurement = 5000.0
    canary: dict[str, float | Measurement] = field(default_factory=dict)
    stable: dict[str, float | Measurement] = field(default_factory=dict)
    gpu_fraction: float | Measurement = 0.5

    def __call__(self, request: EvidenceRequest) -> Evidence:
        requests = self.requests
        count = requests if isinstance(requests, Measurement) else Measurement.ok(requests, Unit.COUNT)
        canary: dict[str, Measurement] = {REQUESTS: count}
        stable: dict[str, Measurement] = {}
        for check in request.checks:
            canary[check.name] = _measure(check, self.canary.get(check.name, HEALTHY.get(check.name, 0.0)))
            if check.max_fraction is not None:
                fraction = self.gpu_fraction
                canary[fraction_key(check)] = (
                    fraction if isinstance(fraction, Measurement) else Measurement.ok(fraction, Unit.RATIO)
                )
            if request.compare_with_stable and check.comparable_to_stable:
                stable[check.name] = _measure(
                    check, self.stable.get(check.name, HEALTHY_STABLE.get(check.name, 0.0))
                )
        return Evidence(request=request, canary=canary, stable=stable)

    def failing(self, **values: float | Measurement) -> EvidenceMaker:
        return EvidenceMaker(self.requests, {**self.canary, **values}, dict(self.stable), self.gpu_fraction)


def _measure(check: Check, value: float | Measurement) -> Measurement:
    if isinstance(value, Measurement):
        return value
    return Measurement.ok(value, check.value_unit, samples=1000.0, query=f"query-of-{check.name}")


def no_data(detail: str = "no requests in the window") -> Measurement:
    return Measurement.no_data(detail)


def query_error(detail: str = "connection refused") -> Measurement:
    return Measurement.error(ErrorClass.UNREACHABLE, detail)


HEALTHY_EVIDENCE = EvidenceMaker()


class Harness:
    """Plays the controller's shell around the pure core, against a :class:`KServeSim`.

    Every tick: observe, ask for evidence, decide, store the state (as JSON, exactly as the shell
    would, so every test also exercises restarts), patch, and let KServe reconcile.
    """

    def __init__(self, policy: PromotionPolicy, sim: KServeSim, *, now: datetime = T0) -> None:
        self.policy = policy
        self.sim = sim
        self.now = now
        self.state = RolloutState()
        self.timeline = Timeline()
        self.decisions: list[Decision] = []
        self.requests: list[EvidenceRequest] = []

    def tick(
        self,
        after: float = 0.0,
        *,
        evidence: Callable[[EvidenceRequest], Evidence] | None = HEALTHY_EVIDENCE,
        patch: bool = True,
        reconcile: bool = True,
        alarm: bool = False,
    ) -> Decision:
        self.now += timedelta(seconds=after)
        observed = self.sim.observe()
        request = evidence_request(self.policy, observed, self.state, self.now, alarm=alarm)
        answer = evidence(request) if request is not None and evidence is not None else None
        if request is not None:
            self.requests.append(request)
        decision = decide(self.policy, observed, self.state, answer, self.now, alarm=alarm)
        # Write-ahead: the state (with the intent) is stored before the patch.
        self.state = RolloutState.from_json(decision.new_state.to_json())
        if patch and decision.action.writes:
            self.sim.set_percent(decision.weight)
        if reconcile:
            self.sim.reconcile()
        self.timeline.record(decision, self.now)
        self.decisions.append(decision)
        return decision

    def run(
        self,
        until: Callable[[Decision], bool],
        *,
        every: float = 60.0,
        limit: int = 500,
        evidence: Callable[[EvidenceRequest], Evidence] | None = HEALTHY_EVIDENCE,
    ) -> Decision:
        """Tick every ``every`` seconds until ``until(decision)``; fails after ``limit`` ticks."""
        for _ in range(limit):
            decision = self.tick(every, evidence=evidence)
            if until(decision):
                return decision
        raise AssertionError(f"condition not reached in {limit} ticks:\n{self.timeline.render()}")

    def start_rollout(self, storage_uri: str = "s3://m/v2") -> Decision:
        """Adopt the serving InferenceService, push a new spec, and let the controller start."""
        self.tick()
        self.sim.change_model(storage_uri)
        self.sim.reconcile()
        return self.tick(1)

    def writes(self) -> list[int | None]:
        return self.timeline.written_weights()


def at(minutes: float = 0.0, seconds: float = 0.0) -> datetime:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


def measurements(**values: float) -> Mapping[str, Measurement]:
    return {name: Measurement.ok(value, Unit.NONE) for name, value in values.items()}


def in_sequence(*answers: Callable[[EvidenceRequest], Evidence]) -> Callable[[EvidenceRequest], Evidence]:
    """Answers the n-th evidence request with the n-th answer (the last one repeats)."""
    calls = iter(range(1_000_000))

    def answer(request: EvidenceRequest) -> Evidence:
        return answers[min(next(calls), len(answers) - 1)](request)

    return answer


def progressing(policy: PromotionPolicy | None = None, sim: KServeSim | None = None) -> Harness:
    """A harness whose canary llama-predictor-00002 is Ready and holds the first step, just started."""
    harness = Harness(policy or make_policy(), sim or KServeSim.serving())
    harness.start_rollout()
    harness.sim.make_ready()
    harness.sim.reconcile()
    started = harness.tick(60)
    step = started.new_state.step
    assert step is not None
    assert step.started_at == harness.now, harness.timeline.render()
    return harness
