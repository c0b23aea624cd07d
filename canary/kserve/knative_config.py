"""The cluster's Knative progress deadline, read from ``knative-serving/config-deployment``.

Knative applies ``progress-deadline`` (or the legacy ``progressDeadline``) of that ConfigMap to every
revision without a ``serving.knative.dev/progress-deadline`` annotation, and 600 s when neither is
set (knative/serving pkg/deployment/config.go ``NewConfigFromMap``). The controller reads it with
``get`` on that one ConfigMap (RBAC: a Role in ``knative-serving`` naming it); when the read is
refused, finds nothing or fails, Knative's 600 s is assumed and the reason travels with it into
every warning, so nobody mistakes the assumption for a reading.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from canary.kserve.store import read_configmap
from canary.policy.units import parse_duration
from canary.rollout.knative import KnativeDeadline

__all__ = ["CONFIG_DEPLOYMENT", "KNATIVE_NAMESPACE", "ClusterProgressDeadline", "deadline_from_data"]

log = structlog.get_logger(__name__)

KNATIVE_NAMESPACE, CONFIG_DEPLOYMENT = "knative-serving", "config-deployment"
_WHERE = f"{KNATIVE_NAMESPACE}/{CONFIG_DEPLOYMENT}"
_KEYS = ("progressDeadline", "progress-deadline")  # the later wins, as in NewConfigFromMap
REFRESH_SECONDS = 300.0  # a cluster setting: read again every few minutes, not every tick


def deadline_from_data(data: dict[str, str] | None) -> KnativeDeadline:
    """The deadline a ``config-deployment``'s ``data`` sets (Knative's 600 s when it sets none)."""
    found: KnativeDeadline | None = None
    for key in _KEYS:
        value = (data or {}).get(key)
        if value is None:
            continue
        try:
            seconds = parse_duration(value)
        except ValueError:
            seconds = 0.0
        if seconds <= 0:
            return KnativeDeadline.default(f"{_WHERE} {key} {value!r} is not a positive duration")
        found = KnativeDeadline(seconds, f'{_WHERE} {key}: "{value}"')
    return found or KnativeDeadline.default(f"{_WHERE} does not set progress-deadline")


class ClusterProgressDeadline:
    """Callable: the cluster's progress deadline, read at most every ``refresh`` seconds."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        request_timeout: float = 10.0,
        refresh: float = REFRESH_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._timeout = request_timeout
        self._refresh = refresh
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._deadline = KnativeDeadline.default()

    def __call__(self) -> KnativeDeadline:
        with self._lock:
            now = self._monotonic()
            if self._read_at is None or now - self._read_at >= self._refresh:
                self._read_at = now
                self._deadline = self._read()
            return self._deadline

    def _read(self) -> KnativeDeadline:
        try:
            found = read_configmap(self._core, KNATIVE_NAMESPACE, CONFIG_DEPLOYMENT, self._timeout)
        except ApiException as error:
            if error.status == 403:
                why = f"get on {_WHERE} is forbidden (grant it: docs/install.md, RBAC)"
            else:
                why = f"{_WHERE} could not be read ({error.status} {error.reason})"
            log.warning("Knative's progress deadline assumed to be 600 s", reason=why)
            return KnativeDeadline.default(why)
        except Exception as error:
            why = f"{_WHERE} could not be read ({type(error).__name__})"
            log.warning("Knative's progress deadline assumed to be 600 s", reason=why)
            return KnativeDeadline.default(why)
        if found is None:
            return KnativeDeadline.default(f"no {_WHERE}")
        return deadline_from_data(found.get("data"))
