"""Judging checks: the canary's measurements against absolute limits and against the stable revision.

Each check gets one of four verdicts (docs/design.md §4), never confused with each other:

* ``fail`` — a limit is broken (a failure always wins: a broken absolute limit is a failure even
  when the stable revision's value could not be read);
* ``error`` — a query failed: the controller's problem, never the canary's;
* ``no-data`` — nothing to judge (no requests, no pods, the stable revision has no value);
* ``pass`` — every limit that applies is met.

A limit broken by a value measured from a few requests is not yet a failure: for error rates and
latency quantiles a breach must be *significant* (see :func:`significant_breach`); until then the
check has no data ("above the limit, not significant yet"): the step cannot pass, nothing is
counted towards failureLimit, and the growing window soon settles it either way. Peers fail a
canary on one unlucky error among twenty requests; this is the fix for that flapping.

An evaluation fails if any check fails, is inconclusive if none fails but one has no data or an
error, and passes otherwise. Every :class:`Judgement` keeps the value, the limit, the stable value,
the samples and the query, so every decision can be explained with its numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from canary.evidence import REQUESTS, EvidenceStatus, Measurement, fraction_key
from canary.policy.model import Check, MetricKind
from canary.policy.units import Unit, format_value
from canary.rollout.limits import limit_text, percent, relative_bound_text
from canary.rollout.memo import IdentityMemo
from canary.rollout.state import EvaluationVerdict
from canary.rollout.vocabulary import CheckVerdict

__all__ = [
    "CheckVerdict",
    "Evaluation",
    "Judgement",
    "fraction_key",
    "has_absolute_limit",
    "judge_check",
    "judge_evidence",
]


class Judgement(NamedTuple):
    """One check as judged in one evaluation, with the numbers behind the verdict.

    (A NamedTuple rather than a frozen dataclass: equally immutable, four times cheaper to build,
    and six are built per evaluation.)
    """

    name: str
    verdict: CheckVerdict
    value: float | None  # the canary's value, canonical unit
    unit: Unit
    limit: str  # the condition, comparator first: "≤ 800ms and ≤ +20% vs stable (≤ 468ms)"
    stable_value: float | None = None
    samples: float | None = None  # what the value rests on (requests, pods), when known
    critical: bool = False
    detail: str = ""  # which limit broke, why there is no data, what failed
    query: str = ""
    max_allowed: float | None = None  # the effective upper bound (tightest of max and relative)
    min_allowed: float | None = None
    fraction: float | None = None  # gpu-memory-peak: used / total, when maxFraction is judged

    def describe(self) -> str:
        """``p99: 612ms ≤ 800ms (stable 540ms, 1234 samples) -> pass``."""
        value = "no value" if self.value is None else format_value(self.value, self.unit)
        extras = []
        if self.stable_value is not None:
            extras.append(f"stable {format_value(self.stable_value, self.unit)}")
        if self.samples is not None:
            extras.append(f"{self.samples:.0f} samples")
        suffix = f" ({', '.join(extras)})" if extras else ""
        detail = f": {self.detail}" if self.detail and self.verdict is not CheckVerdict.PASS else ""
        return f"{self.name}: {value} {self.limit}{suffix} -> {self.verdict}{detail}"


class Evaluation(NamedTuple):
    """The verdict over all checks, with the canary's request count in the window."""

    verdict: EvaluationVerdict
    judgements: tuple[Judgement, ...]
    requests: float | None  # None: the request count could not be read (query error)
    requests_detail: str = ""
    failures: tuple[Judgement, ...] = ()  # the judgements that failed
    has_error: bool = False  # a query failed — for a check or for the request count

    @property
    def critical_failures(self) -> tuple[Judgement, ...]:
        return tuple(judgement for judgement in self.failures if judgement.critical)

    def summary(self) -> str:
        """One line: ``fail (p99, errors); 1234 requests``."""
        if self.verdict is EvaluationVerdict.FAIL:
            details = [j.name for j in self.failures]
        else:
            details = [
                j.name for j in self.judgements if j.verdict in (CheckVerdict.NO_DATA, CheckVerdict.ERROR)
            ]
        named = f" ({', '.join(details)})" if details else ""
        requests = "request count unavailable" if self.requests is None else f"{self.requests:.0f} requests"
        return f"{self.verdict}{named}; {requests}"


