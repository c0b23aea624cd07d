"""The small view of one InferenceService that the decision core reasons about.

:func:`canary.kserve.view.observe` builds it from the InferenceService JSON; tests and simulations
build it directly. It holds only what the core needs (docs/design.md §2): the deployment mode, a
fingerprint of the predictor spec without the percentage and the artefact it serves, the spec's
``canaryTrafficPercent``, the predictor's revisions and traffic as KServe reports them, and whether
the newest revision is Ready.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from canary.rollout.artefact import Artefact
from canary.rollout.knative import KnativeDeadline

__all__ = ["DeploymentMode", "ObservedInferenceService", "TrafficTarget"]


class DeploymentMode(StrEnum):
    """How KServe deploys the InferenceService. ``canaryTrafficPercent`` works in Knative mode only."""

    KNATIVE = "Knative"  # "Serverless" before KServe 0.15
    STANDARD = "Standard"  # "RawDeployment" before KServe 0.15: the field is silently ignored
    MODEL_MESH = "ModelMesh"
    UNKNOWN = "Unknown"  # not reported yet (a fresh object) or a value this version does not know


@dataclass(frozen=True, slots=True)
class TrafficTarget:
    """One entry of ``status.components.predictor.traffic``."""

    percent: int
    revision_name: str | None = None
    latest_revision: bool = False
    tag: str | None = None


@dataclass(frozen=True, slots=True)
class ObservedInferenceService:
    """What the core knows about one InferenceService at one moment."""

    namespace: str
    name: str
    exists: bool = True
    deployment_mode: DeploymentMode = DeploymentMode.KNATIVE
    deployment_mode_reported: str | None = None  # the raw value, for messages
    generation: int | None = None
    resource_version: str | None = None  # for the shell's patch precondition
    uid: str | None = None  # metadata.uid: the state's owner reference, Events' involvedObject
    predictor_fingerprint: str | None = None  # stable hash of spec.predictor minus the percentage
    # What spec.predictor serves (storageUri, image, runtime, format), safe to show; None = none named.
    artefact: Artefact | None = None
    canary_traffic_percent: int | None = None  # spec.predictor.canaryTrafficPercent; None = absent
    latest_created_revision: str | None = None
    latest_ready_revision: str | None = None
    latest_rolledout_revision: str | None = None
    previous_rolledout_revision: str | None = None
    traffic: tuple[TrafficTarget, ...] = ()
    predictor_ready: bool | None = None  # PredictorReady (or Ready) condition; None = Unknown/absent
    revision_failure: str | None = None  # Knative's message when the latest revision failed
    failed_revision: str | None = None  # the revision a RevisionFailed condition names
    # The progress deadline Knative applies to the newest revision: its annotation, else the
    # cluster's default (the shell reads it); None = not known, Knative's 600 s assumed.
    knative_deadline: KnativeDeadline | None = None
    problems: tuple[str, ...] = ()  # what could not be read (malformed fields), for messages

    @classmethod
    def missing(cls, namespace: str, name: str) -> ObservedInferenceService:
        """The view of an InferenceService that does not exist."""
        return cls(namespace=namespace, name=name, exists=False, deployment_mode=DeploymentMode.UNKNOWN)

    @property
    def knative_failed(self) -> bool:
        """Knative failed the newest revision: a ``RevisionFailed`` condition names it."""
        return self.failed_revision is not None and self.failed_revision == self.latest_created_revision

    @property
    def canary_ready(self) -> bool:
        """The newest revision is Ready: KServe routes ``latestRevision: true`` traffic to it.

        ``latestRevision: true`` resolves to the latest *Ready* revision, so until
        latestCreatedRevision == latestReadyRevision the canary receives nothing (docs/design.md §2.1). A
        revision that was Ready and then failed keeps its place as latestReadyRevision; the
        predictor's Ready condition turning False is what tells it apart.
        """
        return (
            self.latest_created_revision is not None
            and self.latest_created_revision == self.latest_ready_revision
            and self.predictor_ready is not False
        )

    def resolved_revision(self, target: TrafficTarget) -> str | None:
        """The revision a traffic entry routes to (``latestRevision`` entries may omit the name)."""
        if target.revision_name:
            return target.revision_name
        return self.latest_ready_revision if target.latest_revision else None

    def weight_of(self, revision: str | None) -> int:
        """The percentage of traffic status says ``revision`` receives (0 when it is not routed)."""
        if revision is None:
            return 0
        return sum(target.percent for target in self.traffic if self.resolved_revision(target) == revision)

    def stable_for(self, canary: str) -> str | None:
        """The revision carrying the rest of the traffic while ``canary`` is the canary.

        Read from the status traffic's other entry (tagged ``prev``) when there is one, because that
        is where KServe actually routes; otherwise KServe's own choice: the latest rolled-out
        revision, or the previous one when the canary itself was already rolled out (a pin-back).
        """
        for target in self.traffic:
            revision = self.resolved_revision(target)
            if not target.latest_revision and revision is not None and revision != canary:
                return revision
        if self.latest_rolledout_revision is not None and self.latest_rolledout_revision != canary:
            return self.latest_rolledout_revision
        return self.previous_rolledout_revision
