"""Reading an InferenceService (serving.kserve.io/v1beta1) into the core's small view.

:func:`observe` is pure and total: whatever JSON it is given (a fresh object without status, a
field of the wrong type, an InferenceService from a newer KServe) it returns a view, never raises,
and lists what it could not read in ``problems``. A strange InferenceService must never crash the
controller (docs/design.md §7).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from canary.kserve.artefact import artefact_of
from canary.policy.units import parse_duration
from canary.rollout.knative import PROGRESS_DEADLINE_ANNOTATION, KnativeDeadline
from canary.rollout.observed import DeploymentMode, ObservedInferenceService, TrafficTarget

__all__ = ["DEPLOYMENT_MODE_ANNOTATION", "observe", "predictor_fingerprint"]

DEPLOYMENT_MODE_ANNOTATION = "serving.kserve.io/deploymentMode"
_CANARY_FIELD = "canaryTrafficPercent"
# Knative's Configuration: ``Revision %q failed with message: %s.`` (configuration_lifecycle.go line 81).
_FAILED_REVISION = re.compile(r'^Revision "([^"]+)" failed with message: ')

# KServe renamed the modes in 0.15 (Serverless -> Knative, RawDeployment -> Standard); both spellings
# are in the wild.
_MODES = {
    "serverless": DeploymentMode.KNATIVE,
    "knative": DeploymentMode.KNATIVE,
    "rawdeployment": DeploymentMode.STANDARD,
    "standard": DeploymentMode.STANDARD,
    "modelmesh": DeploymentMode.MODEL_MESH,
}


def predictor_fingerprint(predictor: Mapping[str, Any]) -> str:
    """A stable hash of the predictor spec without ``canaryTrafficPercent``.

    Changing only the percentage creates no new revision, so it must not change the fingerprint;
    anything else in the predictor does. Keys are sorted so the hash does not depend on the order
    the API server happens to serialise them in.
    """
    without_percentage = {key: value for key, value in predictor.items() if key != _CANARY_FIELD}
    canonical = json.dumps(without_percentage, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


def observe(
    isvc: Mapping[str, Any] | None, *, namespace: str = "", name: str = ""
) -> ObservedInferenceService:
    """Parse an InferenceService as KServe writes it; ``None`` is an InferenceService that does not exist.

    ``namespace``/``name`` name the object in the view when it does not exist (or lacks metadata).
    """
    if isvc is None:
        return ObservedInferenceService.missing(namespace, name)
    problems: list[str] = []
    metadata = _mapping(isvc.get("metadata"), "metadata", problems)
    spec = _mapping(isvc.get("spec"), "spec", problems)
    status = _mapping(isvc.get("status"), "status", problems)
    predictor_spec = _mapping(spec.get("predictor"), "spec.predictor", problems)
    components = _mapping(status.get("components"), "status.components", problems)
    predictor_status = _mapping(components.get("predictor"), "status.components.predictor", problems)
    annotations = _mapping(metadata.get("annotations"), "metadata.annotations", problems)

    mode, mode_reported = _deployment_mode(status, annotations, predictor_status)
    ready, failure, failed_revision = _readiness(status.get("conditions"), problems)
    return ObservedInferenceService(
        namespace=_text(metadata.get("namespace")) or namespace,
        name=_text(metadata.get("name")) or name,
        exists=True,
        deployment_mode=mode,
        deployment_mode_reported=mode_reported,
        generation=_integer(metadata.get("generation"), "metadata.generation", problems),
        resource_version=_text(metadata.get("resourceVersion")),
        uid=_text(metadata.get("uid")),
        predictor_fingerprint=predictor_fingerprint(predictor_spec) if predictor_spec else None,
        artefact=artefact_of(predictor_spec),
        canary_traffic_percent=_integer(
            predictor_spec.get(_CANARY_FIELD), f"spec.predictor.{_CANARY_FIELD}", problems
        ),
        latest_created_revision=_text(predictor_status.get("latestCreatedRevision")),
        latest_ready_revision=_text(predictor_status.get("latestReadyRevision")),
        latest_rolledout_revision=_text(predictor_status.get("latestRolledoutRevision")),
        previous_rolledout_revision=_text(predictor_status.get("previousRolledoutRevision")),
        traffic=_traffic(predictor_status.get("traffic"), problems),
        predictor_ready=ready,
        revision_failure=failure,
        failed_revision=failed_revision,
        knative_deadline=_annotated_deadline(predictor_spec, annotations, problems),
        problems=tuple(problems),
    )


def _mapping(value: object, where: str, problems: list[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return value
    problems.append(f"{where} is a {type(value).__name__}, not an object")
    return {}


def _text(value: object) -> str | None:
    # KServe omits empty status strings; treat "" the same as absent.
    return value if isinstance(value, str) and value else None


def _integer(value: object, where: str, problems: list[str]) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        problems.append(f"{where} is a boolean, not an integer")
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    problems.append(f"{where} is {value!r}, not an integer")
    return None


def _deployment_mode(
    status: Mapping[str, Any], annotations: Mapping[str, Any], predictor_status: Mapping[str, Any]
) -> tuple[DeploymentMode, str | None]:
    for reported in (status.get("deploymentMode"), annotations.get(DEPLOYMENT_MODE_ANNOTATION)):
        if isinstance(reported, str) and reported:
            return _MODES.get(reported.strip().lower(), DeploymentMode.UNKNOWN), reported
    # Older KServe versions do not report the mode; only Knative mode has a traffic split in status.
    if isinstance(predictor_status.get("traffic"), list) and predictor_status["traffic"]:
        return DeploymentMode.KNATIVE, None
    return DeploymentMode.UNKNOWN, None


def _readiness(conditions: object, problems: list[str]) -> tuple[bool | None, str | None, str | None]:
    """The predictor's readiness and, when Knative reported one, why the latest revision failed and
    the revision its ``RevisionFailed`` names.

    KServe's PropagateStatus copies the Knative Service's Ready and ConfigurationsReady conditions,
    reason and message, into PredictorReady and PredictorConfigurationReady (kserve
    pkg/apis/serving/v1beta1/inference_service_status.go lines 563-583, SetCondition 589-598);
    Knative's Configuration says ``RevisionFailed``, ``Revision "<name>" failed with message: ...``
    when its latest created revision failed (configuration_lifecycle.go lines 77-81).
    """
    if conditions is None:
        return None, None, None
    if not isinstance(conditions, list):
        problems.append("status.conditions is not a list")
        return None, None, None
    by_type: dict[str, Mapping[str, Any]] = {}
    failure: str | None = None
    failed_revision: str | None = None
    for condition in conditions:
        if not isinstance(condition, Mapping) or not isinstance(condition.get("type"), str):
            continue
        by_type[condition["type"]] = condition
        if condition.get("status") == "False" and condition.get("reason") == "RevisionFailed":
            failure = _text(condition.get("message")) or "RevisionFailed"
            named = _FAILED_REVISION.match(failure)
            failed_revision = named.group(1) if named else failed_revision
    readiness = by_type.get("PredictorReady") or by_type.get("Ready")
    if readiness is None:
        return None, failure, failed_revision
    state = readiness.get("status")
    ready = True if state == "True" else False if state == "False" else None
    if ready is False and failure is None:
        failure = _text(readiness.get("message")) or _text(readiness.get("reason"))
    return ready, failure, failed_revision


def _annotated_deadline(
    predictor: Mapping[str, Any], annotations: Mapping[str, Any], problems: list[str]
) -> KnativeDeadline | None:
    """Knative's progress deadline from the annotation KServe passes on to the revision (the
    predictor's annotations, else the object's), or None when neither sets it."""
    own = predictor.get("annotations")
    for where, found in (
        ("spec.predictor.annotations", own if isinstance(own, Mapping) else {}),
        ("metadata.annotations", annotations),
    ):
        value = found.get(PROGRESS_DEADLINE_ANNOTATION)
        if value is None:
            continue
        try:
            seconds = parse_duration(value)
        except ValueError:
            problems.append(f"{where}[{PROGRESS_DEADLINE_ANNOTATION}] is {value!r}, not a duration")
            return None
        return KnativeDeadline(seconds, f'{where} {PROGRESS_DEADLINE_ANNOTATION}: "{value}"')
    return None


def _traffic(entries: object, problems: list[str]) -> tuple[TrafficTarget, ...]:
    if entries is None:
        return ()
    if not isinstance(entries, list):
        problems.append("status.components.predictor.traffic is not a list")
        return ()
    targets = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            problems.append(f"status.components.predictor.traffic[{index}] is not an object")
            continue
        percent = _integer(entry.get("percent"), f"traffic[{index}].percent", problems)
        targets.append(
            TrafficTarget(
                percent=percent if percent is not None else 0,
                revision_name=_text(entry.get("revisionName")),
                latest_revision=entry.get("latestRevision") is True,
                tag=_text(entry.get("tag")),
            )
        )
    return tuple(targets)
