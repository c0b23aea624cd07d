"""A small, pure model of what KServe (Knative mode) reports for one InferenceService.

It follows KServe's own code (kserve/kserve; lines as read at the commits named):

* ``createKnativeService`` in ``pkg/controller/v1beta1/inferenceservice/reconcilers/knative/
  ksvc_reconciler.go`` (279fb1e5, lines 104-145) builds the Knative traffic from
  ``canaryTrafficPercent`` and ``status.components.predictor.latestRolledoutRevision`` *as it is*:
  ``[{latestRevision, N}, {prev: latestRolledout, 100-N}]``. The kfserving-era version (00196962,
  lines 84-90) pinned the split back to ``previousRolledoutRevision`` here, at routing time, when the
  latest rolled-out revision was the latest ready one; KServe PRs #2040/#2097 moved that into
  ``PropagateStatus``, and so does this model.
* ``PropagateStatus`` in ``pkg/apis/serving/v1beta1/inference_service_status.go`` (0217bdab,
  lines 518-587) sums the resolved traffic per revision (527-532), then, for the ``latestRevision``
  entry of the latest ready revision (533-535): records a promotion when it has 100% (536-541), or,
  when that revision is already the latest rolled-out one, is also the latest created, has less than
  100% on that entry and 100% in total — the split is "over the same revision" — rolls
  ``latestRolledoutRevision`` back to ``previousRolledoutRevision`` (542-553, which stays as it is).

One :meth:`KServeSim.reconcile_once` is one KServe pass with Knative's work folded in (the spec
written, the route resolved, the status propagated); :meth:`KServeSim.reconcile` repeats passes
until the status stops changing, as KServe does: its own status write re-triggers it. The lag stays:
the spec changes at once, the status only when a reconcile runs. It produces the InferenceService
JSON that :func:`canary.kserve.view.observe` parses, so every test also exercises the real parser.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from canary.kserve.view import observe
from canary.rollout.observed import ObservedInferenceService

_FIELD = "canaryTrafficPercent"
_MAX_PASSES = 5  # a pin-back settles in two; more means the model loops


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
        """KServe reconciles until its status is stable: each of its status writes triggers a pass."""
        for _ in range(_MAX_PASSES):
            before = self._status_key()
            self.reconcile_once()
            if self._status_key() == before:
                return
        raise AssertionError(f"KServe's status did not settle in {_MAX_PASSES} passes")

    def reconcile_once(self) -> None:
        """One KServe pass: Knative's configuration, ``createKnativeService``, the route, PropagateStatus."""
        self._configuration()
        self._route(self._ksvc_traffic())
        self._propagate_status()

    def _status_key(self) -> tuple[object, ...]:
        return (
            len(self.revisions),
            self.latest_ready,
            self.latest_rolledout,
            self.previous_rolledout,
            copy.deepcopy(self.traffic),
        )

    def _configuration(self) -> None:
        """Knative: a revision for a changed template; the latest ready is the newest Ready one."""
        spec = {key: value for key, value in self.predictor.items() if key != _FIELD}
        if not self.revisions or self.revisions[-1].spec != spec:
            number = len(self.revisions) + 1
            self.revisions.append(SimRevision(f"{self.name}-predictor-{number:05d}", copy.deepcopy(spec)))
        for revision in reversed(self.revisions):
            if revision.ready:
                if self.latest_ready is None or self._index(revision.name) > self._index(self.latest_ready):
                    self.latest_ready = revision.name
                break

    def _ksvc_traffic(self) -> list[dict[str, Any]]:
        """ksvc_reconciler.go createKnativeService (279fb1e5): the targets written to the Knative Service.

        Line 104 takes ``latestRolledoutRevision`` as it is — no pin-back at routing time; 115-134 split
        when the percentage is set and a revision was rolled out, 135-145 route 100% to the latest.
        """
        percent, last_rolledout = self.percent, self.latest_rolledout
        if percent is None or not last_rolledout:
            return [{"latestRevision": True, "percent": 100}]
        targets: list[dict[str, Any]] = [{"latestRevision": True, "percent": percent}]
        if percent < 100:
            prev = {"tag": "prev", "revisionName": last_rolledout, "latestRevision": False}
            targets.append({**prev, "percent": 100 - percent})
        return targets

    def _route(self, targets: list[dict[str, Any]]) -> None:
        """Knative route status: ``latestRevision: true`` resolves to the latest Ready revision."""
        if self.latest_ready is None:
            self.traffic = []
            return
        self.traffic = [
            {**target, "revisionName": target.get("revisionName") or self.latest_ready} for target in targets
        ]

    def _propagate_status(self) -> None:
        """inference_service_status.go PropagateStatus (0217bdab), lines 527-553, line by line."""
        total: dict[str, int] = {}
        for target in self.traffic:  # 527-532: the percentages per revision
            total[target["revisionName"]] = total.get(target["revisionName"], 0) + target["percent"]
        for target in self.traffic:
            if target["revisionName"] != self.latest_ready or not target["latestRevision"]:
                continue  # 533-535: only the latestRevision entry of the latest ready revision
            if self.latest_rolledout != self.latest_ready:
                if target["percent"] == 100:  # 536-541: a promotion
                    self.previous_rolledout = self.latest_rolledout
                    self.latest_rolledout = self.latest_ready
            elif (
                self.latest_ready == self.latest_created  # 545
                and target["percent"] < 100  # 546
                and total.get(target["revisionName"]) == 100  # 548-549: split over the same revision
                and self.previous_rolledout  # 549
            ):
                self.latest_rolledout = self.previous_rolledout  # 550: rolled back after a promotion

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
