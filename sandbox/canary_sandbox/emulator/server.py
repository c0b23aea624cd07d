"""The emulator over HTTP: the Kubernetes REST API, discovery for kubectl, and an admin API.

Clients — the official ``kubernetes`` Python client and ``kubectl`` — talk to it through a kubeconfig
written by :meth:`EmulatorServer.write_kubeconfig`. Tests and the demo drive the simulation through
``/emulator/v1/...`` (see :mod:`canary_sandbox.emulator` for the endpoint list).

Routing reads one snapshot of the store's registry per request, so CRDs created or deleted meanwhile
never leave a request half in the old world. Besides the resources: ``/openapi/v3`` (see
:mod:`~canary_sandbox.emulator.openapi`), ``?fieldValidation=`` (custom objects), server-side apply
(``application/apply-patch+yaml``, see :mod:`~canary_sandbox.emulator.apply`) and ``Warning`` response
headers for what a write wants the client to know.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import re
import select
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from canary_sandbox.emulator import openapi
from canary_sandbox.emulator import resources as r
from canary_sandbox.emulator.client import EmulatorAdminClient
from canary_sandbox.emulator.clock import ManualClock, ScaledClock
from canary_sandbox.emulator.core import Emulator
from canary_sandbox.emulator.diagnostics import LoggedRequest, summarise_body
from canary_sandbox.emulator.errors import ApiError, FieldError
from canary_sandbox.emulator.kserve import RevisionBehaviour, RevisionState
from canary_sandbox.emulator.patching import changed_paths
from canary_sandbox.emulator.store import PatchType, Watch, format_micro_time
from canary_sandbox.emulator.tables import to_table
from canary_sandbox.emulator.views import from_storage, to_storage

__all__ = ["EmulatorServer"]

JsonObject = dict[str, Any]
log = logging.getLogger(__name__)

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2025-01-01T00:00:00Z",
    "goVersion": "go1.23.4",
    "compiler": "gc",
    "platform": "linux/amd64",
}
AGGREGATED_DISCOVERY_TYPE = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
_PATCH_TYPES: dict[str, PatchType] = {
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/json-patch+json": "json",
}
_IGNORED_CHANGES = ("metadata.resourceVersion", "metadata.generation")
_DEFAULT_WATCH_TIMEOUT = 1800.0  # the apiserver's --min-request-timeout
# Who the default kubeconfig authenticates as (kubeadm's and kind's name for the first admin).
DEFAULT_USER = "kubernetes-admin"
DEFAULT_TOKEN = "kserve-canary-emulator"  # noqa: S105 - the emulator's only "credential", not a secret
_SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


@dataclass
class _Response:
    status: int
    body: Any
    content_type: str = "application/json"
    changed: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], owner: EmulatorServer) -> None:
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HttpServer

    # --- plumbing -----------------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes; without TCP_NODELAY, Nagle's algorithm and the
        # client's delayed ACK add ~40 ms to every keep-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    @property
    def owner(self) -> EmulatorServer:
        return self.server.owner

    @property
    def emulator(self) -> Emulator:
        return self.server.owner.emulator

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, response: _Response) -> None:
        if isinstance(response.body, bytes | str):
            payload = response.body.encode() if isinstance(response.body, str) else response.body
        else:
            payload = json.dumps(response.body, separators=(",", ":")).encode()
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-cache, private")
        for warning in response.warnings:
            # RFC 7234 warn-code 299 "miscellaneous persistent warning", as the apiserver sends them.
            self.send_header("Warning", f"299 - {json.dumps(warning)}")
        self.end_headers()
        self.wfile.write(payload)

    def _handle(self, method: str) -> None:
        parsed = urlsplit(self.path)
        path = parsed.path.rstrip("/") or "/"
        query = {key: values[-1] for key, values in parse_qs(parsed.query, keep_blank_values=True).items()}
        body = self._read_body()
        if path.startswith("/emulator/"):
            self._handle_admin(method, path, query, body)
            return
        sequence = self.emulator.requests.next_sequence()
        fault = self.emulator.faults.take(method, path)
        response: _Response | None = None
        try:
            if fault is not None and fault.delay_seconds:
                self.owner.stopping.wait(fault.delay_seconds)
            if fault is not None and fault.status is not None:
                raise fault.error(path)
            response = self._api(method, path, query, body)
        except ApiError as error:
            response = _Response(error.code, error.status())
        except Exception as error:  # an emulator bug must answer 500, not hang the client
            log.exception("emulator failed on %s %s", method, self.path)
            response = _Response(500, ApiError(500, f"emulator internal error: {error}").status())
        finally:
            # A watch (status -1 here) was answered with a 200 and a stream.
            status = 200 if response is None or response.status < 0 else response.status
            self.emulator.requests.add(
                LoggedRequest(
                    sequence=sequence,
                    time=time.time(),
                    method=method,
                    path=path,
                    query=parsed.query,
                    content_type=self.headers.get("Content-Type", ""),
                    status=status,
                    user_agent=self.headers.get("User-Agent", ""),
                    body=summarise_body(body),
                    changed_paths=response.changed if response is not None else (),
                    fault=fault.id if fault is not None and fault.status is not None else None,
                )
            )
        if response.status >= 0:
            self._send(response)

    # --- the Kubernetes API -------------------------------------------------------------------------

    def _accepts(self, fragment: str) -> bool:
        return fragment in self.headers.get("Accept", "")

    def _wants_aggregated_discovery(self) -> bool:
        accept = self.headers.get("Accept", "")
        return self.owner.aggregated_discovery and "as=APIGroupDiscoveryList" in accept and "v=v2" in accept

    def _api(self, method: str, path: str, query: dict[str, str], body: bytes) -> _Response:
        registry = self.emulator.store.registry.snapshot()
        if path == "/version":
            return _Response(200, SERVER_VERSION)
        if path == _SELF_SUBJECT_REVIEWS:
            if method != "POST":
                raise ApiError.method_not_allowed(method, path)
            return _Response(201, self._self_subject_review())
        if path in ("/healthz", "/readyz", "/livez"):
            return _Response(200, "ok", "text/plain; charset=utf-8")
        if path == "/openapi/v3" or path.startswith("/openapi/v3/"):
            return self._openapi(method, path)
        segments = path.strip("/").split("/")
        if segments[0] == "api":
            group, rest = "", segments[1:]
        elif segments[0] == "apis":
            group, rest = (segments[1], segments[2:]) if len(segments) > 1 else ("", [])
        else:
            # /openapi/v2 included: kubectl copes with its absence (see openapi.py for v3).
            raise ApiError.path_not_found()
        if method != "GET" and len(rest) < 2:
            raise ApiError.method_not_allowed(method, path)
        if not rest:
            if segments[0] == "api" or len(segments) == 1:
                legacy = segments[0] == "api"
                if self._wants_aggregated_discovery():
                    return _Response(200, registry.aggregated(legacy), AGGREGATED_DISCOVERY_TYPE)
                host = "{}:{}".format(*self.server.server_address[:2])
                return _Response(200, registry.api_versions(host) if legacy else registry.api_group_list())
            document = registry.api_group(group)
            if document is None:
                raise ApiError.path_not_found()
            return _Response(200, document)
        version, rest = rest[0], rest[1:]
        if not rest:
            resource_list = registry.api_resource_list(group, version)
            if resource_list is None:
                raise ApiError.path_not_found()
            return _Response(200, resource_list)
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3:
            candidate = registry.by_path(group, version, rest[2])
            if candidate is not None and candidate.namespaced:
                namespace, rest = rest[1], rest[2:]
        resource = registry.by_path(group, version, rest[0])
        if resource is None or len(rest) > 3:
            raise ApiError.path_not_found()
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if subresource is not None and not (subresource == "status" and resource.has_status_subresource):
            raise ApiError.path_not_found()
        dry_run = query.get("dryRun") == "All"
        field_validation = query.get("fieldValidation") or "Warn"  # the apiserver's default since 1.23
        if field_validation not in ("Ignore", "Warn", "Strict"):
            raise ApiError.bad_request(
                f"fieldValidation must be one of Ignore, Warn, Strict; got {field_validation!r}"
            )
        if name is None:
            if method == "GET":
                if query.get("watch") in ("1", "true", "True"):
                    self._serve_watch(resource, namespace, query)
                    return _Response(-1, None)
                return self._list(resource, namespace, query)
            if method == "POST" and (namespace is not None or not resource.namespaced):
                document = self._json(body)
                with self.emulator.lock:
                    self.emulator.store.take_warnings()
                    created = self.emulator.store.create(
                        resource, namespace, document, dry_run=dry_run, field_validation=field_validation
                    )
                    warnings = tuple(self.emulator.store.take_warnings())
                return _Response(201, created, changed=_changes({}, created), warnings=warnings)
            raise ApiError.method_not_allowed(method, path)
        store = self.emulator.store
        if method == "GET":
            obj = self._locked(lambda: store.get(resource, namespace, name))
            if self._accepts("as=Table"):
                return self._table(resource, [obj], obj["metadata"]["resourceVersion"], query)
            return _Response(200, obj)
        if method == "PUT":
            document = self._json(body)

            def replace() -> JsonObject:
                return store.update(
                    resource,
                    namespace,
                    name,
                    document,
                    subresource=subresource,
                    dry_run=dry_run,
                    field_validation=field_validation,
                )

            return self._write(resource, namespace, name, replace)
        if method == "PATCH" and self._content_type() == "application/apply-patch+yaml":
            return self._apply(resource, namespace, name, subresource, query, body, dry_run)
        if method == "PATCH":
            patch_type = self._patch_type(resource)
            patch = self._json(body, allow_list=True)

            def apply_patch() -> JsonObject:
                return store.patch(
                    resource,
                    namespace,
                    name,
                    patch_type,
                    patch,
                    subresource=subresource,
                    dry_run=dry_run,
                    field_validation=field_validation,
                )

            return self._write(resource, namespace, name, apply_patch)
        if method == "DELETE" and subresource is None:
            options = self._json(body) if body.strip() else {}
            for key in ("propagationPolicy", "gracePeriodSeconds"):
                if key in query:
                    options[key] = query[key]
            deleted = self._locked(
                lambda: store.delete(resource, namespace, name, options=options, dry_run=dry_run)
            )
            return _Response(200, deleted, changed=("(deleted)",))
        raise ApiError.method_not_allowed(method, path)

    def _self_subject_review(self) -> JsonObject:
        """``kubectl auth whoami``: the user the bearer token authenticates as (the only authentication
        the emulator knows; it authorises everyone for everything)."""
        authorization = self.headers.get("Authorization", "")
        token = authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else ""
        username = self.owner.tokens.get(token)
        user: JsonObject = (
            {"username": username, "groups": ["system:authenticated"]}
            if username is not None
            else {"username": "system:anonymous", "groups": ["system:unauthenticated"]}
        )
        return {
            "kind": "SelfSubjectReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "status": {"userInfo": user},
        }

    def _content_type(self) -> str:
        return self.headers.get("Content-Type", "").split(";")[0].strip()

    def _apply(
        self,
        resource: r.ResourceType,
        namespace: str | None,
        name: str,
        subresource: str | None,
        query: dict[str, str],
        body: bytes,
        dry_run: bool,
    ) -> _Response:
        """Server-side apply (the subset :mod:`~canary_sandbox.emulator.apply` describes)."""
        if subresource is not None:
            raise ApiError(
                415,
                "server-side apply of a subresource is not supported by the kserve-canary emulator",
                reason="UnsupportedMediaType",
            )
        manager = query.get("fieldManager", "")
        if not manager:
            raise ApiError.invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                [
                    FieldError(
                        "fieldManager", "FieldValueRequired", "Required value: is required for apply patch"
                    )
                ],
            )
        try:
            config = yaml.safe_load(body) if body.strip() else None
        except yaml.YAMLError as error:
            raise ApiError.bad_request(f"error decoding YAML: {error}") from None
        force = query.get("force") in ("true", "True", "1")
        field_validation = query.get("fieldValidation") or "Strict"
        with self.emulator.lock:
            store = self.emulator.store
            existing = store.get_stored(resource, namespace, name)
            before = from_storage(resource, existing) if existing is not None else {}
            store.take_warnings()
            result, created = store.apply(
                resource,
                namespace,
                name,
                config,
                manager=manager,
                force=force,
                dry_run=dry_run,
                field_validation=field_validation,
            )
            warnings = tuple(store.take_warnings())
        return _Response(201 if created else 200, result, changed=_changes(before, result), warnings=warnings)

    def _patch_type(self, resource: r.ResourceType) -> PatchType:
        content_type = self._content_type()
        patch_type = _PATCH_TYPES.get(content_type)
        if patch_type is not None:
            return patch_type
        accepted = [*_PATCH_TYPES, "application/apply-patch+yaml"]
        if resource.is_custom:
            accepted.remove("application/strategic-merge-patch+json")
        raise ApiError.unsupported_media_type(content_type, accepted)

    def _locked(self, action: Any) -> Any:
        with self.emulator.lock:
            return action()

    def _write(self, resource: r.ResourceType, namespace: str | None, name: str, action: Any) -> _Response:
        with self.emulator.lock:
            before = self.emulator.store.get(resource, namespace, name)
            self.emulator.store.take_warnings()
            after = action()
            warnings = tuple(self.emulator.store.take_warnings())
        return _Response(200, after, changed=_changes(before, after), warnings=warnings)

    def _openapi(self, method: str, path: str) -> _Response:
        if method != "GET":
            raise ApiError.method_not_allowed(method, path)
        registry = self.emulator.store.registry.snapshot()
        with self.emulator.lock:
            if path == "/openapi/v3":
                return _Response(200, openapi.index_document(registry))
            segments = path.removeprefix("/openapi/v3/").split("/")
            document = None
            if len(segments) == 2 and segments[0] == "api":
                document = openapi.group_version_document(registry, "", segments[1])
            elif len(segments) == 3 and segments[0] == "apis":
                document = openapi.group_version_document(registry, segments[1], segments[2])
        if document is None:
            raise ApiError.path_not_found()
        return _Response(200, document)

    def _json(self, body: bytes, allow_list: bool = False) -> Any:
        content_type = self.headers.get("Content-Type", "")
        if "protobuf" in content_type:
            raise ApiError.unsupported_media_type(content_type, ["application/json", "application/yaml"])
        try:
            document = yaml.safe_load(body) if "yaml" in content_type else json.loads(body or b"null")
        except (ValueError, yaml.YAMLError) as error:
            raise ApiError.bad_request(f"the request body is not valid JSON: {error}") from None
        if isinstance(document, list) and allow_list:
            return document
        if not isinstance(document, dict):
            raise ApiError.bad_request("the request body must be a JSON object")
        return document

    def _list(self, resource: r.ResourceType, namespace: str | None, query: dict[str, str]) -> _Response:
        items: list[JsonObject] = []
        version = ""
        if not query.get("continue"):  # a continued list is served from its first page's snapshot
            with self.emulator.lock:
                items, version = self.emulator.store.list_objects(
                    resource, namespace, query.get("labelSelector", ""), query.get("fieldSelector", "")
                )
        selected = bool(query.get("labelSelector") or query.get("fieldSelector"))
        items, version, paged = self.emulator.pages.page(items, version, query, selected=selected)
        if self._accepts("as=Table"):
            return self._table(resource, items, version, query)
        return _Response(
            200,
            {
                "kind": resource.list_kind,
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": version, **paged},
                "items": items,
            },
        )

    def _table(
        self, resource: r.ResourceType, items: list[JsonObject], version: str, query: dict[str, str]
    ) -> _Response:
        # Cells are computed from the stored (core) form; rows carry the object as this endpoint shows it.
        stored = [to_storage(resource, item) for item in items]
        table = to_table(resource, stored, version, self.emulator.clock.now())
        include = query.get("includeObject", "Metadata")
        for row, item in zip(table["rows"], items, strict=True):
            if include == "Object":
                row["object"] = item
            elif include != "None":
                row["object"] = {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": item.get("metadata", {}),
                }
        return _Response(200, table, "application/json;as=Table;v=v1;g=meta.k8s.io")

    def _serve_watch(self, resource: r.ResourceType, namespace: str | None, query: dict[str, str]) -> None:
        store = self.emulator.store
        expired: ApiError | None = None
        watch: Watch | None = None
        with self.emulator.lock:
            try:
                watch = store.watch(
                    resource,
                    namespace,
                    query.get("labelSelector", ""),
                    query.get("fieldSelector", ""),
                    query.get("resourceVersion", ""),
                )
            except ApiError as error:
                if error.code != 410:
                    raise
                # The apiserver's watch cache answers an expired version with a 200 and an ERROR event.
                expired = error
        table = self._accepts("as=Table")
        try:
            timeout = float(query.get("timeoutSeconds") or _DEFAULT_WATCH_TIMEOUT)
        except ValueError:
            timeout = _DEFAULT_WATCH_TIMEOUT
        bookmarks = query.get("allowWatchBookmarks") in ("1", "true", "True")
        self.send_response(200)
        self.send_header(
            "Content-Type", "application/json;as=Table;v=v1;g=meta.k8s.io" if table else "application/json"
        )
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.close_connection = True
        try:
            if expired is not None:
                self._chunk({"type": "ERROR", "object": expired.status()})
                return
            assert watch is not None
            self._stream(resource, watch, table, query, timeout, bookmarks)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            if watch is not None:
                with self.emulator.lock:
                    store.stop_watch(watch)
            with contextlib.suppress(OSError):
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

    def _stream(
        self,
        resource: r.ResourceType,
        watch: Watch,
        table: bool,
        query: dict[str, str],
        timeout: float,
        bookmarks: bool,
    ) -> None:
        deadline = time.monotonic() + timeout
        last_bookmark = time.monotonic()
        interval = self.owner.bookmark_interval
        while not self.owner.stopping.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                item = watch.next(timeout=min(remaining, 0.5, interval if bookmarks else 0.5))
            except queue.Empty:
                if self._client_gone():
                    return
                if bookmarks and time.monotonic() - last_bookmark >= interval:
                    last_bookmark = time.monotonic()
                    version = str(self.emulator.store.resource_version)
                    self._chunk(
                        {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": resource.kind,
                                "apiVersion": resource.api_version,
                                "metadata": {"resourceVersion": version},
                            },
                        }
                    )
                continue
            if item is None:
                return
            event_type, stored = item
            obj = from_storage(resource, stored)
            if table:
                version = obj["metadata"]["resourceVersion"]
                obj = self._table(resource, [obj], version, query).body
            self._chunk({"type": event_type, "object": obj})

    def _client_gone(self) -> bool:
        """Whether the client closed the connection (a stopped ``Watch``), so an idle watch can end."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _chunk(self, event: JsonObject) -> None:
        data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # --- the admin API ------------------------------------------------------------------------------

    def _handle_admin(self, method: str, path: str, query: dict[str, str], body: bytes) -> None:
        try:
            response = _Admin(self.emulator, self.owner).handle(method, path, query, body)
        except ApiError as error:
            response = _Response(error.code, error.status())
        except Exception as error:
            log.exception("emulator admin request failed: %s %s", method, path)
            response = _Response(500, ApiError(500, f"emulator internal error: {error}").status())
        self._send(response)


