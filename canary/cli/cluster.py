"""The Kubernetes API client of the CLI's cluster commands, from the person's kubeconfig.

Imported by the commands that talk to a cluster, never at start-up: the Kubernetes client alone
takes a third of a second to import.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from canary import __version__
from canary.cli.failures import NoKubeconfig

__all__ = ["api_client", "get_json"]

_DEFAULT = Path("~/.kube/config")


def api_client(kubeconfig: str | None, context: str | None = None) -> client.ApiClient:
    """A client for ``kubeconfig`` (a file, or several joined by ':' as in KUBECONFIG) and ``context``;
    without a kubeconfig, the pod's service account, else ~/.kube/config.

    Raises :class:`NoKubeconfig` when there is none, and the client's ConfigException for one it
    cannot use. A connection that fails is not retried: a person is waiting, and kubectl does not.
    """
    configuration = client.Configuration()
    if kubeconfig:
        files = [part for part in kubeconfig.split(os.pathsep) if part]
        missing = [part for part in files if not Path(part).expanduser().exists()]
        if missing and len(missing) == len(files):
            raise NoKubeconfig(f"{', '.join(missing)} does not exist")
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    elif context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    elif _DEFAULT.expanduser().exists():
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(_DEFAULT.expanduser()), context=context, client_configuration=configuration
        )
    else:
        raise NoKubeconfig("KUBECONFIG is not set, ~/.kube/config does not exist and this is not a pod")
    configuration.retries = 0
    api = client.ApiClient(configuration)
    api.user_agent = f"kserve-canary/{__version__}"
    return api


def get_json(
    api: client.ApiClient, path: str, query: dict[str, str] | None = None, *, timeout: float = 10.0
) -> dict[str, Any]:
    """``GET path`` as the API's JSON, through ``api``'s authentication and TLS settings.

    Not through the generated API classes: importing ``CoreV1Api`` builds several hundred pydantic
    models (about half a second), and ``status`` has to answer within a second. Raises the client's
    ApiException for an answer that is not 2xx, as the generated methods do.
    """
    method, url, headers, _body, _post = api.param_serialize(
        "GET",
        path,
        query_params=list((query or {}).items()),
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, header_params=headers, _request_timeout=timeout)
    response.read()  # type: ignore[no-untyped-call]
    text = response.data.decode("utf-8", "replace") if response.data else ""
    if not 200 <= response.status <= 299:
        raise ApiException.from_response(http_resp=response, body=text, data=None)
    document: dict[str, Any] = json.loads(text)
    return document
