"""The emulator's object store: what etcd plus the generic apiserver machinery do for our resources.

- one global, monotonically increasing ``resourceVersion`` (a string on the wire), bumped by every
  write; a write that changes nothing is not a write (no new version, no watch event), as in the real
  apiserver;
- ``metadata.uid``, ``creationTimestamp``; ``generation`` for custom resources and CRDs, bumped when
  anything outside ``metadata`` changes — and outside ``status`` too when status is a subresource;
- optimistic concurrency: a stale ``resourceVersion`` in an update (or in a merge patch, where it is a
  precondition) is a 409 Conflict;
- the status subresource: main-resource writes cannot change ``status``, status writes change nothing
  else;
- finalizers (deletion waits for them), and the garbage collector's handling of ``ownerReferences``;
- watches: a bounded history of events to resume from, 410 Expired beyond it;
- CustomResourceDefinitions (:mod:`~canary_sandbox.emulator.crds`): a CRD write updates this store's
  registry (what discovery shows and the server routes), its objects are pruned, defaulted and
  validated against their version's schema (:mod:`~canary_sandbox.emulator.schema`); deleting a CRD
  deletes its objects first (the cleanup finalizer);
- server-side apply (:meth:`ObjectStore.apply`, the subset :mod:`~canary_sandbox.emulator.apply`
  describes) and ``fieldValidation`` for custom objects; warnings for the client (unknown fields,
  CEL rules not evaluated) are collected per write (:meth:`ObjectStore.take_warnings`).

Everything runs under one lock owned by the :class:`~canary_sandbox.emulator.core.Emulator`; listeners (the
KServe behaviour layer) are called under it and must only record work, never block.
"""

from __future__ import annotations

import copy
import datetime as dt
import queue
import random
import string
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from canary_sandbox.emulator import apply as ssa
from canary_sandbox.emulator import crds
from canary_sandbox.emulator import resources as r
from canary_sandbox.emulator import schema as crd_schema
from canary_sandbox.emulator.clock import Clock
from canary_sandbox.emulator.errors import ApiError, FieldError
from canary_sandbox.emulator.patching import apply_json_patch, apply_merge_patch
from canary_sandbox.emulator.scheduler import Scheduler
from canary_sandbox.emulator.selectors import FieldSelector, LabelSelector
from canary_sandbox.emulator.validation import validate_object
from canary_sandbox.emulator.views import from_storage, to_storage

__all__ = [
    "Actor",
    "Change",
    "ObjectStore",
    "PatchType",
    "Watch",
    "format_micro_time",
    "format_time",
]

JsonObject = dict[str, Any]
Actor = Literal["client", "emulator"]
PatchType = Literal["merge", "strategic", "json"]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_GENERATE_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # what the apiserver uses (no vowels)