def _changes(before: JsonObject, after: JsonObject) -> tuple[str, ...]:
    return tuple(path for path in changed_paths(before, after) if path not in _IGNORED_CHANGES)


class _Admin:
    """``/emulator/v1/...``: drive the simulation and inspect what clients did."""

    _ROUTES: tuple[tuple[str, str, str], ...] = (
        ("GET", r"/emulator/v1/healthz", "healthz"),
        ("GET", r"/emulator/v1/clock", "clock"),
        ("POST", r"/emulator/v1/clock/advance", "advance"),
        ("GET", r"/emulator/v1/config", "config"),
        ("PATCH", r"/emulator/v1/config", "patch_config"),
        ("GET", r"/emulator/v1/revisions", "all_revisions"),
        (
            "GET",
            r"/emulator/v1/namespaces/(?P<ns>[^/]+)/inferenceservices/(?P<name>[^/]+)/revisions",
            "revisions",
        ),
        (
            "GET",
            r"/emulator/v1/namespaces/(?P<ns>[^/]+)/inferenceservices/(?P<name>[^/]+)/knativeservice",
            "ksvc",
        ),
        (
            "PUT",
            r"/emulator/v1/namespaces/(?P<ns>[^/]+)/inferenceservices/(?P<name>[^/]+)/revision-behaviour",
            "isvc_behaviour",
        ),
        (
            "DELETE",
            r"/emulator/v1/namespaces/(?P<ns>[^/]+)/inferenceservices/(?P<name>[^/]+)/revision-behaviour",
            "reset_isvc_behaviour",
        ),
        (
            "PUT",
            r"/emulator/v1/namespaces/(?P<ns>[^/]+)/revisions/(?P<rev>[^/]+)/behaviour",
            "revision_behaviour",
        ),
        ("POST", r"/emulator/v1/namespaces/(?P<ns>[^/]+)/revisions/(?P<rev>[^/]+)/state", "revision_state"),
        ("GET", r"/emulator/v1/requests", "requests"),
        ("DELETE", r"/emulator/v1/requests", "clear_requests"),
        ("GET", r"/emulator/v1/faults", "faults"),
        ("POST", r"/emulator/v1/faults", "add_fault"),
        ("DELETE", r"/emulator/v1/faults", "clear_faults"),
        ("DELETE", r"/emulator/v1/faults/(?P<id>\d+)", "remove_fault"),
    )

    def __init__(self, emulator: Emulator, server: EmulatorServer) -> None:
        self.emulator = emulator
        self.server = server

    def handle(self, method: str, path: str, query: dict[str, str], raw: bytes) -> _Response:
        known_path = False
        for route_method, pattern, handler in self._ROUTES:
            match = re.fullmatch(pattern, path)
            if match is None:
                continue
            known_path = True
            if route_method == method:
                try:
                    body = json.loads(raw) if raw.strip() else {}
                except ValueError as error:
                    raise ApiError.bad_request(f"the request body is not valid JSON: {error}") from None
                if not isinstance(body, dict):
                    raise ApiError.bad_request("the request body must be a JSON object")
                result = getattr(self, handler)(query=query, body=body, **match.groupdict())
                return _Response(200, result)
        if known_path:
            raise ApiError.method_not_allowed(method, path)
        raise ApiError.path_not_found()

    def healthz(self, **_: Any) -> JsonObject:
        return {"ok": True, "url": self.server.url}

    def clock(self, **_: Any) -> JsonObject:
        clock = self.emulator.clock
        kind = (
            "manual"
            if isinstance(clock, ManualClock)
            else "scaled"
            if isinstance(clock, ScaledClock)
            else "system"
        )
        now = clock.now()
        result: JsonObject = {"kind": kind, "now": now, "time": format_micro_time(now)}
        if isinstance(clock, ScaledClock):
            result["speed"] = clock.speed
        return result

    def advance(self, body: JsonObject, **_: Any) -> JsonObject:
        seconds = body.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ApiError.bad_request('"seconds" must be a non-negative number')
        if not isinstance(self.emulator.clock, ManualClock):
            raise ApiError(
                409, "the emulator's clock is not manual (start it with --manual-clock)", reason="Conflict"
            )
        self.emulator.advance(float(seconds))
        return self.clock()

    def config(self, **_: Any) -> JsonObject:
        config = self.emulator.config
        return {
            "reconcileDelaySeconds": config.reconcile_delay,
            "knativeDelaySeconds": config.knative_delay,
            "revisionReadyDelaySeconds": config.revision_ready_delay,
            "podsPerRevision": config.pods_per_revision,
            "scaleDownGraceSeconds": config.scale_down_grace,
            "ingressDomain": config.ingress_domain,
            "garbageCollectionDelaySeconds": self.emulator.store.garbage_collection_delay,
        }

    def patch_config(self, body: JsonObject, **_: Any) -> JsonObject:
        fields = {
            "reconcileDelaySeconds": "reconcile_delay",
            "knativeDelaySeconds": "knative_delay",
            "revisionReadyDelaySeconds": "revision_ready_delay",
            "podsPerRevision": "pods_per_revision",
            "scaleDownGraceSeconds": "scale_down_grace",
        }
        collector = "garbageCollectionDelaySeconds"
        unknown = set(body) - set(fields) - {collector}
        if unknown:
            raise ApiError.bad_request(f"unknown configuration fields: {sorted(unknown)}")
        with self.emulator.lock:
            for key, value in body.items():
                if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                    raise ApiError.bad_request(f"{key} must be a non-negative number")
                if key == collector:
                    self.emulator.store.garbage_collection_delay = float(value)
                    continue
                setattr(
                    self.emulator.config,
                    fields[key],
                    int(value) if key == "podsPerRevision" else float(value),
                )
        return self.config()

    def revisions(self, ns: str, name: str, **_: Any) -> JsonObject:
        return {
            "namespace": ns,
            "inferenceService": name,
            "revisionCount": self.emulator.revision_count(ns, name),
            "items": self.emulator.revisions(ns, name),
        }

    def all_revisions(self, **_: Any) -> JsonObject:
        with self.emulator.lock:
            items = []
            for isvc in self.emulator.store.iter_stored(r.INFERENCESERVICES):
                ns, name = isvc["metadata"]["namespace"], isvc["metadata"]["name"]
                for revision in self.emulator.kserve.revisions(ns, name):
                    items.append({"namespace": ns, "inferenceService": name, **revision})
            total = self.emulator.kserve.revisions_created_total
        return {"revisionsCreatedTotal": total, "items": items}

    def ksvc(self, ns: str, name: str, **_: Any) -> JsonObject:
        ksvc = self.emulator.knative_service(ns, name)
        if ksvc is None:
            raise ApiError.not_found("services.serving.knative.dev", f"{name}-predictor")
        return ksvc

    def isvc_behaviour(self, ns: str, name: str, body: JsonObject, **_: Any) -> JsonObject:
        behaviour = RevisionBehaviour.from_json(body, self.emulator.config.default_behaviour())
        self.emulator.set_default_behaviour(ns, name, behaviour)
        return {"namespace": ns, "inferenceService": name, "behaviour": behaviour.to_json()}

    def reset_isvc_behaviour(self, ns: str, name: str, **_: Any) -> JsonObject:
        self.emulator.set_default_behaviour(ns, name, None)
        return {"namespace": ns, "inferenceService": name, "behaviour": None}

    def revision_behaviour(self, ns: str, rev: str, body: JsonObject, **_: Any) -> JsonObject:
        behaviour = RevisionBehaviour.from_json(body, self.emulator.config.default_behaviour())
        exists = self.emulator.set_revision_behaviour(ns, rev, behaviour)
        return {"namespace": ns, "revision": rev, "applied": "now" if exists else "on-creation",
                "behaviour": behaviour.to_json()}  # fmt: skip

    def revision_state(self, ns: str, rev: str, body: JsonObject, **_: Any) -> JsonObject:
        try:
            state = RevisionState(str(body.get("state")))
        except ValueError:
            raise ApiError.bad_request('"state" must be one of Ready, Failed, Pending') from None
        self.emulator.set_revision_state(ns, rev, state, str(body.get("message", "")))
        return {"namespace": ns, "revision": rev, "state": state.value}

    def requests(self, query: dict[str, str], **_: Any) -> JsonObject:
        since = int(query.get("since") or 0)
        entries = self.emulator.requests.entries(query.get("method"), query.get("path"), since)
        return {"items": [entry.to_json() for entry in entries]}

    def clear_requests(self, **_: Any) -> JsonObject:
        self.emulator.requests.clear()
        return {"cleared": True}

    def faults(self, **_: Any) -> JsonObject:
        return {"items": [fault.to_json() for fault in self.emulator.faults.active()]}

    def add_fault(self, body: JsonObject, **_: Any) -> JsonObject:
        return self.emulator.faults.add_from_json(body).to_json()

    def clear_faults(self, **_: Any) -> JsonObject:
        self.emulator.faults.clear()
        return {"cleared": True}

    def remove_fault(self, id: str, **_: Any) -> JsonObject:
        if not self.emulator.faults.remove(int(id)):
            raise ApiError(404, f"fault {id} not found", reason="NotFound")
        return {"removed": int(id)}


