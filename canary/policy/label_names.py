"""How a policy names the labels its evidence joins on: the label styles of the request, DCGM and
kube-state-metrics series, and label names set by hand (canary.metrics.labels applies them)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import Field, field_validator

from canary.policy.base import _Model


class GpuLabelStyle(StrEnum):
    """How DCGM series name the pod: directly, exported_* behind a ServiceMonitor, or pod_name (old)."""

    AUTO = "auto"
    POD = "pod"
    EXPORTED_POD = "exported_pod"
    POD_NAME = "pod_name"  # dcgm-exporter --use-old-namespace: pod_name/pod_namespace


class RequestLabelStyle(StrEnum):
    """Where the request series carry the namespace and pod (docs/metric-profiles.md)."""

    AUTO = "auto"
    SCRAPED = "scraped"  # the queue-proxy scraped by a PodMonitor: the profile's own labels
    OTLP = "otlp"  # pushed over OTLP, resource attributes promoted: k8s_namespace_name, instance
    OTLP_TARGET_INFO = "otlp-target-info"  # pushed over OTLP, not promoted: joined with target_info


class KubeStateLabelStyle(StrEnum):
    """How kube-state-metrics series name the pod: as exported, or renamed exported_* by a
    ServiceMonitor without honorLabels (its target labels win)."""

    AUTO = "auto"
    POD = "pod"
    EXPORTED_POD = "exported_pod"


_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"


def _label_field(role: str) -> Any:
    # The pattern is for the JSON Schema and the CRD; the validator below says what to write instead.
    return Field(
        default=None, json_schema_extra={"pattern": _LABEL_NAME}, description=f"The label naming the {role}."
    )


class JoinLabelNames(_Model):
    """Label names that replace a family's built-in ones (each a Prometheus label name)."""

    namespace: str | None = _label_field("workload's namespace")
    pod: str | None = _label_field("workload's pod")

    @field_validator("*")
    @classmethod
    def _label_name(cls, name: str | None) -> str | None:
        if name is not None and not re.fullmatch(_LABEL_NAME, name):
            suggestion = re.sub(r"[^a-zA-Z0-9_]", "_", name)
            raise ValueError(
                f"{name!r} is not a Prometheus label name (letters, digits and underscores, not starting "
                f"with a digit); Prometheus stores an OpenTelemetry attribute such as {name!r} as "
                f"{suggestion!r}"
            )
        return name


class KubeStateLabelNames(JoinLabelNames):
    container: str | None = _label_field("container (exported_container behind a ServiceMonitor)")


class MetricLabels(_Model):
    """Per family, label names replacing those of the detected or chosen style."""

    requests: JoinLabelNames = Field(default_factory=JoinLabelNames, description="Knative request metrics.")
    kube_state_metrics: KubeStateLabelNames = Field(
        default_factory=KubeStateLabelNames, description="kube-state-metrics."
    )
    gpu: JoinLabelNames = Field(default_factory=JoinLabelNames, description="dcgm-exporter.")
