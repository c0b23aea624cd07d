"""The emulator as a Python object: store, simulated KServe/Knative, clock, request log, faults.

Use it in-process (``Emulator()``) or behind HTTP (:class:`~canary_sandbox.emulator.server.EmulatorServer`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from canary_sandbox.emulator import resources as r
from canary_sandbox.emulator.clock import Clock, ManualClock, ScaledClock, SystemClock
from canary_sandbox.emulator.diagnostics import FaultInjector, RequestLog
from canary_sandbox.emulator.errors import ApiError
from canary_sandbox.emulator.kserve import KServeBehaviour, KServeConfig, RevisionBehaviour, RevisionState
from canary_sandbox.emulator.paging import ListPages
from canary_sandbox.emulator.scheduler import Scheduler
from canary_sandbox.emulator.store import ObjectStore

__all__ = ["Emulator"]

JsonObject = dict[str, Any]
log = logging.getLogger(__name__)


class Emulator:
    """A Kubernetes API with KServe behaviour, in memory.

    All state changes happen under :attr:`lock`. Simulated time comes from :attr:`clock`; with a
    :class:`ManualClock`, :meth:`advance` steps it and runs what falls due, in order. With any other
    clock, :meth:`start` runs a ticker thread that does the same as real (or scaled) time passes.
    """

    def __init__(
        self,
        config: KServeConfig | None = None,
        clock: Clock | None = None,
        *,
        history_size: int = 2000,
        request_log_size: int = 10_000,
        seed: int | None = None,
    ) -> None:
        self.clock: Clock = clock or SystemClock()
        self.lock = threading.RLock()
        self.scheduler = Scheduler(self.clock)
        self.store = ObjectStore(self.clock, self.lock, self.scheduler, history_size=history_size, seed=seed)
        self.kserve = KServeBehaviour(self.store, self.scheduler, self.clock, config, seed=seed)
        self.requests = RequestLog(request_log_size)
        self.pages = ListPages()  # the rest of paged lists (limit/continue)
        self.faults = FaultInjector()
        self._ticker: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def config(self) -> KServeConfig:
        return self.kserve.config

    # --- time ---------------------------------------------------------------------------------------

    def start(self) -> Emulator:
        """Start the ticker thread that runs due work as the clock moves (idempotent)."""
        if self._ticker is None:
            self._stopping.clear()
            self._ticker = threading.Thread(target=self._tick_forever, name="emulator-ticker", daemon=True)
            self._ticker.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self.scheduler.wake.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None
        with self.lock:
            self.store.close_all_watches()

    def _tick_forever(self) -> None:
        while not self._stopping.is_set():
            with self.lock:
                self.scheduler.wake.clear()
                self.scheduler.run_due(self.clock.now())
                next_due = self.scheduler.next_due()
            wait = 0.25
            if next_due is not None and not isinstance(self.clock, ManualClock):
                remaining = next_due - self.clock.now()
                if isinstance(self.clock, ScaledClock):
                    remaining = self.clock.real_seconds(remaining)
                wait = min(wait, max(0.001, remaining))
            self.scheduler.wake.wait(wait)

    def advance(self, seconds: float) -> None:
        """Move a ManualClock forward, running every task as it falls due (in simulated-time order)."""
        if not isinstance(self.clock, ManualClock):
            raise TypeError(f"advance() needs a ManualClock; this emulator runs on {self.clock!r}")
        if seconds < 0:
            raise ValueError("time cannot go backwards")
        clock = self.clock
        with self.lock:
            target = clock.now() + seconds
            while (due := self.scheduler.next_due()) is not None and due <= target:
                clock.set(max(clock.now(), due))
                self.scheduler.run_due(clock.now())
            clock.set(target)
            self.scheduler.run_due(target)

    def settle(self) -> None:
        """Run everything already due (what the ticker would do in its next few milliseconds)."""
        with self.lock:
            self.scheduler.run_due(self.clock.now())

    # --- objects ------------------------------------------------------------------------------------

    def _resource_of(self, obj: JsonObject) -> r.ResourceType:
        resource = self.store.registry.by_kind(str(obj.get("apiVersion")), str(obj.get("kind")))
        if resource is None:
            raise ApiError.bad_request(
                f"the emulator does not serve {obj.get('apiVersion')}/{obj.get('kind')}"
            )
        return resource

    def create(self, obj: JsonObject) -> JsonObject:
        """Create an object given with apiVersion and kind, as a client would."""
        resource = self._resource_of(obj)
        with self.lock:
            return self.store.create(resource, obj.get("metadata", {}).get("namespace"), obj)

    def get(self, resource: r.ResourceType, namespace: str | None, name: str) -> JsonObject:
        with self.lock:
            return self.store.get(resource, namespace, name)

    def list_objects(
        self, resource: r.ResourceType, namespace: str | None = None, label_selector: str = ""
    ) -> list[JsonObject]:
        with self.lock:
            return self.store.list_objects(resource, namespace, label_selector)[0]

    def merge_patch(
        self, resource: r.ResourceType, namespace: str | None, name: str, patch: JsonObject
    ) -> JsonObject:
        with self.lock:
            return self.store.patch(resource, namespace, name, "merge", patch)

    def delete(self, resource: r.ResourceType, namespace: str | None, name: str) -> JsonObject:
        with self.lock:
            return self.store.delete(resource, namespace, name)

    def create_namespace(self, name: str) -> JsonObject:
        return self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def load_objects(self, documents: Iterable[JsonObject]) -> list[JsonObject]:
        """Create objects (Namespaces first, then CustomResourceDefinitions, whose objects need them
        established); an existing Namespace is not an error."""
        first = {"Namespace": 0, "CustomResourceDefinition": 1}
        ordered = sorted(
            (doc for doc in documents if doc), key=lambda doc: first.get(str(doc.get("kind")), 2)
        )
        created = []
        for document in ordered:
            try:
                created.append(self.create(document))
            except ApiError as error:
                if not (document.get("kind") == "Namespace" and error.reason == "AlreadyExists"):
                    raise
        return created

    def load_seed_file(self, path: Path) -> list[JsonObject]:
        with path.open(encoding="utf-8") as handle:
            documents = [doc for doc in yaml.safe_load_all(handle) if doc]
        for document in documents:
            if not isinstance(document, dict):
                raise ValueError(f"{path}: every document must be a Kubernetes object")
        return self.load_objects(documents)

    # --- the simulated KServe -----------------------------------------------------------------------

    def revisions(self, namespace: str, name: str) -> list[JsonObject]:
        with self.lock:
            return self.kserve.revisions(namespace, name)

    def revision_count(self, namespace: str, name: str) -> int:
        with self.lock:
            return self.kserve.revision_count(namespace, name)

    def set_revision_behaviour(self, namespace: str, revision: str, behaviour: RevisionBehaviour) -> bool:
        with self.lock:
            return self.kserve.set_revision_behaviour(namespace, revision, behaviour)

    def set_revision_state(
        self, namespace: str, revision: str, state: RevisionState, message: str = ""
    ) -> None:
        with self.lock:
            self.kserve.set_revision_state(namespace, revision, state, message)

    def set_default_behaviour(self, namespace: str, name: str, behaviour: RevisionBehaviour | None) -> None:
        with self.lock:
            self.kserve.set_default_behaviour(namespace, name, behaviour)

    def knative_service(self, namespace: str, name: str) -> JsonObject | None:
        with self.lock:
            return self.kserve.knative_service(namespace, name)
