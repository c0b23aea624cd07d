"""What failed and what to do, in one or two lines, with the documented exit code.

Imported only when a command fails (:class:`canary.cli.help.CanaryGroup`): it looks at the
Kubernetes client's, urllib3's and requests' exceptions by their modules, so nothing here imports
them.
"""

from __future__ import annotations

import json
import re

from canary.cli.exit_codes import EXIT_REFUSED, EXIT_UNREACHABLE

__all__ = ["ClusterUnreachable", "NoKubeconfig", "describe"]

DEBUG_HINT = "run with --debug for the traceback"


class NoKubeconfig(Exception):
    """No kubeconfig to reach a cluster with (none given, none found, not in a pod)."""


class ClusterUnreachable(Exception):
    """The API server did not answer."""


def _errno_text(error: BaseException) -> str:
    """``[Errno 111] Connection refused`` out of urllib3's long messages, else the message itself."""
    text = str(error)
    found = re.search(r"\[Errno -?\d+\] [^'\")]+", text)
    if found:
        return found.group(0).strip()
    if "timed out" in text.lower():
        return "timed out"
    return text.rsplit(": ", 1)[-1] if ": " in text else text or type(error).__name__


def _server_message(error: BaseException) -> str:
    body = getattr(error, "body", None)
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, AttributeError):
            message = None
        if message:
            return str(message)
    return f"{getattr(error, 'status', '?')} {getattr(error, 'reason', '') or ''}".strip()


def describe(error: BaseException) -> tuple[int, list[str]]:
    """The exit code and the lines to print for ``error``."""
    module = type(error).__module__ or ""
    name = type(error).__name__
    if isinstance(error, NoKubeconfig) or name == "ConfigException":
        return EXIT_UNREACHABLE, [
            f"error: no usable kubeconfig: {error}",
            "Set KUBECONFIG or pass --kubeconfig FILE (kubectl config view shows what is configured).",
        ]
    if isinstance(error, ClusterUnreachable):
        return EXIT_UNREACHABLE, [f"error: {error}", "Is this the right cluster (kubectl cluster-info)?"]
    if module.startswith("urllib3") or isinstance(error, ConnectionError | TimeoutError):
        pool = getattr(error, "pool", None)
        where = f" at {pool.scheme}://{pool.host}:{pool.port}" if pool is not None else ""
        reason = getattr(error, "reason", None) or error
        return EXIT_UNREACHABLE, [
            f"error: cannot reach the Kubernetes API server{where}: {_errno_text(reason)}",
            f"Is the cluster up and is this the right context (kubectl cluster-info)? {DEBUG_HINT}.",
        ]
    if module.startswith("requests"):
        request = getattr(error, "request", None)
        url = getattr(request, "url", None)
        return EXIT_UNREACHABLE, [
            f"error: cannot reach Prometheus{f' at {url}' if url else ''}: {_errno_text(error)}",
            f"Check --prometheus-url; {DEBUG_HINT}.",
        ]
    # The client raises subclasses (ServiceException for 5xx, ForbiddenException, ...): look at the MRO.
    if any(kind.__name__ == "ApiException" for kind in type(error).__mro__) and module.startswith(
        "kubernetes"
    ):
        status = int(getattr(error, "status", 0) or 0)
        message = _server_message(error)
        if status == 401:
            return EXIT_REFUSED, [
                f"error: the API server did not accept your credentials: {message}",
                "Log in again (your kubeconfig's token or certificate may have expired).",
            ]
        if status == 403:
            return EXIT_REFUSED, [
                f"error: forbidden: {message}",
                "Ask for the kserve-canary-viewer (status, explain) or kserve-canary-operator "
                "(commands) role in that namespace.",
            ]
        if status >= 500 or status == 0:
            return EXIT_UNREACHABLE, [f"error: the API server failed: {message}", DEBUG_HINT.capitalize()]
        return EXIT_REFUSED, [f"error: the API server answered: {message}"]
    if isinstance(error, OSError):
        return EXIT_REFUSED, [f"error: {error}"]
    return EXIT_REFUSED, [
        f"error: unexpected {name}: {error}",
        f"This is a bug in kserve-canary: {DEBUG_HINT} and report it.",
    ]
