"""Reading and patching InferenceServices through the official ``kubernetes`` client.

The controller writes exactly one field on an InferenceService: ``spec.predictor.canaryTrafficPercent``.
Never annotations or labels — KServe copies them into the Knative revision template, which creates a
new revision and restarts the model's GPU pods. Every write is a JSON merge patch (RFC 7386) carrying
``metadata.resourceVersion`` as a precondition, so a write based on a stale read fails with 409
instead of silently overwriting somebody else's change.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from canary.rollout.decision import canary_percent_patch

__all__ = [
    "GROUP",
    "PLURAL",
    "VERSION",
    "ConflictError",
    "InferenceServiceClient",
    "WatchEvent",
    "is_not_found",
]

GROUP = "serving.kserve.io"
VERSION = "v1beta1"
PLURAL = "inferenceservices"
MERGE_PATCH = "application/merge-patch+json"


class ConflictError(Exception):
    """The object changed since it was read (HTTP 409): re-read and decide again."""


def is_not_found(error: ApiException) -> bool:
    return getattr(error, "status", None) == 404


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK | ERROR
    object: Mapping[str, Any]


class InferenceServiceClient:
    """The KServe edge: get, list, watch, and set the canary percentage — nothing else."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        request_timeout: float = 10.0,
        field_manager: str = "kserve-canary",
    ):
        self._api = client.CustomObjectsApi(api_client)
        self._timeout = request_timeout
        self._field_manager = field_manager

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = self._api.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=self._timeout
            )
        except ApiException as error:
            if is_not_found(error):
                return None
            raise
        return cast(dict[str, Any], found)

    def list(self, namespace: str | None = None) -> tuple[list[dict[str, Any]], str]:
        """All InferenceServices (in a namespace, or cluster-wide) and the list's resourceVersion."""
        if namespace is None:
            listed = self._api.list_cluster_custom_object(
                GROUP, VERSION, PLURAL, _request_timeout=self._timeout
            )
        else:
            listed = self._api.list_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, _request_timeout=self._timeout
            )
        body = cast(dict[str, Any], listed)
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")

    def watch(
        self, namespace: str | None, resource_version: str, *, timeout_seconds: int = 60
    ) -> Iterator[WatchEvent]:
        """Stream changes after ``resource_version``; ends after ``timeout_seconds`` (then list again)."""
        watcher = watch.Watch()  # type: ignore[no-untyped-call]
        scope: tuple[Any, ...] = (
            (self._api.list_cluster_custom_object, GROUP, VERSION, PLURAL)
            if namespace is None
            else (self._api.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL)
        )
        stream = watcher.stream(  # type: ignore[no-untyped-call]
            *scope,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
            _request_timeout=timeout_seconds + self._timeout,
        )
        try:
            for event in stream:
                yield WatchEvent(type=str(event["type"]), object=cast(Mapping[str, Any], event["object"]))
        finally:
            watcher.stop()  # type: ignore[no-untyped-call]

    def set_canary_percent(
        self, namespace: str, name: str, percent: int | None, resource_version: str
    ) -> dict[str, Any]:
        """Write ``canaryTrafficPercent`` (``None`` removes it: promotion) unless it changed since the read.

        Raises :class:`ConflictError` when the InferenceService changed since ``resource_version``.
        """
        return self.apply_patch(namespace, name, canary_percent_patch(percent, resource_version))

    def apply_patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Send a decision's patch (:attr:`canary.rollout.decision.Decision.patch`) exactly as it is.

        Only the one write the controller makes is sent: ``canaryTrafficPercent`` within 0..100 (or
        null), with a resourceVersion precondition. Raises :class:`ConflictError` when the
        InferenceService changed since that resourceVersion, ValueError for any other patch.
        """
        _check_patch(patch)
        try:
            patched = self._api.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                patch,
                field_manager=self._field_manager,
                _content_type=MERGE_PATCH,
                _request_timeout=self._timeout,
            )
        except ApiException as error:
            if error.status == 409:
                raise ConflictError(
                    f"InferenceService {namespace}/{name} changed since it was read"
                ) from error
            raise
        return cast(dict[str, Any], patched)


def _check_patch(patch: Mapping[str, Any]) -> None:
    """Refuse anything but a conditional write of canaryTrafficPercent (the controller's only write)."""
    expected = canary_percent_patch(0, "0")
    metadata = patch.get("metadata")
    spec = patch.get("spec")
    predictor = spec.get("predictor") if isinstance(spec, Mapping) else None
    if (
        set(patch) != set(expected)
        or not isinstance(metadata, Mapping)
        or set(metadata) != {"resourceVersion"}
        or not isinstance(spec, Mapping)
        or set(spec) != {"predictor"}
        or not isinstance(predictor, Mapping)
        or set(predictor) != {"canaryTrafficPercent"}
    ):
        raise ValueError(f"only a conditional canaryTrafficPercent patch is ever sent, not {dict(patch)!r}")
    if not isinstance(metadata["resourceVersion"], str) or not metadata["resourceVersion"]:
        raise ValueError("a canaryTrafficPercent patch needs the resourceVersion it was decided on")
    percent = predictor["canaryTrafficPercent"]
    if percent is not None and (
        isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100
    ):
        # The CRD has no minimum or maximum: the controller is the only guard.
        raise ValueError(f"canaryTrafficPercent must be within 0..100, not {percent}")
