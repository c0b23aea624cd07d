"""Recorded histories for the backtest tests, and what the policy should conclude from their counts.

The expected answers are computed here from the generated requests themselves (the generator keeps
every scrape's requests, errors and latencies) and the policy: the step rules of
canary/rollout/SEMANTICS.md ("Steps and evaluations") applied to tallies built from the raw data,
judged by the judge's own test (``judge_evidence``). The backtest gets the same data only through
promtool's blocks, a real Prometheus, the evidence pipeline and ``decide()``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from canary_sandbox.history import (
    EXAMPLE_POLICY,
    EXAMPLE_START,
    HEALTHY,
    REGRESSION,
    RolloutHistory,
)
from canary_sandbox.kserve_metrics import OPENCENSUS_BUCKETS_MS, OTEL_BUCKETS

from canary.evidence import CountSeries, EvidenceStatus, Histogram, Tally
from canary.policy import PromotionPolicy
from canary.rollout.horizon import Horizon, HorizonOutcome, evidence_time
from canary.rollout.judge import CountContext, judge_evidence
from canary.rollout.sampled import ErrorBudget
from canary.rollout.state import EvaluationVerdict

MINUTE = 60.0
T0 = EXAMPLE_START
END = T0 + 40 * MINUTE
SCRAPE = 15.0

POLICY = EXAMPLE_POLICY
# REGRESSION: a 5%-error canary somebody pushed to 100% by hand, against a stable revision at 0.4%;
# HEALTHY: a release a controller drove 10 -> 30 -> 50 -> 100 (its weight gauge scraped too).
# Healthy too, but Prometheus recorded nothing for a minute in the middle of the first step.
GAP = (T0 + 7 * MINUTE, T0 + 8 * MINUTE)
WITH_GAP = RolloutHistory(
    "ml",
    "vision",
    T0,
    END,
    traffic=[(T0 + 5 * MINUTE, 10), (T0 + 9 * MINUTE, 30), (T0 + 13 * MINUTE, 50), (T0 + 21 * MINUTE, 100)],
    scrape_interval=SCRAPE,
    gaps=[GAP],
    seed=11,
)
# The regression again, as Knative <= 1.18 exports it (OpenCensus names, milliseconds, revision_name).
LEGACY = dataclasses.replace(
    REGRESSION, namespace="legacy", inference_service="scorer", profile="knative-opencensus"
)
# The regression under InferenceService names whose pods no longer read "<revision>-deployment-...":
# 31 characters (the generateName is cut right after "deployment") and 37 (the Deployment name is
# md5-shortened); the pods are named as the cluster names them (canary_sandbox.k8s_names).
LONG_NAME = dataclasses.replace(
    REGRESSION, namespace="long", inference_service="llama-3-1-70b-instruct-awq-chat"
)
HASHED_NAME = dataclasses.replace(
    REGRESSION, namespace="long", inference_service="llama-3-1-70b-instruct-awq-chatbot-pr"
)
HISTORIES = (REGRESSION, HEALTHY, WITH_GAP, LEGACY, LONG_NAME, HASHED_NAME)


def when(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def _document(history: RolloutHistory) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(
        POLICY.format(name=history.inference_service, namespace=history.namespace)
    )
    if history.profile == "knative-opencensus":
        # One Prometheus holds both generations here (as one serving several clusters would), and
        # detection picks the newest: the policy names its own, as the live controller needs it to.
        document["spec"]["metrics"] = {"requests": history.profile}
    return document


def write_policy(directory: Path, history: RolloutHistory) -> Path:
    path = directory / f"{history.inference_service}.yaml"
    path.write_text(yaml.safe_dump(_document(history), sort_keys=False), encoding="utf-8")
    return path


def policy_for(history: RolloutHistory, **spec: object) -> PromotionPolicy:
    document = _document(history)
    document["spec"].update(spec)
    return PromotionPolicy.model_validate(document)


def first_served(history: RolloutHistory) -> float:
    """The scrape at which the canary's first requests were counted: where its first step starts."""
    return next(scrape.at for scrape in history.scrapes(history.canary_name) if scrape.requests > 0)