class EmulatorServer:
    """The emulator served over HTTP on ``host:port`` (port 0: any free port); a context manager.

    ``aggregated_discovery=False`` makes ``kubectl`` fall back to per-group discovery documents.
    ``bookmark_interval`` is in real seconds, for watches that ask for bookmarks.
    """

    def __init__(
        self,
        emulator: Emulator | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        aggregated_discovery: bool = True,
        bookmark_interval: float = 10.0,
    ) -> None:
        self.emulator = emulator or Emulator()
        self.host = host
        self.port = port
        self.aggregated_discovery = aggregated_discovery
        self.bookmark_interval = bookmark_interval
        self.stopping = threading.Event()
        # Bearer token -> the username a SelfSubjectReview answers; kubeconfig(user=...) adds one.
        self.tokens: dict[str, str] = {DEFAULT_TOKEN: DEFAULT_USER}
        self._http: _HttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("the emulator server is not started")
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> EmulatorServer:
        if self._http is not None:
            return self
        self.stopping.clear()
        self._http = _HttpServer((self.host, self.port), self)
        # A short poll interval makes stop() quick (shutdown waits for the serving loop to notice).
        self._thread = threading.Thread(
            target=self._http.serve_forever, args=(0.02,), name="emulator-http", daemon=True
        )
        self._thread.start()
        self.emulator.start()
        return self

    def stop(self) -> None:
        if self._http is None:
            return
        self.stopping.set()
        self.emulator.stop()  # closes open watches, so their handler threads finish
        self._http.shutdown()
        self._http.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._http = None
        self._thread = None

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    def admin_client(self) -> EmulatorAdminClient:
        """A client for this server's admin API (what another process would use)."""
        return EmulatorAdminClient(self.url)

    def kubeconfig(
        self, namespace: str = "default", context: str = "kserve-canary-emulator", *, user: str | None = None
    ) -> JsonObject:
        """A kubeconfig authenticating as :data:`DEFAULT_USER`, or as ``user`` (a token of its own, which
        a SelfSubjectReview answers with that name; the kubeconfig's user entry is named after it)."""
        token, entry = DEFAULT_TOKEN, context
        if user is not None:
            token, entry = f"{DEFAULT_TOKEN}-{len(self.tokens)}", user
            self.tokens[token] = user
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": entry, "user": {"token": token}}],
            "contexts": [
                {"name": context, "context": {"cluster": context, "user": entry, "namespace": namespace}}
            ],
            "current-context": context,
            "preferences": {},
        }

    def write_kubeconfig(
        self, path: Path | str, namespace: str = "default", *, user: str | None = None
    ) -> Path:
        """Write a kubeconfig for the ``kubernetes`` client and ``kubectl``; returns the path."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        document = self.kubeconfig(namespace, user=user)
        target.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        return target
