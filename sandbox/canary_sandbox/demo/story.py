"""The demo's story: three models, what their new versions do, and what must happen to each.

* **A** ``sentiment``: v2 is a little faster and loads its weights for a few seconds. It is deployed
  the GitOps way (a new ``storageUri``, no percentage); the controller puts it at 10% before it is
  Ready, then it climbs 10 → 30 → 50 → promoted.
* **B** ``llm-chat``: v2 looks fine at 10% but its latency grows with its traffic share (a batching
  bug that only load reveals): at 30% its p99 breaks the limit relative to stable → rolled back
  (should the p99 of a few hundred requests still pass at 30%, it fails at 50%: the exit status
  asks for a rollback by the p99 check, not for the step it happened at).
* **C** ``image-classifier``: v2 never becomes Ready (say, an image that cannot be pulled) → rolled
  back at its progress deadline.

An outcome is judged from what the controller recorded (its state ConfigMap) and told people (the
webhook notifications), and from the InferenceService as the API showed it — never from what the demo
meant to happen.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from canary.rollout.state import Phase
from canary.rollout.vocabulary import NotificationAction
from canary_sandbox.demo.policies import DEMO_NAMESPACE, DemoTiming
from canary_sandbox.fleet.behaviour import RevisionBehaviour
from canary_sandbox.fleet.world import ModelTraffic

__all__ = ["ModelStory", "Outcome", "model_traffic", "storage_uri", "stories"]

# Enough traffic that a 10% canary collects a few hundred requests per window: a p99 from fewer
# samples is mostly noise, and the demo must not promote or roll back by luck.
REQUESTS_PER_SECOND = 200.0
_DECISION_PREFIX = re.compile(r"^(Rolling back|Promoting) \S+: ")


def storage_uri(name: str, version: str) -> str:
    return f"s3://models/{name}/{version}"


# What happened, in the webhook's words: the decisions that move traffic, and those that end a rollout.
TRAFFIC_MOVES = frozenset(
    {
        NotificationAction.STARTED,
        NotificationAction.ADVANCED,
        NotificationAction.PROMOTED,
        NotificationAction.ROLLED_BACK,
    }
)
_FINAL = frozenset({NotificationAction.PROMOTED, NotificationAction.ROLLED_BACK})


@dataclass(frozen=True)
class Outcome:
    """What happened to one model, as the controller recorded and announced it."""

    name: str
    phase: str | None
    history: Sequence[Mapping[str, Any]]  # the state's decision history (JSON form)
    notifications: Sequence[Mapping[str, Any]]  # webhook payloads, in arrival order
    first_step_before_ready: bool  # the demo saw the first step in the spec while v2 was not Ready

    def rollback(self) -> Mapping[str, Any] | None:
        rolled_back = NotificationAction.ROLLED_BACK
        return next((n for n in self.notifications if n.get("action") == rolled_back), None)

    def traffic_moves(self) -> list[int | None]:
        """``traffic.to`` of every decision that moved traffic (None: promoted, the field removed)."""
        return [n["traffic"]["to"] for n in self.notifications if n.get("action") in TRAFFIC_MOVES]

    def decisive_reason(self) -> str:
        """The sentence behind the final decision, for the summary table."""
        final = next(
            (n for n in reversed(self.notifications) if n.get("action") in _FINAL),
            None,
        )
        if final is None:
            return str(self.history[-1].get("reason", "")) if self.history else ""
        # "Rolling back llm-chat-predictor-00002: <why>" -> "<why>": the table names the model already.
        return _DECISION_PREFIX.sub("", str(final.get("summary", "")))


@dataclass(frozen=True)
class ModelStory:
    letter: str
    name: str
    stable: RevisionBehaviour
    canary: RevisionBehaviour
    plot: str  # what the new version does
    expected: str  # what must happen to it
    expected_phase: Phase
    judge: Callable[[Outcome], list[str]]  # what went wrong; empty when the story happened

    @property
    def namespace(self) -> str:
        return DEMO_NAMESPACE


def _judge_promoted(outcome: Outcome) -> list[str]:
    problems = []
    if outcome.phase != Phase.SUCCEEDED:
        problems.append(f"expected Succeeded, ended {outcome.phase}")
    if outcome.traffic_moves() != [10, 30, 50, None]:
        problems.append(f"expected traffic 10 → 30 → 50 → promoted, saw {outcome.traffic_moves()}")
    if not outcome.first_step_before_ready:
        problems.append("the first step was not in place before v2 became Ready")
    return problems


def _judge_rolled_back(outcome: Outcome, why: Callable[[Mapping[str, Any]], str | None]) -> list[str]:
    """Rolled back, announced, and for the reason ``why`` checks in the rollback's notification."""
    problems = []
    if outcome.phase != Phase.ROLLED_BACK:
        problems.append(f"expected RolledBack, ended {outcome.phase}")
    rollback = outcome.rollback()
    if rollback is None:
        return [*problems, "no rolled-back notification was received"]
    problem = why(rollback)
    return [*problems, problem] if problem else problems


