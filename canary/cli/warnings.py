"""The latest Warning Events of an InferenceService, for ``kserve-canary explain``: what the controller
said when a rollout could not proceed (``ReconcileFailed``: canary.controller.failures) and what
KServe and Knative said about the model."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.cli.cluster import get_json

__all__ = ["latest_warnings"]

SHOWN = 3  # the newest ones; `kubectl get events` has the rest


def _when(event: dict[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


def latest_warnings(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    """Lines for the newest Warning Events of ``namespace/name`` (one saying why, when they cannot
    be read)."""
    selector = f"involvedObject.kind=InferenceService,involvedObject.name={name},type=Warning"
    try:
        listed = get_json(api, f"/api/v1/namespaces/{quote(namespace)}/events", {"fieldSelector": selector})
    except ApiException as error:
        return [f"warning events not read: the apiserver answered {error.status} {error.reason}"]
    events = sorted(listed.get("items") or (), key=_when, reverse=True)[:SHOWN]
    lines = []
    for event in events:
        count = int(event.get("count") or 1)
        times = f" ×{count}" if count > 1 else ""
        lines.append(
            f"warning {event.get('reason', '')}{times} (last {_when(event)}): {event.get('message', '')}"
        )
    return lines
