"""The notification outbox of one InferenceService: its own ConfigMap, next to the state one.

Not the state ConfigMap: the outbox changes when a receiver answers, the state when a decision is
made; one document for both would make every delivery race the reconcile. Same labels as the state
(so the shipped admission policy admits it and a label selector finds every object of ours), the
name ``<inference service>-kserve-canary-outbox``, an owner reference to the InferenceService
(``blockOwnerDeletion`` false, as for the state) so deleting the model deletes its outbox, and every
write under the resourceVersion read. Implements :class:`canary.notify.outbox.OutboxStore` by shape
(the two layers do not import each other; the controller wires them).
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.kserve.client import GROUP, VERSION, is_not_found
from canary.kserve.store import LABEL_INFERENCE_SERVICE, LABEL_MANAGED_BY, MANAGED_BY

__all__ = ["OUTBOX_KEY", "OUTBOX_SUFFIX", "ConfigMapOutboxStore", "outbox_configmap_name"]

OUTBOX_KEY = "outbox.json"
OUTBOX_SUFFIX = "-kserve-canary-outbox"


def outbox_configmap_name(inference_service: str) -> str:
    return f"{inference_service}{OUTBOX_SUFFIX}"


class ConfigMapOutboxStore:
    def __init__(self, api_client: client.ApiClient, *, request_timeout: float = 10.0):
        self._core = client.CoreV1Api(api_client)
        self._timeout = request_timeout

    def read_outbox(self, namespace: str, inference_service: str) -> tuple[str | None, str | None]:
        """The stored text and its resourceVersion; (None, None) when there is no outbox yet."""
        try:
            found = self._core.read_namespaced_config_map(
                outbox_configmap_name(inference_service), namespace, _request_timeout=self._timeout
            )
        except ApiException as error:
            if is_not_found(error):
                return None, None
            raise
        version = found.metadata.resource_version if found.metadata else None
        return (found.data or {}).get(OUTBOX_KEY), version

    def write_outbox(
        self,
        namespace: str,
        inference_service: str,
        text: str,
        *,
        resource_version: str | None,
        owner_uid: str | None,
    ) -> str | None:
        """Create (``resource_version`` None) or replace; the new resourceVersion, None on a conflict."""
        name = outbox_configmap_name(inference_service)
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
            data={OUTBOX_KEY: text},
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
            if error.status == 409:  # changed since read, or created by somebody else meanwhile
                return None
            raise
        return str(written.metadata.resource_version if written.metadata else "")