def _failed_on_p99(rollback: Mapping[str, Any]) -> str | None:
    failed = [c["name"] for c in rollback.get("checks", []) if c.get("verdict") == "fail"]
    if "p99" in failed:
        return None
    return f"expected the p99 check to fail, the rollback's failing checks were {failed}"


def _at_the_deadline(rollback: Mapping[str, Any]) -> str | None:
    text = " ".join([str(rollback.get("summary", "")), *map(str, rollback.get("reasons", []))])
    if "progressDeadline" in text:
        return None
    return f"expected a rollback at the progress deadline, the reason was: {text}"


def _judge_regression(outcome: Outcome) -> list[str]:
    return _judge_rolled_back(outcome, _failed_on_p99)


def _judge_deadline(outcome: Outcome) -> list[str]:
    return _judge_rolled_back(outcome, _at_the_deadline)


def stories(timing: DemoTiming) -> list[ModelStory]:
    """The three models at a given speed (loading times shrink with the windows)."""

    def loading(seconds: float, floor: float) -> float:
        return max(floor, seconds / timing.speed)

    return [
        ModelStory(
            "A",
            "sentiment",
            stable=RevisionBehaviour(median_ms=45, gpu_base_mib=30000, ready_after_s=1.0),
            # Loads for a few seconds, as a GPU model does: long enough to show the first step is
            # written before it is Ready, short next to the windows.
            canary=RevisionBehaviour(median_ms=40, gpu_base_mib=31000, ready_after_s=loading(5, 2)),
            plot="healthy, a little faster; loads for a few seconds",
            expected="started at 10% before Ready, 10 → 30 → 50 → promoted",
            expected_phase=Phase.SUCCEEDED,
            judge=_judge_promoted,
        ),
        ModelStory(
            "B",
            "llm-chat",
            stable=RevisionBehaviour(median_ms=120, gpu_base_mib=52000, ready_after_s=1.0),
            # median x (1 + 3 x share): 1.3x stable at 10%, inside the +50% limit; 1.9x at 30%, well
            # outside it (a p99 measured from a few hundred requests wobbles by several percent).
            canary=RevisionBehaviour(
                median_ms=120, gpu_base_mib=54000, load_sensitivity=3.0, ready_after_s=loading(3, 1.5)
            ),
            plot="latency grows with its traffic share",
            expected="passes 10%; p99 fails against stable once its share grows → rolled back",
            expected_phase=Phase.ROLLED_BACK,
            judge=_judge_regression,
        ),
        ModelStory(
            "C",
            "image-classifier",
            stable=RevisionBehaviour(median_ms=90, gpu_base_mib=20000, ready_after_s=1.0),
            canary=RevisionBehaviour(median_ms=90, gpu_base_mib=20000, ready_after_s=None),
            plot="never becomes Ready",
            expected="rolled back at the progress deadline",
            expected_phase=Phase.ROLLED_BACK,
            judge=_judge_deadline,
        ),
    ]


def model_traffic(story: ModelStory) -> ModelTraffic:
    return ModelTraffic(
        story.namespace,
        story.name,
        REQUESTS_PER_SECOND,
        {storage_uri(story.name, "v1"): story.stable, storage_uri(story.name, "v2"): story.canary},
    )
