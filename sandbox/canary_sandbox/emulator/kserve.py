"""KServe's InferenceService controller and the Knative Serving it drives, simulated.

Modelled on KServe's ``ksvc_reconciler.go`` and ``PropagateStatus`` (HEAD) and Knative's
configuration/route reconcilers, as summarised in docs/design.md §2:

- a change to ``spec.predictor`` other than ``canaryTrafficPercent``, or to the InferenceService's
  labels or annotations (KServe copies them into the revision template), gives the Knative Service a
  new template, and Knative creates revision ``{isvc}-predictor-{NNNNN}`` (``kmeta.ChildName``); a
  percentage change only changes traffic; pods are named as Knative and the apiserver name them
  (:mod:`canary_sandbox.k8s_names`), and a Knative Service name over 63 characters is refused;
- traffic as the ksvc reconciler writes it: with ``canaryTrafficPercent`` set and a
  ``latestRolledoutRevision`` in status, ``[{latestRevision: true, percent: N}, {revisionName:
  <latestRolledout>, percent: 100-N, tag: prev}]``, else ``[{latestRevision: true, percent: 100}]``;
  the ``latest`` tag only with ``serving.kserve.io/enable-tag-routing: "true"``;
- ``latestRevision: true`` resolves to the latest *Ready* revision;
- ``PropagateStatus`` records promotions (and the pin-back after a promotion) from the resolved
  traffic, and copies conditions and ``observedGeneration`` (the Knative Service's generation);
- the lag: KServe reconciles ``reconcile_delay`` after a change and propagates the Knative status it
  read *before* updating the Knative Service, so the InferenceService status reflects a spec change
  only after Knative has reconciled and KServe has run again;
- revisions become Ready (or fail, or stop being Ready) following a :class:`RevisionBehaviour`; pods
  follow; a revision that gets no traffic is scaled to zero after ``scale_down_grace`` and comes back
  cold when traffic returns.

RawDeployment/Standard mode has no revisions and no traffic split: ``canaryTrafficPercent`` is
silently ignored there.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from canary_sandbox import k8s_names
from canary_sandbox.emulator import progress_deadline
from canary_sandbox.emulator import resources as r
from canary_sandbox.emulator.clock import Clock
from canary_sandbox.emulator.conditions import TRUE, UNKNOWN, ConditionSet
from canary_sandbox.emulator.errors import ApiError
from canary_sandbox.emulator.scheduler import Scheduler
from canary_sandbox.emulator.store import Change, ObjectStore, format_micro_time, format_time

__all__ = [
    "DEPLOYMENT_MODE_ANNOTATION",
    "TAG_ROUTING_ANNOTATION",
    "KServeBehaviour",
    "KServeConfig",
    "RevisionBehaviour",
    "RevisionState",
]

JsonObject = dict[str, Any]

DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
TAG_ROUTING_ANNOTATION = "serving.kserve.io/enable-tag-routing"
ISVC_LABEL = "serving.kserve.io/inferenceservice"
# KServe does not copy these into the revision template (constants.ServiceAnnotationDisallowedList),
# and moves the rollout-duration/passthrough annotations to the Knative Service itself.
_ANNOTATIONS_NOT_IN_TEMPLATE = frozenset(
    {
        "autoscaling.knative.dev/min-scale",
        "autoscaling.knative.dev/max-scale",
        "internal.serving.kserve.io/storage-initializer-sourceuri",
        "kubectl.kubernetes.io/last-applied-configuration",
        "serving.knative.dev/rollout-duration",
        "serving.knative.openshift.io/enablePassthrough",
    }
)
_LABELS_NOT_IN_TEMPLATE = frozenset({"networking.kserve.io/visibility"})
_RAW_MODES = ("RawDeployment", "Standard")
_KSVC_NAME_TOO_LONG = (
    'admission webhook "validation.webhook.serving.knative.dev" denied the request: validation failed: '
    "not a DNS 1035 label: [must be no more than 63 characters]: metadata.name"
)
_HASH_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class RevisionState(StrEnum):
    PENDING = "Pending"
    READY = "Ready"
    FAILED = "Failed"


@dataclass(frozen=True)
class RevisionBehaviour:
    """How a simulated revision behaves, in seconds after it was created.

    ``ready_after_seconds=None`` never becomes Ready; ``fail_after_seconds`` makes it Failed from
    then on (before Ready: it never became Ready; after: it stopped being Ready mid-rollout).
    """

    ready_after_seconds: float | None = 1.0
    fail_after_seconds: float | None = None
    failure_message: str = "Container failed with: model server exited with code 1"
    replicas: int = 1

    def state_at(self, age: float) -> RevisionState:
        if self.fail_after_seconds is not None and age >= self.fail_after_seconds:
            return RevisionState.FAILED
        if self.ready_after_seconds is not None and age >= self.ready_after_seconds:
            return RevisionState.READY
        return RevisionState.PENDING

    def to_json(self) -> JsonObject:
        return {
            "readyAfterSeconds": self.ready_after_seconds,
            "failAfterSeconds": self.fail_after_seconds,
            "failureMessage": self.failure_message,
            "replicas": self.replicas,
        }

    @classmethod
    def from_json(cls, document: JsonObject, base: RevisionBehaviour) -> RevisionBehaviour:
        """Fields absent from ``document`` keep ``base``'s values; ``null`` means never."""
        known = {"readyAfterSeconds", "failAfterSeconds", "failureMessage", "replicas"}
        unknown = set(document) - known
        if unknown:
            raise ApiError.bad_request(f"unknown revision behaviour fields: {sorted(unknown)}")

        def seconds(key: str, default: float | None) -> float | None:
            if key not in document:
                return default
            value = document[key]
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ApiError.bad_request(f"{key} must be a non-negative number or null")
            return float(value)

        replicas = document.get("replicas", base.replicas)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ApiError.bad_request("replicas must be a non-negative integer")
        return cls(
            ready_after_seconds=seconds("readyAfterSeconds", base.ready_after_seconds),
            fail_after_seconds=seconds("failAfterSeconds", base.fail_after_seconds),
            failure_message=str(document.get("failureMessage", base.failure_message)),
            replicas=replicas,
        )