def has_absolute_limit(check: Check) -> bool:
    """Whether the check can be judged without the stable revision (while pending or baking)."""
    return check.max is not None or check.min is not None or check.max_fraction is not None


def judge_evidence(
    checks: Sequence[Check],
    canary: Mapping[str, Measurement],
    stable: Mapping[str, Measurement],
    *,
    compare_with_stable: bool,
) -> Evaluation:
    """Judge every check; without ``compare_with_stable`` only absolute limits apply."""
    judgements = tuple(
        judge_check(check, canary, stable, compare_with_stable=compare_with_stable) for check in checks
    )
    verdicts = {judgement.verdict for judgement in judgements}
    requests, requests_detail = _request_count(canary.get(REQUESTS))
    if CheckVerdict.FAIL in verdicts:
        verdict = EvaluationVerdict.FAIL
        failures = tuple(judgement for judgement in judgements if judgement.verdict is CheckVerdict.FAIL)
    elif CheckVerdict.NO_DATA in verdicts or CheckVerdict.ERROR in verdicts:
        verdict, failures = EvaluationVerdict.INCONCLUSIVE, ()
    else:
        verdict, failures = EvaluationVerdict.PASS, ()
    has_error = requests is None or CheckVerdict.ERROR in verdicts
    return Evaluation(verdict, judgements, requests, requests_detail, failures, has_error)


def _request_count(measurement: Measurement | None) -> tuple[float | None, str]:
    # No requests in the window is a count of zero (the step cannot pass); a failed query is an
    # unknown count (None), which the core treats as a query error.
    if measurement is None:
        return 0.0, "no request count was supplied"
    if measurement.status is EvidenceStatus.ERROR:
        return None, f"request count query failed: {measurement.detail or measurement.error_class}"
    if measurement.status is EvidenceStatus.INVALID_VALUE:  # NaN/±Inf: unknown, like a query error
        return None, f"request count is not a number to judge: {measurement.detail}"
    if measurement.status is EvidenceStatus.NO_DATA or measurement.value is None:
        return 0.0, measurement.detail or "no requests"
    if math.isnan(measurement.value):
        return 0.0, "request count is NaN"
    return measurement.value, ""


@dataclass(frozen=True, slots=True)
class _CheckPlan:
    """What judging a check needs that depends only on the check: derived once, not per evaluation.

    (``Check.comparable_to_stable`` scans a custom query with a regex, and the limit texts format
    numbers: at thousands of decisions per second that is most of the cost.)
    """

    name: str
    unit: Unit
    max: float | None
    min: float | None
    max_fraction: float | None
    fraction_key: str
    max_increase: float | None  # None also when the check cannot be compared with the stable revision
    min_stable: float | None
    critical: bool
    absolute_limit_text: str
    relative_limit_text: str
    # How a breach is tested for significance: a rate of events among requests, a quantile of
    # request latencies (q), or nothing (gauges, counts, custom queries: taken as measured).
    sampling: _Sampling | None

    @classmethod
    def of(cls, check: Check) -> _CheckPlan:
        unit = check.value_unit
        comparable = check.max_increase is not None and check.comparable_to_stable
        sampling: _Sampling | None = None
        if check.metric is MetricKind.ERROR_RATE:
            sampling = _Sampling("rate", None)
        elif check.effective_quantile is not None:
            sampling = _Sampling("quantile", check.effective_quantile)
        return cls(
            name=check.name,
            unit=unit,
            max=check.max,
            min=check.min,
            max_fraction=check.max_fraction,
            fraction_key=fraction_key(check),
            max_increase=check.max_increase if comparable else None,
            min_stable=check.min_stable,
            critical=check.critical,
            absolute_limit_text=limit_text(check, relative=False),
            relative_limit_text=limit_text(check, relative=comparable),
            sampling=sampling,
        )