def last_shared(history: RolloutHistory) -> float:
    """The last scrape at which both revisions served: where the recorded period ends."""
    both = {scrape.at for scrape in history.scrapes(history.canary_name) if scrape.requests > 0}
    return max(
        scrape.at
        for scrape in history.scrapes(history.stable_name)
        if scrape.requests > 0 and scrape.at in both
    )


def counts(history: RolloutHistory, revision: str, start: float, end: float, interval: float) -> CountSeries:
    """The revision's tallies over (start, end] on the evaluation grid, straight from the raw scrapes."""
    edges = (
        tuple(bound / 1000.0 for bound in OPENCENSUS_BUCKETS_MS)
        if history.profile == "knative-opencensus"
        else tuple(OTEL_BUCKETS)
    )
    tallies = []
    moment = start
    while moment < end:
        scrapes = history.counted(revision, moment, moment + interval)
        latencies = [latency for scrape in scrapes for latency in scrape.latencies]
        histogram = Histogram(
            edges, tuple(sum(1 for latency in latencies if latency <= edge) for edge in edges), len(latencies)
        )
        tallies.append(
            Tally(
                when(moment),
                when(moment + interval),
                sum(scrape.requests for scrape in scrapes),
                sum(scrape.errors for scrape in scrapes),
                0,
                {"latency": histogram},
            )
        )
        moment += interval
    return CountSeries(EvidenceStatus.OK, tuple(tallies))


@dataclass(frozen=True)
class Expected:
    action: str  # advance | promote | rollback
    at: float
    weight: int | None  # what it writes (None: the promotion removes the field)


def expected_story(history: RolloutHistory, policy: PromotionPolicy) -> list[Expected]:
    """The decisions the policy must reach on the generated counts (see the module docstring)."""
    spec = policy.spec
    interval, steps = spec.interval, spec.canary_steps
    budget = ErrorBudget.of(policy)
    fair = [step.weight / sum(earlier.weight for earlier in steps[: i + 1]) for i, step in enumerate(steps)]
    first, last = first_served(history), last_shared(history)
    story: list[Expected] = []
    index, step_start, moment, counted = 0, first, first, 0.0
    while moment + interval <= last:
        moment += interval
        final = index == len(steps) - 1
        step = steps[index]
        window = step.window if step.window is not None else spec.window
        canary = counts(history, history.canary_name, first, moment, interval)
        horizon = Horizon(
            timedelta(seconds=spec.step_horizon(step)),
            evidence_time(canary, when(step_start)),
            when(moment),
            spec.at_horizon,
            moment - step_start >= window,
        )
        evaluation = judge_evidence(
            spec.checks,
            {},
            {},
            compare_with_stable=True,
            counts={
                "canary": canary,
                "stable": counts(history, history.stable_name, first, moment, interval),
            },
            context=CountContext(
                step_start=when(step_start),
                budget=budget,
                confidence=spec.confidence,
                final_step=final,
                horizon=horizon,
            ),
        )
        if evaluation.verdict is EvaluationVerdict.FAIL:
            story.append(Expected("rollback", moment, 0))
            return story
        minimum = step.min_requests if step.min_requests is not None else spec.min_requests
        requests = evaluation.requests or 0
        held = moment - step_start >= window and requests >= minimum
        # The highest step carries its share of what the steps counted, unless decided on its estimate.
        on_estimate = any(j.horizon is HorizonOutcome.ESTIMATE for j in evaluation.judgements)
        share = on_estimate or fair[index] >= 1 or requests >= fair[index] / (1 - fair[index]) * counted
        if held and final and evaluation.verdict is EvaluationVerdict.PASS and share:
            story.append(Expected("promote", moment, None))
            return story
        if held and not final and evaluation.advance_ok:
            index += 1
            counted += requests
            story.append(Expected("advance", moment, steps[index].weight))
            step_start = moment
    return story


def offset(moment: datetime, seconds: float) -> datetime:
    return moment + timedelta(seconds=seconds)