@dataclass
class KServeConfig:
    """Timing and sizing of the simulation (seconds are simulated seconds)."""

    reconcile_delay: float = 0.5  # KServe's reaction to an InferenceService change
    knative_delay: float = 0.0  # Knative's reaction to a Knative Service change
    revision_ready_delay: float = 1.0  # default time for a new revision to become Ready
    pods_per_revision: int = 1
    scale_down_grace: float = 30.0  # an unrouted revision keeps its pods this long
    ingress_domain: str = "example.com"

    def default_behaviour(self) -> RevisionBehaviour:
        return RevisionBehaviour(
            ready_after_seconds=self.revision_ready_delay, replicas=self.pods_per_revision
        )


@dataclass
class _Revision:
    """A Knative revision (or, in RawDeployment mode, one ReplicaSet of the predictor Deployment)."""

    name: str
    number: int
    created_at: float
    behaviour: RevisionBehaviour
    replica_set: str  # the "<rs>" in pod names
    template: JsonObject
    raw: bool = False  # a RawDeployment ReplicaSet rather than a Knative revision
    pods: list[str] = field(default_factory=list)
    pods_started_at: float = 0.0
    unrouted_since: float | None = None
    scaled_to_zero: bool = False
    progress_deadline: float = math.inf  # Knative's, counted from creation (progress_deadline.py)

    def state(self, now: float) -> RevisionState:
        if self.missed_deadline(now):
            return RevisionState.FAILED
        return self.behaviour.state_at(now - self.created_at)

    def missed_deadline(self, now: float) -> bool:
        """Not Ready (nor failed otherwise) within Knative's progress deadline: failed for good."""
        if now - self.created_at < self.progress_deadline:
            return False
        ready_after, fail_after = self.behaviour.ready_after_seconds, self.behaviour.fail_after_seconds
        ready_in_time = ready_after is not None and ready_after <= self.progress_deadline
        failed_before = fail_after is not None and fail_after < self.progress_deadline
        return not ready_in_time and not failed_before

    def failure_message(self, now: float) -> str:
        if self.missed_deadline(now):
            return progress_deadline.INITIAL_SCALE_NEVER_ACHIEVED
        return self.behaviour.failure_message

    def pods_ready(self, now: float) -> bool:
        if self.state(now) is not RevisionState.READY:
            return False
        warm_up = self.behaviour.ready_after_seconds or 0.0
        return now - self.pods_started_at >= warm_up

    def transition_times(self) -> set[float]:
        """Instants (after creation or after the last scale-up) at which something changes."""
        times = set()
        for offset in (self.behaviour.ready_after_seconds, self.behaviour.fail_after_seconds):
            if offset is not None:
                times.update({self.created_at + offset, self.pods_started_at + offset})
        if math.isfinite(self.progress_deadline):
            times.add(self.created_at + self.progress_deadline)
        return times


@dataclass
class _KnativeService:
    name: str
    generation: int
    template: JsonObject
    template_fingerprint: str
    traffic: list[JsonObject]
    status: JsonObject = field(default_factory=dict)
    latest_ready: str | None = None
    realised_fingerprint: str | None = None  # the template the latest revision was made from


@dataclass
class _Service:
    """Everything KServe and Knative hold for one InferenceService (keyed by its uid)."""

    namespace: str
    name: str
    uid: str
    revisions: list[_Revision] = field(default_factory=list)
    ksvc: _KnativeService | None = None
    raw_generation: int = 0
    raw_fingerprint: str | None = None
    reported_errors: set[str] = field(default_factory=set)

    @property
    def revisions_created(self) -> int:
        return len(self.revisions)

    def revision(self, name: str) -> _Revision | None:
        return next((rev for rev in self.revisions if rev.name == name), None)


def _without_empty(mapping: JsonObject) -> JsonObject:
    return {key: value for key, value in mapping.items() if value not in (None, "", [], {})}


def _deployment_mode(isvc: JsonObject) -> str:
    recorded = (isvc.get("status") or {}).get("deploymentMode")
    if recorded:
        return str(recorded)
    annotations = isvc["metadata"].get("annotations") or {}
    return str(annotations.get(DEPLOYMENT_MODE_ANNOTATION) or "Serverless")


def _template(isvc: JsonObject) -> JsonObject:
    """What KServe puts in the revision template: the predictor minus the percentage, labels, annotations."""
    predictor = dict(isvc["spec"]["predictor"])
    predictor.pop("canaryTrafficPercent", None)
    metadata = isvc["metadata"]
    annotations = {
        key: value
        for key, value in (metadata.get("annotations") or {}).items()
        if key not in _ANNOTATIONS_NOT_IN_TEMPLATE
    }
    labels = {
        key: value
        for key, value in (metadata.get("labels") or {}).items()
        if key not in _LABELS_NOT_IN_TEMPLATE
    }
    return {"predictor": predictor, "annotations": annotations, "labels": labels}


