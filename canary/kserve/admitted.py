"""Which labelled ConfigMaps the controller keeps: only what it wrote.

The controller lists and watches every ConfigMap labelled ``app.kubernetes.io/managed-by=kserve-canary``
(cluster-wide, or per watched namespace). Anyone who may create a ConfigMap in a namespace can set that
label, so a label proves nothing: a ConfigMap is kept only if

* its name is the state, rollback-ledger or notification-outbox name of the InferenceService its
  ``kserve-canary.dev/inference-service`` label names (``kserve-canary-<isvc>``,
  ``kserve-canary-<isvc>.ledger``, ``<isvc>-kserve-canary-outbox``);
* it holds that document (``state.json``, ``ledger.json``, ``outbox.json``, a JSON object) and no key
  the controller or a command never writes, and no ``binaryData``;
* its data and annotations total at most :attr:`ConfigMapLimits.max_bytes` characters (what the
  controller writes at most: a state of :data:`~canary.kserve.store.MAX_STATE_BYTES` with a command
  beside it; an outbox or a ledger is smaller);
* its namespace has fewer than :attr:`ConfigMapLimits.per_namespace` kept already.

Lists are read in pages of :attr:`ConfigMapLimits.page` (``limit``/``continue``), each page judged
before the next is read, so a hostile ConfigMap costs one page's worth of memory while it is judged
and nothing after. What is ignored is told by ``ignored(namespace, name, reason)``, never kept.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from kubernetes import client

from canary.kserve.ledger_store import LEDGER_KEY, LEDGER_SUFFIX
from canary.kserve.outbox import OUTBOX_KEY, outbox_configmap_name
from canary.kserve.store import (
    COMMAND_ISSUER_KEY,
    COMMAND_KEY,
    COMMAND_RESULT_KEY,
    EXPLAIN_KEY,
    LABEL_INFERENCE_SERVICE,
    MAX_STATE_BYTES,
    ROLLOUTS_KEY,
    SELECTOR,
    STATE_KEY,
    state_configmap_name,
)

__all__ = [
    "MAX_COMMAND_BYTES",
    "ConfigMapLimits",
    "Ignored",
    "list_our_configmaps",
    "why_not_ours",
]

# The largest command.json the admission policy admits (deploy/…/command-issuer.yaml): a command is
# a verb, who, an id, a time and a reason of at most a few hundred characters.
MAX_COMMAND_BYTES = 4096
# What the controller writes at most into one ConfigMap: a state of MAX_STATE_BYTES (state, explain,
# answer and past rollouts together), a command and its issuer beside it, and room for annotations.
_MAX_CONFIGMAP_BYTES = MAX_STATE_BYTES + 2 * MAX_COMMAND_BYTES + 8 * 1024

_STATE_KEYS = frozenset(
    {STATE_KEY, EXPLAIN_KEY, COMMAND_KEY, COMMAND_ISSUER_KEY, COMMAND_RESULT_KEY, ROLLOUTS_KEY}
)

# (namespace, name, reason): a ConfigMap that is not kept.
Ignored = Callable[[str, str, str], None]


@dataclass(frozen=True, slots=True)
class ConfigMapLimits:
    """What the ConfigMap cache keeps at most (docs/security.md, "The controller's ConfigMaps")."""

    max_bytes: int = _MAX_CONFIGMAP_BYTES  # data and annotations of one ConfigMap, in characters
    # Three ConfigMaps per InferenceService (state, ledger, outbox) for the 10,000 rollouts the
    # controller is measured with (docs/performance.md), in one namespace.
    per_namespace: int = 30_000
    # Items per list request: a page is judged whole before the next is read, so a page of hostile
    # ConfigMaps at the apiserver's 1 MiB limit costs about 10 MiB, twice while it is decoded.
    page: int = 10


def why_not_ours(configmap: Mapping[str, Any], max_bytes: int) -> str | None:
    """None if ``configmap`` is one the controller wrote (see the module); else why not, without
    any of its content."""
    meta = configmap.get("metadata") or {}
    name = str(meta.get("name") or "")
    model = str((meta.get("labels") or {}).get(LABEL_INFERENCE_SERVICE) or "")
    if configmap.get("binaryData"):
        return "it has binaryData, which kserve-canary never writes"
    data = configmap.get("data") or {}
    size = sum(len(str(key)) + len(str(value)) for key, value in data.items())
    size += sum(len(str(key)) + len(str(value)) for key, value in (meta.get("annotations") or {}).items())
    if size > max_bytes:
        return f"its data and annotations are {size} characters, over the {max_bytes} kept per ConfigMap"
    if not model:
        return f"it has no {LABEL_INFERENCE_SERVICE} label"
    if name == state_configmap_name(model) and model.endswith(LEDGER_SUFFIX):
        main, allowed = LEDGER_KEY, frozenset({LEDGER_KEY})
    elif name == state_configmap_name(model) and "." not in model:
        main, allowed = STATE_KEY, _STATE_KEYS
    elif name == outbox_configmap_name(model):
        main, allowed = OUTBOX_KEY, frozenset({OUTBOX_KEY})
    else:
        return f"its name is not the state, ledger or outbox name of InferenceService {model[:63]!r}"
    unknown = sorted(str(key)[:63] for key in data if key not in allowed)
    if unknown:
        return f"it has keys kserve-canary never writes: {', '.join(unknown[:5])}"
    if not data:
        # Ours, emptied (by hand, or a restore without data): kept, so that the controller sees its
        # resourceVersion, treats the document as lost (docs/failure-modes.md) and writes it again.
        return None
    if not str(data.get(main) or "").lstrip().startswith("{"):
        return f"it has no {main} document"
    return None


def list_our_configmaps(
    api_client: client.ApiClient,
    namespace: str | None,
    *,
    limits: ConfigMapLimits,
    ignored: Ignored,
    timeout: float = 30.0,
) -> tuple[list[dict[str, Any]], str]:
    """The controller's ConfigMaps (as JSON dicts) and the list's resourceVersion, read in pages;
    the others are told to ``ignored`` and dropped page by page."""
    core = client.CoreV1Api(api_client)
    kept: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    token: str | None = None
    version = ""
    while True:
        body = _page(core, namespace, limits.page, token, timeout)
        if not version:
            version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        for item in body.get("items") or ():
            meta = item.get("metadata") or {}
            where, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
            reason = why_not_ours(item, limits.max_bytes)
            if reason is None and counts[where] >= limits.per_namespace:
                reason = f"its namespace already has the {limits.per_namespace} ConfigMaps kept per namespace"
            if reason is not None:
                ignored(where, name, reason)
                continue
            counts[where] += 1
            kept.append(item)
        token = (body.get("metadata") or {}).get("continue") or None
        del body
        if token is None:
            return kept, version


def _page(
    core: client.CoreV1Api, namespace: str | None, limit: int, token: str | None, timeout: float
) -> dict[str, Any]:
    paging: dict[str, Any] = {"limit": limit, **({"_continue": token} if token else {})}
    if namespace is None:
        response = core.list_config_map_for_all_namespaces(
            label_selector=SELECTOR, _preload_content=False, _request_timeout=timeout, **paging
        )
    else:
        response = core.list_namespaced_config_map(
            namespace, label_selector=SELECTOR, _preload_content=False, _request_timeout=timeout, **paging
        )
    return cast(dict[str, Any], json.loads(cast(Any, response).data))
