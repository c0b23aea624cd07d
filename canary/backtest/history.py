"""What happened: the periods in which two revisions of one InferenceService served traffic.

Read from Prometheus with range queries over ``[from, to]``:

* the request rate of every revision of the InferenceService, from the requests profile's counter
  (the policy's ``metrics.requests``, or the profile detected over the whole range), each series
  attributed to its revision as the evidence layer does it — the revision label where the profile
  has one (OpenCensus' ``revision_name``, ``metrics.revisionLabel``), else the pod name, read back
  exactly (:mod:`canary.metrics.podnames`; not possible from 37 characters, see :func:`_by_pod_name`);
* where present, the controller's own ``kserve_canary_rollout_weight`` gauge (the percentage status
  showed when a controller governed the model).

A *period* is a maximal run of steps in which at least two revisions served requests. Its canary is
the newest revision (Knative numbers them), its stable the other revision that served most. A step
without any sample is *missing*: it is reported, never filled, and it does not end a period by
itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from canary.evidence import ErrorClass
from canary.metrics.catalog import REQUESTS_PROFILES
from canary.metrics.client import PrometheusClient, QueryFailure, as_utc
from canary.metrics.detect import ProfileDetector
from canary.metrics.podnames import CUT_REVISION, KEPT_REVISION, PodNaming, naming
from canary.metrics.promql import format_duration_seconds, regex_literal, string_literal
from canary.policy.model import PromotionPolicy, RequestsProfile

__all__ = [
    "MAX_POINTS",
    "History",
    "HistoryError",
    "Period",
    "TrafficPoint",
    "find_periods",
    "read_history",
]

MAX_POINTS = 10_000  # Prometheus refuses more than 11,000 points per series
_WEIGHT_METRIC = "kserve_canary_rollout_weight"
_NUMBER = re.compile(r"(\d+)$")


class HistoryError(Exception):
    """Prometheus could not say what happened: ``unreachable`` when it could not be asked (or failed
    to answer), otherwise there is nothing to read (no request metrics in the range)."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True, slots=True)
class TrafficPoint:
    """At ``at``: each revision's request rate (requests/s) over the step before, and the controller's
    weight if it exported one. ``rates`` is empty when Prometheus has no sample at all (missing)."""

    at: datetime
    rates: Mapping[str, float]
    controller_weight: float | None = None

    @property
    def missing(self) -> bool:
        return not self.rates

    def share(self, canary: str, stable: str) -> float | None:
        """The canary's share of the two revisions' requests, in percent; None when nothing was served
        (or nothing was recorded)."""
        total = self.rates.get(canary, 0.0) + self.rates.get(stable, 0.0)
        return None if total <= 0 else 100.0 * self.rates.get(canary, 0.0) / total


@dataclass(frozen=True, slots=True)
class Period:
    """Two revisions serving side by side from ``start`` to ``end`` (the first and last step)."""

    canary: str
    stable: str
    start: datetime
    end: datetime
    # What the traffic did next: "canary-took-over" (the canary served alone afterwards),
    # "stable-kept" (the stable revision did), "open" (the range or the data ends first).
    outcome: str
    missing_steps: int = 0

    @property
    def id(self) -> str:
        return f"{self.canary}@{self.start.isoformat()}"


@dataclass(frozen=True, slots=True)
class History:
    """The range read, its points, the periods found, and how the series were read."""

    namespace: str
    inference_service: str
    start: datetime
    end: datetime
    step: float  # seconds between points
    profile: str  # the requests profile the rates come from
    points: tuple[TrafficPoint, ...]
    periods: tuple[Period, ...]
    query: str
    weight_query: str
    detail: str = ""  # how the profile was chosen
    revisions: tuple[str, ...] = field(default=())

    @property
    def recorded(self) -> tuple[TrafficPoint, ...]:
        """The points from the first to the last one with any sample (before and after is not a gap)."""
        present = [index for index, point in enumerate(self.points) if not point.missing]
        return self.points[present[0] : present[-1] + 1] if present else ()

    @property
    def missing_points(self) -> int:
        """Points without any sample between the first and the last recorded one: gaps in the data."""
        return sum(1 for point in self.recorded if point.missing)

    @property
    def has_controller_weight(self) -> bool:
        return any(point.controller_weight is not None for point in self.points)

    def between(self, start: datetime, end: datetime) -> tuple[TrafficPoint, ...]:
        return tuple(point for point in self.points if start <= point.at <= end)


