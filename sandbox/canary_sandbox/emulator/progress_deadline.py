"""Knative's progress deadline, as the emulator applies it to a new revision.

Knative gives a revision's Deployment ``progressDeadlineSeconds`` from the revision's
``serving.knative.dev/progress-deadline`` annotation, else ``progress-deadline`` (or the legacy
``progressDeadline``) in ``knative-serving/config-deployment``, else 600 s (knative/serving
pkg/reconciler/revision/resources/deploy.go ``MakeDeployment``; pkg/deployment/config.go lines 41-46
and ``NewConfigFromMap``). A revision that has not reached its initial scale by then is failed for good:
ResourcesAvailable False, ``ProgressDeadlineExceeded``, "Initial scale was never achieved"
(pkg/apis/serving/v1/revision_lifecycle.go lines 234-235), and scaled to zero. KServe copies the
revision template's annotations from the InferenceService and from the predictor's own
``annotations``.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "CONFIG_DEPLOYMENT",
    "DEFAULT_PROGRESS_DEADLINE",
    "INITIAL_SCALE_NEVER_ACHIEVED",
    "KNATIVE_NAMESPACE",
    "PROGRESS_DEADLINE_ANNOTATION",
    "revision_deadline",
]

PROGRESS_DEADLINE_ANNOTATION = "serving.knative.dev/progress-deadline"
DEFAULT_PROGRESS_DEADLINE = 600.0  # ProgressDeadlineDefault
KNATIVE_NAMESPACE, CONFIG_DEPLOYMENT = "knative-serving", "config-deployment"
INITIAL_SCALE_NEVER_ACHIEVED = "Initial scale was never achieved"
# Keys of config-deployment, read in this order, the later winning (NewConfigFromMap parses the
# legacy key first).
_CONFIG_KEYS = ("progressDeadline", "progress-deadline")
_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float | None:
    """Seconds of a Go ``time.ParseDuration`` string ("600s", "20m", "1h30m"); None when it is not one."""
    parts = _GO_DURATION.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNITS[unit] for number, unit in parts)


def revision_deadline(template: dict[str, Any], config_deployment: dict[str, Any] | None) -> float:
    """The progress deadline Knative applies to a revision made from ``template``.

    An annotation the webhook would refuse (not a positive duration) is not modelled: it falls back
    to the cluster's value, as a value the emulator cannot read.
    """
    predictor_annotations = (template.get("predictor") or {}).get("annotations") or {}
    for found in (predictor_annotations, template.get("annotations") or {}):
        value = found.get(PROGRESS_DEADLINE_ANNOTATION)
        seconds = parse_go_duration(value) if isinstance(value, str) else None
        if seconds:
            return seconds
    deadline = DEFAULT_PROGRESS_DEADLINE
    data = (config_deployment or {}).get("data") or {}
    for key in _CONFIG_KEYS:
        value = data.get(key)
        seconds = parse_go_duration(value) if isinstance(value, str) else None
        if seconds:
            deadline = seconds
    return deadline