def _fingerprint(template: JsonObject) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()


def _hash_name(seed: str, length: int) -> str:
    digest = hashlib.sha256(seed.encode()).digest()
    return "".join(_HASH_ALPHABET[byte % len(_HASH_ALPHABET)] for byte in digest[:length])


def _desired_traffic(isvc: JsonObject) -> list[JsonObject]:
    """``createKnativeService``'s traffic targets (KServe HEAD)."""
    predictor = isvc["spec"]["predictor"]
    percent = predictor.get("canaryTrafficPercent")
    component = ((isvc.get("status") or {}).get("components") or {}).get("predictor") or {}
    last_rolled_out = component.get("latestRolledoutRevision") or ""
    tag_routing = (isvc["metadata"].get("annotations") or {}).get(TAG_ROUTING_ANNOTATION) == "true"
    latest: JsonObject = {"latestRevision": True, "percent": 100}
    if tag_routing:
        latest["tag"] = "latest"
    if percent is None or not last_rolled_out:
        return [latest]
    latest["percent"] = percent
    targets = [latest]
    if percent < 100:
        targets.append(
            {
                "tag": "prev",
                "revisionName": last_rolled_out,
                "latestRevision": False,
                "percent": 100 - percent,
            }
        )
    return targets


class KServeBehaviour:
    """The simulated KServe + Knative controllers; driven by store changes and the scheduler."""

    def __init__(
        self,
        store: ObjectStore,
        scheduler: Scheduler,
        clock: Clock,
        config: KServeConfig | None = None,
        seed: int | None = None,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.clock = clock
        self.config = config or KServeConfig()
        self._services: dict[tuple[str, str], _Service] = {}
        self._revision_overrides: dict[tuple[str, str], RevisionBehaviour] = {}
        self._isvc_defaults: dict[tuple[str, str], RevisionBehaviour] = {}
        # Generated names only need to be unique and reproducible with a seed, not secret.
        self._random = random.Random(seed)  # noqa: S311
        self.revisions_created_total = 0
        store.add_listener(self._on_change)

    # --- triggers -----------------------------------------------------------------------------------

    def _on_change(self, change: Change) -> None:
        if change.resource is not r.INFERENCESERVICES:
            return
        metadata = change.new["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        if change.type == "DELETED":
            self.scheduler.schedule(0, lambda: self._tear_down(namespace, name, metadata["uid"]))
            return
        # KServe's own status writes re-trigger it (controller-runtime sees the update) at once;
        # anything else is processed after the reconcile delay.
        delay = 0.0 if change.actor == "emulator" else self.config.reconcile_delay
        self._schedule_kserve(namespace, name, delay)

    def _schedule_kserve(self, namespace: str, name: str, delay: float) -> None:
        self.scheduler.schedule(
            delay, lambda: self._reconcile_kserve(namespace, name), key=f"kserve/{namespace}/{name}"
        )

    def _schedule_knative(self, namespace: str, name: str, delay: float) -> None:
        self.scheduler.schedule(
            delay, lambda: self._reconcile_knative(namespace, name), key=f"knative/{namespace}/{name}"
        )

    def _schedule_at(self, namespace: str, name: str, instant: float) -> None:
        delay = instant - self.clock.now()
        if delay > 0:
            self.scheduler.schedule(delay, lambda: self._reconcile_knative(namespace, name))

    def _service(self, isvc: JsonObject) -> _Service:
        metadata = isvc["metadata"]
        key = (metadata["namespace"], metadata["name"])
        service = self._services.get(key)
        if service is None or service.uid != metadata["uid"]:
            service = _Service(metadata["namespace"], metadata["name"], metadata["uid"])
            self._services[key] = service
        return service

    def _tear_down(self, namespace: str, name: str, uid: str) -> None:
        service = self._services.get((namespace, name))
        if service is None or service.uid != uid:
            return
        del self._services[(namespace, name)]
        for revision in service.revisions:
            self._delete_pods(namespace, revision)

    # --- KServe's InferenceService reconcile --------------------------------------------------------

    def _reconcile_kserve(self, namespace: str, name: str) -> None:
        isvc = self.store.get_stored(r.INFERENCESERVICES, namespace, name)
        if isvc is None or isvc["metadata"].get("deletionTimestamp"):
            return
        service = self._service(isvc)
        mode = _deployment_mode(isvc)
        if mode in _RAW_MODES:
            status = self._reconcile_raw(service, isvc, mode)
        else:
            observed = self._update_knative_service(service, isvc)
            if observed is None:
                return
            status = self._propagate(isvc, observed, mode)
        if status != isvc.get("status"):
            self.store.update(
                r.INFERENCESERVICES,
                namespace,
                name,
                {
                    "metadata": {"name": name, "resourceVersion": isvc["metadata"]["resourceVersion"]},
                    "status": status,
                },
                subresource="status",
                actor="emulator",
            )

    def _update_knative_service(self, service: _Service, isvc: JsonObject) -> JsonObject | None:
        """Create or update the Knative Service; return the ksvc status read *before* the update."""
        template = _template(isvc)
        fingerprint = _fingerprint(template)
        traffic = _desired_traffic(isvc)
        invalid = [target["percent"] for target in traffic if not 0 <= target["percent"] <= 100]
        if invalid:
            # Knative's webhook refuses the update; KServe's reconcile fails and the status stays.
            self._report_error(
                service,
                isvc,
                'admission webhook "validation.webhook.serving.knative.dev" denied the request: validation '
                f"failed: expected 0 <= {invalid[0]} <= 100: spec.traffic[0].percent",
            )
            return None
        ksvc, ksvc_name = service.ksvc, f"{service.name}-predictor"
        if len(ksvc_name) > 63:  # Knative's webhook: a Service name is a DNS-1035 label
            self._report_error(service, isvc, _KSVC_NAME_TOO_LONG)
            return None
        if ksvc is None:
            service.ksvc = _KnativeService(ksvc_name, 1, template, fingerprint, traffic)
            self._schedule_knative(service.namespace, service.name, self.config.knative_delay)
            return {}
        observed = copy.deepcopy(ksvc.status)
        if ksvc.template_fingerprint != fingerprint or ksvc.traffic != traffic:
            ksvc.generation += 1
            ksvc.template = template
            ksvc.template_fingerprint = fingerprint
            ksvc.traffic = traffic
            self._schedule_knative(service.namespace, service.name, self.config.knative_delay)
        return observed

    def _report_error(self, service: _Service, isvc: JsonObject, message: str) -> None:
        key = f"{isvc['metadata'].get('generation')}:{message}"
        if key in service.reported_errors:
            return
        service.reported_errors.add(key)
        now = self.clock.now()
        self.store.create(
            r.EVENTS,
            service.namespace,
            {
                "metadata": {"generateName": f"{service.name}.", "namespace": service.namespace},
                "involvedObject": {
                    "apiVersion": r.INFERENCESERVICES.api_version,
                    "kind": "InferenceService",
                    "name": service.name,
                    "namespace": service.namespace,
                    "uid": service.uid,
                },
                "reason": "InternalError",
                "message": f"fails to reconcile predictor: fails to update knative service: {message}",
                "type": "Warning",
                "source": {"component": "v1beta1Controllers"},
                "firstTimestamp": format_time(now),
                "lastTimestamp": format_time(now),
                "count": 1,
            },
            actor="emulator",
        )

    def _propagate(self, isvc: JsonObject, ksvc_status: JsonObject, mode: str) -> JsonObject:
        """``PropagateStatus`` + cross-component conditions + the ingress reconciler (Serverless)."""
        status = copy.deepcopy(isvc.get("status") or {})
        conditions = ConditionSet(
            "Ready",
            ("PredictorReady", "IngressReady"),
            status.get("conditions") or [],
            format_time(self.clock.now()),
        )
        conditions.initialize()
        components = status.setdefault("components", {})
        spec = dict(components.get("predictor") or {})
        latest_ready = ksvc_status.get("latestReadyRevisionName") or ""
        latest_created = ksvc_status.get("latestCreatedRevisionName") or ""
        spec["latestCreatedRevision"] = latest_created
        traffic = ksvc_status.get("traffic") or []
        traffic_by_revision: dict[str, int] = {}
        for target in traffic:
            traffic_by_revision[target["revisionName"]] = traffic_by_revision.get(
                target["revisionName"], 0
            ) + int(target.get("percent", 0))
        for target in traffic:
            if target["revisionName"] != latest_ready or not target.get("latestRevision"):
                continue
            percent = target.get("percent")
            if spec.get("latestRolledoutRevision", "") != latest_ready:
                if percent == 100:
                    # The latest ready revision has all the traffic: a promotion, recorded.
                    spec["previousRolledoutRevision"] = spec.get("latestRolledoutRevision", "")
                    spec["latestRolledoutRevision"] = latest_ready
            elif (
                latest_ready == latest_created
                and percent is not None
                and percent < 100
                and traffic_by_revision.get(target["revisionName"]) == 100
                and spec.get("previousRolledoutRevision")
            ):
                # Rolled back after a promotion (pin-back): roll latestRolledout back to the previous
                # one; previousRolledoutRevision stays as it is.
                spec["latestRolledoutRevision"] = spec["previousRolledoutRevision"]
        spec["latestReadyRevision"] = latest_ready
        ksvc_conditions = {c["type"]: c for c in ksvc_status.get("conditions") or []}
        ready = ksvc_conditions.get("Ready")
        if ready is not None and ready.get("status") == TRUE:
            spec["url"] = ksvc_status.get("url")
            spec["address"] = ksvc_status.get("address")
        conditions.set_like("PredictorReady", ready)
        conditions.set_like("PredictorRouteReady", ksvc_conditions.get("RoutesReady"))
        spec["traffic"] = copy.deepcopy(traffic)
        conditions.set_like("PredictorConfigurationReady", ksvc_conditions.get("ConfigurationsReady"))
        components["predictor"] = _without_empty(spec)
        observed_generation = ksvc_status.get("observedGeneration")
        if observed_generation:
            status["observedGeneration"] = observed_generation
        for aggregate, component in (
            ("RoutesReady", "PredictorRouteReady"),
            ("LatestDeploymentReady", "PredictorConfigurationReady"),
        ):
            self._cross_component(conditions, aggregate, component)
        self._ingress(isvc, status, conditions, raw=False)
        conditions.mark_false("Stopped", "")
        status["conditions"] = conditions.as_list()
        status["deploymentMode"] = mode
        status["modelStatus"] = self._model_status(isvc, status)
        return _without_empty(status)

    @staticmethod
    def _cross_component(conditions: ConditionSet, aggregate: str, component: str) -> None:
        if conditions.is_true(component):
            conditions.mark_true(aggregate)
            return
        reason = f"{component} not ready"
        if conditions.status(component) == UNKNOWN:
            conditions.mark_unknown(aggregate, reason)
        else:
            conditions.mark_false(aggregate, reason)

    def _ingress(self, isvc: JsonObject, status: JsonObject, conditions: ConditionSet, raw: bool) -> None:
        if not conditions.is_true("PredictorReady"):
            # Serverless (Istio VirtualService) follows PredictorReady's Unknown; raw is always False.
            if not raw and conditions.status("PredictorReady") == UNKNOWN:
                conditions.mark_unknown("IngressReady", "Predictor ingress not created")
            else:
                conditions.mark_false("IngressReady", "Predictor ingress not created")
            return
        name, namespace = isvc["metadata"]["name"], isvc["metadata"]["namespace"]
        status["url"] = f"http://{name}.{namespace}.{self.config.ingress_domain}"
        status["address"] = {"url": f"http://{name}.{namespace}.svc.cluster.local"}
        conditions.mark_true("IngressReady")

    def _model_status(self, isvc: JsonObject, status: JsonObject) -> JsonObject:
        service = self._services.get((isvc["metadata"]["namespace"], isvc["metadata"]["name"]))
        previous = status.get("modelStatus") or {}
        active = (previous.get("states") or {}).get("activeModelState", "")
        now = self.clock.now()
        latest = service.revisions[-1] if service and service.revisions else None
        ready_copies = len(latest.pods) if latest is not None and latest.pods_ready(now) else 0
        model_status: JsonObject = {"copies": {"failedCopies": 0, "totalCopies": ready_copies}}
        if latest is None:
            target, transition = "Pending", "InProgress"
        elif latest.state(now) is RevisionState.FAILED:
            target, transition = "FailedToLoad", "BlockedByFailedLoad"
            model_status["lastFailureInfo"] = {
                "location": latest.pods[0] if latest.pods else "",
                "reason": "ModelLoadFailed",
                "message": latest.failure_message(now),
                "exitCode": 1,
            }
        elif latest.pods_ready(now):
            target, transition, active = "Loaded", "UpToDate", "Loaded"
        else:
            target, transition = "Loading", "InProgress"
        model_status["transitionStatus"] = transition
        model_status["states"] = _without_empty({"activeModelState": active, "targetModelState": target})
        return model_status

    # --- Knative's configuration and route reconcile ------------------------------------------------

    def _reconcile_knative(self, namespace: str, name: str) -> None:
        service = self._services.get((namespace, name))
        if service is None:
            return
        if service.ksvc is None:
            # RawDeployment: pods are KServe's (the Deployment's) business, reconciled there.
            self._schedule_kserve(namespace, name, 0)
            return
        ksvc = service.ksvc
        now = self.clock.now()
        if ksvc.realised_fingerprint != ksvc.template_fingerprint:
            # The Configuration's template changed: Knative stamps out the next revision.
            revision = k8s_names.revision_name(ksvc.name, len(service.revisions) + 1)
            self._create_revision(service, ksvc.template, revision, raw=False)
            ksvc.realised_fingerprint = ksvc.template_fingerprint
        latest = service.revisions[-1]
        latest_state = latest.state(now)
        if latest_state is RevisionState.READY:
            ksvc.latest_ready = latest.name
        else:
            # Knative's findAndSetLatestReadyRevision: a newer Ready revision still moves it forward.
            current = service.revision(ksvc.latest_ready) if ksvc.latest_ready else None
            newer = [
                rev
                for rev in service.revisions
                if (current is None or rev.number > current.number) and rev.state(now) is RevisionState.READY
            ]
            if newer:
                ksvc.latest_ready = newer[-1].name
        conditions = ConditionSet(
            "Ready",
            ("ConfigurationsReady", "RoutesReady"),
            ksvc.status.get("conditions") or [],
            format_time(now),
        )
        conditions.initialize()
        if latest_state is RevisionState.READY:
            conditions.mark_true("ConfigurationsReady")
        elif latest_state is RevisionState.FAILED:
            conditions.mark_false(
                "ConfigurationsReady",
                "RevisionFailed",
                f'Revision "{latest.name}" failed with message: {latest.failure_message(now)}.',
            )
        else:
            conditions.mark_unknown("ConfigurationsReady", "")
        traffic: list[JsonObject] = []
        for target in ksvc.traffic:
            revision_name = ksvc.latest_ready if target.get("latestRevision") else target.get("revisionName")
            if not revision_name or service.revision(revision_name) is None:
                traffic = []
                break
            entry: JsonObject = {}
            if target.get("tag"):
                entry["tag"] = target["tag"]
            entry["revisionName"] = revision_name
            entry["latestRevision"] = bool(target.get("latestRevision"))
            entry["percent"] = target["percent"]
            if target.get("tag"):
                entry["url"] = f"http://{target['tag']}-{ksvc.name}.{namespace}.{self.config.ingress_domain}"
            traffic.append(entry)
        if traffic:
            conditions.mark_true("RoutesReady")
        elif latest_state is RevisionState.FAILED and ksvc.latest_ready is None:
            conditions.mark_false(
                "RoutesReady",
                "RevisionMissing",
                f'Configuration "{ksvc.name}" does not have any ready Revision.',
            )
        else:
            conditions.mark_unknown(
                "RoutesReady",
                "RevisionMissing",
                f'Configuration "{ksvc.name}" is waiting for a Revision to become ready.',
            )
        status = _without_empty(
            {
                "observedGeneration": ksvc.generation,
                "conditions": conditions.as_list(),
                "latestCreatedRevisionName": latest.name,
                "latestReadyRevisionName": ksvc.latest_ready,
                "url": f"http://{ksvc.name}.{namespace}.{self.config.ingress_domain}",
                "address": {"url": f"http://{ksvc.name}.{namespace}.svc.cluster.local"},
                "traffic": traffic,
            }
        )
        routed = {entry["revisionName"] for entry in traffic} | {latest.name}
        self._sync_pods(service, routed, self.config.scale_down_grace)
        ksvc.status = status
        # KServe watches the Knative Service (a status change triggers its reconcile) and the pods
        # (model status); it writes the InferenceService only when its status would change.
        self._schedule_kserve(namespace, name, 0)

    def _create_revision(self, service: _Service, template: JsonObject, name: str, raw: bool) -> _Revision:
        now = self.clock.now()
        behaviour = (
            self._revision_overrides.pop((service.namespace, name), None)
            or self._isvc_defaults.get((service.namespace, service.name))
            or self.config.default_behaviour()
        )
        revision = _Revision(
            name=name,
            number=len(service.revisions) + 1,
            created_at=now,
            behaviour=behaviour,
            replica_set=k8s_names.pod_template_hash(f"{service.uid}/{name}"),
            template=copy.deepcopy(template),
            raw=raw,
            pods_started_at=now,
        )
        if not raw:
            config = self.store.get_stored(
                r.CONFIGMAPS, progress_deadline.KNATIVE_NAMESPACE, progress_deadline.CONFIG_DEPLOYMENT
            )
            revision.progress_deadline = progress_deadline.revision_deadline(template, config)
        service.revisions.append(revision)
        self.revisions_created_total += 1
        self._start_pods(service, revision, revision.behaviour.replicas)
        for instant in revision.transition_times():
            self._schedule_at(service.namespace, service.name, instant)
        return revision

    # --- RawDeployment ------------------------------------------------------------------------------

    def _reconcile_raw(self, service: _Service, isvc: JsonObject, mode: str) -> JsonObject:
        template = _template(isvc)
        fingerprint = _fingerprint(template)
        if service.raw_fingerprint != fingerprint:
            # The Deployment's pod template changed (canaryTrafficPercent is not part of it): a new
            # ReplicaSet rolls out.
            service.raw_fingerprint = fingerprint
            service.raw_generation += 1
            replica_set = k8s_names.pod_template_hash(f"{service.uid}/{fingerprint}")
            self._create_revision(service, template, f"{service.name}-predictor-{replica_set}", raw=True)
        now = self.clock.now()
        latest = service.revisions[-1]
        status = copy.deepcopy(isvc.get("status") or {})
        conditions = ConditionSet(
            "Ready", ("PredictorReady", "IngressReady"), status.get("conditions") or [], format_time(now)
        )
        conditions.initialize()
        if latest.pods_ready(now):
            conditions.mark_true("PredictorReady")
        elif latest.state(now) is RevisionState.FAILED:
            conditions.mark_false(
                "PredictorReady", "ProgressDeadlineExceeded", latest.behaviour.failure_message
            )
        else:
            conditions.mark_unknown(
                "PredictorReady", "ReplicaSetUpdated", f'ReplicaSet "{latest.name}" is progressing.'
            )
        self._ingress(isvc, status, conditions, raw=True)
        conditions.mark_false("Stopped", "")
        status["conditions"] = conditions.as_list()
        status["deploymentMode"] = mode
        status["observedGeneration"] = service.raw_generation
        status.setdefault("components", {}).setdefault("predictor", {})
        if conditions.is_true("PredictorReady"):
            name, namespace = service.name, service.namespace
            status["components"]["predictor"]["url"] = (
                f"http://{name}-predictor.{namespace}.{self.config.ingress_domain}"
            )
        status["modelStatus"] = self._model_status(isvc, status)
        # A rolling update: the old ReplicaSets go once the new one is available.
        self._sync_pods(service, {latest.name} if latest.pods_ready(now) else None, grace=0.0)
        return _without_empty(status)

    # --- pods ---------------------------------------------------------------------------------------

    def _sync_pods(self, service: _Service, routed: set[str] | None, grace: float) -> None:
        """Scale revisions by routing (None: keep all) and bring pod statuses up to date."""
        now = self.clock.now()
        for revision in service.revisions:
            if revision.missed_deadline(now):
                # Knative scales a revision that missed its deadline to zero and never retries it.
                self._delete_pods(service.namespace, revision)
                revision.scaled_to_zero = True
                continue
            if routed is not None and revision.name not in routed:
                if revision.unrouted_since is None:
                    revision.unrouted_since = now
                    if grace > 0:
                        self._schedule_at(service.namespace, service.name, now + grace)
                if now - revision.unrouted_since >= grace and not revision.scaled_to_zero:
                    # Knative does not keep an unrouted revision at minScale.
                    self._delete_pods(service.namespace, revision)
                    revision.scaled_to_zero = True
            else:
                revision.unrouted_since = None
                if revision.scaled_to_zero:
                    # Traffic came back: a cold start.
                    revision.scaled_to_zero = False
                    revision.pods_started_at = now
                    self._start_pods(service, revision, revision.behaviour.replicas)
                    for instant in revision.transition_times():
                        self._schedule_at(service.namespace, service.name, instant)
            for pod_name in revision.pods:
                self._update_pod_status(service, revision, pod_name)

    def _start_pods(self, service: _Service, revision: _Revision, count: int) -> None:
        deployment = k8s_names.deployment_name(revision.name)
        owner_name = (
            revision.name if revision.raw else k8s_names.replica_set_name(deployment, revision.replica_set)
        )
        for _ in range(count):
            pod_name = k8s_names.pod_name(owner_name, self._random)
            pod = self._pod(service, revision, pod_name, owner_name)
            self.store.create(r.PODS, service.namespace, pod, actor="emulator")
            revision.pods.append(pod_name)

    def _pod(self, service: _Service, revision: _Revision, pod_name: str, owner: str) -> JsonObject:
        template = revision.template
        labels = dict(template.get("labels") or {})
        labels.update(
            {ISVC_LABEL: service.name, "component": "predictor", "pod-template-hash": revision.replica_set}
        )
        if revision.raw:
            labels["app"] = f"isvc.{service.name}-predictor"
        else:
            ksvc = f"{service.name}-predictor"
            labels.update(
                {
                    "serving.knative.dev/revision": revision.name,
                    "serving.knative.dev/revisionUID": _hash_name(revision.name, 8),
                    "serving.knative.dev/configuration": ksvc,
                    "serving.knative.dev/configurationGeneration": str(revision.number),
                    "serving.knative.dev/service": ksvc,
                    "app": revision.name,
                }
            )
        predictor = template.get("predictor") or {}
        model = predictor.get("model") or {}
        containers = predictor.get("containers") or []
        image = model.get("image") or (containers[0].get("image") if containers else None)
        runtime = (model.get("modelFormat") or {}).get("name", "model")
        spec: JsonObject = {
            "containers": [
                {"name": "kserve-container", "image": image or f"kserve/{runtime}-server:emulated"}
            ],
            "nodeName": "emulated-node-1",
        }
        if not revision.raw:
            spec["containers"].append(
                {
                    "name": "queue-proxy",
                    "image": "gcr.io/knative-releases/knative.dev/serving/cmd/queue:emulated",
                }
            )
        if model.get("storageUri") or predictor.get("storageUri"):
            spec["initContainers"] = [
                {"name": "storage-initializer", "image": "kserve/storage-initializer:emulated"}
            ]
        return {
            "metadata": {
                "name": pod_name,
                "namespace": service.namespace,
                "labels": labels,
                "annotations": dict(template.get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": owner,
                        "uid": _hash_name(owner, 12),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
            "status": self._pod_status(revision, spec, self.clock.now()),
        }

    def _pod_status(self, revision: _Revision, spec: JsonObject, now: float) -> JsonObject:
        behaviour = revision.behaviour
        started = revision.pods_started_at
        state = revision.state(now)
        ready = revision.pods_ready(now)
        # Still loading the model: the storage initializer runs, the pod is Pending.
        loading = not ready and state is not RevisionState.FAILED
        ready_at = max(started, revision.created_at) + (behaviour.ready_after_seconds or 0.0)
        failed_at = revision.created_at + (behaviour.fail_after_seconds or 0.0)
        containers = [container["name"] for container in spec["containers"]]

        def condition(kind: str, value: bool, since: float) -> JsonObject:
            return {
                "type": kind,
                "status": "True" if value else "False",
                "lastTransitionTime": format_time(since),
            }

        statuses = []
        for container in containers:
            image = next(c["image"] for c in spec["containers"] if c["name"] == container)
            started_container = not loading or container == "queue-proxy"
            container_status: JsonObject = {
                "name": container,
                "image": image,
                # The runtime fills imageID in once the image is pulled; clients require the field.
                "imageID": f"{image.split(':')[0]}@sha256:{_hash_name(image, 16)}"
                if started_container
                else "",
                "ready": ready,
                "restartCount": 0,
                "started": started_container,
            }
            if state is RevisionState.FAILED and container == "kserve-container":
                container_status["restartCount"] = 1 + int(max(0.0, now - failed_at) // 30)
                container_status["state"] = {
                    "waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": "back-off restarting failed container",
                    }
                }
                container_status["lastState"] = {
                    "terminated": {
                        "exitCode": 1,
                        "reason": "Error",
                        "message": behaviour.failure_message,
                        "finishedAt": format_time(failed_at),
                    }
                }
                container_status["started"] = False
            else:
                container_status["state"] = {"running": {"startedAt": format_time(started)}}
            statuses.append(container_status)
        transition = ready_at if ready else (failed_at if state is RevisionState.FAILED else started)
        status: JsonObject = {
            "phase": "Pending" if loading else "Running",
            "conditions": [
                condition("PodScheduled", True, started),
                condition("Initialized", not loading, started),
                condition("ContainersReady", ready, transition),
                condition("Ready", ready, transition),
            ],
            "containerStatuses": statuses,
            "hostIP": "10.0.0.1",
            "podIP": f"10.244.{revision.number % 250}.{1 + sum(map(ord, revision.name)) % 250}",
            "startTime": format_time(started),
            "qosClass": "Burstable",
        }
        if spec.get("initContainers"):
            status["initContainerStatuses"] = [
                {
                    "name": "storage-initializer",
                    "image": spec["initContainers"][0]["image"],
                    "imageID": "kserve/storage-initializer@sha256:emulated",
                    "ready": not loading,
                    "restartCount": 0,
                    "state": (
                        {"running": {"startedAt": format_time(started)}}
                        if loading
                        else {
                            "terminated": {
                                "exitCode": 0,
                                "reason": "Completed",
                                "finishedAt": format_time(started),
                            }
                        }
                    ),
                }
            ]
        return status

    def _update_pod_status(self, service: _Service, revision: _Revision, pod_name: str) -> None:
        stored = self.store.get_stored(r.PODS, service.namespace, pod_name)
        if stored is None:
            return
        status = self._pod_status(revision, stored["spec"], self.clock.now())
        if status != stored.get("status"):
            self.store.update(
                r.PODS,
                service.namespace,
                pod_name,
                {"metadata": {"name": pod_name}, "status": status},
                subresource="status",
                actor="emulator",
            )

    def _delete_pods(self, namespace: str, revision: _Revision) -> None:
        for pod_name in revision.pods:
            if self.store.get_stored(r.PODS, namespace, pod_name) is not None:
                self.store.delete(r.PODS, namespace, pod_name, actor="emulator")
        revision.pods = []

    # --- the admin interface ------------------------------------------------------------------------

    def revisions(self, namespace: str, name: str) -> list[JsonObject]:
        """Every revision created for the InferenceService, oldest first, with state and pods."""
        service = self._services.get((namespace, name))
        if service is None:
            return []
        now = self.clock.now()
        ksvc = service.ksvc
        traffic = (ksvc.status.get("traffic") if ksvc else None) or []
        result = []
        for revision in service.revisions:
            percent = sum(int(t.get("percent", 0)) for t in traffic if t["revisionName"] == revision.name)
            result.append(
                {
                    "name": revision.name,
                    "number": revision.number,
                    "createdAt": format_micro_time(revision.created_at),
                    "state": revision.state(now).value,
                    "podsReady": revision.pods_ready(now),
                    "scaledToZero": revision.scaled_to_zero,
                    "trafficPercent": percent,
                    "pods": list(revision.pods),
                    "behaviour": revision.behaviour.to_json(),
                }
            )
        return result

    def revision_count(self, namespace: str, name: str) -> int:
        """How many revisions (RawDeployment: pod-template rollouts) this InferenceService has had."""
        service = self._services.get((namespace, name))
        return service.revisions_created if service else 0

    def knative_service(self, namespace: str, name: str) -> JsonObject | None:
        """The simulated Knative Service (spec traffic, generation, status) — for tests and debugging."""
        service = self._services.get((namespace, name))
        if service is None or service.ksvc is None:
            return None
        ksvc = service.ksvc
        return {
            "name": ksvc.name,
            "generation": ksvc.generation,
            "spec": {"traffic": copy.deepcopy(ksvc.traffic)},
            "status": copy.deepcopy(ksvc.status),
        }

    def set_revision_behaviour(
        self, namespace: str, revision_name: str, behaviour: RevisionBehaviour
    ) -> bool:
        """Set how a revision behaves; for one not created yet, it applies when it is. True if it exists."""
        for service in self._services.values():
            if service.namespace != namespace:
                continue
            revision = service.revision(revision_name)
            if revision is not None:
                revision.behaviour = behaviour
                self._after_behaviour_change(service, revision)
                return True
        self._revision_overrides[(namespace, revision_name)] = behaviour
        return False

    def set_revision_state(
        self, namespace: str, revision_name: str, state: RevisionState, message: str = ""
    ) -> None:
        """Force an existing revision Ready, Failed or Pending from now on.

        One that missed Knative's progress deadline is scaled to zero for good: 409 Conflict.
        """
        for service in self._services.values():
            revision = service.revision(revision_name) if service.namespace == namespace else None
            if revision is None:
                continue
            if revision.missed_deadline(self.clock.now()):
                raise ApiError.conflict(
                    "revisions.serving.knative.dev", revision_name, "serving.knative.dev", "revisions",
                    progress_deadline.INITIAL_SCALE_NEVER_ACHIEVED,
                )  # fmt: skip
            age = self.clock.now() - revision.created_at
            behaviour = revision.behaviour
            if state is RevisionState.READY:
                previous = behaviour.ready_after_seconds
                ready_after = age if previous is None else min(previous, age)
                revision.behaviour = RevisionBehaviour(
                    ready_after, None, behaviour.failure_message, behaviour.replicas
                )
                revision.pods_started_at = min(revision.pods_started_at, self.clock.now() - ready_after)
            elif state is RevisionState.FAILED:
                revision.behaviour = RevisionBehaviour(
                    behaviour.ready_after_seconds,
                    age,
                    message or behaviour.failure_message,
                    behaviour.replicas,
                )
            else:
                revision.behaviour = RevisionBehaviour(
                    None, None, behaviour.failure_message, behaviour.replicas
                )
            self._after_behaviour_change(service, revision)
            return
        raise ApiError.not_found(
            "revisions.serving.knative.dev", revision_name, "serving.knative.dev", "revisions"
        )

    def set_default_behaviour(self, namespace: str, name: str, behaviour: RevisionBehaviour | None) -> None:
        """How the InferenceService's future revisions behave (None: the configured default)."""
        if behaviour is None:
            self._isvc_defaults.pop((namespace, name), None)
        else:
            self._isvc_defaults[(namespace, name)] = behaviour

    def _after_behaviour_change(self, service: _Service, revision: _Revision) -> None:
        missing = revision.behaviour.replicas - len(revision.pods)
        if missing > 0 and not revision.scaled_to_zero:
            self._start_pods(service, revision, missing)
        for instant in revision.transition_times():
            self._schedule_at(service.namespace, service.name, instant)
        if service.ksvc is not None:
            self._schedule_knative(service.namespace, service.name, 0)
        else:
            self._schedule_kserve(service.namespace, service.name, 0)

    def knative_tick_all(self) -> None:
        """Re-run every Knative reconcile (used after configuration changes)."""
        for namespace, name in list(self._services):
            self._schedule_knative(namespace, name, 0)
