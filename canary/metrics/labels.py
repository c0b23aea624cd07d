"""The labels each family's series are joined to revisions on, per label style (docs/metric-profiles.md).

The same exporter's series carry the workload's namespace and pod under different names, depending
on how they reach Prometheus:

* **requests, scraped** (a PodMonitor on the queue-proxy): the profile's own labels
  (:class:`~canary.metrics.catalog.RequestsMetrics`: ``namespace``/``pod``, OpenCensus
  ``namespace_name``/``pod_name``/``revision_name``).
* **requests, pushed over OTLP** (Knative's ``metrics-protocol: http/protobuf`` to Prometheus' OTLP
  receiver): the queue-proxy's resource attributes are ``k8s.namespace.name``, ``service.name``,
  ``service.instance.id`` (the pod's name) and ``kn.service.name``, ``kn.configuration.name``,
  ``kn.revision.name`` (knative/serving ``pkg/queue/sharedmain/otel.go``, ``res``; the keys in
  ``pkg/metrics/newkey.go``). Prometheus maps ``service.name`` to ``job`` and
  ``service.instance.id`` to ``instance`` on every series, and the other resource attributes only
  onto ``target_info`` — unless ``otlp.promote_resource_attributes`` names them, then they are
  labels of every series, dots written as underscores (``storage/remote/otlptranslator/
  prometheusremotewrite/helper.go``: ``createAttributes`` and ``addResourceTargetInfo``). So
  :data:`OTLP` reads ``k8s_namespace_name`` and the pod from ``instance``; :data:`OTLP_TARGET_INFO`
  joins ``target_info`` on ``(job, instance)`` for ``k8s_namespace_name`` and ``kn_revision_name``.
* **kube-state-metrics and dcgm-exporter behind a ServiceMonitor without honorLabels**: the target's
  own ``namespace``, ``pod`` and ``container`` labels win and the workload's are renamed
  ``exported_namespace``, ``exported_pod``, ``exported_container``.

A policy can replace any of these names (``spec.metrics.labels``); every name is checked to be a
Prometheus label name before it enters PromQL (:func:`~canary.metrics.promql.label_name`).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace

from canary.metrics.promql import label_name
from canary.policy.model import (
    JoinLabelNames,
    KubeStateLabelNames,
    KubeStateLabelStyle,
    MetricsSpec,
    RequestLabelStyle,
)

__all__ = [
    "KSM_EXPORTED",
    "KSM_LABELS",
    "OTLP_NAMESPACE",
    "OTLP_POD",
    "OTLP_REVISION",
    "TARGET_INFO",
    "JoinLabels",
    "kube_state_labels",
    "overridden",
    "request_labels",
]

# Knative's resource attributes as Prometheus names them (see the module docstring).
OTLP_NAMESPACE = "k8s_namespace_name"  # k8s.namespace.name
OTLP_POD = "instance"  # service.instance.id, the queue-proxy's pod name
OTLP_REVISION = "kn_revision_name"  # kn.revision.name
TARGET_INFO = "target_info"
_TARGET_INFO_KEYS = "job, instance"  # service.name and service.instance.id: on every series


@dataclass(frozen=True, slots=True)
class JoinLabels:
    """The labels one family's series name the workload by.

    ``revision`` None: the revision is known only from the pod's name. ``target_info``: namespace and
    revision are labels of ``target_info`` only, joined on ``(job, instance)``; the pod is on the
    series themselves.
    """

    namespace: str = "namespace"
    pod: str = "pod"
    revision: str | None = None
    container: str = "container"
    target_info: bool = False
    pushed: bool = False  # over OTLP: an instrumentation scope is a label only when Prometheus promotes it

    def __post_init__(self) -> None:
        for name in (self.namespace, self.pod, self.container, self.revision):
            if name is not None:
                label_name(name)

    def joined(self, expression: str, matchers: Collection[str]) -> str:
        """``expression`` with ``target_info``'s namespace and revision labels, restricted by ``matchers``
        (on target_info's labels); unchanged when the series carry their labels themselves."""
        if not self.target_info:
            return expression
        copied = ", ".join(name for name in (self.namespace, self.revision) if name is not None)
        info = f"{TARGET_INFO}{{{', '.join(matchers)}}}"
        return f"{expression} * on ({_TARGET_INFO_KEYS}) group_left ({copied}) {info}"


KSM_LABELS = JoinLabels()
# A ServiceMonitor without honorLabels: the target labels (kube-state-metrics' own pod) win.
KSM_EXPORTED = JoinLabels("exported_namespace", "exported_pod", container="exported_container")
_KSM_STYLES = {KubeStateLabelStyle.POD: KSM_LABELS, KubeStateLabelStyle.EXPORTED_POD: KSM_EXPORTED}
_OTLP = JoinLabels(OTLP_NAMESPACE, OTLP_POD, pushed=True)
_OTLP_TARGET_INFO = JoinLabels(OTLP_NAMESPACE, OTLP_POD, OTLP_REVISION, target_info=True, pushed=True)


def overridden(labels: JoinLabels, names: JoinLabelNames) -> JoinLabels:
    """``labels`` with the names a policy sets (``spec.metrics.labels.<family>``)."""
    container = names.container if isinstance(names, KubeStateLabelNames) else None
    return replace(
        labels,
        namespace=names.namespace or labels.namespace,
        pod=names.pod or labels.pod,
        container=container or labels.container,
    )


def request_labels(scraped: JoinLabels, style: RequestLabelStyle, spec: MetricsSpec) -> JoinLabels:
    """The request family's labels: ``scraped`` (the profile's own) or the OTLP names, then the
    policy's ``revisionLabel`` and ``labels.requests``."""
    if style is RequestLabelStyle.AUTO:
        raise ValueError("the request label style must be chosen or detected first")
    labels = {RequestLabelStyle.OTLP: _OTLP, RequestLabelStyle.OTLP_TARGET_INFO: _OTLP_TARGET_INFO}.get(
        style, scraped
    )
    if spec.revision_label is not None and not labels.target_info and labels.revision is None:
        labels = replace(labels, revision=spec.revision_label)
    return overridden(labels, spec.labels.requests)


def kube_state_labels(style: KubeStateLabelStyle, spec: MetricsSpec) -> JoinLabels:
    if style is KubeStateLabelStyle.AUTO:
        raise ValueError("the kube-state-metrics label style must be chosen or detected first")
    return overridden(_KSM_STYLES[style], spec.labels.kube_state_metrics)
