"""The rollout state store: one ConfigMap per InferenceService, next to it.

Why a ConfigMap and not an annotation: any annotation on an InferenceService is copied into the
Knative revision template and restarts the model's pods. The ConfigMap carries an owner reference
to the InferenceService so deleting the model deletes its state (``blockOwnerDeletion`` is false: it
would need ``update`` on ``inferenceservices/finalizers`` and buys nothing here), a label that selects
every state object of ours, and is always written with a resourceVersion precondition.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from canary.kserve.client import GROUP, MERGE_PATCH, VERSION, ConflictError, WatchEvent, is_not_found
from canary.rollout.past import PastRollouts
from canary.rollout.records import CommandFormatError, CommandOutcome, CommandRequest, ExplainDocument
from canary.rollout.state import RolloutState

__all__ = [
    "COMMAND_ISSUER_KEY",
    "COMMAND_KEY",
    "COMMAND_RESULT_KEY",
    "EXPLAIN_KEY",
    "MANAGED_BY",
    "MAX_STATE_BYTES",
    "ROLLOUTS_KEY",
    "STATE_KEY",
    "ConfigMapStateStore",
    "StateTooLarge",
    "StoredState",
    "as_dict",
    "state_configmap_name",
    "stored_from_dict",
    "watch_configmaps",
]

STATE_KEY = "state.json"
# An operator's command (pause, resume, approve, abort, promote) waiting for the controller. The
# controller applies it and saves the state without it, under the resourceVersion it read, so a
# command written in between is never lost (the save fails with 409 and is retried).
COMMAND_KEY = "command.json"
# Who wrote command.json: a plain string, so the admission policy can compare it with the identity
# the apiserver authenticated (CEL cannot parse JSON); the controller believes this key, not "by".
COMMAND_ISSUER_KEY = "command-issuer"
# The controller's answer to the last command (accepted or refused, and why), which the CLI waits for.
COMMAND_RESULT_KEY = "command-result.json"
# The latest evaluation in full (each check's value, limit, stable value and PromQL), for
# ``kserve-canary explain``. Kept beside the state so the core's state stays small.
EXPLAIN_KEY = "explain.json"
# The record of past rollouts (canary.rollout.past): the last 10, written with the decision that ends one.
ROLLOUTS_KEY = "rollouts.json"
MANAGED_BY = "kserve-canary"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_INFERENCE_SERVICE = "kserve-canary.dev/inference-service"
# A ConfigMap holds 1 MiB; stay well below so an object with metadata always fits.
MAX_STATE_BYTES = 512 * 1024


class StateTooLarge(Exception):
    pass


def state_configmap_name(inference_service: str) -> str:
    return f"kserve-canary-{inference_service}"


T = TypeVar("T")


class _ParsedByRollout(Generic[T]):
    """Every evaluation reads its rollout's stored state and latest evaluation, which change only on
    a write: each is parsed once per text, not once per look (parsing the same JSON on every look is
    a real share of the controller's CPU at a thousand rollouts). One parsed record per rollout, its
    current text's: keyed by rollout rather than by text, so the records of texts already replaced
    are not kept alive. Beyond ``size`` rollouts the least recently read is dropped. A text that
    cannot be read raises each time and nothing is kept. Thread-safe."""

    def __init__(self, parse: Callable[[str], T], size: int = 2048) -> None:
        self._parse = parse
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[str, T]] = OrderedDict()

    def get(self, rollout: str, text: str) -> T:
        with self._lock:
            found = self._entries.get(rollout)
            if found is not None and found[0] == text:
                if found[0] is not text:
                    # The same text read again (a watch that re-listed decodes every object anew):
                    # keep the caller's copy, or both would stay alive — a second copy of every
                    # rollout's explain.json after each re-list.
                    self._entries[rollout] = (text, found[1])
                self._entries.move_to_end(rollout)
                return found[1]
        parsed = self._parse(text)
        with self._lock:
            self._entries[rollout] = (text, parsed)
            self._entries.move_to_end(rollout)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return parsed


_STATES: _ParsedByRollout[RolloutState] = _ParsedByRollout(RolloutState.from_json)
_EXPLAINS: _ParsedByRollout[ExplainDocument] = _ParsedByRollout(ExplainDocument.from_json)
_EXPLAIN_READINGS: _ParsedByRollout[ExplainDocument] = _ParsedByRollout(
    lambda text: ExplainDocument.from_json(text).without_queries()
)


@dataclass(frozen=True)
class StoredState:
    """The state ConfigMap of one InferenceService as read: its files as stored, parsed on demand.

    The texts are kept so that what cannot be read is never overwritten (the reconciler refuses to
    act on an unreadable state) and a person can be shown it; the typed records come from
    :meth:`state`, :meth:`command` and :meth:`explain`, each raising its own format error.
    """

    namespace: str
    inference_service: str
    state_json: str | None  # None when nothing is stored yet
    resource_version: str | None  # precondition for the next write; None = create
    command_json: str | None = None  # a pending operator command, if any
    explain_json: str | None = None  # the latest evaluation, for ``explain``
    command_issuer: str | None = None  # who wrote command.json (checked at admission, when installed)
    command_result_json: str | None = None  # the controller's answer to the last command
    owner_uid: str | None = None  # the uid of the InferenceService in the owner references, if any
    rollouts_json: str | None = None  # the record of past rollouts, as stored

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.inference_service}"

    def state(self) -> RolloutState:
        """The stored state (a fresh one when nothing is stored). Raises :class:`StateFormatError`."""
        return _STATES.get(self.key, self.state_json) if self.state_json else RolloutState()

    def command(self) -> CommandRequest | None:
        """The pending operator command. Raises :class:`CommandFormatError`."""
        return CommandRequest.from_json(self.command_json) if self.command_json else None

    def explain(self) -> ExplainDocument | None:
        """The latest evaluation. Raises :class:`ExplainFormatError`."""
        return _EXPLAINS.get(self.key, self.explain_json) if self.explain_json else None

    def explain_uncached(self) -> ExplainDocument | None:
        """The latest evaluation, parsed now and not kept (to write it back: rarely).
        Raises :class:`ExplainFormatError`."""
        return ExplainDocument.from_json(self.explain_json) if self.explain_json else None

    def explain_reading(self) -> ExplainDocument | None:
        """The latest evaluation without its PromQL (:meth:`ExplainDocument.without_queries`), for
        comparing it with a new one and projecting a status: the controller reads it at every
        evaluation of every rollout, so it is parsed once per text and kept, small. Never written
        back. Raises :class:`ExplainFormatError`."""
        return _EXPLAIN_READINGS.get(self.key, self.explain_json) if self.explain_json else None

    def past_rollouts(self) -> PastRollouts:
        """The record of past rollouts (empty when none is stored).

        Raises :class:`~canary.rollout.past.PastRolloutsFormatError`."""
        return PastRollouts.from_json(self.rollouts_json) if self.rollouts_json else PastRollouts()

    def command_result(self) -> CommandOutcome | None:
        """The controller's answer to the last command. Raises :class:`CommandFormatError`."""
        return CommandOutcome.from_json(self.command_result_json) if self.command_result_json else None

    def readable_command_result(self) -> CommandOutcome | None:
        """The answer to the last command, or None when there is none or it cannot be read."""
        try:
            return self.command_result()
        except CommandFormatError:
            return None


# Called with every ConfigMap the controller wrote, as the API answered it (a JSON dict): the
# controller's watch cache keeps its own writes without waiting for the watch event.
WriteObserver = Callable[[dict[str, Any]], None]


class ConfigMapDocuments:
    """The documents of ours beside an InferenceService (its state, rollback ledger, notification
    outbox), each a ConfigMap of files: read as the API has it (a JSON dict), written whole under
    the resourceVersion read (None: create), labelled as ours and owned by the InferenceService
    (``blockOwnerDeletion`` false). ``on_written`` sees every ConfigMap written."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        request_timeout: float = 10.0,
        on_written: WriteObserver | None = None,
    ):
        self.api_client = api_client  # for the stores kept beside this one (the rollback ledger)
        self.request_timeout = request_timeout
        self.on_written = on_written
        self._core = client.CoreV1Api(api_client)

    def _read(self, namespace: str, name: str) -> dict[str, Any] | None:
        return read_configmap(self._core, namespace, name, self.request_timeout)

    def _write(
        self,
        namespace: str,
        name: str,
        files: dict[str, str],
        *,
        inference_service: str,
        owner_uid: str | None,
        resource_version: str | None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Create or replace ConfigMap ``name`` of ``inference_service`` with ``files`` (``labels``
        added to ours, or replacing them); the new resourceVersion. Raises :class:`ConflictError` on
        409 (written since it was read)."""
        body = client.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=namespace,
                labels={
                    LABEL_MANAGED_BY: MANAGED_BY,
                    LABEL_INFERENCE_SERVICE: inference_service,
                    **(labels or {}),
                },
                owner_references=_owned_by(inference_service, owner_uid),
                resource_version=resource_version,
            ),
            data=files,
        )
        try:
            if resource_version is None:
                written = self._core.create_namespaced_config_map(
                    namespace, body, _request_timeout=self.request_timeout
                )
            else:
                written = self._core.replace_namespaced_config_map(
                    name, namespace, body, _request_timeout=self.request_timeout
                )
        except ApiException as error:
            if error.status == 409:
                raise ConflictError(f"ConfigMap {namespace}/{name} changed since it was read") from error
            raise
        if self.on_written is not None:
            self.on_written(as_dict(self.api_client, written))
        return str(written.metadata.resource_version if written.metadata else "")