def format_time(instant: float) -> str:
    """``metav1.Time``: RFC 3339, whole seconds, UTC."""
    return dt.datetime.fromtimestamp(instant, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(instant: float) -> str:
    """``metav1.MicroTime``: RFC 3339 with exactly six fractional digits."""
    return dt.datetime.fromtimestamp(instant, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class Change:
    """A committed write, as the store's listeners see it."""

    resource: r.ResourceType
    type: EventType
    old: JsonObject | None
    new: JsonObject  # for DELETED: the object as it was deleted
    actor: Actor
    subresource: str | None


@dataclass(frozen=True)
class _HistoryEvent:
    resource_version: int
    store_key: str
    type: EventType
    obj: JsonObject
    old: JsonObject | None


class Watch:
    """One open watch: a queue of ``(type, stored object)`` filtered by namespace and selectors."""

    def __init__(
        self,
        resource: r.ResourceType,
        namespace: str | None,
        labels: LabelSelector | None,
        fields: FieldSelector | None,
    ) -> None:
        self.resource = resource
        self.namespace = namespace
        self._labels = labels
        self._fields = fields
        self._queue: queue.SimpleQueue[tuple[str, JsonObject] | None] = queue.SimpleQueue()
        self.closed = threading.Event()

    def _matches(self, obj: JsonObject | None) -> bool:
        if obj is None:
            return False
        metadata = obj.get("metadata", {})
        if self.namespace is not None and metadata.get("namespace") != self.namespace:
            return False
        if self._labels is not None and not self._labels.matches(metadata.get("labels")):
            return False
        return self._fields is None or self._fields.matches(obj)

    def offer(self, event: _HistoryEvent) -> None:
        if event.store_key != self.resource.store_key or self.closed.is_set():
            return
        now_matches = self._matches(event.obj)
        if event.type == "MODIFIED":
            # An object moving in or out of the selection is an ADDED or DELETED for this watch,
            # exactly as the apiserver's watch cache reports it.
            before = self._matches(event.old)
            if before and now_matches:
                self._queue.put(("MODIFIED", event.obj))
            elif now_matches:
                self._queue.put(("ADDED", event.obj))
            elif before:
                self._queue.put(("DELETED", event.obj))
        elif now_matches:
            self._queue.put((event.type, event.obj))

    def put_initial(self, obj: JsonObject) -> None:
        self._queue.put(("ADDED", obj))

    def next(self, timeout: float) -> tuple[str, JsonObject] | None:
        """The next event, or None when the watch was closed; raises ``queue.Empty`` on timeout."""
        item = self._queue.get(timeout=timeout)
        if item is None:
            self.closed.set()
        return item

    def close(self) -> None:
        self.closed.set()
        self._queue.put(None)


class ObjectStore:
    """Objects by storage key, namespace and name; every method expects the emulator's lock held."""

    def __init__(
        self,
        clock: Clock,
        lock: threading.RLock,
        scheduler: Scheduler,
        registry: r.ResourceRegistry | None = None,
        history_size: int = 2000,
        seed: int | None = None,
    ) -> None:
        self.clock = clock
        self.lock = lock
        self.scheduler = scheduler
        # Its own registry: the CRDs created in this store add resources to it, and to no other store's.
        self.registry = registry if registry is not None else r.ResourceRegistry(list(r.BUILTIN_RESOURCES))
        # The garbage collector's lag (seconds): a real cluster removes the dependents of a deleted
        # owner some time later, so a model deleted and re-created at once (`kubectl replace --force`)
        # can meet its predecessor's dependents. 0: at once.
        self.garbage_collection_delay = 0.0
        self._objects: dict[str, dict[tuple[str, str], JsonObject]] = {}
        self._resource_version = 0
        self._history: deque[_HistoryEvent] = deque(maxlen=max(1, history_size))
        self._compacted_through = 0  # the newest resourceVersion no longer in the history
        self._watches: list[Watch] = []
        self._listeners: list[Callable[[Change], None]] = []
        self._warnings: list[str] = []
        # Generated names only need to be unique and reproducible with a seed, not secret.
        self._random = random.Random(seed)  # noqa: S311
        with lock:
            for name in DEFAULT_NAMESPACES:
                self.create(r.NAMESPACES, None, {"metadata": {"name": name}}, actor="emulator")

    # --- plumbing -----------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._resource_version

    def add_listener(self, listener: Callable[[Change], None]) -> None:
        self._listeners.append(listener)

    def _bucket(self, resource: r.ResourceType) -> dict[tuple[str, str], JsonObject]:
        return self._objects.setdefault(resource.store_key, {})

    def _next_version(self) -> int:
        self._resource_version += 1
        return self._resource_version

    def _record(self, resource: r.ResourceType, change: Change, version: int) -> None:
        if len(self._history) == self._history.maxlen:
            self._compacted_through = self._history[0].resource_version
        event = _HistoryEvent(version, resource.store_key, change.type, change.new, change.old)
        self._history.append(event)
        for watch in self._watches:
            watch.offer(event)
        for listener in self._listeners:
            listener(change)

    def _not_found(self, resource: r.ResourceType, name: str) -> ApiError:
        return ApiError.not_found(resource.qualified_resource, name, resource.group, resource.plural)

    def _conflict(self, resource: r.ResourceType, name: str, why: str = "") -> ApiError:
        return ApiError.conflict(resource.qualified_resource, name, resource.group, resource.plural, why)

    def _require_namespace(self, namespace: str) -> None:
        stored = self._bucket(r.NAMESPACES).get(("", namespace))
        if stored is None:
            raise ApiError.not_found("namespaces", namespace)
        if stored["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f"unable to create new content in namespace {namespace} because it is being terminated",
                reason="Forbidden",
            )

    def _key(self, resource: r.ResourceType, namespace: str | None, name: str) -> tuple[str, str]:
        return (namespace or "" if resource.namespaced else "", name)

    # --- reads --------------------------------------------------------------------------------------

    def get_stored(self, resource: r.ResourceType, namespace: str | None, name: str) -> JsonObject | None:
        """The stored object itself (not a copy): for the emulator's own layers, which must not mutate it."""
        return self._bucket(resource).get(self._key(resource, namespace, name))

    def get(self, resource: r.ResourceType, namespace: str | None, name: str) -> JsonObject:
        stored = self.get_stored(resource, namespace, name)
        if stored is None:
            raise self._not_found(resource, name)
        return from_storage(resource, stored)

    def iter_stored(self, resource: r.ResourceType, namespace: str | None = None) -> Iterator[JsonObject]:
        for (object_namespace, _), stored in sorted(self._bucket(resource).items()):
            if namespace is None or object_namespace == namespace:
                yield stored

    def list_objects(
        self,
        resource: r.ResourceType,
        namespace: str | None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[list[JsonObject], str]:
        labels = LabelSelector(label_selector) if label_selector else None
        fields = FieldSelector(field_selector, resource.extra_field_selectors) if field_selector else None
        items = []
        for stored in self.iter_stored(resource, namespace):
            if labels is not None and not labels.matches(stored["metadata"].get("labels")):
                continue
            if fields is not None and not fields.matches(stored):
                continue
            items.append(from_storage(resource, stored))
        return items, str(self._resource_version)

    # --- writes -------------------------------------------------------------------------------------

    def create(
        self,
        resource: r.ResourceType,
        namespace: str | None,
        body: JsonObject,
        *,
        actor: Actor = "client",
        dry_run: bool = False,
        field_validation: str = "Ignore",
        managed_fields: list[JsonObject] | None = None,
    ) -> JsonObject:
        if not isinstance(body, dict):
            raise ApiError.bad_request(f"a {resource.kind} must be a JSON object")
        self._check_type_meta(resource, body)
        self._check_unknown_fields(resource, body, field_validation)
        obj = copy.deepcopy(body)
        metadata = obj.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            raise ApiError.bad_request("metadata must be an object")
        if resource.namespaced:
            body_namespace = metadata.get("namespace")
            if body_namespace and namespace and body_namespace != namespace:
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            namespace = namespace or body_namespace or "default"
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)
        if not metadata.get("name") and isinstance(metadata.get("generateName"), str):
            suffix = "".join(self._random.choice(_GENERATE_NAME_ALPHABET) for _ in range(5))
            metadata["name"] = metadata["generateName"] + suffix
        if resource.crd is not None:
            self._refuse_if_terminating(resource)
            obj = crd_schema.normalise(obj, resource.crd.schema)
            metadata = obj["metadata"]
        elif resource is r.CUSTOMRESOURCEDEFINITIONS:
            obj = crds.apply_crd_defaults(obj)
            metadata = obj["metadata"]
        self._warnings.extend(validate_object(resource, obj, None))
        if resource.namespaced:
            assert namespace is not None
            self._require_namespace(namespace)
        stored = to_storage(resource, obj)
        key = self._key(resource, namespace, metadata["name"])
        if key in self._bucket(resource):
            raise ApiError.already_exists(
                resource.qualified_resource, metadata["name"], resource.group, resource.plural
            )
        metadata = stored["metadata"]
        for server_owned in (
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
        ):
            metadata.pop(server_owned, None)
        if managed_fields:
            metadata["managedFields"] = copy.deepcopy(managed_fields)
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = format_time(self.clock.now())
        if _tracks_generation(resource):
            metadata["generation"] = 1
        if resource is r.NAMESPACES:
            metadata.setdefault("labels", {})["kubernetes.io/metadata.name"] = metadata["name"]
            stored.setdefault("spec", {"finalizers": ["kubernetes"]})
            stored["status"] = {"phase": "Active"}
        elif resource.has_status_subresource and actor == "client" and resource.is_custom:
            # Custom resources with a status subresource drop status on create.
            stored.pop("status", None)
        if resource is r.CUSTOMRESOURCEDEFINITIONS:
            finalizers = metadata.setdefault("finalizers", [])
            if crds.CLEANUP_FINALIZER not in finalizers:
                finalizers.append(crds.CLEANUP_FINALIZER)
            stored["status"] = crds.compute_status(
                stored, None, self._other_crds(stored), metadata["creationTimestamp"]
            )
        if dry_run:
            return from_storage(resource, stored)
        version = self._next_version()
        metadata["resourceVersion"] = str(version)
        self._bucket(resource)[key] = stored
        self._record(resource, Change(resource, "ADDED", None, stored, actor, None), version)
        if resource is r.CUSTOMRESOURCEDEFINITIONS:
            self.registry.set_custom(metadata["name"], crds.served_resources(stored))
        if metadata.get("ownerReferences"):
            self._schedule_owner_check(resource, namespace, metadata["name"])
        return from_storage(resource, stored)

    def _check_type_meta(self, resource: r.ResourceType, body: JsonObject) -> None:
        # The apiserver defaults a missing kind/apiVersion from the URL, and refuses a different one.
        kind, api_version = body.get("kind"), body.get("apiVersion")
        if (kind and kind != resource.kind) or (api_version and api_version != resource.api_version):
            raise ApiError.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({resource.api_version})"
                if api_version != resource.api_version
                else f"the kind in the data ({kind}) does not match the expected kind ({resource.kind})"
            )

    def update(
        self,
        resource: r.ResourceType,
        namespace: str | None,
        name: str,
        body: JsonObject,
        *,
        subresource: str | None = None,
        actor: Actor = "client",
        dry_run: bool = False,
        field_validation: str = "Ignore",
    ) -> JsonObject:
        if not isinstance(body, dict):
            raise ApiError.bad_request(f"a {resource.kind} must be a JSON object")
        self._check_type_meta(resource, body)
        old = self.get_stored(resource, namespace, name)
        if old is not None:
            self._check_unknown_fields(resource, body, field_validation)
        if old is None:
            raise self._not_found(resource, name)
        metadata = body.get("metadata")
        if not isinstance(metadata, dict):
            raise ApiError.bad_request("metadata must be an object")
        if metadata.get("name") not in (None, name):
            raise ApiError.bad_request(
                f"the name of the object ({metadata.get('name')}) does not match the name on the URL ({name})"
            )
        if resource.namespaced and metadata.get("namespace") not in (None, "", namespace):
            raise ApiError.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        requested_version = metadata.get("resourceVersion")
        if requested_version in (None, "") and resource.is_custom:
            # Custom resources do not allow unconditional updates (built-in kinds do).
            cause = FieldError(
                "metadata.resourceVersion",
                "FieldValueInvalid",
                "Invalid value: 0x0: must be specified for an update",
            )
            raise ApiError.invalid(resource.kind, resource.group, name, [cause])
        if (
            requested_version not in (None, "")
            and str(requested_version) != old["metadata"]["resourceVersion"]
        ):
            raise self._conflict(resource, name)
        requested_uid = metadata.get("uid")
        if requested_uid not in (None, "") and requested_uid != old["metadata"]["uid"]:
            raise self._conflict(
                resource,
                name,
                f"Precondition failed: UID in precondition: {requested_uid}, "
                f"UID in object meta: {old['metadata']['uid']}",
            )
        new = to_storage(resource, body)
        if subresource == "status":
            status = new.get("status")
            new = copy.deepcopy(old)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        else:
            new["metadata"] = {**new["metadata"], "name": name}
            if resource.namespaced:
                new["metadata"]["namespace"] = namespace
            if resource.has_status_subresource and actor == "client":
                if "status" in old:
                    new["status"] = copy.deepcopy(old["status"])
                else:
                    new.pop("status", None)
            for server_owned in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ):
                if server_owned in old["metadata"]:
                    new["metadata"][server_owned] = old["metadata"][server_owned]
                else:
                    new["metadata"].pop(server_owned, None)
            if resource is r.NAMESPACES:
                new["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = name
                new["status"] = copy.deepcopy(old.get("status", {}))
        if subresource != "status" and "managedFields" not in (metadata or {}):
            # A write that does not mention managedFields keeps them, as the apiserver does (only
            # server-side apply records them here; see apply.py).
            if old["metadata"].get("managedFields"):
                new["metadata"]["managedFields"] = copy.deepcopy(old["metadata"]["managedFields"])
        elif not new["metadata"].get("managedFields"):
            new["metadata"].pop("managedFields", None)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if resource.crd is not None:
            new = crd_schema.normalise(new, resource.crd.schema)
        elif resource is r.CUSTOMRESOURCEDEFINITIONS:
            new = crds.apply_crd_defaults(new)
            # The names and establishing controllers own status; a client's status write can only
            # shrink storedVersions (what a storage migration does), which validation then checks.
            basis = copy.deepcopy(old)
            if subresource == "status" and isinstance((new.get("status") or {}).get("storedVersions"), list):
                basis.setdefault("status", {})["storedVersions"] = new["status"]["storedVersions"]
            new["status"] = crds.compute_status(
                new, basis, self._other_crds(new), format_time(self.clock.now())
            )
        if _tracks_generation(resource):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1)
            if _generation_relevant(resource, old) != _generation_relevant(resource, new):
                new["metadata"]["generation"] += 1
        self._warnings.extend(
            validate_object(resource, from_storage(resource, new), from_storage(resource, old))
        )
        if new == old or dry_run:
            # An update that changes nothing is not written: same resourceVersion, no watch event.
            return from_storage(resource, new)
        if old["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            return self._remove(resource, old, actor, new)
        version = self._next_version()
        new["metadata"]["resourceVersion"] = str(version)
        self._bucket(resource)[self._key(resource, namespace, name)] = new
        self._record(resource, Change(resource, "MODIFIED", old, new, actor, subresource), version)
        if resource is r.CUSTOMRESOURCEDEFINITIONS:
            self.registry.set_custom(name, crds.served_resources(new))
        if new["metadata"].get("ownerReferences") != old["metadata"].get("ownerReferences"):
            self._schedule_owner_check(resource, namespace, name)
        return from_storage(resource, new)

    def patch(
        self,
        resource: r.ResourceType,
        namespace: str | None,
        name: str,
        patch_type: PatchType,
        patch: Any,
        *,
        subresource: str | None = None,
        actor: Actor = "client",
        dry_run: bool = False,
        field_validation: str = "Ignore",
    ) -> JsonObject:
        if patch_type == "strategic" and resource.is_custom:
            raise ApiError.unsupported_media_type(
                "application/strategic-merge-patch+json",
                [
                    "application/json-patch+json",
                    "application/merge-patch+json",
                    "application/apply-patch+yaml",
                ],
            )
        current = self.get(resource, namespace, name)
        if patch_type == "json":
            patched = apply_json_patch(current, patch)
        else:
            if not isinstance(patch, dict):
                raise ApiError.bad_request("a merge patch must be a JSON object")
            patched = apply_merge_patch(current, patch)
        if not isinstance(patched, dict):
            raise ApiError.bad_request("the patched object is not a JSON object")
        patched.setdefault("metadata", {})
        # A resourceVersion left in the patched object (because the patch carried one) is a
        # precondition; update() compares it with the stored version.
        return self.update(
            resource,
            namespace,
            name,
            patched,
            subresource=subresource,
            actor=actor,
            dry_run=dry_run,
            field_validation=field_validation,
        )

    def apply(
        self,
        resource: r.ResourceType,
        namespace: str | None,
        name: str,
        config: Any,
        *,
        manager: str,
        force: bool = False,
        dry_run: bool = False,
        field_validation: str = "Strict",
    ) -> tuple[JsonObject, bool]:
        """Server-side apply of ``config`` by ``manager`` (see :mod:`~canary_sandbox.emulator.apply`);
        returns the object and whether it was created."""
        if not isinstance(config, dict):
            raise ApiError.bad_request("an applied configuration must be an object")
        if not config.get("apiVersion") or not config.get("kind"):
            raise ApiError.bad_request(
                f"invalid object type: {config.get('apiVersion') or ''}, Kind={config.get('kind') or ''}"
            )
        self._check_type_meta(resource, config)
        given = config.get("metadata")
        metadata: JsonObject = given if isinstance(given, dict) else {}
        if metadata.get("name") not in (None, name):
            raise ApiError.bad_request(
                f"the name of the object ({metadata.get('name')}) does not match the name on the URL ({name})"
            )
        applied = ssa.leaf_paths(config)
        now = format_time(self.clock.now())
        own_entry: JsonObject = {
            "manager": manager,
            "operation": "Apply",
            "apiVersion": resource.api_version,
            "time": now,
            "fieldsType": "FieldsV1",
            "fieldsV1": ssa.fields_v1(applied),
        }
        stored = self.get_stored(resource, namespace, name)
        if stored is None:
            body = copy.deepcopy(config)
            body.setdefault("metadata", {})["name"] = name
            if resource.has_status_subresource:
                body.pop("status", None)
            created = self.create(
                resource,
                namespace,
                body,
                dry_run=dry_run,
                field_validation=field_validation,
                managed_fields=[own_entry],
            )
            return created, True
        live = from_storage(resource, stored)
        previous: set[ssa.Path] = set()
        others: list[tuple[JsonObject, set[ssa.Path]]] = []
        for entry in live["metadata"].get("managedFields") or []:
            owned = ssa.owned_paths(entry.get("fieldsV1") or {})
            if entry.get("manager") == manager and entry.get("operation") == "Apply":
                previous = owned
            else:
                others.append((entry, owned))
        conflicts: dict[str, list[ssa.Path]] = {}
        taken: set[ssa.Path] = set()
        for entry, owned in others:
            for path in applied:
                overlapping = [q for q in owned if q[: len(path)] == path or path[: len(q)] == q]
                for theirs in overlapping:
                    shorter = theirs if len(theirs) <= len(path) else path
                    if ssa.value_at(live, shorter) != ssa.value_at(ssa.merge(live, config), shorter):
                        conflicts.setdefault(str(entry.get("manager")), []).append(theirs)
                        taken.add(theirs)
        if conflicts and not force:
            causes = [
                {
                    "reason": "FieldManagerConflict",
                    "message": f'conflict with "{who}"',
                    "field": ssa.render_path(p),
                }
                for who, paths in conflicts.items()
                for p in paths
            ]
            raise ApiError(
                409,
                ssa.conflict_message(conflicts),
                reason="Conflict",
                details={"causes": causes},
            )
        result = ssa.merge(live, {k: v for k, v in config.items() if k != "status"})
        still_owned = set().union(*(owned - taken for _, owned in others)) if others else set()
        for path in previous - applied:
            if path not in still_owned:
                ssa.remove_path(result, path)
        entries: list[JsonObject] = []
        for entry, owned in others:
            kept = owned - taken
            if kept:
                entries.append({**entry, "fieldsV1": ssa.fields_v1(kept)})
        entries.append(own_entry)
        result["metadata"]["managedFields"] = entries
        updated = self.update(
            resource, namespace, name, result, dry_run=dry_run, field_validation=field_validation
        )
        return updated, False

    def delete(
        self,
        resource: r.ResourceType,
        namespace: str | None,
        name: str,
        *,
        options: JsonObject | None = None,
        actor: Actor = "client",
        dry_run: bool = False,
    ) -> JsonObject:
        options = options or {}
        old = self.get_stored(resource, namespace, name)
        if old is None:
            raise self._not_found(resource, name)
        preconditions = options.get("preconditions") or {}
        if preconditions.get("resourceVersion") not in (None, old["metadata"]["resourceVersion"]):
            raise self._conflict(
                resource,
                name,
                f"Precondition failed: ResourceVersion in precondition: {preconditions['resourceVersion']}, "
                f"ResourceVersion in object meta: {old['metadata']['resourceVersion']}",
            )
        if preconditions.get("uid") not in (None, old["metadata"]["uid"]):
            raise self._conflict(
                resource,
                name,
                f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                f"UID in object meta: {old['metadata']['uid']}",
            )
        if dry_run:
            return from_storage(resource, old)
        if old["metadata"].get("finalizers"):
            if old["metadata"].get("deletionTimestamp"):
                return from_storage(resource, old)
            terminating = copy.deepcopy(old)
            terminating["metadata"]["deletionTimestamp"] = format_time(self.clock.now())
            terminating["metadata"]["deletionGracePeriodSeconds"] = 0
            if resource is r.CUSTOMRESOURCEDEFINITIONS:
                terminating["status"] = crds.compute_status(
                    terminating, old, self._other_crds(old), terminating["metadata"]["deletionTimestamp"]
                )
                # The finalizer controller deletes the CRD's objects, then lets the CRD go.
                self.scheduler.schedule(0.0, lambda: self._clean_up_crd(name))
            version = self._next_version()
            terminating["metadata"]["resourceVersion"] = str(version)
            self._bucket(resource)[self._key(resource, namespace, name)] = terminating
            self._record(resource, Change(resource, "MODIFIED", old, terminating, actor, None), version)
            return from_storage(resource, terminating)
        if resource is r.NAMESPACES:
            self._empty_namespace(name)
        orphan = (options.get("propagationPolicy") or "") == "Orphan" or options.get(
            "orphanDependents"
        ) is True
        uid = old["metadata"]["uid"]
        if orphan:
            # The garbage collector orphans the dependents before the owner goes (the orphan
            # finalizer): a dependent's own owner check, still pending from its creation, must never
            # find the owner gone and the reference kept, and delete it.
            self._collect_dependents(uid, orphan=True)
        deleted = self._remove(resource, old, actor, old)
        if not orphan:
            self.scheduler.schedule(
                self.garbage_collection_delay, lambda: self._collect_dependents(uid, orphan=False)
            )
        return deleted

    def _remove(
        self, resource: r.ResourceType, old: JsonObject, actor: Actor, final: JsonObject
    ) -> JsonObject:
        metadata = old["metadata"]
        del self._bucket(resource)[self._key(resource, metadata.get("namespace"), metadata["name"])]
        gone = copy.deepcopy(final)
        version = self._next_version()
        gone["metadata"]["resourceVersion"] = str(version)
        self._record(resource, Change(resource, "DELETED", old, gone, actor, None), version)
        if resource is r.CUSTOMRESOURCEDEFINITIONS:
            self._stop_serving_crd(old)
        elif resource.crd is not None:
            crd_name = resource.crd.crd_name
            crd = self.get_stored(r.CUSTOMRESOURCEDEFINITIONS, None, crd_name)
            if crd is not None and crd["metadata"].get("deletionTimestamp"):
                self.scheduler.schedule(0.0, lambda: self._clean_up_crd(crd_name))
        return from_storage(resource, gone)

    # --- CustomResourceDefinitions ------------------------------------------------------------------

    def take_warnings(self) -> list[str]:
        """The warnings of the last write (``Warning`` response headers), cleared as they are taken."""
        warnings, self._warnings = self._warnings, []
        return warnings

    def _check_unknown_fields(self, resource: r.ResourceType, body: JsonObject, directive: str) -> None:
        """``fieldValidation``: fields a custom object's schema prunes are an error (Strict), a warning
        (Warn, the real server's default) or nothing (Ignore). Built-in kinds are not checked: the
        emulator does not hold their full schemas."""
        if resource.crd is None or directive == "Ignore":
            return
        dropped: list[str] = []
        crd_schema.prune(body, resource.crd.schema, dropped)
        if not dropped:
            return
        if directive == "Strict":
            unknown = ", ".join(f'unknown field "{path}"' for path in dropped)
            raise ApiError.bad_request(
                f'{resource.kind} in version "{resource.version}" cannot be handled as a {resource.kind}: '
                f"strict decoding error: {unknown}"
            )
        self._warnings.extend(f'unknown field "{path}"' for path in dropped)

    def _other_crds(self, crd: JsonObject) -> list[JsonObject]:
        """The other CRDs of ``crd``'s group (whose accepted names it must not take)."""
        group = (crd.get("spec") or {}).get("group")
        name = crd["metadata"].get("name")
        return [
            other
            for other in self.iter_stored(r.CUSTOMRESOURCEDEFINITIONS)
            if other["metadata"]["name"] != name and (other.get("spec") or {}).get("group") == group
        ]

    def _refuse_if_terminating(self, resource: r.ResourceType) -> None:
        assert resource.crd is not None
        crd = self.get_stored(r.CUSTOMRESOURCEDEFINITIONS, None, resource.crd.crd_name)
        if crd is not None and crd["metadata"].get("deletionTimestamp"):
            raise ApiError(
                405,
                "create not allowed while custom resource definition is terminating",
                reason="MethodNotAllowed",
            )

    def _clean_up_crd(self, name: str) -> None:
        crd = self.get_stored(r.CUSTOMRESOURCEDEFINITIONS, None, name)
        if crd is None or not crd["metadata"].get("deletionTimestamp"):
            return
        versions = crds.served_resources(crd, every_version=True)
        if versions:
            # A built-in the CRD shadows (InferenceServices) is deleted through the built-in, so its
            # behaviour layer sees the deletions.
            first = versions[0]
            resource = self.registry.by_path(first.group, first.version, first.plural) or first
            for stored in list(self.iter_stored(resource)):
                metadata = stored["metadata"]
                if not metadata.get("deletionTimestamp"):
                    self.delete(resource, metadata.get("namespace"), metadata["name"], actor="emulator")
            if any(True for _ in self.iter_stored(resource)):
                # Objects with finalizers of their own hold the CRD until their controllers let go;
                # the last one's removal runs this again (see _remove).
                return
        view = from_storage(r.CUSTOMRESOURCEDEFINITIONS, crd)
        view["metadata"]["finalizers"] = [
            f for f in view["metadata"].get("finalizers") or [] if f != crds.CLEANUP_FINALIZER
        ]
        self.update(r.CUSTOMRESOURCEDEFINITIONS, None, name, view, actor="emulator")

    def _stop_serving_crd(self, crd: JsonObject) -> None:
        name = crd["metadata"]["name"]
        self.registry.remove_custom(name)
        keys = {resource.store_key for resource in crds.served_resources(crd, every_version=True)}
        for watch in list(self._watches):
            if watch.resource.store_key in keys:
                # The real server ends watches on a CRD's resource when its storage goes away.
                self.stop_watch(watch)
        for key in keys:
            self._objects.pop(key, None)

    def _empty_namespace(self, namespace: str) -> None:
        for resource in self._storage_resources():
            if resource.namespaced:
                for stored in list(self.iter_stored(resource, namespace)):
                    self._remove(resource, stored, "emulator", stored)

    def _storage_resources(self) -> list[r.ResourceType]:
        seen: dict[str, r.ResourceType] = {}
        for resource in self.registry.resources:
            seen.setdefault(resource.store_key, resource)
        return list(seen.values())

    # --- garbage collection -------------------------------------------------------------------------

    def _owner_exists(self, dependent_namespace: str | None, reference: JsonObject) -> bool:
        owner_resource = self.registry.by_kind(str(reference.get("apiVersion")), str(reference.get("kind")))
        if owner_resource is None:
            # Owners of kinds the emulator does not serve (ReplicaSets, Knative objects) are assumed
            # to exist: the emulator cannot know better.
            return True
        owner = self.get_stored(owner_resource, dependent_namespace, str(reference.get("name")))
        return owner is not None and owner["metadata"]["uid"] == reference.get("uid")

    def _schedule_owner_check(self, resource: r.ResourceType, namespace: str | None, name: str) -> None:
        def check() -> None:
            stored = self.get_stored(resource, namespace, name)
            if stored is None:
                return
            references = stored["metadata"].get("ownerReferences") or []
            if references and not any(self._owner_exists(namespace, ref) for ref in references):
                # Every owner is gone (or the uid never matched): the garbage collector deletes it.
                self.delete(resource, namespace, name, actor="emulator")

        self.scheduler.schedule(self.garbage_collection_delay, check)

    def _collect_dependents(self, owner_uid: str, orphan: bool) -> None:
        for resource in self._storage_resources():
            for stored in list(self.iter_stored(resource)):
                metadata = stored["metadata"]
                references = metadata.get("ownerReferences") or []
                if not any(ref.get("uid") == owner_uid for ref in references):
                    continue
                remaining = [ref for ref in references if ref.get("uid") != owner_uid]
                solid = [ref for ref in remaining if self._owner_exists(metadata.get("namespace"), ref)]
                view = from_storage(resource, stored)
                if orphan or solid:
                    if remaining:
                        view["metadata"]["ownerReferences"] = remaining
                    else:
                        view["metadata"].pop("ownerReferences")
                    self.update(resource, metadata.get("namespace"), metadata["name"], view, actor="emulator")
                else:
                    self.delete(resource, metadata.get("namespace"), metadata["name"], actor="emulator")

    # --- watch --------------------------------------------------------------------------------------

    def watch(
        self,
        resource: r.ResourceType,
        namespace: str | None,
        label_selector: str = "",
        field_selector: str = "",
        resource_version: str = "",
    ) -> Watch:
        labels = LabelSelector(label_selector) if label_selector else None
        fields = FieldSelector(field_selector, resource.extra_field_selectors) if field_selector else None
        watch = Watch(resource, namespace, labels, fields)
        if resource_version in ("", "0"):
            # No version (or "any"): the watch starts with the current state as ADDED events.
            for stored in self.iter_stored(resource, namespace):
                if watch._matches(stored):
                    watch.put_initial(stored)
        else:
            try:
                since = int(resource_version)
            except ValueError:
                raise ApiError.bad_request(f'invalid resource version: "{resource_version}"') from None
            if since < self._compacted_through:
                raise ApiError.expired(since, self._compacted_through + 1)
            for event in self._history:
                if event.resource_version > since:
                    watch.offer(event)
        self._watches.append(watch)
        return watch

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def stop_watch(self, watch: Watch) -> None:
        watch.close()
        if watch in self._watches:
            self._watches.remove(watch)

    def close_all_watches(self) -> None:
        for watch in list(self._watches):
            self.stop_watch(watch)


def _tracks_generation(resource: r.ResourceType) -> bool:
    # Custom resources and CRDs themselves have metadata.generation; of the built-in kinds the
    # emulator serves, no other does.
    return resource.is_custom or resource is r.CUSTOMRESOURCEDEFINITIONS


def _generation_relevant(resource: r.ResourceType, obj: JsonObject) -> JsonObject:
    """What a change must touch to bump metadata.generation: everything but metadata, and but status
    when status is a subresource (without one, a status change is a change like any other)."""
    ignored = {"metadata", "apiVersion", "kind"}
    if resource.has_status_subresource:
        ignored.add("status")
    return {key: value for key, value in obj.items() if key not in ignored}


def random_suffix(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(length))
