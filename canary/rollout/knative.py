"""Knative's progress deadline: how long a new revision has to reach its initial scale.

Knative gives a revision's Deployment ``progressDeadlineSeconds`` from the revision's
``serving.knative.dev/progress-deadline`` annotation, else from ``progress-deadline`` in the
``config-deployment`` ConfigMap of ``knative-serving``, else 600 s (knative/serving
pkg/reconciler/revision/resources/deploy.go ``MakeDeployment``; pkg/deployment/config.go lines 41-46,
``ProgressDeadlineDefault``). A revision that has not reached its initial scale by then is failed:
Ready False, reason ``ProgressDeadlineExceeded``, "Initial scale was never achieved"
(pkg/apis/serving/v1/revision_lifecycle.go lines 234-235), scaled to zero and never retried. The
Configuration reports it as ``RevisionFailed`` (configuration_lifecycle.go line 77), and KServe copies
that into the InferenceService's ``PredictorReady`` (inference_service_status.go lines 563-573).

KServe sets no deadline of its own on the Knative Service, so a model that loads for longer than
Knative's deadline is dead there, whatever the policy's ``progressDeadline`` says. This module says
so, before it bites (:func:`deadline_warning`) and in general words for ``validate``
(:func:`policy_deadline_warning`).
"""

from __future__ import annotations

from dataclasses import dataclass

from canary.policy.units import format_duration

__all__ = [
    "KNATIVE_DEFAULT_PROGRESS_DEADLINE",
    "PROGRESS_DEADLINE_ANNOTATION",
    "KnativeDeadline",
    "deadline_warning",
    "is_progress_deadline_failure",
    "policy_deadline_warning",
]

PROGRESS_DEADLINE_ANNOTATION = "serving.knative.dev/progress-deadline"
KNATIVE_DEFAULT_PROGRESS_DEADLINE = 600.0  # seconds: ProgressDeadlineDefault, pkg/deployment/config.go

# What Knative says of a revision that missed its deadline: the autoscaler's "Initial scale was never
# achieved" (revision_lifecycle.go 234-235), or the Deployment's own ProgressDeadlineExceeded
# ("ReplicaSet ... has timed out progressing"), propagated by PropagateDeploymentStatus.
_DEADLINE_WORDS = (
    "Initial scale was never achieved",
    "ProgressDeadlineExceeded",
    "has timed out progressing",
)


@dataclass(frozen=True, slots=True)
class KnativeDeadline:
    """The progress deadline Knative applies to a revision, and where it comes from (for messages)."""

    seconds: float
    source: str

    @classmethod
    def default(cls, why: str = "") -> KnativeDeadline:
        """Knative's built-in 600 s; ``why`` says why nothing more specific is known."""
        source = "Knative's default"
        return cls(KNATIVE_DEFAULT_PROGRESS_DEADLINE, f"{source}, {why}" if why else source)

    @property
    def text(self) -> str:
        return f"{format_duration(self.seconds)} ({self.source})"


def annotation_value(seconds: float) -> str:
    """The annotation's value for a deadline of ``seconds`` (a Go duration, whole seconds)."""
    return f"{int(-(-seconds // 1))}s"


def deadline_warning(revision: str, policy_deadline: float, knative: KnativeDeadline) -> str | None:
    """The warning when the policy waits longer for ``revision`` than Knative will, else None."""
    if policy_deadline <= knative.seconds:
        return None
    return (
        f"progressDeadline {format_duration(policy_deadline)} is longer than Knative's progress "
        f"deadline for {revision}, {knative.text}: Knative fails a revision that is not Ready by then "
        '("Initial scale was never achieved") and the rollout is rolled back at that moment. For a '
        f"model that loads longer, annotate the InferenceService {PROGRESS_DEADLINE_ANNOTATION}: "
        f'"{annotation_value(policy_deadline)}" (KServe passes it on to the revision).'
    )


def policy_deadline_warning(policy_deadline: float) -> str | None:
    """``validate``'s general words for a ``progressDeadline`` beyond Knative's default, else None."""
    if policy_deadline <= KNATIVE_DEFAULT_PROGRESS_DEADLINE:
        return None
    return (
        f"progressDeadline {format_duration(policy_deadline)} is longer than Knative's default progress "
        f"deadline ({format_duration(KNATIVE_DEFAULT_PROGRESS_DEADLINE)}, progress-deadline in "
        "knative-serving/config-deployment): Knative fails a revision that is not Ready by its own "
        "deadline, and the rollout is rolled back then. Annotate the InferenceService "
        f'{PROGRESS_DEADLINE_ANNOTATION}: "{annotation_value(policy_deadline)}" (or raise the cluster\'s '
        "default) for models that load this long."
    )


def is_progress_deadline_failure(message: str) -> bool:
    """Whether Knative's failure message says the revision missed its progress deadline."""
    return any(words in message for words in _DEADLINE_WORDS)
