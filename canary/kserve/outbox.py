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

from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.kserve.client import GROUP, VERSION, is_not_found
from canary.kserve.store import (
    LABEL_INFERENCE_SERVICE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    WriteObserver,
    as_dict,
)

# A cached read of one of our ConfigMaps (namespace, name) -> its JSON, or None when there is none.
CachedRead = Callable[[str, str], "dict[str, Any] | None"]

__all__ = ["OUTBOX_KEY", "OUTBOX_SUFFIX", "ConfigMapOutboxStore", "outbox_configmap_name"]

OUTBOX_KEY = "outbox.json"
OUTBOX_SUFFIX = "-kserve-canary-outbox"


def outbox_configmap_name(inference_service: str) -> str:
    return f"{inference_service}{OUTBOX_SUFFIX}"


class ConfigMapOutboxStore:
    """With ``cached`` (the controller's ConfigMap watch cache) reads come from the cache, writes
    go to ``on_written`` as the API answered them, and a 409 reads the ConfigMap again into the
    cache through ``refresh`` before the caller reads it."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        request_timeout: float = 10.0,
        cached: CachedRead | None = None,
        on_written: WriteObserver | None = None,
        refresh: CachedRead | None = None,
    ):
        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._timeout = request_timeout
        self._cached = cached
        self._on_written = on_written
        self._refresh = refresh

    def read_outbox(self, namespace: str, inference_service: str) -> tuple[str | None, str | None]:
        """The stored text and its resourceVersion; (None, None) when there is no outbox yet."""
        if self._cached is not None:
            body = self._cached(namespace, outbox_configmap_name(inference_service))
            if body is None:
                return None, None
            meta = body.get("metadata") or {}
            return (body.get("data") or {}).get(OUTBOX_KEY), meta.get("resourceVersion")
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
                if self._refresh is not None:
                    self._refresh(namespace, name)
                return None
            raise
        if self._on_written is not None:
            self._on_written(as_dict(self._api_client, written))
        return str(written.metadata.resource_version if written.metadata else "")
