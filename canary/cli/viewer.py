"""``status`` with the viewer role: no ConfigMap list, only what the controller owns and names.

The viewer ClusterRole (deploy/base/operator-rbac.yaml, the chart's ``-viewer``) grants no read of
a namespace's ConfigMaps. When listing the state ConfigMaps is forbidden, ``status`` reads instead:

* the PromotionPolicy objects' ``status`` (``list promotionpolicies``, in ``-n``'s namespace or in
  all), for the rollouts objects govern;
* ``rollouts.json`` of the ConfigMap ``kserve-canary-file-policies`` in the controller's namespace
  (``get`` on that one name; ``KSERVE_CANARY_NAMESPACE``, default ``kserve-canary``), for the
  rollouts policy files govern (canary/kserve/file_status.py).

The requests are exactly those the viewer role allows (tests/cli/test_viewer_role.py checks them
against the rendered roles).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.cli.cluster import get_json
from canary.cli.rollouts import StatusRow
from canary.kserve.file_status import FILE_STATUS_CONFIGMAP, FILE_STATUS_KEY
from canary.rollout.artefact import Artefact

__all__ = ["CONTROLLER_NAMESPACE_ENV", "viewer_rows"]

CONTROLLER_NAMESPACE_ENV = "KSERVE_CANARY_NAMESPACE"
_POLICIES = "/apis/kserve-canary.dev/v1alpha1"


def viewer_rows(api: client.ApiClient, namespace: str | None) -> list[StatusRow] | None:
    """The rollouts in ``namespace`` (None: all) from PromotionPolicy statuses and the file
    policies' ConfigMap; a source the person may not read (or that is not there) is left out, the
    other kept. None when neither could be read: the person has not even the viewer role."""
    objects, files = _object_rows(api, namespace), _file_policy_rows(api, namespace)
    if objects is None and files is None:
        return None
    rows = {(row.namespace, row.name): row for row in (files or []) + (objects or [])}
    return sorted(rows.values(), key=lambda row: (row.namespace, row.name))


def _object_rows(api: client.ApiClient, namespace: str | None) -> list[StatusRow] | None:
    path = f"{_POLICIES}/promotionpolicies" if namespace is None else (
        f"{_POLICIES}/namespaces/{quote(namespace)}/promotionpolicies"
    )  # fmt: skip
    try:
        listed = get_json(api, path)
    except ApiException as error:
        if error.status in (403, 404):  # not allowed, or no CRD installed: file policies only
            return None
        raise
    return [row for item in listed.get("items") or () if (row := _object_row(item)) is not None]


def _object_row(item: Mapping[str, Any]) -> StatusRow | None:
    meta, spec, status = (item.get(key) or {} for key in ("metadata", "spec", "status"))
    target = (spec.get("target") or {}).get("inferenceService")
    if not isinstance(target, str) or not isinstance(meta.get("namespace"), str):
        return None
    last = status.get("lastDecision") or {}
    step = status.get("step")
    return StatusRow(
        meta["namespace"],
        target,
        str(status.get("phase") or "Unknown"),
        revision=status.get("canaryRevision"),
        weight=status.get("weight"),
        step=int(step.split("/")[0]) if isinstance(step, str) and "/" in step else None,
        since=_time(last.get("at")),
        reason=str(last.get("message") or ""),
        stable=status.get("stableRevision"),
        canary_artefact=_artefact(status.get("canaryArtefact")),
        stable_artefact=_artefact(status.get("stableArtefact")),
    )


def _file_policy_rows(api: client.ApiClient, namespace: str | None) -> list[StatusRow] | None:
    home = os.environ.get(CONTROLLER_NAMESPACE_ENV) or "kserve-canary"
    path = f"/api/v1/namespaces/{quote(home)}/configmaps/{FILE_STATUS_CONFIGMAP}"
    try:
        found = get_json(api, path)
    except ApiException as error:
        if error.status in (403, 404):  # not allowed, or no controller has written it
            return None
        raise
    try:
        rows = json.loads((found.get("data") or {}).get(FILE_STATUS_KEY) or "{}").get("rollouts") or []
    except (ValueError, AttributeError):
        rows = []
    return [
        _file_row(row)
        for row in rows
        if isinstance(row, dict) and (namespace is None or row.get("namespace") == namespace)
    ]


def _file_row(row: Mapping[str, Any]) -> StatusRow:
    return StatusRow(
        str(row.get("namespace")),
        str(row.get("name")),
        str(row.get("phase") or "Unknown"),
        revision=row.get("revision"),
        weight=row.get("weight"),
        step=row.get("step"),
        step_weight=row.get("stepWeight"),
        since=_time(row.get("since")),
        reason=str(row.get("reason") or ""),
        stable=row.get("stableRevision"),
        canary_artefact=_artefact(row.get("canaryArtefact")),
        stable_artefact=_artefact(row.get("stableArtefact")),
    )


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _artefact(value: object) -> Artefact | None:
    if not isinstance(value, Mapping):
        return None
    fields = [value.get(key) for key in ("storageUri", "image", "runtime", "modelFormat")]
    storage_uri, image, runtime, model_format = (
        field if isinstance(field, str) else None for field in fields
    )
    return Artefact(storage_uri, image, runtime, model_format)
