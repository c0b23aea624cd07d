"""Which profile and label style each metric family of a policy is read with: configured, or detected.

A policy's ``metrics`` settings name a requests profile, a request label style, a DCGM label style
and a kube-state-metrics label style, each possibly ``auto``; :class:`FamilyResolver` turns them
into a :class:`~canary.metrics.plan.Resolution` per family needed (the ``auto`` ones asked of the
:class:`~canary.metrics.detect.ProfileDetector`), or the measurement saying why a family is unread.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from canary.evidence import Measurement
from canary.metrics.catalog import Family
from canary.metrics.detect import (
    GPU_FAMILY,
    KUBE_STATE_FAMILY,
    REQUEST_LABELS_FAMILY,
    REQUESTS_FAMILY,
    Detection,
    ProfileDetector,
)
from canary.metrics.labels import KSM_LABELS
from canary.metrics.plan import Resolution, families_needed, family_labels
from canary.metrics.tick_queries import CounterQuery
from canary.policy.model import KubeStateLabelStyle, PromotionPolicy, RequestsProfile

__all__ = ["FamilyResolver"]

_AUTO = "auto"  # every profile and label style setting's "detect it"
_Detect = Callable[[dict[str, str]], tuple[Detection, int]]  # the choices so far -> detection, round trips


class FamilyResolver:
    """Profiles and label styles per family for each policy, detected through ``detector`` when ``auto``."""

    def __init__(self, detector: ProfileDetector) -> None:
        self.detector = detector

    def resolve(
        self, policy: PromotionPolicy, at: datetime
    ) -> tuple[dict[Family, Resolution], dict[str, str], int]:
        """Profiles and label styles per family for this policy: configured, or detected; and the
        detection round trips."""
        needed = families_needed(policy)
        used, unavailable, cost = self._choose(policy, needed, at)
        labels = family_labels(
            policy.spec.metrics,
            used.get(REQUESTS_FAMILY),
            used.get(REQUEST_LABELS_FAMILY),
            used.get(GPU_FAMILY),
            used.get(KUBE_STATE_FAMILY),
        )
        ksm = labels.get(Family.KUBE_STATE)
        resolutions = {
            Family.REQUESTS: Resolution(used.get(REQUESTS_FAMILY), labels=labels.get(Family.REQUESTS)),
            Family.DCGM: Resolution(used.get(GPU_FAMILY), labels=labels.get(Family.DCGM)),
            Family.KUBE_STATE: Resolution(labels=None if ksm == KSM_LABELS else ksm),  # None: the default
        }
        resolutions = {
            family: unavailable.get(family) or resolution
            for family, resolution in resolutions.items()
            if family in needed
        }
        # The other families have one profile each; report them for explain all the same.
        for family in needed - set(resolutions):
            used[family.value] = "builtin"
        return resolutions, used, cost

    def _choose(
        self, policy: PromotionPolicy, needed: set[Family], at: datetime
    ) -> tuple[dict[str, str], dict[Family, Resolution], int]:
        """Each setting's choice (configured, or detected: ``none`` when nothing fits), the families
        that cannot be read (and why), and the detection round trips."""
        metrics = policy.spec.metrics
        detector = self.detector
        settings: tuple[tuple[Family, str, str, _Detect], ...] = (
            (
                Family.REQUESTS,
                REQUESTS_FAMILY,
                metrics.requests.value,
                lambda _: detector.requests_profile(at),
            ),
            (
                Family.REQUESTS,
                REQUEST_LABELS_FAMILY,
                metrics.request_labels.value,
                lambda used: detector.request_labels(RequestsProfile(used[REQUESTS_FAMILY]), at),
            ),
            (Family.DCGM, GPU_FAMILY, metrics.gpu_labels.value, lambda _: detector.gpu_labels(at)),
            (
                Family.KUBE_STATE,
                KUBE_STATE_FAMILY,
                metrics.kube_state_labels.value,
                lambda _: detector.kube_state_labels(at),
            ),
        )
        used: dict[str, str] = {}
        unavailable: dict[Family, Resolution] = {}
        cost = 0
        for family, report_name, configured, detect in settings:
            if family not in needed or family in unavailable:
                continue
            if configured != _AUTO:
                used[report_name] = configured
                continue
            detection, spent = detect(used)
            cost += spent
            resolution = _resolution_from(detection)
            if family is Family.KUBE_STATE and detection.failure is None and not detection.found:
                resolution = Resolution(KubeStateLabelStyle.POD.value)  # not scraped yet: the standard labels
            if resolution.unavailable is not None:
                unavailable[family] = resolution
            used[report_name] = resolution.choice or "none"
        return used, unavailable, cost

    def restarts_counter(self, policy: PromotionPolicy, at: datetime) -> CounterQuery:
        """The restart counters in ``policy``'s kube-state-metrics label style (configured or detected)."""
        metrics = policy.spec.metrics
        style = metrics.kube_state_labels.value
        if style == _AUTO:
            style = self.detector.kube_state_labels(at)[0].choice or KubeStateLabelStyle.POD.value
        labels = family_labels(metrics, None, None, None, style).get(Family.KUBE_STATE)
        return CounterQuery(None, labels=None if labels == KSM_LABELS else labels)


def _resolution_from(detection: Detection) -> Resolution:
    if detection.failure is not None:
        return Resolution(
            unavailable=Measurement.error(
                detection.failure.error_class, f"metric profile detection failed: {detection.failure.detail}"
            )
        )
    if detection.choice is None:
        return Resolution(unavailable=Measurement.no_data(detection.detail))
    return Resolution(detection.choice)