def _owned_by(inference_service: str, uid: str | None) -> list[client.V1OwnerReference] | None:
    if not uid:
        return None
    return [
        client.V1OwnerReference(
            api_version=f"{GROUP}/{VERSION}",
            kind="InferenceService",
            name=inference_service,
            uid=uid,
            controller=False,
            block_owner_deletion=False,
        )
    ]


class ConfigMapStateStore(ConfigMapDocuments):
    def load(self, namespace: str, inference_service: str) -> StoredState:
        found = self._read(namespace, state_configmap_name(inference_service))
        return stored_from_dict(found, namespace, inference_service)

    def save(
        self,
        namespace: str,
        inference_service: str,
        state: RolloutState,
        *,
        resource_version: str | None,
        owner_uid: str | None,
        explain: ExplainDocument | None = None,
        command_result: CommandOutcome | None = None,
        rollouts: str | None = None,
    ) -> str:
        """Write the state (and the latest evaluation, the answer to the last command, and the record of
        past rollouts as the text to store); returns the new resourceVersion.

        Raises :class:`ConflictError` on 409 and :class:`StateTooLarge` beyond :data:`MAX_STATE_BYTES`.
        Whatever else the ConfigMap held is replaced: a pending command is consumed.
        """
        files = {
            STATE_KEY: state.to_json(),
            **({COMMAND_RESULT_KEY: command_result.to_json()} if command_result else {}),
            **({ROLLOUTS_KEY: rollouts} if rollouts else {}),
        }
        if explain is not None:
            # The evaluation is the one record that grows with the policy (its checks and their
            # PromQL): shortened to what is left, it never keeps the state itself from being written.
            room = MAX_STATE_BYTES - sum(len(text.encode()) for text in files.values())
            files[EXPLAIN_KEY] = explain.fitted_json(max(room, 0))
        return self.save_files(
            namespace,
            inference_service,
            files,
            resource_version=resource_version,
            owner_uid=owner_uid,
        )

    def save_files(
        self,
        namespace: str,
        inference_service: str,
        files: dict[str, str],
        *,
        resource_version: str | None,
        owner_uid: str | None,
    ) -> str:
        """Write the ConfigMap's files as they are (:meth:`save` for the controller's own records; this
        for tests and tools that must store something the controller would never write)."""
        size = sum(len(text.encode()) for text in files.values())
        if size > MAX_STATE_BYTES:
            raise StateTooLarge(
                f"state of {namespace}/{inference_service} is {size} bytes (limit {MAX_STATE_BYTES})"
            )
        return self._write(
            namespace,
            state_configmap_name(inference_service),
            files,
            inference_service=inference_service,
            owner_uid=owner_uid,
            resource_version=resource_version,
        )

    def request_command(
        self,
        namespace: str,
        inference_service: str,
        command: CommandRequest,
        *,
        issuer: str | None = None,
        resource_version: str | None = None,
    ) -> str:
        """Leave a command for the controller (used by the CLI, with the operator's own credentials);
        returns the new resourceVersion.

        ``issuer`` (default: ``command.by``) goes to :data:`COMMAND_ISSUER_KEY`. With
        ``resource_version`` the write lands only on the state read at that version, else
        :class:`ConflictError`.
        """
        body: dict[str, object] = {
            "data": {COMMAND_KEY: command.to_json(), COMMAND_ISSUER_KEY: issuer or command.by or ""}
        }
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            written = self._core.patch_namespaced_config_map(
                state_configmap_name(inference_service),
                namespace,
                body,
                # The generated client defaults to JSON Patch for every body: say what this is.
                _content_type=MERGE_PATCH,
                _request_timeout=self.request_timeout,
            )
        except ApiException as error:
            if is_not_found(error):
                raise LookupError(
                    f"no rollout state for {namespace}/{inference_service}: kserve-canary has not seen it yet"
                ) from error
            if error.status == 409:
                raise ConflictError(
                    f"state of {namespace}/{inference_service} changed since it was read"
                ) from error
            raise
        return str(written.metadata.resource_version if written.metadata else "")


SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY}"


def as_dict(api_client: client.ApiClient, model: object) -> dict[str, Any]:
    """A client model as the JSON dict the API sent."""
    return cast(dict[str, Any], api_client.sanitize_for_serialization(model))  # type: ignore[no-untyped-call]


def _json_body(response: object) -> dict[str, Any]:
    # With _preload_content=False the generated client hands back the raw HTTP response.
    return cast(dict[str, Any], json.loads(cast(Any, response).data))


def read_configmap(
    core: client.CoreV1Api, namespace: str, name: str, timeout: float
) -> dict[str, Any] | None:
    try:
        response = core.read_namespaced_config_map(
            name, namespace, _preload_content=False, _request_timeout=timeout
        )
    except ApiException as error:
        if is_not_found(error):
            return None
        raise
    return _json_body(response)


def watch_configmaps(
    api_client: client.ApiClient,
    namespace: str | None,
    resource_version: str,
    *,
    timeout_seconds: int = 300,
    request_timeout: float = 10.0,
) -> Iterator[WatchEvent]:
    """Changes of our ConfigMaps after ``resource_version`` (objects as JSON dicts)."""
    core = client.CoreV1Api(api_client)
    watcher = watch.Watch()  # type: ignore[no-untyped-call]
    scope: tuple[Any, ...] = (
        (core.list_config_map_for_all_namespaces,)
        if namespace is None
        else (core.list_namespaced_config_map, namespace)
    )
    stream = watcher.stream(  # type: ignore[no-untyped-call]
        *scope,
        label_selector=SELECTOR,
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
        allow_watch_bookmarks=True,
        _request_timeout=timeout_seconds + request_timeout,
    )
    try:
        for event in stream:
            yield WatchEvent(type=str(event["type"]), object=cast(Mapping[str, Any], event["raw_object"]))
    finally:
        watcher.stop()  # type: ignore[no-untyped-call]


