"""Watch caches: what a reconcile reads, kept by list+watch instead of a GET per rollout per tick.

Two caches, each one list and then one watch per watched namespace (or one cluster-wide):

* the InferenceServices;
* the controller's own ConfigMaps (the ``app.kubernetes.io/managed-by=kserve-canary`` label): the
  state, the rollback ledger and the notification outbox of every model.

Objects are kept as the JSON the API sent, with their ``resourceVersion``, which the reconciler
uses as the write precondition exactly as it used the one of a GET. The controller's own writes go
into the cache as the API answered them (``put``), so the next reconcile never reads an object older
than what it wrote; an event older than the cached object (resourceVersions compared as numbers,
when they are numbers) is ignored. A deletion leaves a tombstone with its resourceVersion: a
write of ours answered before the deletion but cached after its event (the reconcile thread and
the watch thread race) would otherwise bring the deleted object back until the next list, and the
controller would go on reading a state nobody has. A write refused with 409 refreshes the object with one GET
(``refresh``): the cache was behind, the next reconcile reads what the API has.

What is kept of an object is the JSON the API sent less what the controller never reads and a
cluster fills: ``metadata.managedFields`` (server-side apply's field owners, often larger than the
spec) and the ``kubectl.kubernetes.io/last-applied-configuration`` annotation (a whole copy of the
object as last applied); and every key is an interned string. Each watch event is decoded on its
own, so without that every cached object held its own copy of ``"metadata"``, ``"conditions"``,
``"lastTransitionTime"`` and the rest; ten thousand objects share one of each
(:func:`kept_of`).

A namespace whose initial list has not completed is not *synced*; the runtime reconciles nothing
there until it is (:meth:`WatchCache.synced`). A watch that ends at its timeout is resumed from the
last resourceVersion it delivered; one that fails, or that the API ends with 410 Gone, lists again.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from sys import intern
from typing import Any

import structlog

from canary.kserve.admitted import ConfigMapLimits, why_not_ours
from canary.kserve.client import InferenceServiceClient, WatchEvent
from canary.kserve.ledger_store import (
    ConfigMapLedgerStore,
    StoredLedger,
    ledger_configmap_name,
    ledger_from_dict,
)
from canary.kserve.store import (
    ConfigMapStateStore,
    StoredState,
    state_configmap_name,
    stored_from_dict,
)

__all__ = [
    "LAST_APPLIED",
    "Admit",
    "CachedReads",
    "DirectReads",
    "Reads",
    "WatchCache",
    "kept_of",
    "our_configmaps",
]

log = structlog.get_logger("kserve_canary.caches")

Lister = Callable[[str | None], tuple[list[dict[str, Any]], str]]
Watcher = Callable[[str | None, str, int], Iterator[WatchEvent]]
Getter = Callable[[str, str], "dict[str, Any] | None"]


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def kept_of(obj: Mapping[str, Any], *, strip: bool = True) -> dict[str, Any]:
    """What a cache keeps of ``obj`` (a copy): every key interned and, with ``strip``, without
    ``metadata.managedFields`` and the last-applied annotation."""
    kept: dict[str, Any] = _interned(obj)
    meta = kept.get("metadata")
    if strip and isinstance(meta, dict):
        meta.pop("managedFields", None)
        annotations = meta.get("annotations")
        if isinstance(annotations, dict) and LAST_APPLIED in annotations:
            del annotations[LAST_APPLIED]
    return kept


def _interned(value: Any) -> Any:
    if isinstance(value, dict):
        return {intern(key) if type(key) is str else key: _interned(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_interned(item) for item in value]
    return value


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _version(obj: Mapping[str, Any] | None) -> int | None:
    if obj is None:
        return None
    return _number((obj.get("metadata") or {}).get("resourceVersion"))


def _number(text: object) -> int | None:
    if text is None:
        return None
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None


class WatchCache:
    """One kind of object, listed and watched per scope (namespace, or None for all)."""

    def __init__(
        self,
        kind: str,
        *,
        lister: Lister,
        watcher: Watcher,
        getter: Getter,
        scopes: Sequence[str | None],
        watch_timeout: int = 300,
        on_event: Callable[[str, Mapping[str, Any]], None] | None = None,
        on_synced: Callable[[str | None], None] | None = None,
        strip: bool = True,
        admit: Admit | None = None,
    ):
        """``strip``: keep objects without managedFields and the last-applied annotation
        (:func:`kept_of`); False for objects written back whole (a PromotionPolicy's status PUT).
        ``admit``: which objects an event or a GET may bring into the cache (the lister judges its
        own); the others are dropped, and told to it."""
        self.kind = kind
        self._lister = lister
        self._watcher = watcher
        self._getter = getter
        self._scopes = list(scopes) or [None]
        self._watch_timeout = watch_timeout
        self._on_event = on_event
        self._on_synced = on_synced
        self._strip = strip
        self._admit = admit
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}
        self._counts: Counter[str] = Counter()  # objects cached per namespace
        # resourceVersion of each deletion seen; an object at or below it is a ghost of before it
        self._tombstones: dict[tuple[str, str], int] = {}
        # each scope's last list or resumed watch, by its resourceVersion (tombstones older go)
        self._listed_at: dict[str | None, int] = {}
        self._synced: set[str | None] = set()
        self._lock = threading.Lock()
        self.lists = 0  # initial lists and re-lists, for tests and the benchmark
        self.resumes = 0  # watches resumed from the last version seen, without a list

    # -- reads -----------------------------------------------------------------------------------

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((namespace, name))

    def synced(self, namespace: str) -> bool:
        with self._lock:
            return None in self._synced or namespace in self._synced

    def synced_scope(self, scope: str | None) -> bool:
        with self._lock:
            return scope in self._synced

    @property
    def all_synced(self) -> bool:
        with self._lock:
            return all(scope in self._synced for scope in self._scopes)

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def values(self) -> list[dict[str, Any]]:
        """Every cached object (a copy of the list; the objects are the cache's, not to be changed)."""
        with self._lock:
            return list(self._objects.values())

    # -- writes by the controller ------------------------------------------------------------------

    def put(self, obj: Mapping[str, Any]) -> None:
        """An object as the API answered a write of ours (or a GET): newer than what is cached."""
        self._apply("MODIFIED", kept_of(obj, strip=self._strip))

    def refresh(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Read the object again (after a 409: the cache was behind) and keep what the API has."""
        found = self._getter(namespace, name)
        if found is not None and self._refused(found, (namespace, name)):
            found = None
        if found is not None:
            found = kept_of(found, strip=self._strip)
        with self._lock:
            if found is None:
                self._drop_locked((namespace, name))
            else:
                self._keep_locked((namespace, name), found)
        return found

    # -- list + watch ------------------------------------------------------------------------------

    def run(self, scope: str | None, stop: threading.Event) -> None:
        """List, then watch until ``stop``. For a thread.

        A watch that ends at its timeout is resumed from the last resourceVersion it delivered (an
        event's, or a bookmark's), as client-go's reflector does: no list. Listing again every watch
        period was the controller's largest allocation at scale (every state ConfigMap with its
        latest evaluation, decoded and copied at once: about 10 MiB of resident memory more at each
        re-list with 1,000 rollouts, which Python's allocator kept). A watch the API refuses or ends
        with an error (410 Gone: the version is older than what the API keeps), or that fails,
        lists again."""
        backoff = 1.0
        version: str | None = None  # where the next watch starts; None: list first
        while not stop.is_set():
            try:
                if version is None:
                    items, listed = self._lister(scope)
                    self.lists += 1
                    first = not self.synced_scope(scope)
                    self._replace(scope, items, listed)
                    if first and self._on_synced is not None:
                        self._on_synced(scope)
                    version = listed
                else:
                    self.resumes += 1
                    self._settle(scope, _number(version))
                backoff = 1.0
                for event in self._watcher(scope, version, self._watch_timeout):
                    if stop.is_set():
                        return
                    if event.type == "ERROR":
                        version = None  # e.g. 410 Gone: list again
                        break
                    seen = (event.object.get("metadata") or {}).get("resourceVersion")
                    if event.type == "DELETED" or (
                        event.type != "BOOKMARK" and not self._refused(event.object, _key(event.object))
                    ):
                        self._apply(event.type, kept_of(event.object, strip=self._strip))
                    if seen:
                        version = str(seen)
                if not version:
                    version = None  # a list without a version cannot be resumed from
            except Exception as error:
                version = None
                if stop.is_set():
                    return
                log.warning(
                    "watch interrupted; listing again",
                    kind=self.kind,
                    namespace=scope or "all",
                    error=str(error),
                )
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _replace(self, scope: str | None, items: list[dict[str, Any]], version: str = "") -> None:
        fresh = {_key(item): kept_of(item, strip=self._strip) for item in items}
        listed_at = _number(version)
        with self._lock:
            self._settle_locked(scope, listed_at)
            for key in [key for key in self._objects if scope is None or key[0] == scope]:
                if key not in fresh:
                    del self._objects[key]
                    if listed_at is not None:
                        self._tombstones[key] = listed_at
            for key in fresh:
                self._tombstones.pop(key, None)
            self._objects.update(fresh)
            self._counts = Counter(namespace for namespace, _ in self._objects)
            self._synced.add(scope)

    def _settle(self, scope: str | None, version: int | None) -> None:
        with self._lock:
            self._settle_locked(scope, version)

    def _settle_locked(self, scope: str | None, version: int | None) -> None:
        """A list or a resumed watch from ``version``: tombstones older than the previous one go. A
        late answer to a write of ours arrives within moments, not a watch period later, and they
        would otherwise pile up for as long as the process runs."""
        previous = self._listed_at.get(scope)
        if previous is not None:
            for key in [
                key
                for key, buried in self._tombstones.items()
                if (scope is None or key[0] == scope) and buried < previous
            ]:
                del self._tombstones[key]
        if version is not None:
            self._listed_at[scope] = version

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        key = _key(obj)
        with self._lock:
            cached = self._objects.get(key)
            new, old = _version(obj), _version(cached)
            if new is not None and old is not None and new < old:
                return  # an event older than a write of ours already cached
            buried = self._tombstones.get(key)
            if buried is not None and new is not None and new <= buried:
                return  # the object as it was before a deletion already seen
            if kind == "DELETED":
                self._drop_locked(key)
                if new is not None:
                    self._tombstones[key] = new
            else:
                self._keep_locked(key, obj)
                self._tombstones.pop(key, None)
        if self._on_event is not None:
            self._on_event(kind, obj)

    def _refused(self, obj: Mapping[str, Any], key: tuple[str, str]) -> bool:
        """An object ``admit`` refuses: dropped from the cache if it was there, and told."""
        if self._admit is None:
            return False
        with self._lock:
            full = key not in self._objects and self._counts[key[0]] >= self._admit.per_namespace
        reason = self._admit.reason(obj, full)
        if reason is None:
            return False
        with self._lock:
            self._drop_locked(key)
        self._admit.ignored(key[0], key[1], reason)
        return True

    def _keep_locked(self, key: tuple[str, str], obj: dict[str, Any]) -> None:
        if key not in self._objects:
            self._counts[key[0]] += 1
        self._objects[key] = obj

    def _drop_locked(self, key: tuple[str, str]) -> None:
        if self._objects.pop(key, None) is not None:
            self._counts[key[0]] -= 1


@dataclass(frozen=True)
class Admit:
    """Which objects a cache keeps: ``reason(obj, namespace_full)`` is None to keep it, else why not
    (then ``ignored(namespace, name, reason)`` is told); at most ``per_namespace`` per namespace."""

    reason: Callable[[Mapping[str, Any], bool], str | None]
    ignored: Callable[[str, str, str], None]
    per_namespace: int


def our_configmaps(limits: ConfigMapLimits, ignored: Callable[[str, str, str], None]) -> Admit:
    """The ConfigMap cache's rule for watch events and GETs: what :func:`list_our_configmaps` keeps."""

    def reason(obj: Mapping[str, Any], full: bool) -> str | None:
        found = why_not_ours(obj, limits.max_bytes)
        if found is None and full:
            return f"its namespace already has the {limits.per_namespace} ConfigMaps kept per namespace"
        return found

    return Admit(reason, ignored, limits.per_namespace)


class Reads:
    """What a reconcile reads: the InferenceService, its state and its ledger (and how a 409 is
    answered: the cached object is read again)."""

    def synced(self, namespace: str) -> bool:
        return True

    def inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def state(self, namespace: str, name: str) -> StoredState:
        raise NotImplementedError

    def ledger(self, namespace: str, name: str) -> StoredLedger:
        raise NotImplementedError

    def refresh_inference_service(self, namespace: str, name: str) -> None:
        return None

    def wrote_inference_service(self, obj: Mapping[str, Any]) -> None:
        """The InferenceService as the API answered our patch."""

    def refresh_state(self, namespace: str, name: str) -> None:
        return None

    def refresh_ledger(self, namespace: str, name: str) -> None:
        return None


class DirectReads(Reads):
    """A GET for every read (tests, tools, and a controller without caches)."""

    def __init__(
        self, isvcs: InferenceServiceClient, store: ConfigMapStateStore, ledgers: ConfigMapLedgerStore
    ):
        self._isvcs = isvcs
        self._store = store
        self._ledgers = ledgers

    def inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._isvcs.get(namespace, name)

    def state(self, namespace: str, name: str) -> StoredState:
        return self._store.load(namespace, name)

    def ledger(self, namespace: str, name: str) -> StoredLedger:
        return self._ledgers.load(namespace, name)


class CachedReads(Reads):
    """Reads from the two watch caches; nothing is read before both have listed the namespace."""

    def __init__(self, inference_services: WatchCache, configmaps: WatchCache):
        self.inference_services = inference_services
        self.configmaps = configmaps

    def synced(self, namespace: str) -> bool:
        return self.inference_services.synced(namespace) and self.configmaps.synced(namespace)

    def inference_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.inference_services.get(namespace, name)

    def state(self, namespace: str, name: str) -> StoredState:
        return stored_from_dict(self.configmaps.get(namespace, state_configmap_name(name)), namespace, name)

    def ledger(self, namespace: str, name: str) -> StoredLedger:
        return ledger_from_dict(self.configmaps.get(namespace, ledger_configmap_name(name)))

    def refresh_inference_service(self, namespace: str, name: str) -> None:
        self.inference_services.refresh(namespace, name)

    def wrote_inference_service(self, obj: Mapping[str, Any]) -> None:
        self.inference_services.put(obj)

    def refresh_state(self, namespace: str, name: str) -> None:
        self.configmaps.refresh(namespace, state_configmap_name(name))

    def refresh_ledger(self, namespace: str, name: str) -> None:
        self.configmaps.refresh(namespace, ledger_configmap_name(name))
