"""Which rollout a command means, the way kubectl reads it: ``NAME`` in the namespace of ``-n`` or of
the kubeconfig's context (else ``default``), or ``NAMESPACE/NAME``; and, for a name nobody knows, the
names it may have meant.

Imported by the cluster commands only.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path

import typer
from kubernetes import config

__all__ = ["context_namespace", "resolve_target", "suggestions"]

# Where a pod finds its own namespace (the in-cluster default, as kubectl uses it).
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_DEFAULT_KUBECONFIG = Path("~/.kube/config")


def resolve_target(
    target: str, namespace: str | None, kubeconfig: str | None, context: str | None
) -> tuple[str, str]:
    """``(namespace, name)`` of ``target``: ``NAMESPACE/NAME``, or ``NAME`` in ``-n``'s namespace, else
    the context's, else ``default``. A ``NAMESPACE/`` that contradicts ``-n`` is a usage error."""
    written, separator, name = target.partition("/")
    if not separator:
        if not target:
            raise typer.BadParameter("expected NAME or NAMESPACE/NAME, got ''", param_hint="NAME")
        return namespace or context_namespace(kubeconfig, context) or "default", target
    if not written or not name or "/" in name:
        raise typer.BadParameter(f"expected NAME or NAMESPACE/NAME, got {target!r}", param_hint="NAME")
    if namespace is not None and namespace != written:
        raise typer.BadParameter(
            f"{target!r} names namespace {written}, but -n says {namespace}: give one of them",
            param_hint="NAME",
        )
    return written, name


def context_namespace(kubeconfig: str | None, context: str | None) -> str | None:
    """The namespace the kubeconfig's context (or the pod) sets, or None when none is set.

    The same files as :func:`canary.cli.cluster.api_client`: ``kubeconfig`` (several joined by ':'),
    in a pod its own namespace, else ``~/.kube/config``. A kubeconfig that cannot be read sets nothing:
    the client reports it when it connects.
    """
    if not kubeconfig and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
        except OSError:
            return None
    path = kubeconfig or str(_DEFAULT_KUBECONFIG.expanduser())
    try:
        contexts, active = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    except (config.ConfigException, OSError, ValueError, TypeError):
        return None
    chosen = active if context is None else next((c for c in contexts if c.get("name") == context), None)
    namespace = ((chosen or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else None


def suggestions(namespace: str, name: str, known: Iterable[tuple[str, str]]) -> list[str]:
    """The known rollouts ``namespace/name`` may have meant: close names in its namespace, and the same
    name in other namespaces. At most three, closest first."""
    known = list(known)
    here = [other for ns, other in known if ns == namespace]
    close = [f"{namespace}/{other}" for other in difflib.get_close_matches(name, here, n=3, cutoff=0.6)]
    elsewhere = sorted(f"{ns}/{other}" for ns, other in known if other == name and ns != namespace)
    return (close + elsewhere)[:3]
