"""The latest Warning Events of an InferenceService, for ``kserve-canary explain``: what the controller
said when a rollout could not proceed (``ReconcileFailed``: canary.controller.failures) and what
KServe and Knative said about the model."""

from __future__ import annotations

from datetime import UTC, datetime

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.cli.output import timestamp

__all__ = ["latest_warnings"]

SHOWN = 3  # the newest ones; `kubectl get events` has the rest
_NEVER = datetime.min.replace(tzinfo=UTC)


def _when(event: client.CoreV1Event) -> datetime:
    moment = event.last_timestamp or event.event_time or event.first_timestamp
    return moment if isinstance(moment, datetime) else _NEVER


def latest_warnings(api: client.ApiClient, namespace: str, name: str) -> list[str]:
    """Lines for the newest Warning Events of ``namespace/name`` (one saying why, when they cannot
    be read)."""
    selector = f"involvedObject.kind=InferenceService,involvedObject.name={name},type=Warning"
    try:
        listed = client.CoreV1Api(api).list_namespaced_event(
            namespace, field_selector=selector, _request_timeout=10
        )
    except ApiException as error:
        return [f"warning events not read: the apiserver answered {error.status} {error.reason}"]
    lines = []
    for event in sorted(listed.items or (), key=_when, reverse=True)[:SHOWN]:
        count = int(event.count or 1)
        times = f" ×{count}" if count > 1 else ""
        when = _when(event)
        last = f" (last {timestamp(when)})" if when is not _NEVER else ""
        lines.append(f"warning {event.reason or ''}{times}{last}: {event.message or ''}")
    return lines