def read_history(
    client: PrometheusClient,
    policy: PromotionPolicy,
    start: datetime,
    end: datetime,
    *,
    scrape_interval: float,
    step: float | None = None,
) -> History:
    """Read the request rates per revision over ``[start, end]`` and find the periods. Raises
    :class:`HistoryError` when Prometheus cannot answer or no requests profile is found."""
    start, end = as_utc(start), as_utc(end)
    if end <= start:
        raise HistoryError(f"--to ({end.isoformat()}) must be after --from ({start.isoformat()})")
    span = (end - start).total_seconds()
    resolution = max(step or scrape_interval, span / MAX_POINTS)
    namespace, name = policy.metadata.namespace, policy.spec.target.inference_service
    profile, detail = _profile(client, policy, start, end)
    metrics = REQUESTS_PROFILES[profile]
    revision_label = metrics.revision_label or policy.spec.metrics.revision_label
    window = format_duration_seconds(max(resolution, 2 * scrape_interval))
    revisions = regex_literal(name) + "-predictor-.+"
    scoped = f"{metrics.series_matcher}, " if metrics.series_matcher else ""
    rate = f'rate({metrics.count_metric}{{{scoped}{metrics.namespace_label}="{string_literal(namespace)}", '
    if revision_label is not None:
        series = f'{rate}{revision_label}=~"{string_literal(revisions)}"}}[{window}])'
        attributed = f'label_replace({series}, "revision", "$1", "{revision_label}", "(.+)")'
    else:
        attributed = _by_pod_name(rate, name, window)
    query = f"sum by (revision) ({attributed})"
    rates = _matrix(client, query, start, end, resolution, "revision")
    weight_selector = f'inference_service="{string_literal(name)}"'
    weight_query = (
        f'max({_WEIGHT_METRIC}{{{weight_selector}, namespace="{string_literal(namespace)}"}} or '
        f'{_WEIGHT_METRIC}{{{weight_selector}, exported_namespace="{string_literal(namespace)}"}})'
    )
    weights = _matrix(client, weight_query, start, end, resolution, None).get("", {})
    moments = [start + timedelta(seconds=index * resolution) for index in range(int(span // resolution) + 1)]
    points = tuple(
        TrafficPoint(
            moment,
            {
                revision: values[key]
                for revision, values in rates.items()
                if (key := round(moment.timestamp(), 3)) in values
            },
            weights.get(round(moment.timestamp(), 3)),
        )
        for moment in moments
    )
    periods = find_periods(points, resolution)
    return History(
        namespace, name, start, end, resolution, profile.value, points, periods, query, weight_query,
        detail, tuple(sorted(rates, key=_order)),
    )  # fmt: skip


def _by_pod_name(rate: str, name: str, window: str) -> str:
    """The rate of every revision's pods, each attributed to its revision by its pod name.

    The revision is read back exactly from pods whose name starts with it (an InferenceService name of
    up to 36 characters: :data:`~canary.metrics.podnames.KEPT_REVISION` and
    :data:`~canary.metrics.podnames.CUT_REVISION`). From 37 characters Knative md5-shortens the
    Deployment name: the pods no longer hold the revision's name, and the revisions are not known
    here to compute them — ``spec.metrics.revisionLabel`` is needed.
    """
    if naming(f"{name}-predictor-00001") is PodNaming.HASHED:
        raise HistoryError(
            f"the pods of {name!r} (37 characters or more) do not carry their revision's name (Knative "
            "shortens the Deployment name with an md5); relabel the revision into the request metrics "
            "and set spec.metrics.revisionLabel"
        )
    pods = regex_literal(name) + "-predictor-[0-9]+-deplo.+"
    series = f'{rate}pod=~"{string_literal(pods)}"}}[{window}])'
    kept = f'label_replace({series}, "revision", "$1", "pod", "{string_literal(KEPT_REVISION)}")'
    return f'label_replace({kept}, "revision", "$1", "pod", "{string_literal(CUT_REVISION)}")'


def _profile(
    client: PrometheusClient, policy: PromotionPolicy, start: datetime, end: datetime
) -> tuple[RequestsProfile, str]:
    chosen = policy.spec.metrics.requests
    if chosen is not RequestsProfile.AUTO:
        return chosen, f"{chosen.value} (spec.metrics.requests)"
    detector = ProfileDetector(client, lookback=(end - start).total_seconds())
    detection, _ = detector.requests_profile(end)
    if detection.failure is not None:
        raise HistoryError(
            f"Prometheus could not be asked which request metrics exist: {detection.detail}", unreachable=True
        )
    if detection.choice is None:
        raise HistoryError(f"no request metrics between --from and --to: {detection.detail}")
    return RequestsProfile(detection.choice), detection.detail


def _matrix(
    client: PrometheusClient, query: str, start: datetime, end: datetime, step: float, label: str | None
) -> dict[str, dict[float, float]]:
    outcome = client.range_query(query, start, end, step)
    if outcome.failure is not None or outcome.answer is None:
        failure = outcome.failure or QueryFailure(ErrorClass.MALFORMED_RESPONSE, "no answer")
        raise HistoryError(f"Prometheus could not answer {query!r}: {failure.detail}", unreachable=True)
    if outcome.answer.result_type != "matrix":
        raise HistoryError(f"Prometheus answered a {outcome.answer.result_type} to a range query")
    series: dict[str, dict[float, float]] = {}
    for item in outcome.answer.result:
        key = str(item.get("metric", {}).get(label, "")) if label is not None else ""
        values = series.setdefault(key, {})
        for moment, text in item.get("values", []):
            value = float(text)
            if math.isfinite(value):
                values[round(float(moment), 3)] = value
    return series


def _order(revision: str) -> tuple[int, str]:
    found = _NUMBER.search(revision)
    return (int(found.group(1)) if found else -1, revision)


def find_periods(
    points: Sequence[TrafficPoint], step: float, *, merge_gap: float = 300.0
) -> tuple[Period, ...]:
    """Maximal runs of points with at least two revisions serving (see the module docstring); runs of
    the same pair apart by at most ``merge_gap`` seconds (a quiet minute at 1 %) are one period."""
    runs: list[list[int]] = []
    for index, point in enumerate(points):
        serving = [revision for revision, rate in point.rates.items() if rate > 0]
        if len(serving) >= 2:
            if runs and index - runs[-1][-1] - 1 <= _gap_points(points, runs[-1][-1], index):
                runs[-1].append(index)
            else:
                runs.append([index])
    periods: list[Period] = []
    for run in runs:
        first, last = run[0], run[-1]
        served: dict[str, float] = {}
        for point in points[first : last + 1]:
            for revision, rate in point.rates.items():
                served[revision] = served.get(revision, 0.0) + rate
        canary = max(served, key=_order)
        stable = max((revision for revision in served if revision != canary), key=lambda r: served[r])
        missing = sum(1 for point in points[first : last + 1] if point.missing)
        period = Period(
            canary, stable, points[first].at, points[last].at, _outcome(points, last, canary, stable), missing
        )
        previous = periods[-1] if periods else None
        if (
            previous is not None
            and (previous.canary, previous.stable) == (canary, stable)
            and (period.start - previous.end).total_seconds() <= merge_gap
        ):
            period = Period(
                canary, stable, previous.start, period.end, period.outcome, previous.missing_steps + missing
            )
            periods[-1] = period
        else:
            periods.append(period)
    return tuple(periods)


def _gap_points(points: Sequence[TrafficPoint], last: int, index: int) -> int:
    # Points in between that are missing (no sample at all) do not break a run.
    return sum(1 for point in points[last + 1 : index] if point.missing)


def _outcome(points: Sequence[TrafficPoint], last: int, canary: str, stable: str) -> str:
    for point in points[last + 1 :]:
        if point.missing:
            continue
        canary_rate, stable_rate = point.rates.get(canary, 0.0), point.rates.get(stable, 0.0)
        if canary_rate > 0 and stable_rate <= 0:
            return "canary-took-over"
        if stable_rate > 0 and canary_rate <= 0:
            return "stable-kept"
    return "open"
