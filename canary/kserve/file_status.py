"""Where the status of file policies lives: one ConfigMap the controller owns and names.

A PromotionPolicy object carries its rollout's status on itself (``status``), which every
namespace's ``view`` role already reads. A policy *file* has no object: its rollout's status is a
row of ``rollouts.json`` in the ConfigMap ``kserve-canary-file-policies`` in the controller's own
namespace, written by the controller when a row changes. RBAC's ``resourceNames`` cannot name the
per-model state ConfigMaps (``kserve-canary-<model>``) in advance, but it can name this one: the
viewer role reads it with ``get`` on that name and nothing else of ConfigMaps
(``kserve-canary status``, docs/install.md "RBAC for people").

File policies are the platform's (the controller's configuration, not a tenant's), so the one
ConfigMap lists every namespace's file-policy rollouts; tenants who must not see each other use
PromotionPolicy objects. A row holds what ``status`` shows, never a secret (the artefacts' URIs are
already stripped of credentials). At most :data:`MAX_ROWS` rows are kept (newest state first),
well under a ConfigMap's 1 MiB.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.rollout.state import RolloutState

__all__ = ["FILE_STATUS_CONFIGMAP", "FILE_STATUS_KEY", "MAX_ROWS", "FileStatusPublisher", "summary_row"]

FILE_STATUS_CONFIGMAP = "kserve-canary-file-policies"
FILE_STATUS_KEY = "rollouts.json"
MAX_ROWS = 1000  # ~600 bytes a row: under 1 MiB with room to spare

log = structlog.get_logger("kserve_canary.file_status")


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def summary_row(namespace: str, name: str, policy: str, state: RolloutState) -> dict[str, Any]:
    """One rollout as ``status`` shows it (the keys of ``status -o json``)."""
    last = state.history[-1] if state.history else None
    step = state.step
    canary, stable = state.artefact_of(state.revision), state.artefact_of(state.stable_revision)
    return {
        "namespace": namespace,
        "name": name,
        "policy": policy,
        "revision": state.revision,
        "phase": str(state.phase),
        "weight": state.spec_weight.weight if state.spec_weight else None,
        "step": None if step is None else step.index + 1,
        "stepWeight": None if step is None else step.weight,
        "since": _iso(step.started_at if step is not None else state.started_at),
        "reason": last.reason if last else "",
        "stableRevision": state.stable_revision,
        "canaryArtefact": canary.as_dict() if canary else None,
        "stableArtefact": stable.as_dict() if stable else None,
    }


class FileStatusPublisher:
    """Writes the file policies' rows into :data:`FILE_STATUS_CONFIGMAP` when they changed, at most
    once per ``min_interval`` seconds (a due write waits for the next pass, never lost: the rows are
    computed again from the stored states)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        *,
        min_interval: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
        request_timeout: float = 10.0,
    ) -> None:
        self._api = client.CoreV1Api(api_client)
        self._namespace = namespace
        self._min_interval = min_interval
        self._monotonic = monotonic
        self._timeout = request_timeout
        self._written: str | None = None
        self._last_write: float | None = None
        self._failure: str | None = None  # the last write's error, logged once

    def publish(self, rows: Iterable[dict[str, Any]]) -> str:
        """``unchanged``, ``deferred``, ``written`` or ``failed``."""
        ordered = sorted(rows, key=lambda row: (row["namespace"], row["name"]))[:MAX_ROWS]
        document = json.dumps({"rollouts": ordered}, separators=(",", ":"), sort_keys=True)
        if document == self._written:
            return "unchanged"
        now = self._monotonic()
        if self._last_write is not None and now - self._last_write < self._min_interval:
            return "deferred"
        self._last_write = now
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name=FILE_STATUS_CONFIGMAP,
                namespace=self._namespace,
                labels={"app.kubernetes.io/part-of": "kserve-canary"},
            ),
            data={FILE_STATUS_KEY: document},
        )
        try:
            try:
                self._api.replace_namespaced_config_map(
                    FILE_STATUS_CONFIGMAP, self._namespace, body, _request_timeout=self._timeout
                )
            except ApiException as error:
                if error.status != 404:
                    raise
                self._api.create_namespaced_config_map(self._namespace, body, _request_timeout=self._timeout)
        except Exception as error:  # the next pass writes it again; said once per distinct error
            said = str(error)[:300]
            if said != self._failure:
                log.warning(
                    "file-policy status not written; trying again",
                    configmap=f"{self._namespace}/{FILE_STATUS_CONFIGMAP}",
                    error=said,
                )
            self._failure = said
            return "failed"
        self._written, self._failure = document, None
        return "written"
