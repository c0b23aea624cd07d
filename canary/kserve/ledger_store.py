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

from canary.kserve.store import (
    LABEL_INFERENCE_SERVICE,
    ConfigMapDocuments,
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


class ConfigMapLedgerStore(ConfigMapDocuments):
    def load(self, namespace: str, inference_service: str) -> StoredLedger:
        return ledger_from_dict(self._read(namespace, ledger_configmap_name(inference_service)))

    def save(
        self, namespace: str, inference_service: str, ledger: RollbackLedger, *, resource_version: str | None
    ) -> str:
        """Write the ledger, owned by the InferenceService object it describes; returns the new
        resourceVersion. Raises :class:`ConflictError` on 409 (someone wrote it since it was read)."""
        return self._write(
            namespace,
            ledger_configmap_name(inference_service),
            {LEDGER_KEY: ledger.to_json()},
            inference_service=inference_service,
            owner_uid=ledger.inference_service_uid,
            resource_version=resource_version,
            labels={LABEL_INFERENCE_SERVICE: inference_service + LEDGER_SUFFIX, LABEL_RECORD: LEDGER_RECORD},
        )
