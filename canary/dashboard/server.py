"""``kserve-canary dashboard``: a local web UI over the rollouts, with the user's own kubeconfig.

It acts with the user's credentials, so no other web page may read or drive it (docs/dashboard.md,
"Security"):

* it binds 127.0.0.1 unless told otherwise;
* every request carries a random token (``secrets.token_urlsafe(32)``), compared in constant time:
  the page by ``?token=`` once (answered with an HttpOnly, SameSite=Strict cookie and a redirect that
  takes the token out of the address bar) or that cookie; the API only by the ``X-Dashboard-Token``
  header, which the page's own script sets and no cross-origin form or image can. A cookie alone
  never reaches the API: cookies are not separated by port, so a page on another local port is
  "same-site" and its requests would carry it;
* ``Host`` must name the dashboard itself (a DNS-rebinding page has its own name there);
* a POST must come from the dashboard's own ``Origin`` (when the browser says one),
  with ``Content-Type: application/json`` (a cross-origin one needs a preflight, which is refused),
  and ``Sec-Fetch-Site`` (when sent) must be ``same-origin`` for the API;
* no CORS header is ever sent; ``Content-Security-Policy: default-src 'self'`` and
  ``X-Frame-Options: DENY`` on every answer; the request log never shows the token.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import json
import re
import secrets
import signal
import socket
import sys
import threading
import webbrowser
from collections.abc import Callable
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from types import FrameType, TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from canary import __version__
from canary.dashboard.actions import UNSET, ActionResult, Unset, perform_action
from canary.dashboard.views import EvaluationLog, PrometheusSeries, rollout_detail, rollout_row
from canary.kserve.admitted import list_states
from canary.kserve.store import ConfigMapStateStore, StoredState
from canary.rollout.state import CommandKind

__all__ = ["TOKEN_HEADER", "Dashboard", "run_dashboard"]

TOKEN_HEADER = "X-Dashboard-Token"  # noqa: S105 - a header name, not a secret
_NAME = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_MAX_BODY = 16 * 1024
_STATIC = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
}
_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def _is_dns_label(text: str) -> bool:
    return len(text) <= 63 and re.fullmatch(_NAME, text) is not None


def _static(name: str) -> bytes:
    return resources.files("canary.dashboard").joinpath("static", name).read_bytes()


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a POST waiting for the controller must not hold up Ctrl-C
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], dashboard: Dashboard, family: int) -> None:
        self.address_family = family
        self.dashboard = dashboard
        super().__init__(address, _Handler)


class Dashboard:
    """The dashboard's HTTP server, in-process: ``start()``, ``url``, ``token``, ``stop()``."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        kubeconfig: str | None = None,
        namespaces: list[str] | None = None,
        address: str = "127.0.0.1",
        port: int = 0,
        prometheus_url: str | None = None,
        command_wait: float = 90.0,
        token: str | None = None,
    ) -> None:
        self.api_client = api_client
        self.kubeconfig = kubeconfig
        self.namespaces = sorted(set(namespaces or []))
        self.address = address
        self.requested_port = port
        self.command_wait = command_wait
        self.token = token or secrets.token_urlsafe(32)
        self.store = ConfigMapStateStore(api_client)
        self.log = EvaluationLog()
        self.prometheus = PrometheusSeries(prometheus_url) if prometheus_url else None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._allowed_hosts: frozenset[str] = frozenset()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Dashboard:
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        self._server = _Server((self.address, self.requested_port), self, family)
        # Once, not per request: for a wildcard address it asks the resolver for the machine's names.
        self._allowed_hosts = self._hosts()
        self._thread = threading.Thread(target=self._server.serve_forever, name="dashboard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._server = None
        self._thread = None

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the dashboard is not started")
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        """The address as it goes into a URL (``[::1]`` for IPv6)."""
        return f"[{self.address}]" if ":" in self.address else self.address

    @property
    def origin(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The URL to open: the page with the token."""
        return f"{self.origin}/?token={self.token}"

    @property
    def cookie_name(self) -> str:
        # Cookies are shared by every port of a host: one dashboard's must not replace another's.
        return f"kserve_canary_dashboard_{self.port}"

    def allowed_hosts(self) -> frozenset[str]:
        """The ``Host`` values that name this dashboard: its address, and the loopback names."""
        return self._allowed_hosts

    def _hosts(self) -> frozenset[str]:
        port = self.port
        names = {self.host, "localhost", "127.0.0.1", "[::1]"}
        try:
            wildcard = ipaddress.ip_address(self.address).is_unspecified
        except ValueError:
            wildcard = False
        if wildcard:
            # Bound to every interface on purpose: the machine's own names reach it too.
            names |= {socket.gethostname(), socket.getfqdn()}
        return frozenset(f"{name}:{port}".lower() for name in names)

    def token_matches(self, candidate: str | None) -> bool:
        return candidate is not None and hmac.compare_digest(candidate.encode(), self.token.encode())

    # -- data -----------------------------------------------------------------------------------

    def in_scope(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces

    def list_states(self) -> list[StoredState]:
        # Listed as the controller lists them (bounded pages, only what it wrote), so that anyone's
        # large ConfigMaps labelled as ours cost the dashboard no more memory than the controller.
        scopes: list[str | None] = list(self.namespaces) or [None]
        found = [
            stored
            for scope in scopes
            for stored in list_states(self.api_client, scope, ignored=_not_shown, timeout=10.0)
        ]
        return sorted(found, key=lambda stored: stored.key)

    def rollouts(self) -> list[dict[str, Any]]:
        rows = []
        for stored in self.list_states():
            # An unreadable explain.json is left out; the detail view says why.
            with contextlib.suppress(ValueError):
                self.log.record(stored.key, stored.explain())
            rows.append(rollout_row(stored))
        return rows

    def rollout(self, namespace: str, name: str) -> dict[str, Any] | None:
        stored = self.store.load(namespace, name)
        if stored.state_json is None and stored.resource_version is None:
            return None
        return rollout_detail(stored, self.log, self.prometheus)

    def act(
        self,
        namespace: str,
        name: str,
        kind: CommandKind,
        *,
        seen_revision: str | Unset | None,
        seen_step: int | Unset | None,
        reason: str | None,
    ) -> ActionResult:
        return perform_action(
            self.api_client,
            self.kubeconfig,
            namespace,
            name,
            kind,
            seen_revision=seen_revision,
            seen_step=seen_step,
            reason=reason,
            wait=self.command_wait,
        )


class _Refusal(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = f"kserve-canary-dashboard/{__version__}"
    sys_version = ""
    protocol_version = "HTTP/1.1"

    @property
    def dashboard(self) -> Dashboard:
        return self.server.dashboard

    # -- logging: never the query string (the token) ----------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        return

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        return

    # -- answers --------------------------------------------------------------------------------

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        extra: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        for header, value in {**_SECURITY_HEADERS, **(extra or {})}.items():
            self.send_header(header, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, document: object) -> None:
        self._send(status, json.dumps(document).encode(), "application/json; charset=utf-8")

    def _refuse(self, refusal: _Refusal) -> None:
        # A refused request's body may be unread: the connection cannot carry another request.
        self.close_connection = True
        self._send(
            refusal.status,
            json.dumps({"error": refusal.message}).encode(),
            "application/json; charset=utf-8",
            {"Connection": "close"},
        )

    # -- checks ---------------------------------------------------------------------------------

    def _check_host(self) -> None:
        host = (self.headers.get("Host") or "").strip().lower()
        if host not in self.dashboard.allowed_hosts():
            raise _Refusal(HTTPStatus.FORBIDDEN, "Host does not name this dashboard (DNS rebinding?)")

    def _cookie_token(self) -> str | None:
        raw = self.headers.get("Cookie")
        if not raw:
            return None
        try:
            jar: SimpleCookie = SimpleCookie(raw)
        except CookieError:
            return None
        morsel = jar.get(self.dashboard.cookie_name)
        return morsel.value if morsel is not None else None

    def _check_api_request(self) -> None:
        if not self.dashboard.token_matches(self.headers.get(TOKEN_HEADER)):
            raise _Refusal(HTTPStatus.UNAUTHORIZED, f"the API needs the dashboard's token in {TOKEN_HEADER}")
        fetch_site = self.headers.get("Sec-Fetch-Site")
        if fetch_site is not None and fetch_site != "same-origin":
            raise _Refusal(HTTPStatus.FORBIDDEN, f"a request from another site ({fetch_site}) is refused")

    def _check_origin(self) -> None:
        origin = self.headers.get("Origin")
        if origin is None:
            return  # not a browser (curl, a test): the token header is the proof
        parts = urlsplit(origin)
        if parts.scheme != "http" or (parts.netloc or "").lower() not in self.dashboard.allowed_hosts():
            raise _Refusal(HTTPStatus.FORBIDDEN, f"a request from origin {origin!r} is refused")

    # -- methods --------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._guarded(self._get)

    def do_POST(self) -> None:
        self._guarded(self._check_origin, self._post)

    def _guarded(self, *steps: Callable[[], None]) -> None:
        try:
            self._check_host()
            for step in steps:
                step()
        except _Refusal as refusal:
            self._refuse(refusal)
        except Exception as error:
            # The API server unreachable, a timeout: the page says so and keeps polling.
            self._refuse(_Refusal(HTTPStatus.BAD_GATEWAY, f"{type(error).__name__}: {error}"[:500]))

    def _not_allowed(self) -> None:
        # OPTIONS included: a CORS preflight gets no Access-Control-* header, so the browser stops.
        self._refuse(_Refusal(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not allowed"))

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

    def _get(self) -> None:
        parts = urlsplit(self.path)
        path = parts.path
        if path == "/":
            query = parse_qs(parts.query)
            from_query = query["token"][0] if query.get("token") else None
            if from_query is not None:
                if not self.dashboard.token_matches(from_query):
                    raise _Refusal(HTTPStatus.UNAUTHORIZED, "wrong token: use the URL the dashboard printed")
                cookie = (
                    f"{self.dashboard.cookie_name}={self.dashboard.token}; Path=/; HttpOnly; SameSite=Strict"
                )
                # The token leaves the address bar (and the history's later entries).
                self._send(HTTPStatus.SEE_OTHER, b"", "text/plain", {"Location": "/", "Set-Cookie": cookie})
                return
            if not self.dashboard.token_matches(self._cookie_token()):
                raise _Refusal(HTTPStatus.UNAUTHORIZED, "no token: open the URL the dashboard printed")
            page = _static("index.html").replace(b"{{TOKEN}}", self.dashboard.token.encode())
            self._send(HTTPStatus.OK, page, "text/html; charset=utf-8")
            return
        if path.startswith("/static/"):
            name = path.removeprefix("/static/")
            if name not in _STATIC:
                raise _Refusal(HTTPStatus.NOT_FOUND, "no such file")
            if not self.dashboard.token_matches(self._cookie_token()):
                raise _Refusal(HTTPStatus.UNAUTHORIZED, "no token")
            self._send(HTTPStatus.OK, _static(name), _STATIC[name])
            return
        if path.startswith("/api/"):
            self._check_api_request()
            self._api_get(path)
            return
        raise _Refusal(HTTPStatus.NOT_FOUND, "not found")

    def _target(self, segments: list[str]) -> tuple[str, str]:
        namespace, name = segments[0], segments[1]
        if not _is_dns_label(namespace) or not _is_dns_label(name):
            raise _Refusal(HTTPStatus.NOT_FOUND, "not a namespace/name")
        if not self.dashboard.in_scope(namespace):
            raise _Refusal(HTTPStatus.NOT_FOUND, f"namespace {namespace} is not shown by this dashboard")
        return namespace, name

    def _api_get(self, path: str) -> None:
        segments = [segment for segment in path.split("/")[2:] if segment]
        try:
            if segments == ["rollouts"]:
                self._json(
                    HTTPStatus.OK,
                    {
                        "rollouts": self.dashboard.rollouts(),
                        "namespaces": self.dashboard.namespaces,
                    },
                )
                return
            if len(segments) == 3 and segments[0] == "rollouts":
                namespace, name = self._target(segments[1:])
                detail = self.dashboard.rollout(namespace, name)
                if detail is None:
                    raise _Refusal(HTTPStatus.NOT_FOUND, f"no rollout state for {namespace}/{name}")
                self._json(HTTPStatus.OK, detail)
                return
        except ApiException as error:
            self._json(
                HTTPStatus.BAD_GATEWAY,
                {"error": f"the API server answered {error.status} {error.reason}", "status": error.status},
            )
            return
        raise _Refusal(HTTPStatus.NOT_FOUND, "not found")

    def _post(self) -> None:
        path = urlsplit(self.path).path
        if not path.startswith("/api/"):
            raise _Refusal(HTTPStatus.NOT_FOUND, "not found")
        self._check_api_request()
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if content_type != "application/json":
            raise _Refusal(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "an action is a JSON body (application/json)")
        segments = [segment for segment in path.split("/")[2:] if segment]
        if len(segments) != 4 or segments[0] != "rollouts":
            raise _Refusal(HTTPStatus.NOT_FOUND, "not found")
        namespace, name = self._target(segments[1:3])
        try:
            kind = CommandKind(segments[3])
        except ValueError:
            raise _Refusal(HTTPStatus.NOT_FOUND, f"no action {segments[3]!r}") from None
        body = self._body()
        reason = body.get("reason")
        if reason is not None and not isinstance(reason, str):
            raise _Refusal(HTTPStatus.BAD_REQUEST, "reason must be a string")
        seen_revision: str | Unset | None = UNSET
        if "revision" in body:
            if body["revision"] is not None and not isinstance(body["revision"], str):
                raise _Refusal(HTTPStatus.BAD_REQUEST, "revision must be a string or null")
            seen_revision = body["revision"]
        seen_step: int | Unset | None = UNSET
        if "step" in body:
            step = body["step"]
            if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
                raise _Refusal(HTTPStatus.BAD_REQUEST, "step must be an integer (0-based) or null")
            seen_step = step
        result = self.dashboard.act(
            namespace,
            name,
            kind,
            seen_revision=seen_revision,
            seen_step=seen_step,
            reason=(reason or None) and reason[:200],
        )
        self._json(result.http_status, result.to_dict())

    def _body(self) -> dict[str, Any]:
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            raise _Refusal(HTTPStatus.BAD_REQUEST, "bad Content-Length") from None
        if length < 0 or length > _MAX_BODY:
            raise _Refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "the body is too large")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            document = json.loads(raw)
        except ValueError:
            raise _Refusal(HTTPStatus.BAD_REQUEST, "the body is not JSON") from None
        if not isinstance(document, dict):
            raise _Refusal(HTTPStatus.BAD_REQUEST, "the body is not a JSON object")
        return document


def load_client(kubeconfig: str | None, context: str | None) -> client.ApiClient:
    """The user's kubeconfig (the given file, else $KUBECONFIG or ~/.kube/config), at ``context``."""
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context
    )
    api.user_agent = f"kserve-canary-dashboard/{__version__}"
    return api


def run_dashboard(
    *,
    kubeconfig: str | None,
    context: str | None,
    namespaces: list[str],
    address: str = "127.0.0.1",
    port: int = 0,
    open_browser: bool = False,
    prometheus_url: str | None = None,
    command_wait: float = 90.0,
    out: Callable[[str], None] = print,
) -> int:
    """Serve the dashboard until Ctrl-C (exit 0); 1 when the kubeconfig or the address is unusable."""
    try:
        api = load_client(kubeconfig, context)
    except (config.ConfigException, OSError) as error:
        print(f"dashboard: cannot load the kubeconfig: {error}", file=sys.stderr)
        return 1
    dashboard = Dashboard(
        api,
        kubeconfig=kubeconfig,
        namespaces=namespaces,
        address=address,
        port=port,
        prometheus_url=prometheus_url,
        command_wait=command_wait,
    )
    try:
        dashboard.start()
    except OSError as error:
        print(f"dashboard: cannot listen on {address}:{port}: {error}", file=sys.stderr)
        return 1
    stopping = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopping.set()

    previous = signal.signal(signal.SIGTERM, stop)
    out(f"Dashboard: {dashboard.url}")
    if open_browser:
        webbrowser.open(dashboard.url)
    try:
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        dashboard.stop()
    return 0


def _not_shown(namespace: str, name: str, reason: str) -> None:
    """A ConfigMap labelled as ours that the controller did not write: not a rollout, not shown (the
    controller logs and counts it)."""