# Derived once per (immutable) Check object: see canary.rollout.memo.
_plan = IdentityMemo(_CheckPlan.of, capacity=4096)


def judge_check(
    check: Check,
    canary: Mapping[str, Measurement],
    stable: Mapping[str, Measurement],
    *,
    compare_with_stable: bool,
) -> Judgement:
    plan = _plan(check)
    unit = plan.unit
    max_increase = plan.max_increase if compare_with_stable else None
    condition = plan.relative_limit_text if max_increase is not None else plan.absolute_limit_text
    measurement = canary.get(plan.name)
    value = _value_of(measurement)
    if value is None:
        verdict, detail = _unusable(measurement, "the canary")
        samples = measurement.samples if measurement is not None else None
        query = measurement.query if measurement is not None else ""
        return Judgement(
            plan.name, verdict, None, unit, condition, None, samples, plan.critical, detail, query
        )
    assert measurement is not None
    failures: list[str] = []
    # Breaches of limits on sampled values, with the bound and its side, for the significance test.
    breaches: list[tuple[float, bool]] = []
    # The worst missing piece (an error outranks no-data), reported when no limit broke.
    missing: tuple[CheckVerdict, str] | None = None
    max_allowed = plan.max
    if max_allowed is not None and value > max_allowed:
        failures.append(f"{format_value(value, unit)} is above max {format_value(max_allowed, unit)}")
        breaches.append((max_allowed, True))
    if plan.min is not None and value < plan.min:
        failures.append(f"{format_value(value, unit)} is below min {format_value(plan.min, unit)}")
        breaches.append((plan.min, False))

    fraction: float | None = None
    if plan.max_fraction is not None:
        fraction_measurement = canary.get(plan.fraction_key)
        fraction = _value_of(fraction_measurement)
        if fraction is None:
            missing = _worse(missing, _unusable(fraction_measurement, "the GPU memory fraction"))
        elif fraction > plan.max_fraction:
            failures.append(
                f"GPU memory {percent(fraction)} of the device is above maxFraction "
                f"{percent(plan.max_fraction)}"
            )

    stable_value: float | None = None
    below_floor = False
    if max_increase is not None:
        stable_measurement = stable.get(plan.name)
        stable_value = _value_of(stable_measurement)
        if stable_value is None:
            missing = _worse(missing, _unusable(stable_measurement, "the stable revision"))
        else:
            # Below the floor the relative limit is noise: only the absolute limits apply.
            below_floor = plan.min_stable is not None and stable_value < plan.min_stable
            if not below_floor:
                allowed = stable_value * (1.0 + max_increase)
                max_allowed = allowed if max_allowed is None else min(max_allowed, allowed)
                if value > allowed:
                    failures.append(
                        f"{format_value(value, unit)} is above "
                        + relative_bound_text(max_increase, stable_value, allowed, unit)
                    )
                    breaches.append((allowed, True))

    fraction_failed = len(failures) > len(breaches)  # maxFraction: a gauge, taken as measured
    if failures and plan.sampling is not None and not fraction_failed:
        samples = measurement.samples
        if not any(
            significant_breach(plan.sampling, value, bound, samples, above) for bound, above in breaches
        ):
            failures, missing = (
                [],
                (
                    CheckVerdict.NO_DATA,
                    "; ".join(failures) + f", but not significant yet with {_samples_text(samples)}"
                    f" ({plan.sampling.needs()})",
                ),
            )
    if failures:
        verdict, detail = CheckVerdict.FAIL, "; ".join(failures)
    elif missing is not None:
        verdict, detail = missing
    else:
        verdict, detail = CheckVerdict.PASS, ""
    if below_floor:
        assert stable_value is not None
        assert plan.min_stable is not None
        note = (
            f"maxIncrease not applied: stable {format_value(stable_value, unit)} is below minStable "
            f"{format_value(plan.min_stable, unit)}"
        )
        detail = f"{detail}; {note}" if detail else note
    return Judgement(
        plan.name,
        verdict,
        value,
        unit,
        condition,
        stable_value,
        measurement.samples,
        plan.critical,
        detail,
        measurement.query,
        max_allowed,
        plan.min,
        fraction,
    )


