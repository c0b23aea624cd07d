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

from canary.kserve.client import ConflictError
from canary.kserve.store import ConfigMapDocuments, WriteObserver

# A cached read of one of our ConfigMaps (namespace, name) -> its JSON, or None when there is none.
CachedRead = Callable[[str, str], "dict[str, Any] | None"]

__all__ = ["OUTBOX_KEY", "OUTBOX_SUFFIX", "ConfigMapOutboxStore", "outbox_configmap_name"]

OUTBOX_KEY = "outbox.json"
OUTBOX_SUFFIX = "-kserve-canary-outbox"


def outbox_configmap_name(inference_service: str) -> str:
    return f"{inference_service}{OUTBOX_SUFFIX}"


class ConfigMapOutboxStore(ConfigMapDocuments):
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
        super().__init__(api_client, request_timeout=request_timeout, on_written=on_written)
        self._cached = cached
        self._refresh = refresh

    def read_outbox(self, namespace: str, inference_service: str) -> tuple[str | None, str | None]:
        """The stored text and its resourceVersion; (None, None) when there is no outbox yet."""
        name = outbox_configmap_name(inference_service)
        body = self._cached(namespace, name) if self._cached is not None else self._read(namespace, name)
        if body is None:
            return None, None
        return (body.get("data") or {}).get(OUTBOX_KEY), (body.get("metadata") or {}).get("resourceVersion")

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
        try:
            return self._write(
                namespace,
                name,
                {OUTBOX_KEY: text},
                inference_service=inference_service,
                owner_uid=owner_uid,
                resource_version=resource_version,
            )
        except ConflictError:  # changed since read, or created by somebody else meanwhile
            if self._refresh is not None:
                self._refresh(namespace, name)
            return None
