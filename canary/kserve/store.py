"""The rollout state store: one ConfigMap per InferenceService, next to it.

Why a ConfigMap and not an annotation: any annotation on an InferenceService is copied into the
Knative revision template and restarts the model's pods. The ConfigMap carries an owner reference
to the InferenceService so deleting the model deletes its state (``blockOwnerDeletion`` is false: it
would need ``update`` on ``inferenceservices/finalizers`` and buys nothing here), a label that selects
every state object of ours, and is always written with a resourceVersion precondition.
"""

from __future__ import annotations

from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.kserve.client import GROUP, MERGE_PATCH, VERSION, ConflictError, is_not_found

__all__ = [
    "COMMAND_KEY",
    "EXPLAIN_KEY",
    "MANAGED_BY",
    "MAX_STATE_BYTES",
    "STATE_KEY",
    "ConfigMapStateStore",
    "StateTooLarge",
    "StoredState",
    "state_configmap_name",
]

STATE_KEY = "state.json"
# An operator's command (pause, resume, approve, abort, promote) waiting for the controller. The
# controller applies it and saves the state without it, under the resourceVersion it read, so a
# command written in between is never lost (the save fails with 409 and is retried).
COMMAND_KEY = "command.json"
# The latest evaluation in full (each check's value, limit, stable value and PromQL), for
# ``kserve-canary explain``. Kept beside the state so the core's state stays small.
EXPLAIN_KEY = "explain.json"
MANAGED_BY = "kserve-canary"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INFERENCE_SERVICE = "kserve-canary.dev/inference-service"
# A ConfigMap holds 1 MiB; stay well below so an object with metadata always fits.
MAX_STATE_BYTES = 512 * 1024


class StateTooLarge(Exception):
    pass


def state_configmap_name(inference_service: str) -> str:
    return f"kserve-canary-{inference_service}"


@dataclass(frozen=True)
class StoredState:
    namespace: str
    inference_service: str
    data: str | None  # the serialised state; None when nothing is stored yet
    resource_version: str | None  # precondition for the next write; None = create
    command: str | None = None  # a pending operator command (JSON), if any
    explain: str | None = None  # the latest evaluation, for ``explain``


class ConfigMapStateStore:
    def __init__(self, api_client: client.ApiClient, *, request_timeout: float = 10.0):
        self._core = client.CoreV1Api(api_client)
        self._timeout = request_timeout

    def load(self, namespace: str, inference_service: str) -> StoredState:
        try:
            found = self._core.read_namespaced_config_map(
                state_configmap_name(inference_service), namespace, _request_timeout=self._timeout
            )
        except ApiException as error:
            if is_not_found(error):
                return StoredState(namespace, inference_service, None, None)
            raise
        data = found.data or {}
        return StoredState(
            namespace,
            inference_service,
            data.get(STATE_KEY),
            found.metadata.resource_version if found.metadata else None,
            data.get(COMMAND_KEY),
            data.get(EXPLAIN_KEY),
        )

    def save(
        self,
        namespace: str,
        inference_service: str,
        data: str,
        *,
        resource_version: str | None,
        owner_uid: str | None,
        explain: str | None = None,
    ) -> str:
        """Write the state; returns the new resourceVersion. Raises :class:`ConflictError` on 409."""
        size = len(data.encode()) + len((explain or "").encode())
        if size > MAX_STATE_BYTES:
            raise StateTooLarge(
                f"state of {namespace}/{inference_service} is {size} bytes (limit {MAX_STATE_BYTES})"
            )
        name = state_configmap_name(inference_service)
        owners = None
        if owner_uid:
            owners = [
                client.V1OwnerReference(
                    api_version=f"{GROUP}/{VERSION}",
                    kind="InferenceService",
                    name=inference_service,
                    uid=owner_uid,
                    controller=False,
                    block_owner_deletion=False,
                )
            ]
        body = client.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=namespace,
                labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_INFERENCE_SERVICE: inference_service},
                owner_references=owners,
                resource_version=resource_version,
            ),
            data={STATE_KEY: data, **({EXPLAIN_KEY: explain} if explain else {})},
        )
        try:
            if resource_version is None:
                written = self._core.create_namespaced_config_map(
                    namespace, body, _request_timeout=self._timeout
                )
            else:
                written = self._core.replace_namespaced_config_map(
                    name, namespace, body, _request_timeout=self._timeout
                )
        except ApiException as error:
            if error.status == 409:
                raise ConflictError(
                    f"state of {namespace}/{inference_service} changed since it was read"
                ) from error
            raise
        return str(written.metadata.resource_version if written.metadata else "")

    def request_command(self, namespace: str, inference_service: str, command: str) -> None:
        """Leave a command for the controller (used by the CLI, with the operator's own credentials)."""
        body = {"data": {COMMAND_KEY: command}}
        try:
            self._core.patch_namespaced_config_map(
                state_configmap_name(inference_service),
                namespace,
                body,
                # The generated client defaults to JSON Patch for every body: say what this is.
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            )
        except ApiException as error:
            if is_not_found(error):
                raise LookupError(
                    f"no rollout state for {namespace}/{inference_service}: kserve-canary has not seen it yet"
                ) from error
            raise

    def list_all(self, namespace: str | None = None) -> list[StoredState]:
        selector = f"{LABEL_MANAGED_BY}={MANAGED_BY}"
        if namespace is None:
            listed = self._core.list_config_map_for_all_namespaces(
                label_selector=selector, _request_timeout=self._timeout
            )
        else:
            listed = self._core.list_namespaced_config_map(
                namespace, label_selector=selector, _request_timeout=self._timeout
            )
        states = []
        for item in listed.items:
            meta = item.metadata or client.V1ObjectMeta()
            states.append(
                StoredState(
                    meta.namespace or "",
                    (meta.labels or {}).get(LABEL_INFERENCE_SERVICE, ""),
                    (item.data or {}).get(STATE_KEY),
                    meta.resource_version,
                    (item.data or {}).get(COMMAND_KEY),
                    (item.data or {}).get(EXPLAIN_KEY),
                )
            )
        return states