def stored_from_dict(
    configmap: Mapping[str, Any] | None, namespace: str, inference_service: str
) -> StoredState:
    """The state ConfigMap as the watch cache holds it (a JSON dict; None: there is none)."""
    if configmap is None:
        return StoredState(namespace, inference_service, None, None)
    meta = configmap.get("metadata") or {}
    data = configmap.get("data") or {}
    return StoredState(
        meta.get("namespace") or namespace,
        (meta.get("labels") or {}).get(LABEL_INFERENCE_SERVICE) or inference_service,
        data.get(STATE_KEY),
        meta.get("resourceVersion"),
        data.get(COMMAND_KEY),
        data.get(EXPLAIN_KEY),
        data.get(COMMAND_ISSUER_KEY),
        data.get(COMMAND_RESULT_KEY),
        owner_uid=owner_uid_of(meta),
        rollouts_json=data.get(ROLLOUTS_KEY),
    )


def owner_uid_of(meta: Mapping[str, Any]) -> str | None:
    return next(
        (
            ref.get("uid")
            for ref in meta.get("ownerReferences") or ()
            if ref.get("kind") == "InferenceService"
        ),
        None,
    )


def is_state_configmap(configmap: Mapping[str, Any]) -> bool:
    meta = configmap.get("metadata") or {}
    model = (meta.get("labels") or {}).get(LABEL_INFERENCE_SERVICE)
    # A dotted label is no InferenceService name: the rollback ledger (kserve.ledger_store).
    return model is None or (meta.get("name") == state_configmap_name(model) and "." not in model)
