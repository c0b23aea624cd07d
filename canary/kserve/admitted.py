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

Lists are read in pages (``limit``/``continue``) of at most :attr:`ConfigMapLimits.page` items and about
:attr:`ConfigMapLimits.page_bytes` of data (sized by the largest item of the page before), each judged
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
    StoredState,
    is_state_configmap,
    state_configmap_name,
    stored_from_dict,
)

__all__ = [
    "MAX_COMMAND_BYTES",
    "ConfigMapLimits",
    "Ignored",
    "list_our_configmaps",
    "list_states",
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

# Bytes read at a time from a list response.
_CHUNK = 64 * 1024

# (namespace, name, reason): a ConfigMap that is not kept.
Ignored = Callable[[str, str, str], None]


@dataclass(frozen=True, slots=True)
class ConfigMapLimits:
    """What the ConfigMap cache keeps at most (docs/security.md, "The controller's ConfigMaps")."""

    max_bytes: int = _MAX_CONFIGMAP_BYTES  # data and annotations of one ConfigMap, in characters
    # Three ConfigMaps per InferenceService (state, ledger, outbox) for the 10,000 rollouts the
    # controller is measured with (docs/performance.md), in one namespace.
    per_namespace: int = 30_000
    # Items per list request at most: a page is judged whole before the next is read.
    page: int = 10
    # Characters of data one page should hold: the next page asks for as many items as fit, by the
    # largest of the page before (the first asks for one). The controller's largest ConfigMap
    # (``max_bytes``) fits three times; hostile 1 MiB objects come two at a time, so a page costs
    # a few MiB while it is parsed, not ``page`` MiB.
    page_bytes: int = 2 * 1024 * 1024


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
    the others are told to ``ignored`` and dropped page by page.

    The first page asks for one item; each next page for twice as many as the page before, at most
    ``limits.page`` and as many as fit ``limits.page_bytes`` by the largest item seen last. A page
    whose answer grows past ``limits.page_bytes`` anyway is dropped unread and asked again (the same
    ``continue`` token) for a quarter as many."""
    core = client.CoreV1Api(api_client)
    kept: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    token: str | None = None
    version = ""
    asked = 1
    while True:
        body = _page(core, namespace, asked, token, timeout, None if asked == 1 else limits.page_bytes)
        if body is None:
            asked = max(1, asked // 4)
            continue
        version = version or str((body.get("metadata") or {}).get("resourceVersion") or "")
        items = body.get("items") or ()
        largest = max((_characters(item) for item in items), default=1)
        # Twice the largest item's characters: JSON escaping can double a stored document's size.
        asked = max(1, min(limits.page, 2 * asked, limits.page_bytes // (2 * max(largest, 1))))
        for item in items:
            _judge(item, limits, counts, kept, ignored)
        token = (body.get("metadata") or {}).get("continue") or None
        del body, items
        if token is None:
            return kept, version


def list_states(
    api_client: client.ApiClient,
    namespace: str | None,
    *,
    ignored: Ignored,
    limits: ConfigMapLimits = ConfigMapLimits(),
    timeout: float = 30.0,
) -> list[StoredState]:
    """The rollout states of ``namespace`` (None: every namespace), listed as the controller lists
    them: in bounded pages, only the ConfigMaps it wrote (the dashboard's and the CLI's view)."""
    listed, _ = list_our_configmaps(api_client, namespace, limits=limits, ignored=ignored, timeout=timeout)
    # The same labels mark each InferenceService's notification outbox: only the state is a state.
    return [stored_from_dict(item, "", "") for item in listed if is_state_configmap(item)]


def _judge(
    item: dict[str, Any],
    limits: ConfigMapLimits,
    counts: Counter[str],
    kept: list[dict[str, Any]],
    ignored: Ignored,
) -> None:
    """Keep ``item`` (counted for its namespace) if it is ours, else tell ``ignored`` why not."""
    meta = item.get("metadata") or {}
    where, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    reason = why_not_ours(item, limits.max_bytes)
    if reason is None and counts[where] >= limits.per_namespace:
        reason = f"its namespace already has the {limits.per_namespace} ConfigMaps kept per namespace"
    if reason is not None:
        ignored(where, name, reason)
        return
    counts[where] += 1
    kept.append(item)


def _characters(configmap: Mapping[str, Any]) -> int:
    """About how large ``configmap`` is: its data, binaryData and annotations, in characters."""
    meta = configmap.get("metadata") or {}
    parts = (configmap.get("data"), configmap.get("binaryData"), meta.get("annotations"))
    return sum(len(str(key)) + len(str(value)) for part in parts for key, value in (part or {}).items())


def _page(
    core: client.CoreV1Api,
    namespace: str | None,
    limit: int,
    token: str | None,
    timeout: float,
    max_bytes: int | None,
) -> dict[str, Any] | None:
    """One page of the list, parsed; None if its answer grew past ``max_bytes``."""
    paging: dict[str, Any] = {"limit": limit, **({"_continue": token} if token else {})}
    if namespace is None:
        response = core.list_config_map_for_all_namespaces(
            label_selector=SELECTOR, _preload_content=False, _request_timeout=timeout, **paging
        )
    else:
        response = core.list_namespaced_config_map(
            namespace, label_selector=SELECTOR, _preload_content=False, _request_timeout=timeout, **paging
        )
    return _parsed(response, max_bytes)


def _parsed(response: Any, max_bytes: int | None) -> dict[str, Any] | None:
    """The page's JSON, read as it streams in: one copy of the body at a time (``response.data``
    joins the read chunks into a second copy, and ``json.loads`` of bytes decodes a third beside
    them). None, with the connection closed, once more than ``max_bytes`` arrived."""
    buffer = bytearray()
    for chunk in response.stream(_CHUNK):
        buffer += chunk
        if max_bytes is not None and len(buffer) > max_bytes:
            response.close()
            return None
    response.release_conn()
    text = buffer.decode("utf-8")
    del buffer
    return cast(dict[str, Any], json.loads(text))
