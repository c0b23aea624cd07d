"""The rollback ledger store: one ConfigMap per InferenceService, beside its state ConfigMap.

The ledger (:class:`canary.rollout.ledger.RollbackLedger`) is a ConfigMap of its own,
``kserve-canary-<model>.ledger``, so deleting the state to start over leaves it and a rollback is
never undone (docs/design.md §4.3). It is labelled like a state ConfigMap — its
``kserve-canary.dev/inference-service`` label is ``<model>.ledger``, which the shipped admission
policy's name rule (``kserve-canary-`` + that label) admits; an InferenceService name has no dot, so
no model's state ConfigMap can have that name — plus ``kserve-canary.dev/record: rollback-ledger``.
It is owned by the InferenceService it describes (``blockOwnerDeletion`` false), so it goes with the
model, and always written with a resourceVersion precondition. Never an annotation or a label on
the InferenceService: KServe copies those into the revision template and restarts the pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.kserve.client import GROUP, VERSION, ConflictError, is_not_found
from canary.kserve.store import (
    LABEL_INFERENCE_SERVICE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    WriteObserver,
    as_dict,
    owner_uid_of,
    state_configmap_name,
)
from canary.rollout.ledger import RollbackLedger

__all__ = [
    "LABEL_RECORD",
    "LEDGER_KEY",
    "LEDGER_RECORD",
    "ConfigMapLedgerStore",
    "StoredLedger",
    "ledger_configmap_name",
    "ledger_from_dict",
]

LEDGER_KEY = "ledger.json"
LEDGER_SUFFIX = ".ledger"
LABEL_RECORD = "kserve-canary.dev/record"
LEDGER_RECORD = "rollback-ledger"


def ledger_configmap_name(inference_service: str) -> str:
    return state_configmap_name(inference_service + LEDGER_SUFFIX)


@dataclass(frozen=True)
class StoredLedger:
    """The rollback ledger ConfigMap of one InferenceService as read."""

    ledger_json: str | None  # None when there is none yet
    resource_version: str | None  # precondition for the next write; None = create
    owner_uid: str | None = None  # the InferenceService uid of its owner reference

    def ledger(self) -> RollbackLedger:
        """The stored ledger (an empty one when none is stored). Raises :class:`LedgerFormatError`."""
        return RollbackLedger.from_json(self.ledger_json) if self.ledger_json else RollbackLedger()


def ledger_from_dict(configmap: Mapping[str, Any] | None) -> StoredLedger:
    """The ledger ConfigMap as the watch cache holds it (a JSON dict; None: there is none)."""
    if configmap is None:
        return StoredLedger(None, None)
    meta = configmap.get("metadata") or {}
    return StoredLedger(
        (configmap.get("data") or {}).get(LEDGER_KEY), meta.get("resourceVersion"), owner_uid_of(meta)
    )


class ConfigMapLedgerStore:
    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        request_timeout: float = 10.0,
        on_written: WriteObserver | None = None,
    ):
        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._timeout = request_timeout
        self.on_written = on_written

    def load(self, namespace: str, inference_service: str) -> StoredLedger:
        try:
            found = self._core.read_namespaced_config_map(
                ledger_configmap_name(inference_service), namespace, _request_timeout=self._timeout
            )
        except ApiException as error:
            if is_not_found(error):
                return StoredLedger(None, None)
            raise
        meta = found.metadata or client.V1ObjectMeta()
        owner = next((ref.uid for ref in meta.owner_references or () if ref.kind == "InferenceService"), None)
        return StoredLedger((found.data or {}).get(LEDGER_KEY), meta.resource_version, owner)

    def save(
        self, namespace: str, inference_service: str, ledger: RollbackLedger, *, resource_version: str | None
    ) -> str:
        """Write the ledger, owned by the InferenceService object it describes; returns the new
        resourceVersion. Raises :class:`ConflictError` on 409 (someone wrote it since it was read)."""
        name = ledger_configmap_name(inference_service)
        owners = None
        if ledger.inference_service_uid:
            owners = [
                client.V1OwnerReference(
                    api_version=f"{GROUP}/{VERSION}",
                    kind="InferenceService",
                    name=inference_service,
                    uid=ledger.inference_service_uid,
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
                labels={
                    LABEL_MANAGED_BY: MANAGED_BY,
                    LABEL_INFERENCE_SERVICE: inference_service + LEDGER_SUFFIX,
                    LABEL_RECORD: LEDGER_RECORD,
                },
                owner_references=owners,
                resource_version=resource_version,
            ),
            data={LEDGER_KEY: ledger.to_json()},
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
                    f"rollback ledger of {namespace}/{inference_service} changed since it was read"
                ) from error
            raise
        if self.on_written is not None:
            self.on_written(as_dict(self._api_client, written))
        return str(written.metadata.resource_version if written.metadata else "")
