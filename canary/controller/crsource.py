"""PromotionPolicy objects as a policy source: the CRD discovered, the objects listed and watched.

``promotionpolicies.kserve-canary.dev`` (v1alpha1, namespaced) carries the same document as a policy
file. :class:`PolicyObjects` keeps a :class:`~canary.controller.caches.WatchCache` of them per
watched namespace (or cluster-wide) and parses each with :func:`canary.policy.loader.load_object` —
the model and the ``field: message`` errors of ``kserve-canary validate`` — only when what its author
wrote changed. An object whose current generation does not validate keeps its previous valid
generation running (as a broken file keeps its previous version), and is reported.

Whether the CRD is served is found out by listing it (at most one item): a 404 means the API server
does not know the resource. That is said once in the log and on ``/readyz``, and asked again every
minute, so installing the CRD later needs no restart.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

import structlog
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from canary.controller.caches import WatchCache
from canary.kserve.client import ConflictError, WatchEvent, is_not_found
from canary.policy import LoadedPolicy, PolicyError
from canary.policy.objects import ObjectRules, load_object

__all__ = [
    "POLICY_API_VERSION",
    "POLICY_GROUP",
    "POLICY_KIND",
    "POLICY_PLURAL",
    "POLICY_VERSION",
    "CrdState",
    "ParsedObject",
    "PolicyObjects",
    "PromotionPolicyClient",
]

log = structlog.get_logger("kserve_canary.policy_objects")

POLICY_GROUP = "kserve-canary.dev"
POLICY_VERSION = "v1alpha1"
POLICY_PLURAL = "promotionpolicies"
POLICY_API_VERSION = f"{POLICY_GROUP}/{POLICY_VERSION}"
POLICY_KIND = "PromotionPolicy"


class CrdState(StrEnum):
    UNKNOWN = "unknown"  # not asked yet, or the API did not answer
    SERVED = "served"
    NOT_SERVED = "not-served"  # 404: the CRD is not installed
    FORBIDDEN = "forbidden"  # 403: RBAC does not let the controller list them


class PromotionPolicyClient:
    """The PromotionPolicy edge: list, watch, get, and write ``status`` — never the spec."""

    def __init__(self, api_client: client.ApiClient, *, request_timeout: float = 10.0):
        self._api = client.CustomObjectsApi(api_client)
        self._timeout = request_timeout

    def probe(self, namespace: str | None) -> CrdState:
        """Whether the API server serves PromotionPolicies (listed where the controller watches)."""
        try:
            if namespace is None:
                self._api.list_cluster_custom_object(
                    POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, limit=1, _request_timeout=self._timeout
                )
            else:
                self._api.list_namespaced_custom_object(
                    POLICY_GROUP,
                    POLICY_VERSION,
                    namespace,
                    POLICY_PLURAL,
                    limit=1,
                    _request_timeout=self._timeout,
                )
        except ApiException as error:
            if is_not_found(error):
                return CrdState.NOT_SERVED
            if error.status == 403:
                return CrdState.FORBIDDEN
            return CrdState.UNKNOWN
        except Exception:
            return CrdState.UNKNOWN
        return CrdState.SERVED

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found = self._api.get_namespaced_custom_object(
                POLICY_GROUP, POLICY_VERSION, namespace, POLICY_PLURAL, name, _request_timeout=self._timeout
            )
        except ApiException as error:
            if is_not_found(error):
                return None
            raise
        return cast(dict[str, Any], found)

    def list(self, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        if namespace is None:
            listed = self._api.list_cluster_custom_object(
                POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL, _request_timeout=self._timeout
            )
        else:
            listed = self._api.list_namespaced_custom_object(
                POLICY_GROUP, POLICY_VERSION, namespace, POLICY_PLURAL, _request_timeout=self._timeout
            )
        body = cast(dict[str, Any], listed)
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")

    def watch(
        self, namespace: str | None, resource_version: str, timeout_seconds: int
    ) -> Iterator[WatchEvent]:
        watcher = watch.Watch()  # type: ignore[no-untyped-call]
        scope: tuple[Any, ...] = (
            (self._api.list_cluster_custom_object, POLICY_GROUP, POLICY_VERSION, POLICY_PLURAL)
            if namespace is None
            else (
                self._api.list_namespaced_custom_object,
                POLICY_GROUP,
                POLICY_VERSION,
                namespace,
                POLICY_PLURAL,
            )
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

    def replace_status(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """PUT the status subresource (``body`` carries the resourceVersion read). The spec is not
        written by this request whatever ``body`` holds: the API server takes only ``status`` from
        it. None when the object is gone; :class:`ConflictError` on 409."""
        try:
            written = self._api.replace_namespaced_custom_object_status(
                POLICY_GROUP,
                POLICY_VERSION,
                namespace,
                POLICY_PLURAL,
                name,
                body,
                _request_timeout=self._timeout,
            )
        except ApiException as error:
            if is_not_found(error):
                return None
            if error.status == 409:
                raise ConflictError(
                    f"PromotionPolicy {namespace}/{name} changed since it was read"
                ) from error
            raise
        return cast(dict[str, Any], written)


@dataclass(frozen=True)
class ParsedObject:
    """One PromotionPolicy object as the controller understood it."""

    namespace: str
    name: str
    uid: str | None
    generation: int | None
    errors: tuple[PolicyError, ...]  # the current generation's problems (empty: it is valid)
    running: LoadedPolicy | None  # what runs: the current generation, or the previous valid one

    @property
    def origin(self) -> str:
        return f"promotionpolicy/{self.namespace}/{self.name}"


def _authored(obj: Mapping[str, Any]) -> str:
    """What the author wrote (and what parsing depends on): a change elsewhere is not re-parsed."""
    meta = obj.get("metadata") or {}
    return json.dumps(
        [
            {
                key: meta.get(key)
                for key in ("name", "namespace", "labels", "annotations", "generation", "uid")
            },
            {key: value for key, value in obj.items() if key not in {"metadata", "status"}},
        ],
        sort_keys=True,
        default=str,
    )


class PolicyObjects:
    """The PromotionPolicy objects of the watched namespaces, listed, watched and parsed."""

    def __init__(
        self,
        api: PromotionPolicyClient,
        *,
        scopes: Sequence[str | None],
        rules: ObjectRules,
        watch_timeout: int = 300,
        recheck: float = 60.0,
        on_change: Callable[[], None] = lambda: None,
        spawn: Callable[[str, Callable[[], object]], None] | None = None,
    ):
        self._api = api
        self._scopes = list(scopes) or [None]
        self._rules = rules
        self._recheck = recheck
        self._on_change = on_change
        self._spawn = spawn
        self.cache = WatchCache(
            POLICY_KIND,
            lister=api.list,
            watcher=api.watch,
            getter=api.get,
            scopes=self._scopes,
            watch_timeout=watch_timeout,
            on_event=lambda kind, obj: on_change(),
            on_synced=lambda scope: on_change(),
            strip=False,  # its status is written back with the object (replace_status)
        )
        self.state = CrdState.UNKNOWN
        self._lock = threading.Lock()
        self._parsed: dict[tuple[str, str], tuple[str, ParsedObject]] = {}
        self._last_valid: dict[str, LoadedPolicy] = {}  # by uid: what runs while a new generation is broken
        self._watching = False

    # -- discovery and the watches -----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Find out whether the CRD is served; once it is, list and watch. For a thread."""
        said: CrdState | None = None
        while not stop.is_set():
            state = self._api.probe(self._scopes[0])
            if state is not CrdState.UNKNOWN or self.state is CrdState.UNKNOWN:
                self.state = state
            if state is not said:
                said = state
                self._say(state)
            if state is CrdState.SERVED:
                self._start_watches(stop)
                self._on_change()
                return
            self._on_change()
            stop.wait(self._recheck if state is not CrdState.UNKNOWN else 5.0)

    def _say(self, state: CrdState) -> None:
        if state is CrdState.SERVED:
            log.info("PromotionPolicy objects are read", crd=f"{POLICY_PLURAL}.{POLICY_GROUP}")
        elif state is CrdState.NOT_SERVED:
            log.warning(
                "the PromotionPolicy CRD is not served: PromotionPolicy objects are not read (install "
                "deploy/crds; asked again every minute)",
                crd=f"{POLICY_PLURAL}.{POLICY_GROUP}",
            )
        elif state is CrdState.FORBIDDEN:
            log.error(
                "listing PromotionPolicy objects is forbidden: they are not read (grant get, list and "
                "watch on promotionpolicies.kserve-canary.dev)",
            )

    def _start_watches(self, stop: threading.Event) -> None:
        if self._watching:
            return
        self._watching = True
        for scope in self._scopes:
            target = self._watch_target(scope, stop)
            if self._spawn is not None:
                self._spawn(f"watch-PromotionPolicy-{scope or 'all'}", target)
            else:
                threading.Thread(target=target, daemon=True).start()

    def _watch_target(self, scope: str | None, stop: threading.Event) -> Callable[[], None]:
        return lambda: self.cache.run(scope, stop)

    @property
    def synced(self) -> bool:
        """Whether what is known of the objects is complete: listed everywhere, or known absent."""
        if self.state is CrdState.SERVED:
            return self.cache.all_synced
        return self.state is not CrdState.UNKNOWN

    # -- parsing ----------------------------------------------------------------------------------

    def snapshot(self) -> list[ParsedObject]:
        """Every object, parsed (again only when what its author wrote changed)."""
        objects = self.cache.values() if self.state is CrdState.SERVED else []
        found: list[ParsedObject] = []
        with self._lock:
            seen: set[tuple[str, str]] = set()
            for obj in objects:
                meta = obj.get("metadata") or {}
                key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
                seen.add(key)
                authored = _authored(obj)
                cached = self._parsed.get(key)
                if cached is None or cached[0] != authored:
                    cached = (authored, self._parse(obj))
                    self._parsed[key] = cached
                found.append(cached[1])
            for key in set(self._parsed) - seen:
                gone = self._parsed.pop(key)[1]
                if gone.uid is not None:
                    self._last_valid.pop(gone.uid, None)
        return found

    def _parse(self, obj: dict[str, Any]) -> ParsedObject:
        loaded, errors = load_object(obj, rules=self._rules)
        meta = obj.get("metadata") or {}
        uid = str(meta["uid"]) if meta.get("uid") else None
        generation = meta.get("generation") if isinstance(meta.get("generation"), int) else None
        if loaded is not None and uid is not None:
            self._last_valid[uid] = loaded
        running = loaded if loaded is not None else (self._last_valid.get(uid) if uid else None)
        return ParsedObject(
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            uid,
            generation,
            tuple(errors),
            running,
        )

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cache.get(namespace, name)
