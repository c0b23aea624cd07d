"""A stateful Kubernetes API emulator with a KServe/Knative behaviour layer.

No apiserver runs on the machines this project is developed and tested on, so tests, ``make demo``
and the end-to-end tests talk to this emulator over real HTTP with the official ``kubernetes`` client
and with ``kubectl``. It enforces what the real apiserver enforces for what kserve-canary uses, and
simulates how KServe turns an InferenceService spec into Knative revisions, traffic and status —
including the lag. See ``docs`` of the project and the module docstrings for the details.

What it serves: Namespaces, Pods, ConfigMaps, Events (core/v1 and events.k8s.io/v1), Leases,
InferenceServices (serving.kserve.io/v1beta1, modelled by hand), CustomResourceDefinitions
(apiextensions.k8s.io/v1) and the objects of every CRD created through the API, at
``/apis/<group>/<version>[/namespaces/<ns>]/<plural>[/<name>[/status]]``, with the CRD's schema
(pruning, defaults, validation), status subresource, printer columns and a subset of its CEL rules
(:mod:`~canary_sandbox.emulator.crds`, :mod:`~canary_sandbox.emulator.schema`). Discovery (legacy and
aggregated) follows the CRDs as they come and go.

In process::

    from canary_sandbox.emulator import Emulator, EmulatorServer, KServeConfig, ManualClock, RevisionBehaviour

    emulator = Emulator(KServeConfig(reconcile_delay=0.5), ManualClock())
    with EmulatorServer(emulator) as server:
        server.write_kubeconfig(path)          # for kubernetes.config / kubectl
        ...                                     # create an InferenceService through the API
        emulator.advance(0.5)                   # KServe reconciles; revision 00001 is created
        emulator.set_revision_behaviour("ml", "llama-predictor-00002", RevisionBehaviour(None, 30.0))

As a process: ``python -m canary_sandbox.emulator --port 0 --kubeconfig-out kubeconfig.yaml`` prints its URL.

Admin API (JSON; ``/emulator/v1`` prefix; not recorded in the request log):

- ``GET healthz``; ``GET clock``; ``POST clock/advance {"seconds": 5}`` (manual clock only, else 409)
- ``GET config``; ``PATCH config {"reconcileDelaySeconds", "knativeDelaySeconds",
  "revisionReadyDelaySeconds", "podsPerRevision", "scaleDownGraceSeconds",
  "garbageCollectionDelaySeconds"}`` (the last: how long the garbage collector takes to remove the
  dependents of a deleted owner; 0 by default)
- ``GET revisions`` (all); ``GET namespaces/{ns}/inferenceservices/{name}/revisions`` ->
  ``{"revisionCount", "items": [{"name", "number", "createdAt", "state", "podsReady", "scaledToZero",
  "trafficPercent", "pods", "behaviour"}]}``
- ``GET namespaces/{ns}/inferenceservices/{name}/knativeservice`` (spec traffic, generation, status)
- ``PUT namespaces/{ns}/revisions/{revision}/behaviour {"readyAfterSeconds": 5 | null,
  "failAfterSeconds": 30 | null, "failureMessage": "...", "replicas": 1}`` — for an existing revision
  or one not created yet (applied at its creation); seconds count from the revision's creation
- ``PUT|DELETE namespaces/{ns}/inferenceservices/{name}/revision-behaviour`` (same body): the
  default for that InferenceService's next revisions
- ``POST namespaces/{ns}/revisions/{revision}/state {"state": "Ready"|"Failed"|"Pending",
  "message": "..."}`` — now
- ``GET requests?method=PATCH&path=inferenceservices&since=N`` -> ``{"items": [{"sequence", "time",
  "method", "path", "query", "contentType", "status", "userAgent", "body", "changedPaths", "fault"}]}``;
  ``DELETE requests``
- ``POST faults {"path": "<regex>", "method": "PATCH", "status": 409, "count": 1, "delaySeconds": 0,
  "message": ""}`` -> the fault with its ``id``; ``GET faults``; ``DELETE faults``; ``DELETE faults/{id}``
"""

from canary_sandbox.emulator.client import AdminApiError, EmulatorAdminClient
from canary_sandbox.emulator.clock import Clock, ManualClock, ScaledClock, SystemClock
from canary_sandbox.emulator.core import Emulator
from canary_sandbox.emulator.diagnostics import Fault, LoggedRequest
from canary_sandbox.emulator.errors import ApiError
from canary_sandbox.emulator.kserve import (
    DEPLOYMENT_MODE_ANNOTATION,
    TAG_ROUTING_ANNOTATION,
    KServeConfig,
    RevisionBehaviour,
    RevisionState,
)
from canary_sandbox.emulator.resources import (
    CONFIGMAPS,
    CUSTOMRESOURCEDEFINITIONS,
    EVENTS,
    EVENTS_V1,
    INFERENCESERVICES,
    LEASES,
    NAMESPACES,
    PODS,
    ResourceType,
)
from canary_sandbox.emulator.server import EmulatorServer

__all__ = [
    "CONFIGMAPS",
    "CUSTOMRESOURCEDEFINITIONS",
    "DEPLOYMENT_MODE_ANNOTATION",
    "EVENTS",
    "EVENTS_V1",
    "INFERENCESERVICES",
    "LEASES",
    "NAMESPACES",
    "PODS",
    "TAG_ROUTING_ANNOTATION",
    "AdminApiError",
    "ApiError",
    "Clock",
    "Emulator",
    "EmulatorAdminClient",
    "EmulatorServer",
    "Fault",
    "KServeConfig",
    "LoggedRequest",
    "ManualClock",
    "ResourceType",
    "RevisionBehaviour",
    "RevisionState",
    "ScaledClock",
    "SystemClock",
]
