"""Before the controller starts: the inputs it cannot run without, checked up front.

Each problem is one line on stderr — which input, what is wrong with it, what to do — and exit code
:data:`EXIT_USAGE` (2, a usage or configuration error), never a traceback. Checked:

* the Prometheus URL: an ``http://`` or ``https://`` scheme, a host, a valid port, IPv6 in brackets
  (credentials in it are never echoed);
* the metrics port (``/metrics``, ``/healthz``, ``/readyz``): a port number, and free to bind;
* the Kubernetes configuration: the kubeconfig named by ``--kubeconfig``/``KUBECONFIG`` exists, is
  not empty, is YAML and loads; without one, the in-cluster service account or ``~/.kube/config``.

Only syntax and local resources are checked: an unreachable Prometheus or API server is not a
startup error (the controller starts, reports not-ready and holds rollouts until they answer).
"""

from __future__ import annotations

import errno
import os
import re
import socket
import sys
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import yaml
from kubernetes import client

from canary.controller.runtime import load_api_client

__all__ = [
    "EXIT_USAGE",
    "StartupError",
    "check_metrics_port",
    "check_prometheus_url",
    "load_kubernetes",
    "preflight",
    "preflight_or_exit",
]

EXIT_USAGE = 2  # a usage or configuration error: fix the input, restarting will not help

KUBECONFIG_INPUT = "--kubeconfig (KUBECONFIG)"
PROMETHEUS_INPUT = "--prometheus-url (PROMETHEUS_URL)"
METRICS_PORT_INPUT = "--metrics-port (METRICS_PORT)"
_IN_CLUSTER_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


class StartupError(Exception):
    """An input the controller cannot start with; the message is the one line shown."""


def preflight(
    *,
    kubeconfig: str | None,
    prometheus_url: str,
    metrics_port: int,
    metrics_host: str = "0.0.0.0",  # noqa: S104
) -> client.ApiClient:
    """Check every input; return the Kubernetes API client (loaded once, here). Raises StartupError."""
    check_prometheus_url(prometheus_url)
    check_metrics_port(metrics_port, metrics_host)
    return load_kubernetes(kubeconfig)


def preflight_or_exit(
    *,
    kubeconfig: str | None,
    prometheus_url: str,
    metrics_port: int,
    metrics_host: str = "0.0.0.0",  # noqa: S104
) -> client.ApiClient:
    """:func:`preflight`, or one line on stderr and exit code 2."""
    try:
        return preflight(
            kubeconfig=kubeconfig,
            prometheus_url=prometheus_url,
            metrics_port=metrics_port,
            metrics_host=metrics_host,
        )
    except StartupError as error:
        _fail(str(error))


def _fail(message: str) -> NoReturn:
    sys.stderr.write(f"kserve-canary: cannot start: {_one_line(message)}\n")
    sys.stderr.flush()
    raise SystemExit(EXIT_USAGE)


# -- Prometheus ---------------------------------------------------------------------------------


def _masked(url: str) -> str:
    """``url`` with any ``user:password@`` replaced: it is shown in the message."""
    return re.sub(r"//[^/?#]*@", "//***@", url)


def check_prometheus_url(url: str) -> None:
    shown = _masked(url)
    if not url.startswith(("http://", "https://")):
        rest = url.split("://", 1)[-1]
        raise StartupError(
            f"{PROMETHEUS_INPUT} {shown!r} has no http:// or https:// scheme: write it as "
            f"http://{_masked('//' + rest)[2:]} (or https://...)"
        )
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port that is not one
    except ValueError as error:
        if "IPv6" in str(error):
            raise StartupError(
                f"{PROMETHEUS_INPUT} {shown!r} is not a valid URL (Invalid IPv6 URL): an IPv6 address goes "
                "in brackets with the port after them, e.g. http://[::1]:9090"
            ) from None
        raise StartupError(
            f"{PROMETHEUS_INPUT} {shown!r} has an invalid port ({error}): use a number 1-65535, "
            "e.g. http://prometheus.monitoring:9090"
        ) from None
    if not host:
        raise StartupError(
            f"{PROMETHEUS_INPUT} {shown!r} has no host: e.g. http://prometheus-operated.monitoring.svc:9090"
        )


# -- the metrics port ---------------------------------------------------------------------------


def check_metrics_port(port: int, host: str = "0.0.0.0") -> None:  # noqa: S104 - the probes' default
    """The port the health server will bind (a negative port turns it off)."""
    if port < 0:
        return
    if port > 65535:
        raise StartupError(
            f"{METRICS_PORT_INPUT} {port} is not a port: use 0-65535 (or -1 to serve no /metrics and probes)"
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server binds it
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                why = "is already in use (another kserve-canary, or another process?)"
                todo = "stop that process or choose a free port"
            elif error.errno == errno.EACCES:
                why = "needs privileges to bind"
                todo = "choose a port above 1023"
            else:
                why = f"cannot be bound ({error.strerror or error})"
                todo = "choose another port"
            raise StartupError(f"{METRICS_PORT_INPUT} {port} on {host} {why}: {todo}") from None


# -- Kubernetes ---------------------------------------------------------------------------------


def load_kubernetes(kubeconfig: str | None) -> client.ApiClient:
    """The API client of ``kubeconfig`` (a path, or several joined by ``os.pathsep`` as KUBECONFIG
    allows), else the in-cluster service account, else ``~/.kube/config``; or a StartupError."""
    if kubeconfig:
        for path in filter(None, kubeconfig.split(os.pathsep)):
            _check_kubeconfig_file(Path(path).expanduser(), KUBECONFIG_INPUT)
        return _load(kubeconfig, kubeconfig)
    default = Path("~/.kube/config").expanduser()
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and _IN_CLUSTER_TOKEN.exists()
    if not in_cluster:
        if not default.exists():
            raise StartupError(
                f"no Kubernetes configuration: not running in-cluster (no service account token at "
                f"{_IN_CLUSTER_TOKEN}) and {default} does not exist: pass {KUBECONFIG_INPUT} naming a "
                "kubeconfig file"
            )
        _check_kubeconfig_file(default, "the default kubeconfig")
    return _load(None, str(default))


def _check_kubeconfig_file(path: Path, source: str) -> None:
    todo = (
        f"pass {KUBECONFIG_INPUT} naming a kubeconfig file, or neither to use the in-cluster service account"
    )
    if not path.exists():
        raise StartupError(f"{source} {path} does not exist: {todo}")
    if path.is_dir():
        raise StartupError(f"{source} {path} is a directory, not a kubeconfig file: {todo}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise StartupError(f"{source} {path} cannot be read ({_reason(error)}): {todo}") from None
    if not text.strip():
        raise StartupError(f"{source} {path} is empty: {todo}")
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise StartupError(
            f"{source} {path} is not a usable kubeconfig: not YAML ({problem}{line})"
        ) from None
    if not isinstance(document, dict):
        raise StartupError(
            f"{source} {path} is not a usable kubeconfig: expected a mapping with clusters, users, contexts "
            f"and current-context, got {type(document).__name__}"
        )


def _load(kubeconfig: str | None, shown: str) -> client.ApiClient:
    try:
        return load_api_client(kubeconfig)
    except Exception as error:  # ConfigException, and whatever a broken file makes the loader raise
        source = KUBECONFIG_INPUT if kubeconfig else "the Kubernetes configuration"
        raise StartupError(
            f"{source} {shown} is not a usable kubeconfig ({_reason(error)}): check it with "
            "`kubectl config view`"
        ) from None


def _reason(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return _one_line(text)[:300]


def _one_line(text: str) -> str:
    return " ".join(text.split())
