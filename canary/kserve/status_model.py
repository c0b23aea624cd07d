"""A small, pure model of what KServe (Knative mode) reports for one InferenceService.

It follows KServe's own logic (``ksvc_reconciler.go`` building the Knative traffic from
``canaryTrafficPercent`` and the rolled-out revisions, ``PropagateStatus`` recording a revision as
rolled out when it has 100%), including the lag: the spec changes at once, the status only when
:meth:`KServeSim.reconcile` runs. It produces the InferenceService JSON that
:func:`canary.kserve.view.observe` parses, so every test also exercises the real parser.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from canary.kserve.view import observe
from canary.rollout.observed import ObservedInferenceService

_FIELD = "canaryTrafficPercent"


@dataclass
class SimRevision:
    name: str
    spec: dict[str, Any]
    ready: bool = False
    failed: str | None = None  # Knative's message when the revision failed
    crashed: bool = False  # was Ready, then its pods stopped being ready


@dataclass
class KServeSim:
    name: str = "llama"
    namespace: str = "ml"
    mode: str = "Serverless"
    predictor: dict[str, Any] = field(
        default_factory=lambda: {"model": {"modelFormat": {"name": "vllm"}, "storageUri": "s3://m/v1"}}
    )
    generation: int = 1
    revisions: list[SimRevision] = field(default_factory=list)
    latest_ready: str | None = None
    latest_rolledout: str | None = None
    previous_rolledout: str | None = None
    traffic: list[dict[str, Any]] = field(default_factory=list)
    exists: bool = True

    # -- constructors ---------------------------------------------------------------------------

    @classmethod
    def serving(cls, **kwargs: Any) -> KServeSim:
        """An InferenceService whose first revision is Ready and rolled out at 100%."""
        sim = cls(**kwargs)
        sim.reconcile()
        sim.make_ready()
        sim.reconcile()
        assert sim.latest_rolledout == sim.latest_created
        return sim

    # -- the spec (what kubectl / Git / the controller change; takes effect at once) -------------

    @property
    def percent(self) -> int | None:
        value = self.predictor.get(_FIELD)
        return value if isinstance(value, int) else None

    def set_percent(self, percent: int | None) -> None:
        """A JSON merge patch of canaryTrafficPercent (None removes it). Changes no revision."""
        if percent is None:
            self.predictor.pop(_FIELD, None)
        else:
            self.predictor[_FIELD] = percent
        self.generation += 1

    def change_model(self, storage_uri: str, *, percent: int | str | None = "keep") -> None:
        """A new predictor spec (as Git would push it), optionally with a percentage."""
        self.predictor["model"] = {**self.predictor["model"], "storageUri": storage_uri}
        if percent != "keep":
            assert percent is None or isinstance(percent, int)
            self.set_percent(percent)
        self.generation += 1

    # -- Knative / KServe (only on reconcile) ---------------------------------------------------

    @property
    def latest_created(self) -> str | None:
        return self.revisions[-1].name if self.revisions else None

    def revision(self, name: str | None = None) -> SimRevision:
        wanted = name or self.latest_created
        return next(revision for revision in self.revisions if revision.name == wanted)

    def make_ready(self, name: str | None = None) -> None:
        revision = self.revision(name)
        revision.ready, revision.failed, revision.crashed = True, None, False

    def fail(
        self, message: str = "Container failed with: CUDA out of memory", name: str | None = None
    ) -> None:
        revision = self.revision(name)
        revision.failed = message

    def crash(self, name: str | None = None) -> None:
        """A Ready revision whose pods stop being ready (crash loop)."""
        self.revision(name).crashed = True

    def recover(self, name: str | None = None) -> None:
        self.revision(name).crashed = False

    def reconcile(self) -> None:
        """One KServe reconcile: create a revision for a changed spec, route, propagate status."""
        spec = {key: value for key, value in self.predictor.items() if key != _FIELD}
        if not self.revisions or self.revisions[-1].spec != spec:
            number = len(self.revisions) + 1
            self.revisions.append(SimRevision(f"{self.name}-predictor-{number:05d}", copy.deepcopy(spec)))
        # Knative: the latest ready revision is the newest revision that became Ready.
        for revision in reversed(self.revisions):
            if revision.ready:
                if self.latest_ready is None or self._index(revision.name) > self._index(self.latest_ready):
                    self.latest_ready = revision.name
                break
        # ksvc_reconciler: which revision takes the rest of the traffic.
        percent = self.percent
        last_rolledout = self.latest_rolledout
        if last_rolledout == self.latest_ready and percent is not None and percent < 100:
            last_rolledout = self.previous_rolledout
        if percent is not None and last_rolledout:
            targets: list[dict[str, Any]] = [{"latestRevision": True, "percent": percent}]
            if percent < 100:
                targets.append(
                    {
                        "tag": "prev",
                        "revisionName": last_rolledout,
                        "latestRevision": False,
                        "percent": 100 - percent,
                    }
                )
        else:
            targets = [{"latestRevision": True, "percent": 100}]
        # Knative route status: latestRevision resolves to the latest Ready revision.
        if self.latest_ready is None:
            self.traffic = []
        else:
            self.traffic = [
                {**target, "revisionName": target.get("revisionName") or self.latest_ready}
                for target in targets
            ]
        # PropagateStatus: record a rollout when the latest ready revision has 100%.
        for target in self.traffic:
            recorded = target["latestRevision"] and target["revisionName"] == self.latest_ready
            if recorded and self.latest_rolledout != self.latest_ready and target["percent"] == 100:
                self.previous_rolledout = self.latest_rolledout
                self.latest_rolledout = self.latest_ready

    def _index(self, name: str) -> int:
        return next(index for index, revision in enumerate(self.revisions) if revision.name == name)

    # -- what the API server returns -------------------------------------------------------------

    def conditions(self) -> list[dict[str, Any]]:
        latest = self.revisions[-1] if self.revisions else None
        if latest is None:
            return []
        if latest.failed:
            ready = {
                "type": "PredictorReady",
                "status": "False",
                "reason": "RevisionFailed",
                "message": f'Revision "{latest.name}" failed with message: {latest.failed}.',
            }
        elif latest.ready and latest.crashed:
            ready = {
                "type": "PredictorReady",
                "status": "False",
                "reason": "RevisionMissing",
                "message": "Container kserve-container is in CrashLoopBackOff",
            }
        elif latest.ready:
            ready = {"type": "PredictorReady", "status": "True"}
        else:
            ready = {"type": "PredictorReady", "status": "Unknown", "reason": "RevisionMissing"}
        return [
            {"type": "IngressReady", "status": "True"},
            ready,
            {**ready, "type": "Ready"},
            {"type": "Stopped", "status": "False"},
        ]

    def to_json(self) -> dict[str, Any] | None:
        if not self.exists:
            return None
        predictor_status = {
            "latestCreatedRevision": self.latest_created,
            "latestReadyRevision": self.latest_ready,
            "latestRolledoutRevision": self.latest_rolledout,
            "previousRolledoutRevision": self.previous_rolledout,
            "traffic": copy.deepcopy(self.traffic),
        }
        return {
            "apiVersion": "serving.kserve.io/v1beta1",
            "kind": "InferenceService",
            "metadata": {"name": self.name, "namespace": self.namespace, "generation": self.generation},
            "spec": {"predictor": copy.deepcopy(self.predictor)},
            "status": {
                "deploymentMode": self.mode,
                "components": {"predictor": {k: v for k, v in predictor_status.items() if v}},
                "conditions": self.conditions(),
            },
        }

    def observe(self) -> ObservedInferenceService:
        return observe(self.to_json(), namespace=self.namespace, name=self.name)