# A breach of a sampled value is significant at this one-sided confidence (z for 95 %).
_Z = 1.645
# A quantile is only as good as the samples in its tail: at least this many requests expected
# beyond it (p99: 500 requests, p95: 100, p50: 10) before a breach of its limit can fail a check.
TAIL_SAMPLES = 5.0


class _Sampling(NamedTuple):
    kind: str  # "rate" | "quantile"
    quantile: float | None

    def needs(self) -> str:
        if self.kind == "rate":
            return "a breach must hold at 95% confidence"
        assert self.quantile is not None
        needed = math.ceil(TAIL_SAMPLES / (1.0 - self.quantile) - 1e-9)
        return f"a p{self.quantile * 100:g} needs {needed} requests"


def significant_breach(
    sampling: _Sampling, value: float, bound: float, samples: float | None, above: bool
) -> bool:
    """Whether a value measured from ``samples`` requests breaks ``bound`` beyond sampling noise.

    * rates (errors / requests): the one-sided 95 % Wilson score bound of the rate must itself be
      beyond the limit — one error among 20 requests (5 %) does not prove a 1 % limit broken;
    * quantiles: at least :data:`TAIL_SAMPLES` requests must be expected beyond the quantile, else
      the quantile is essentially the largest few samples of the window.

    Unknown sample counts are taken at face value (the breach stands).
    """
    if samples is None or math.isinf(value):
        return True
    if samples <= 0:
        return False
    if sampling.kind == "rate":
        low, high = _wilson(min(max(value, 0.0), 1.0), samples)
        return low > bound if above else high < bound
    assert sampling.quantile is not None
    return samples * (1.0 - sampling.quantile) >= TAIL_SAMPLES - 1e-9


def _wilson(rate: float, n: float) -> tuple[float, float]:
    z2 = _Z * _Z
    centre = rate + z2 / (2 * n)
    spread = _Z * math.sqrt(rate * (1 - rate) / n + z2 / (4 * n * n))
    denominator = 1 + z2 / n
    return (centre - spread) / denominator, (centre + spread) / denominator


def _samples_text(samples: float | None) -> str:
    return "an unknown number of requests" if samples is None else f"{samples:.0f} requests"


def _value_of(measurement: Measurement | None) -> float | None:
    """The value of a usable measurement: ok and not NaN (the only value unequal to itself)."""
    if measurement is None or measurement.status is not EvidenceStatus.OK:
        return None
    value = measurement.value
    return value if value is not None and value == value else None  # noqa: PLR0124 - the NaN test


def _unusable(measurement: Measurement | None, whose: str) -> tuple[CheckVerdict, str]:
    """Why a measurement cannot be judged (it has no usable value)."""
    if measurement is None:
        return CheckVerdict.NO_DATA, f"no measurement for {whose}"
    if measurement.status is EvidenceStatus.ERROR:
        cause = measurement.detail or (measurement.error_class or "unknown error")
        return CheckVerdict.ERROR, f"query for {whose} failed: {cause}"
    if measurement.status is EvidenceStatus.INVALID_VALUE:  # NaN/±Inf: held like a query problem
        return CheckVerdict.ERROR, f"invalid value for {whose}: {measurement.detail}"
    if measurement.status is EvidenceStatus.NO_DATA or measurement.value is None:
        return CheckVerdict.NO_DATA, f"no data for {whose}" + (
            f": {measurement.detail}" if measurement.detail else ""
        )
    # NaN is 0/0 in PromQL: nothing was measured (a defensive check; the evidence layer maps it).
    return CheckVerdict.NO_DATA, f"no data for {whose}: the value is NaN"


def _worse(
    current: tuple[CheckVerdict, str] | None, new: tuple[CheckVerdict, str]
) -> tuple[CheckVerdict, str]:
    if current is None or (new[0] is CheckVerdict.ERROR and current[0] is not CheckVerdict.ERROR):
        return new
    return current
