"""The counter book, pure: samples of raw cumulative counters in, exact integer tallies out."""

from __future__ import annotations

import gc
import itertools
import json
import math
import random
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from canary.evidence import REQUESTS, CountSeries, ErrorClass, EvidenceStatus, Histogram, Tally
from canary.metrics.catalog import RevisionKey
from canary.metrics.client import QueryAnswer, QueryFailure, QueryOutcome
from canary.metrics.counting.book import CounterBook
from canary.metrics.counting.counts import count_measurement, interpolated_quantile
from canary.metrics.counting.decode import parse_counter_matrix, parse_counter_vector
from canary.metrics.counting.peaks import PeakBook, PeakSample
from canary.metrics.counting.pipeline import MAX_POINTS_PER_SERIES, plan_backfill
from canary.metrics.counting.rules import RevisionSample, SeriesId
from canary.metrics.tick_queries import BUCKET_FIELD, COUNTER_FIELD, OOM_FIELD
from canary.policy.model import MetricKind
from canary.policy.units import Unit

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
REV = RevisionKey("ml", "llama-predictor-00002")
TOLERANCE = timedelta(seconds=2.5)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ok(pod: str = "p0") -> SeriesId:
    return SeriesId(COUNTER_FIELD, pod, "2xx")


def err(pod: str = "p0") -> SeriesId:
    return SeriesId(COUNTER_FIELD, pod, "5xx")


def sample(values: dict[SeriesId, float], invalid: str = "") -> RevisionSample:
    return RevisionSample(values, invalid)


def book_of(*samples: tuple[float, dict[SeriesId, float]]) -> CounterBook:
    book = CounterBook(tolerance=TOLERANCE)
    for seconds, values in samples:
        assert book.record(REV, at(seconds), sample(values))
    return book


def totals(book: CounterBook, start: float, end: float) -> tuple[int, int]:
    series = book.count_series(REV, at(start), at(end))
    total = CountSeries.total(series.tallies)
    assert total is not None
    return total.requests, total.errors


def test_the_first_sample_is_the_baseline() -> None:
    book = book_of((0, {ok(): 1000.0, err(): 40.0}))
    series = book.count_series(REV, at(0), at(0))
    assert (series.status, series.tallies) == (EvidenceStatus.OK, ())  # nothing happened since
    book.record(REV, at(5), sample({ok(): 1010.0, err(): 41.0}))
    assert totals(book, 0, 5) == (11, 1)


def test_a_series_that_goes_down_counts_from_zero() -> None:
    book = book_of((0, {ok(): 100.0}), (5, {ok(): 110.0}), (10, {ok(): 4.0}), (15, {ok(): 9.0}))
    assert totals(book, 0, 15) == (10 + 4 + 5, 0)


def test_a_restarted_pod_counts_all_its_series_from_zero_and_stale_ones_when_they_change() -> None:
    # p0's queue-proxy restarts between 5 and 10: its 2xx series drops. Its 5xx series still shows the
    # old value (Prometheus' lookback) until the first 5xx after the restart, then starts at 1.
    book = book_of(
        (0, {ok(): 100.0, err(): 7.0, ok("p1"): 50.0}),
        (5, {ok(): 110.0, err(): 7.0, ok("p1"): 55.0}),
        (10, {ok(): 3.0, err(): 7.0, ok("p1"): 60.0}),
        (15, {ok(): 8.0, err(): 7.0, ok("p1"): 65.0}),
        (20, {ok(): 12.0, err(): 1.0, ok("p1"): 70.0}),
        (25, {ok(): 15.0, err(): 2.0, ok("p1"): 75.0}),
    )
    # p0: 10 + 3 + 5 + 4 + 3 = 25 successes, 1 + 1 errors; p1: 25.
    assert totals(book, 0, 25) == (25 + 2 + 25, 2)


def test_a_series_bigger_after_a_restart_still_counts_from_zero() -> None:
    # A sample a tick apart: the pod restarted and served more 5xx since than it had before.
    book = book_of((0, {ok(): 100.0, err(): 2.0}), (30, {ok(): 20.0, err(): 5.0}))
    assert totals(book, 0, 30) == (25, 5)


def test_a_series_absent_after_a_restart_counts_from_zero_when_it_comes_back() -> None:
    book = book_of(
        (0, {ok(): 100.0, err(): 9.0}),
        (5, {ok(): 5.0}),  # restarted; the 5xx series is gone (stale marker)
        (10, {ok(): 9.0, err(): 9.0}),  # back: 9 new 5xx, not 0
    )
    assert totals(book, 0, 10) == (5 + 4 + 9, 9)


def test_a_series_born_after_the_baseline_counts_its_whole_value() -> None:
    book = book_of(
        (0, {ok(): 100.0}),
        (5, {ok(): 104.0, err(): 1.0}),  # the first 5xx: a new series with value 1
        (10, {ok(): 108.0, err(): 1.0, ok("p-new"): 6.0}),  # a new pod
    )
    assert totals(book, 0, 10) == (8 + 1 + 6, 1)


def test_a_revision_first_seen_without_series_counts_them_when_they_appear() -> None:
    book = book_of((0, {}), (5, {ok(): 12.0}))
    assert totals(book, 0, 5) == (12, 0)
    assert book_of((0, {}), (5, {})).count_series(REV, at(0), at(5)).status is EvidenceStatus.NO_DATA


def test_no_revision_is_no_data() -> None:
    book = CounterBook(tolerance=TOLERANCE)
    series = book.count_series(REV, at(0), at(5))
    assert series.status is EvidenceStatus.NO_DATA
    assert series.tallies == ()


def test_tallies_start_at_the_snapshot_standing_for_the_start() -> None:
    book = book_of(*((seconds, {ok(): float(seconds)}) for seconds in range(0, 60, 5)))
    series = book.count_series(REV, at(21), at(54))  # 20 stands for 21, 55 for 54 (within 2.5 s)
    assert (series.tallies[0].start, series.tallies[0].end) == (at(20), at(25))
    assert series.tallies[-1].end == at(55)
    assert series.since(at(30))[0].start == at(30)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), pods=st.integers(1, 4), ticks=st.integers(2, 40))
def test_tallies_are_integers_that_add_up_to_the_truth_and_to_the_whole_range(
    seed: int, pods: int, ticks: int
) -> None:
    rng = random.Random(seed)
    book = CounterBook(tolerance=TOLERANCE)
    state = {pod: {"2xx": 0, "5xx": 0} for pod in range(pods)}
    truth_requests = truth_errors = 0
    for tick in range(ticks):
        if tick > 0:
            for pod, counts in state.items():
                # A restart (visible: the success counter is above what one tick adds): counters
                # from zero, the 5xx series gone until the next 5xx.
                restarted = counts["2xx"] > 20 and rng.random() < 0.15
                if restarted:
                    state[pod] = counts = {"2xx": 0}
                served_ok, served_err = rng.randint(1, 20), rng.choice([0, 0, 1, 3])
                if restarted:
                    # No 5xx in the tick of a restart: a 5xx series back at exactly its old value
                    # cannot be told from a stale one (see the next test).
                    served_err = 0
                counts["2xx"] += served_ok
                if served_err:
                    counts["5xx"] = counts.get("5xx", 0) + served_err
                truth_requests += served_ok + served_err
                truth_errors += served_err
        values = {
            SeriesId(COUNTER_FIELD, f"p{pod}", code): float(value)
            for pod, counts in state.items()
            for code, value in counts.items()
        }
        book.record(REV, at(tick * 5), sample(values))
    series = book.count_series(REV, at(0), at((ticks - 1) * 5))
    assert len(series.tallies) == ticks - 1
    assert all(isinstance(t.requests, int) and isinstance(t.errors, int) for t in series.tallies)
    assert all(t.requests >= 0 and t.errors >= 0 for t in series.tallies)
    total = CountSeries.total(series.tallies)
    assert total is not None
    assert (total.requests, total.errors) == (truth_requests, truth_errors)
    whole, _ = book.tally(REV, at(0), at((ticks - 1) * 5))
    assert whole is not None
    assert (whole.requests, whole.errors) == (truth_requests, truth_errors)


def test_the_limit_a_series_back_at_its_old_value_in_the_restart_tick_counts_when_it_next_changes() -> None:
    book = book_of(
        (0, {ok(): 100.0, err(): 1.0}),
        (5, {ok(): 4.0, err(): 1.0}),  # restarted, and one fresh 5xx: the same value as before
    )
    assert totals(book, 0, 5) == (4, 0)  # taken as stale
    book.record(REV, at(10), sample({ok(): 8.0, err(): 2.0}))
    assert totals(book, 0, 10) == (8 + 2, 2)  # counted from zero once it changes: nothing lost


def test_bucket_counts_become_a_histogram_with_edges_read_from_the_series() -> None:
    def buckets(pod: str, counts: tuple[int, int, int]) -> dict[SeriesId, float]:
        return {
            SeriesId(BUCKET_FIELD, pod, "2xx", le): float(count)
            for le, count in zip((0.1, 0.5, math.inf), counts, strict=True)
        }

    book = book_of(
        (0, {ok(): 10.0, **buckets("p0", (5, 8, 10))}),
        (5, {ok(): 20.0, **buckets("p0", (9, 16, 20))}),
        (10, {ok(): 3.0, **buckets("p0", (1, 2, 3))}),  # a restart
    )
    series = book.count_series(REV, at(0), at(10))
    histograms = [tally.histograms["latency"] for tally in series.tallies]
    assert histograms == [Histogram((0.1, 0.5), (4, 8), 10), Histogram((0.1, 0.5), (1, 2), 3)]
    assert CountSeries.total(series.tallies) is not None


def test_a_non_finite_value_makes_the_answer_invalid_only_while_it_lasts() -> None:
    book = book_of((0, {ok(): 10.0}))
    book.record(REV, at(5), sample({}, invalid="Prometheus answered NaN for a request counter series"))
    series = book.count_series(REV, at(0), at(5))
    assert series.status is EvidenceStatus.INVALID_VALUE
    assert "NaN" in series.detail
    book.record(REV, at(10), sample({ok(): 20.0}))
    assert totals(book, 0, 10) == (10, 0)


def test_memory_is_bounded_by_the_oldest_range_asked_for_and_idle_revisions_are_forgotten() -> None:
    book = CounterBook(tolerance=TOLERANCE, idle=timedelta(minutes=5))
    other = RevisionKey("ml", "other")
    for tick in range(200):
        now = at(tick * 5)
        book.asked(REV, "rollout-a", now - timedelta(seconds=60), now)  # a one-minute window
        if tick < 10:
            book.asked(other, "rollout-b", at(0), now)
        book.record(REV, now, sample({ok(): float(tick)}))
        book.record(other, now, sample({ok(): float(tick)}))
        book.prune(now)
    assert len(book.snapshots(REV)) <= 60 / 5 + 2
    assert other not in book.tracked()  # nobody asked for 5 minutes
    series = book.count_series(REV, at(995 - 60), at(995))
    total = CountSeries.total(series.tallies)
    assert total is not None and total.requests == 12


def test_a_hard_cap_on_snapshots() -> None:
    book = CounterBook(tolerance=TOLERANCE, max_snapshots=10)
    for tick in range(50):
        book.record(REV, at(tick), sample({ok(): float(tick)}))
    assert len(book.snapshots(REV)) == 10


def test_samples_not_newer_than_the_last_are_ignored() -> None:
    book = book_of((0, {ok(): 1.0}), (5, {ok(): 2.0}))
    assert not book.record(REV, at(5), sample({ok(): 50.0}))
    assert not book.record(REV, at(1), sample({ok(): 50.0}))
    assert totals(book, 0, 5) == (1, 0)


def test_backfill_is_needed_once() -> None:
    book = CounterBook(tolerance=TOLERANCE)
    assert book.needs_backfill(REV, at(0))
    book.replay(REV, [(at(5), sample({ok(): 2.0})), (at(0), sample({ok(): 1.0}))])
    book.mark_backfilled(REV, at(0))
    assert not book.needs_backfill(REV, at(0))
    assert not book.needs_backfill(REV, at(3))
    assert book.needs_backfill(REV, at(-60))  # an older start than was filled
    assert totals(book, 0, 5) == (1, 0)


def test_tallies_read_from_the_book_stay_exact_and_adding_them_changes_none() -> None:
    """Two revisions whose requests fell in the same buckets tick after tick: each tally is its
    own tick's, and adding tallies up never changes what another tally holds."""

    def buckets(fast: float, slow: float) -> dict[SeriesId, float]:
        return {
            ok(): fast + slow,
            SeriesId(BUCKET_FIELD, "p0", "2xx", 0.1): fast,
            SeriesId(BUCKET_FIELD, "p0", "2xx", math.inf): fast + slow,
        }

    other = RevisionKey("ml", "llama-predictor-00003")
    book = CounterBook(tolerance=TOLERANCE)
    for revision in (REV, other):
        for tick, (fast, slow) in enumerate([(0, 0), (3, 1), (6, 2), (9, 3)]):
            book.record(revision, at(tick * 5), sample(buckets(fast, slow)))
    series = book.count_series(REV, at(0), at(15))
    assert [tally.histograms["latency"] for tally in series.tallies] == [Histogram((0.1,), (3,), 4)] * 3
    assert book.count_series(other, at(0), at(15)).tallies == series.tallies
    pooled = CountSeries.total(series.tallies)
    assert pooled is not None and pooled.histograms["latency"] == Histogram((0.1,), (9,), 12)
    first = series.tallies[0] + series.tallies[1]
    assert first.histograms["latency"] == Histogram((0.1,), (6,), 8)
    assert series.tallies[0].histograms["latency"] == Histogram((0.1,), (3,), 4), "untouched"


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=30),  # fast requests in the tick
            st.integers(min_value=0, max_value=10),  # slow ones
            st.integers(min_value=0, max_value=4),  # 5xx
            st.booleans(),  # a 4xx series appears from this tick on
            st.booleans(),  # a finer bucket appears from this tick on
        ),
        min_size=1,
        max_size=25,
    ),
    st.integers(min_value=-2, max_value=30),  # where a range starts, in ticks
)
def test_a_series_tallies_and_their_sums_are_what_the_snapshots_define(
    ticks: list[tuple[int, int, int, bool, bool]], start_tick: int
) -> None:
    """The tallies count_series builds (histograms read when asked for) are the differences of
    consecutive snapshots, and ``total_since`` (the difference of a range's end rows) is what
    adding them up one by one gives, a response class or a bucket appearing in between included."""
    book = CounterBook(tolerance=TOLERANCE)
    fast = slow = errors = client = finer = 0
    has_client = has_finer = False
    book.record(REV, at(0), sample({ok(): 0.0}))
    for index, (new_fast, new_slow, new_errors, client_now, finer_now) in enumerate(ticks, start=1):
        fast, slow, errors, finer = (
            fast + new_fast,
            slow + new_slow,
            errors + new_errors,
            finer + new_fast // 2,
        )
        has_client, has_finer = has_client or client_now, has_finer or finer_now
        values = {
            ok(): float(fast + slow),
            err(): float(errors),
            SeriesId(BUCKET_FIELD, "p0", "2xx", 0.1): float(fast),
            SeriesId(BUCKET_FIELD, "p0", "2xx", math.inf): float(fast + slow),
        }
        if has_client:
            client += 1
            values[SeriesId(COUNTER_FIELD, "p0", "4xx", math.inf)] = float(client)
        if has_finer:
            values[SeriesId(BUCKET_FIELD, "p0", "2xx", 0.05)] = float(finer)
        book.record(REV, at(index * 5), sample(values))
    series = book.count_series(REV, at(0), at(len(ticks) * 5))
    snapshots = book.snapshots(REV)
    assert len(series.tallies) == len(snapshots) - 1
    for tally, (before, after) in zip(series.tallies, itertools.pairwise(snapshots), strict=True):
        defined, _ = book.tally(REV, before.at, after.at)
        assert defined is not None
        assert (tally.start, tally.end, tally.requests, tally.errors, tally.client_errors) == (
            defined.start,
            defined.end,
            defined.requests,
            defined.errors,
            defined.client_errors,
        )
        assert dict(tally.histograms) == dict(defined.histograms)
    for start in (None, at(start_tick * 5), at(start_tick * 5 + 1)):
        chosen = series.tallies if start is None else series.since(start)
        assert series.total_since(start) == CountSeries.total(chosen)


@pytest.mark.parametrize("base", [60_000, 2**32 - 10, 2**40])
def test_totals_past_what_the_narrow_columns_hold_stay_exact(base: int) -> None:
    """A revision's totals are held in the narrowest type that fits them (2 bytes a total while
    they stay below 65,536); one that outgrows it widens the whole history, the past included."""
    book = CounterBook(tolerance=TOLERANCE)
    book.record(REV, at(0), sample({ok(): 0.0}))
    values = [0, 100, base, base + 7, base + 7 + 65_536]
    for tick, value in enumerate(values[1:], start=1):
        book.record(REV, at(tick * 5), sample({ok(): float(value)}))
    series = book.count_series(REV, at(0), at(20))
    assert [tally.requests for tally in series.tallies] == [b - a for a, b in itertools.pairwise(values)]
    assert [snapshot.total(0) for snapshot in book.snapshots(REV)] == values
    assert totals(book, 5, 20) == (values[-1] - 100, 0)


# -- a canary's restart counters, counted from its birth ------------------------------------------


def restarted(pod: str, container: str = "kserve-container") -> SeriesId:
    """kube-state-metrics' restart counter of one container (the container rides in code_class)."""
    return SeriesId(COUNTER_FIELD, pod, container)


def oom_marker(pod: str, container: str = "kserve-container") -> SeriesId:
    return SeriesId(OOM_FIELD, pod, container)


# p0 was OOM-killed once while loading its model, before the book ever sampled the revision; p1
# restarts (not an OOM kill) between the two samples.
WARM_UP = ((20, {restarted("p0"): 1.0, oom_marker("p0"): 1.0, restarted("p1"): 0.0}),)
LATER = ((30, {restarted("p0"): 1.0, oom_marker("p0"): 1.0, restarted("p1"): 1.0}),)


def restart_book(*, born: bool) -> CounterBook:
    book = CounterBook(tolerance=TOLERANCE)
    book.asked(REV, "rollout", at(20), at(30), born=born)
    for seconds, values in WARM_UP + LATER:
        assert book.record(REV, at(seconds), sample(values))
    return book


def restarts(book: CounterBook, start: float, *, from_birth: bool) -> tuple[int, int]:
    tally, _ = book.tally(REV, at(start), at(30), from_birth=from_birth)
    assert tally is not None
    return tally.requests, book.oom_kills(REV, at(start), at(30), from_birth=from_birth)


def test_a_canary_counted_from_birth_keeps_the_restarts_before_its_first_sample() -> None:
    born = restart_book(born=True)
    # From birth, whatever the range's start: the warm-up OOM kill and p1's restart.
    assert restarts(born, 10, from_birth=True) == (2, 1)
    assert restarts(born, 25, from_birth=True) == (2, 1)
    # A later range of the same revision (its second step) reads differences, as always.
    assert restarts(born, 25, from_birth=False) == (1, 0)
    # The same counters not counted from birth (the stable revision): the first sample is the baseline.
    baseline = restart_book(born=False)
    assert restarts(baseline, 10, from_birth=True) == (1, 0)
    assert restarts(baseline, 10, from_birth=False) == (1, 0)


def test_a_warm_up_oom_kill_is_an_alarm_in_the_first_sample_of_a_canary_counted_from_birth() -> None:
    for born, alarmed in ((True, 1), (False, 0)):
        book = CounterBook(tolerance=TOLERANCE)
        book.asked(REV, "rollout", at(20), at(20), born=born)
        book.record(REV, at(20), sample(WARM_UP[0][1]))
        assert book.new_oom_kills(REV) == alarmed
        book.record(REV, at(30), sample(LATER[0][1]))
        assert book.new_oom_kills(REV) == 0  # p1's restart is no OOM kill; p0's was counted already


def test_a_backfill_keeps_counting_from_birth() -> None:
    book = CounterBook(tolerance=TOLERANCE)
    book.asked(REV, "rollout", at(20), at(30), born=True)
    book.replay(REV, [(at(seconds), sample(values)) for seconds, values in WARM_UP + LATER])
    assert restarts(book, 10, from_birth=True) == (2, 1)


def test_only_a_revision_not_sampled_yet_can_be_counted_from_birth() -> None:
    book = CounterBook(tolerance=TOLERANCE)
    book.record(REV, at(20), sample(WARM_UP[0][1]))  # already tracked with a baseline
    book.asked(REV, "rollout", at(20), at(30), born=True)
    book.record(REV, at(30), sample(LATER[0][1]))
    assert restarts(book, 10, from_birth=True) == (1, 0)


# ---------------------------------------------------------------------------------------------
# Quantiles as histogram_quantile estimates them


@pytest.mark.parametrize(
    ("quantile", "expected"),
    [
        (0.5, 0.1 + (0.5 - 0.1) * (50 - 40) / (90 - 40)),  # inside the second bucket, linearly
        (0.2, 0.1 * 20 / 40),  # the first bucket starts at 0
        (0.9, 0.5),  # exactly at a bound
        (0.99, 1.0),  # in +Inf: the highest finite bound
    ],
)
def test_quantile_is_interpolated_inside_its_bucket(quantile: float, expected: float) -> None:
    histogram = Histogram((0.1, 0.5, 1.0), (40, 90, 95), 100)
    assert interpolated_quantile(quantile, histogram) == pytest.approx(expected)


def test_quantile_of_nothing_is_none() -> None:
    assert interpolated_quantile(0.5, Histogram((0.1,), (0,), 0)) is None


# ---------------------------------------------------------------------------------------------
# Measurements from counts


def test_counted_measurements() -> None:
    book = book_of(
        (
            0,
            {
                ok(): 0.0,
                SeriesId(BUCKET_FIELD, "p0", "2xx", 0.1): 0.0,
                SeriesId(BUCKET_FIELD, "p0", "2xx"): 0.0,
            },
        ),
        (
            5,
            {
                ok(): 95.0,
                err(): 5.0,
                SeriesId(BUCKET_FIELD, "p0", "2xx", 0.1): 90.0,
                SeriesId(BUCKET_FIELD, "p0", "2xx"): 95.0,
                SeriesId(BUCKET_FIELD, "p0", "5xx", 0.1): 0.0,
                SeriesId(BUCKET_FIELD, "p0", "5xx"): 5.0,
            },
        ),
    )
    counts = book.tally(REV, at(0), at(5))
    requests = count_measurement(REQUESTS, Unit.COUNT, REV, None, counts, min_requests=20, query="q")
    assert (requests.status, requests.value, requests.samples, requests.query) == (
        EvidenceStatus.OK,
        100,
        100,
        "q",
    )
    errors = count_measurement(MetricKind.ERROR_RATE.value, Unit.RATIO, REV, None, counts, min_requests=20)
    assert (errors.value, errors.samples) == (0.05, 100)
    p50 = count_measurement(MetricKind.LATENCY.value, Unit.SECONDS, REV, 0.5, counts, min_requests=20)
    assert p50.value == pytest.approx(0.1 * 50 / 90)
    assert p50.samples == 100
    few = count_measurement(MetricKind.ERROR_RATE.value, Unit.RATIO, REV, None, counts, min_requests=500)
    assert few.status is EvidenceStatus.NO_DATA
    assert few.detail == "100 requests in the window; a value needs at least 500"


def test_counted_measurements_without_series_failures_and_invalid_values() -> None:
    nothing = CounterBook(tolerance=TOLERANCE).tally(REV, at(0), at(5))
    for measure in (REQUESTS, MetricKind.ERROR_RATE.value, MetricKind.LATENCY.value):
        measurement = count_measurement(measure, Unit.NONE, REV, 0.99, nothing, min_requests=1)
        assert measurement.status is EvidenceStatus.NO_DATA
        assert "llama-predictor-00002" in measurement.detail
    failure = QueryFailure(ErrorClass.TIMEOUT, "slow")
    failed = count_measurement(REQUESTS, Unit.COUNT, REV, None, failure, min_requests=1, query="q")
    assert (failed.status, failed.error_class, failed.detail) == (
        EvidenceStatus.ERROR,
        ErrorClass.TIMEOUT,
        "slow",
    )
    book = book_of((0, {ok(): 1.0}))
    book.record(REV, at(5), sample({}, invalid="Prometheus answered +Inf for a request counter series"))
    invalid = count_measurement(
        REQUESTS, Unit.COUNT, REV, None, book.tally(REV, at(0), at(5)), min_requests=1
    )
    assert invalid.status is EvidenceStatus.INVALID_VALUE
    assert "+Inf" in invalid.detail
    zero = book_of((0, {ok(): 1.0}), (5, {ok(): 1.0}))
    none = count_measurement(
        MetricKind.ERROR_RATE.value, Unit.RATIO, REV, None, zero.tally(REV, at(0), at(5)), min_requests=20
    )
    assert none.detail == "no requests in the window; a value needs at least 20"


# ---------------------------------------------------------------------------------------------
# Reading answers


def _vector(series: list[dict[str, object]]) -> QueryOutcome:
    return QueryOutcome("q", QueryAnswer("vector", series), None, 1, 0.0)


def test_parse_vector_reads_series_converts_le_and_skips_revisions_not_asked() -> None:
    labels = {
        "kserve_canary_namespace": "ml",
        "kserve_canary_revision": REV.revision,
        "kserve_canary_pod": "p0",
        "kserve_canary_code_class": "2xx",
    }
    outcome = _vector(
        [
            {"metric": {**labels, "kserve_canary_field": "count"}, "value": [1, "12"]},
            {"metric": {**labels, "kserve_canary_field": "bucket", "le": "250"}, "value": [1, "10"]},
            {"metric": {**labels, "kserve_canary_field": "bucket", "le": "+Inf"}, "value": [1, "12"]},
            {
                "metric": {**labels, "kserve_canary_revision": "unasked", "kserve_canary_field": "count"},
                "value": [1, "1"],
            },
        ]
    )
    parsed = parse_counter_vector(outcome, [REV], divisor=1000.0)
    assert not isinstance(parsed, QueryFailure)
    assert dict(parsed[REV].values) == {
        ok(): 12.0,
        SeriesId(BUCKET_FIELD, "p0", "2xx", 0.25): 10.0,
        SeriesId(BUCKET_FIELD, "p0", "2xx", math.inf): 12.0,
    }


def test_the_identities_kept_share_one_string_per_label_value() -> None:
    """Each label value of a decoded answer is a string object of its own: the series kept from it
    hold one pod name, revision and namespace per pod, not one per series (the memory of a thousand
    rollouts' identities)."""
    pod = "resnet-predictor-00002-deployment-7d9f8c6b5-x2k9p"
    answer = json.loads(
        json.dumps(
            [
                {
                    "metric": {
                        "kserve_canary_namespace": "interned-ns",
                        "kserve_canary_revision": "interned-rev-00002",
                        "kserve_canary_pod": pod,
                        "kserve_canary_code_class": "2xx",
                        "kserve_canary_field": "bucket",
                        "le": le,
                    },
                    "value": [1, "3"],
                }
                for le in ("100", "250", "+Inf")
            ]
        )
    )
    revision = RevisionKey("interned-ns", "interned-rev-00002")
    parsed = parse_counter_vector(_vector(answer), [revision], divisor=1000.0)
    assert not isinstance(parsed, QueryFailure)
    series = list(parsed[revision].values)
    assert len(series) == 3
    assert all(one.pod is series[0].pod and one.code_class is series[0].code_class for one in series)
    again = parse_counter_vector(_vector(json.loads(json.dumps(answer))), [revision], divisor=1000.0)
    assert not isinstance(again, QueryFailure)
    assert {id(one.pod) for one in again[revision].values} == {id(series[0].pod)}


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_parse_vector_names_non_finite_values(value: str) -> None:
    labels = {
        "kserve_canary_namespace": "ml",
        "kserve_canary_revision": REV.revision,
        "kserve_canary_pod": "p0",
        "kserve_canary_field": "count",
    }
    parsed = parse_counter_vector(_vector([{"metric": labels, "value": [1, value]}]), [REV], metric="m")
    assert not isinstance(parsed, QueryFailure)
    assert parsed[REV].invalid == f"Prometheus answered {value} for a request counter series of m"


@pytest.mark.parametrize(
    "outcome",
    [
        QueryOutcome("q", QueryAnswer("matrix", []), None, 1, 0.0),
        _vector([{"metric": {"kserve_canary_namespace": "ml"}, "value": [1, "1"]}]),
        _vector(
            [
                {
                    "metric": {
                        "kserve_canary_namespace": "ml",
                        "kserve_canary_revision": "r",
                        "kserve_canary_field": "x",
                    },
                    "value": [1, "1"],
                }
            ]
        ),
        _vector(
            [
                {
                    "metric": {
                        "kserve_canary_namespace": "ml",
                        "kserve_canary_revision": "r",
                        "kserve_canary_field": "count",
                    },
                    "value": [1],
                }
            ]
        ),
    ],
)
def test_unexpected_answers_are_unexpected_results(outcome: QueryOutcome) -> None:
    parsed = parse_counter_vector(outcome, [RevisionKey("ml", "r")])
    assert isinstance(parsed, QueryFailure)
    assert parsed.error_class is ErrorClass.UNEXPECTED_RESULT


def test_parse_matrix_groups_by_time() -> None:
    labels = {
        "kserve_canary_namespace": "ml",
        "kserve_canary_revision": REV.revision,
        "kserve_canary_pod": "p0",
        "kserve_canary_code_class": "2xx",
        "kserve_canary_field": "count",
    }
    outcome = QueryOutcome(
        "q", QueryAnswer("matrix", [{"metric": labels, "values": [[10, "1"], [15, "3"]]}]), None, 1, 0
    )
    parsed = parse_counter_matrix(outcome, [REV])
    assert not isinstance(parsed, QueryFailure)
    assert {moment: dict(per[REV].values) for moment, per in parsed.items()} == {
        10.0: {ok(): 1.0},
        15.0: {ok(): 3.0},
    }


# ---------------------------------------------------------------------------------------------
# Backfill within Prometheus' limits


def test_a_long_backfill_is_split_within_the_points_per_series_limit_on_one_grid() -> None:
    revisions = {RevisionKey("ml", f"r{index}"): 100 for index in range(3)}
    end = at(30 * 24 * 3600)  # 30 days at 30 s: 86,401 points
    chunks = plan_backfill(revisions, T0, end, 30.0, sample_budget=50_000_000)
    points = [round((c.end - c.start).total_seconds() / 30) + 1 for c in chunks]
    assert max(points) <= MAX_POINTS_PER_SERIES
    assert sum(points) == 86_401
    for first, second in itertools.pairwise(chunks):
        assert second.start - first.end == timedelta(seconds=30)  # no gap, no overlap
    assert chunks[-1].end == end
    assert all(set(chunk.revisions) == set(revisions) for chunk in chunks)


def test_a_backfill_splits_the_revisions_by_the_sample_budget() -> None:
    revisions = {RevisionKey("ml", f"r{index}"): 1000 for index in range(10)}
    chunks = plan_backfill(revisions, T0, at(3600), 30.0, sample_budget=500_000)
    for chunk in chunks:
        points = round((chunk.end - chunk.start).total_seconds() / 30) + 1
        assert sum(revisions[revision] for revision in chunk.revisions) * points <= 500_000
    assert sorted(revision for chunk in chunks for revision in chunk.revisions) == sorted(revisions)
    huge = plan_backfill({REV: 100_000}, T0, at(3600), 30.0, sample_budget=1_000_000)
    assert len(huge) > 1  # one revision alone over budget: its range is split instead
    assert all((round((c.end - c.start).total_seconds() / 30) + 1) * 100_000 <= 1_000_000 for c in huge)


# ---------------------------------------------------------------------------------------------
# Gauge peaks


def _gpu(pod: str) -> frozenset[tuple[str, str]]:
    return frozenset({("pod", pod), ("gpu", "0")})


def test_a_window_peak_is_the_maximum_of_its_ticks_and_counts_every_series_seen() -> None:
    book = PeakBook(tolerance=TOLERANCE)
    book.record(REV, at(0), at(5), PeakSample({_gpu("a"): {"peak": 10.0, "fraction": 0.1}}))
    book.record(REV, at(5), at(10), PeakSample({_gpu("a"): {"peak": 30.0, "fraction": 0.3}}))
    book.record(REV, at(10), at(15), PeakSample({_gpu("b"): {"peak": 20.0, "fraction": 0.2}}))
    assert book.window(REV, at(0), at(15)) == ({"peak": 30.0, "fraction": 0.3}, 2)
    assert book.window(REV, at(10), at(15)) == ({"peak": 20.0, "fraction": 0.2}, 1)
    assert book.window(RevisionKey("ml", "unknown"), at(0), at(15)) == ({}, 0)
    assert not book.record(REV, at(10), at(15), PeakSample({}))  # not newer


def test_peaks_follow_max_over_time_for_non_finite_values() -> None:
    book = PeakBook(tolerance=TOLERANCE)
    book.record(REV, at(0), at(5), PeakSample({_gpu("a"): {"peak": math.nan}}))
    assert math.isnan(book.window(REV, at(0), at(5))[0]["peak"])  # NaN only when all is NaN
    book.record(REV, at(5), at(10), PeakSample({_gpu("a"): {"peak": 3.0}}))
    assert book.window(REV, at(0), at(10))[0]["peak"] == 3.0
    book.record(REV, at(10), at(15), PeakSample({_gpu("a"): {"peak": math.inf}}))
    assert book.window(REV, at(0), at(15))[0]["peak"] == math.inf


def test_peak_memory_is_bounded_and_backfill_needed_once() -> None:
    book = PeakBook(tolerance=TOLERANCE, idle=timedelta(minutes=5))
    assert book.needs_backfill(REV, at(0))
    book.replay(REV, [(at(-5), at(0), PeakSample({_gpu("a"): {"peak": 1.0}}))], at(-5))
    assert not book.needs_backfill(REV, at(-5))
    for tick in range(1, 200):
        now = at(tick * 5)
        book.asked(REV, "rollout", now - timedelta(seconds=60), now)
        book.record(REV, now - timedelta(seconds=5), now, PeakSample({_gpu("a"): {"peak": float(tick)}}))
        book.prune(now)
    assert book.window(REV, at(995 - 60), at(995)) == ({"peak": 199.0}, 1)
    assert len(book.entries(REV)) <= 60 / 5 + 2


def test_keys_that_appear_later_are_zero_before_and_counted_whole_after() -> None:
    # Snapshots keep their totals compactly, over the keys known when each was taken: a 5xx class, a
    # new bucket bound and a new latency measure appearing mid-way must read as zero before and
    # count whole after, in every tally.
    def bucket(le: float, kind: str = BUCKET_FIELD) -> SeriesId:
        return SeriesId(kind, "p0", "", le)

    first = {ok(): 100.0, bucket(0.1): 80.0, bucket(math.inf): 100.0}
    second = {**first, ok(): 130.0, err(): 5.0, bucket(0.1): 90.0, bucket(0.5): 20.0, bucket(math.inf): 135.0}
    third = {
        **second,
        ok(): 140.0,
        bucket(math.inf): 145.0,
        bucket(0.5): 25.0,
        bucket(1.0, "bucket:ttft"): 7.0,
    }
    book = book_of((0, first), (5, second), (10, third))
    one, two = book.count_series(REV, at(0), at(10)).tallies
    assert (one.requests, one.errors, two.requests, two.errors) == (35, 5, 10, 0)
    assert one.histograms["latency"] == Histogram((0.1, 0.5), (10, 20), 35)
    assert two.histograms["latency"] == Histogram((0.1, 0.5), (0, 5), 10)
    assert "ttft" not in one.histograms and two.histograms["ttft"] == Histogram((1.0,), (7,), 7)
    whole, last = book.tally(REV, at(0), at(10))
    assert whole is not None and last is not None
    assert (whole.requests, whole.errors) == (45, 5)
    assert whole.histograms["latency"] == Histogram((0.1, 0.5), (10, 25), 45)
    baseline = book.snapshots(REV)[0]
    assert baseline.by_class == {"2xx": 0} and baseline.buckets == {"latency": {0.1: 0, math.inf: 0}}
    assert last.by_class == {"2xx": 40, "5xx": 5}
    assert last.buckets["ttft"] == {1.0: 7}


def test_revisions_whose_keys_came_in_one_order_share_one_layout_and_read_their_own_totals() -> None:
    # A thousand rollouts' revisions export the same classes and buckets: one layout for all of
    # them, whatever order each answer listed its series in, and a key one revision gains moves it
    # alone to a longer layout while its earlier snapshots read what they read before.
    def bucket(le: float) -> SeriesId:
        return SeriesId(BUCKET_FIELD, "p0", "", le)

    keys = [ok(), err(), bucket(0.1), bucket(0.5), bucket(math.inf)]
    other = RevisionKey("ml", "llama-predictor-00001")
    book = CounterBook(tolerance=TOLERANCE)
    book.record(REV, at(0), sample({series: 10.0 for series in keys}))
    book.record(other, at(0), sample({series: 50.0 for series in reversed(keys)}))
    book.record(REV, at(5), sample({series: 20.0 for series in keys}))
    book.record(other, at(5), sample({series: 52.0 for series in keys}))
    mine, theirs = book.snapshots(REV), book.snapshots(other)
    assert mine[-1].layout is theirs[-1].layout
    assert (mine[-1].by_class, theirs[-1].by_class) == ({"2xx": 10, "5xx": 10}, {"2xx": 2, "5xx": 2})

    book.record(REV, at(10), sample({**{series: 30.0 for series in keys}, bucket(1.0): 4.0}))
    book.record(other, at(10), sample({series: 53.0 for series in keys}))
    mine, theirs = book.snapshots(REV), book.snapshots(other)
    assert mine[-1].layout is not theirs[-1].layout and len(mine[-1].layout.keys) == len(keys) + 1
    assert theirs[-1].layout is theirs[0].layout
    assert [snapshot.buckets for snapshot in mine] == [
        {"latency": {0.1: 0, 0.5: 0, math.inf: 0}},
        {"latency": {0.1: 10, 0.5: 10, math.inf: 10}},
        {"latency": {0.1: 20, 0.5: 20, 1.0: 4, math.inf: 20}},
    ]
    assert totals(book, 0, 10) == (40, 20)


_LABEL_VALUES = st.one_of(
    st.sampled_from(["ml", "r1", "count", "bucket", "oom", "ttft_bucket", "p-0", "5xx", "0.25", "+Inf", "x"]),
    st.text(max_size=4),
    st.integers(-2, 2),
    st.lists(st.integers(), max_size=2),  # not hashable: read the long way
    st.none(),
)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(
                [
                    "kserve_canary_namespace",
                    "kserve_canary_revision",
                    "kserve_canary_field",
                    "kserve_canary_pod",
                    "kserve_canary_code_class",
                    "le",
                    "other",
                ]
            ),
            _LABEL_VALUES,
            max_size=7,
        ),
        min_size=1,
        max_size=6,
    ),
    st.sampled_from([1.0, 1000.0]),
)
def test_a_remembered_series_identity_is_the_one_its_labels_give(
    labels_seen: list[dict[str, object]], divisor: float
) -> None:
    """The identities are remembered across ticks by their label values: asking again, in any order,
    for any labels (broken ones too), gives what reading the labels afresh gives."""
    from canary.metrics.counting import decode as counters

    for labels in [*labels_seen, *reversed(labels_seen)]:
        assert counters._series_id(labels, divisor) == counters._read_series_id(labels, divisor)


# -- compaction: the settled past at the grain of evaluations ----------------------------------


def _per_tick_book(
    ticks: int, period: float, every: int, interval: float, *, second_step: float | None = None
) -> tuple[CounterBook, CounterBook, list[float]]:
    """A compacted book and an uncompacted one, sampled every ``period`` seconds, evaluated every
    ``every`` ticks (asked, recorded, pruned, as a tick does); the rollout's second step starts at
    ``second_step`` (seen at the first evaluation after it)."""
    compacted, reference = CounterBook(tolerance=TOLERANCE), CounterBook(tolerance=TOLERANCE)
    evaluations = []
    for tick in range(ticks):
        seconds = tick * period
        now = at(seconds)
        values = {ok(): float(tick * 10), err(): float(tick // 3)}
        if tick % every == 0:
            step = at(second_step) if second_step is not None and seconds > second_step else at(0)
            compacted.asked(REV, "rollout", at(0), now, starts=(step,), interval=interval)
            evaluations.append(seconds)
        for book in (compacted, reference):
            book.record(REV, now, sample(values))
        compacted.prune(now)
    return compacted, reference, evaluations


def test_past_steps_are_kept_per_evaluation_interval_and_the_current_step_per_tick() -> None:
    compacted, reference, evaluations = _per_tick_book(
        ticks=121, period=5, every=6, interval=30, second_step=302
    )
    assert len(reference.snapshots(REV)) == 121
    # The first step (0-300 s) one per evaluation (11); the second, from 302 s, every tick (60).
    assert len(compacted.snapshots(REV)) == 11 + 60
    series = compacted.count_series(REV, at(0), at(600))
    spans = [
        (round((t.start - T0).total_seconds()), round((t.end - T0).total_seconds())) for t in series.tallies
    ]
    assert spans[:10] == list(itertools.pairwise(evaluations[:11]))
    assert spans[10:] == [(start, start + 5) for start in range(300, 600, 5)]
    whole, expected = (
        CountSeries.total(series.tallies),
        CountSeries.total(reference.count_series(REV, at(0), at(600)).tallies),
    )
    assert whole is not None and expected is not None
    assert (whole.requests, whole.errors) == (expected.requests, expected.errors)
    # Its step's own evidence reads what the uncompacted book reads.
    got, want = compacted.tally(REV, at(302), at(600))[0], reference.tally(REV, at(302), at(600))[0]
    assert got is not None and want is not None
    assert (got.start, got.requests, got.errors) == (want.start, want.requests, want.errors)


def test_tallies_read_after_the_book_moved_on_are_the_ones_of_when_they_were_asked() -> None:
    # A tick's tallies are read lazily from the book's arrays (their histograms when the judge asks):
    # samples recorded after, a widening past 65,535 and a compaction must not change them.
    def bucket(le: float) -> SeriesId:
        return SeriesId(BUCKET_FIELD, "p0", "", le)

    def values(tick: int) -> dict[SeriesId, float]:
        scale = 1 if tick < 30 else 1_000
        return {
            ok(): tick * 10.0 * scale,
            bucket(0.1): tick * 7.0 * scale,
            bucket(math.inf): tick * 10.0 * scale,
        }

    book = CounterBook(tolerance=TOLERANCE)
    for tick in range(20):
        if tick % 6 == 0:  # evaluated every 30 s, sampled every 5 s
            book.asked(REV, "rollout", at(0), at(tick * 5), starts=(at(0),), interval=30)
        book.record(REV, at(tick * 5), sample(values(tick)))
    series = book.count_series(REV, at(0), at(95))
    eager = [
        (tally.requests, dict(tally.histograms)) for tally in book.count_series(REV, at(0), at(95)).tallies
    ]
    whole = series.total_since(at(20))
    assert whole is not None
    for tick in range(20, 80):  # a second step from 150 s: the first is compacted; totals widen
        if tick % 6 == 0:
            step = at(150) if tick * 5 > 150 else at(0)
            book.asked(REV, "rollout", at(0), at(tick * 5), starts=(step,), interval=30)
        book.record(REV, at(tick * 5), sample(values(tick)))
        book.prune(at(tick * 5))
    assert len(book.snapshots(REV)) < 80
    assert [(tally.requests, dict(tally.histograms)) for tally in series.tallies] == eager
    assert eager[0][1]["latency"] == Histogram((0.1,), (7,), 10)
    later = series.total_since(at(20))
    assert later is not None and (later.requests, later.histograms) == (whole.requests, whole.histograms)


def _live_tallies() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is Tally)


def test_a_series_tallies_are_built_when_read_and_not_kept() -> None:
    # A tick holds the evidence of every rollout it decides until their judgements are done: a
    # series that built its step's tallies at once held a tally per tick of every due rollout.
    book = CounterBook(tolerance=TOLERANCE)
    for tick in range(40):
        book.record(REV, at(tick * 5), sample({ok(): tick * 10.0, err(): float(tick // 4)}))
    before = _live_tallies()
    held = [book.count_series(REV, at(0), at(195)) for _ in range(25)]
    assert _live_tallies() == before  # 25 series of 39 tallies each, none built
    every = tuple(held[0].tallies)
    assert len(every) == len(held[0].tallies) == 39
    assert _live_tallies() == before + 39  # the ones read, and only while they are used
    del every
    assert _live_tallies() == before
    # What is read is what a tuple of them is: by index, from the end, by slice, and equal.
    series = held[1].tallies
    assert [tally.requests - tally.errors for tally in series] == [10] * 39  # 2xx, and 5xx apart
    assert (series[0].start, series[0].end, series[-1].end) == (at(0), at(5), at(195))
    assert series[10:12] == tuple(series)[10:12] and series[::7] == tuple(series)[::7]
    assert series[5:5] == () and series == tuple(held[2].tallies) and series == held[3].tallies
    assert sum(tally.errors for tally in series) == 9
    with pytest.raises(IndexError):
        series[39]


def test_a_first_step_is_never_compacted() -> None:
    compacted, reference, _ = _per_tick_book(ticks=61, period=5, every=6, interval=30)
    assert len(compacted.snapshots(REV)) == len(reference.snapshots(REV)) == 61


def test_a_backfilled_past_is_kept_one_snapshot_per_interval() -> None:
    """After a restart the book holds its past at scrape resolution; one evaluation over it must
    still leave one tally per interval, or the judge could not see how the counts vary."""
    book = CounterBook(tolerance=timedelta(seconds=1))
    book.replay(REV, [(at(seconds), sample({ok(): float(seconds)})) for seconds in range(0, 601, 2)])
    book.asked(REV, "rollout", at(0), at(600), starts=(at(300),), interval=60)  # in its second step
    book.prune(at(600))
    tallies = book.count_series(REV, at(0), at(600)).tallies
    assert [round((t.end - t.start).total_seconds()) for t in tallies] == [60] * 5 + [2] * 150
    assert sum(t.requests for t in tallies) == 600


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.5, max_value=8.0),  # seconds since the previous tick
            st.integers(min_value=0, max_value=40),  # requests in it
            st.integers(min_value=0, max_value=5),  # errors in it
            st.booleans(),  # the pod restarted (its counters start from zero)
            st.sampled_from([None, None, 0.0, 0.4, 1.0]),  # an evaluation, its step started x ago
        ),
        min_size=3,
        max_size=60,
    ),
    st.sampled_from([5.0, 10.0, 30.0]),
)
def test_every_range_asked_reads_what_the_uncompacted_book_reads(
    ticks: list[tuple[float, int, int, bool, float | None]], interval: float
) -> None:
    compacted, reference = CounterBook(tolerance=TOLERANCE), CounterBook(tolerance=TOLERANCE)
    moment, served, failed = 0.0, 0, 0
    last_evaluation = 0.0
    for index, (gap, requests, errors, restarted, drawn) in enumerate(ticks):
        step = 0.0 if index == 0 else drawn  # a revision is tracked from its rollout's first ask
        moment += gap
        served, failed = (requests, errors) if restarted else (served + requests, failed + errors)
        now = at(moment)
        step_start = None
        if step is not None:
            step_start = at(last_evaluation + step * (moment - last_evaluation))
            compacted.asked(REV, "rollout", at(0), now, starts=(step_start,), interval=interval)
        for book in (compacted, reference):
            book.record(REV, now, sample({ok(): float(served), err(): float(failed)}))
        compacted.prune(now)
        if step_start is None:
            continue
        last_evaluation = moment
        for start in (at(0), step_start):
            got, want = compacted.tally(REV, start, now)[0], reference.tally(REV, start, now)[0]
            assert (got is None) == (want is None)
            if got is not None and want is not None:
                assert (got.start, got.end, got.requests, got.errors) == (
                    want.start,
                    want.end,
                    want.requests,
                    want.errors,
                )
            series = compacted.count_series(REV, start, now).tallies
            assert all(a.end == b.start for a, b in itertools.pairwise(series)), "contiguous"
            total, expected = (
                CountSeries.total(series),
                CountSeries.total(reference.count_series(REV, start, now).tallies),
            )
            assert (total is None) == (expected is None)
            if total is not None and expected is not None:
                assert (total.requests, total.errors) == (expected.requests, expected.errors)
    assert len(compacted.snapshots(REV)) <= len(reference.snapshots(REV))


# -- a book read only over whole ranges (the restart counters) keeps nothing per tick -------------


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.5, max_value=8.0),  # seconds since the previous tick
            st.frozensets(st.sampled_from(["p0", "p1", "p2"]), max_size=3),  # the pods present
            st.integers(min_value=0, max_value=2),  # restarts of each pod present in it
            st.booleans(),  # those restarts were OOM kills
            st.sampled_from([None, None, None, 0.0, 0.5, 1.0]),  # an evaluation, its step started x ago
        ),
        min_size=3,
        max_size=60,
    ),
    st.booleans(),  # the revision is counted from birth (a canary's restarts)
    st.booleans(),  # the book keeps per-tick tallies (the requests book) or not (the restart book)
)
def test_a_compacted_book_reads_every_range_asked_as_the_whole_book_does(
    ticks: list[tuple[float, frozenset[str], int, bool, float | None]], born: bool, per_tick: bool
) -> None:
    """Whichever snapshots compaction drops, every range a rollout reads (from its first step's
    start or its current step's to the latest sample) reads the same restarts, OOM kills, pods and presence of series as a book that keeps
    every sample, and the latest sample's OOM kills (the alarm) are the same."""
    compacted = CounterBook(tolerance=TOLERANCE, per_tick=per_tick)
    reference = CounterBook(tolerance=TOLERANCE)
    counts: dict[str, float] = {}
    moment, last_evaluation, asked = 0.0, 0.0, False
    for gap, pods, restarts_each, oom, drawn in ticks:
        moment += gap
        now = at(moment)
        step = 0.0 if not asked else drawn  # a revision is tracked from its rollout's first ask
        if step is not None:
            step_start = at(last_evaluation + step * (moment - last_evaluation))
            for book in (compacted, reference):
                book.asked(REV, "rollout", at(0), now, starts=(step_start,), interval=30.0, born=born)
            asked = True
        values: dict[SeriesId, float] = {}
        for pod in sorted(pods):
            counts[pod] = counts.get(pod, 0.0) + restarts_each
            values[restarted(pod)] = counts[pod]
            if oom:
                values[oom_marker(pod)] = 1.0
        for book in (compacted, reference):
            assert book.record(REV, now, sample(values))
        compacted.prune(now)
        assert compacted.new_oom_kills(REV) == reference.new_oom_kills(REV)
        if step is None:
            continue
        last_evaluation = moment
        for start in (at(0), step_start):  # the ranges it reads: its history and its step
            for from_birth in {False, born}:
                got, want = (
                    compacted.tally(REV, start, now, from_birth=from_birth),
                    reference.tally(REV, start, now, from_birth=from_birth),
                )
                assert (got[0] is None) == (want[0] is None)
                if got[0] is not None and want[0] is not None:
                    assert (got[0].start, got[0].end, got[0].requests) == (
                        want[0].start,
                        want[0].end,
                        want[0].requests,
                    )
                assert compacted.oom_kills(REV, start, now, from_birth=from_birth) == reference.oom_kills(
                    REV, start, now, from_birth=from_birth
                )
            assert compacted.pods_seen(REV, start, now) == reference.pods_seen(REV, start, now)
            assert (
                compacted.count_series(REV, start, now).status
                == reference.count_series(REV, start, now).status
            )


def test_a_book_without_per_tick_tallies_keeps_the_range_starts_what_follows_the_last_evaluation_and_the_last_two() -> (
    None
):
    book = CounterBook(tolerance=TOLERANCE, per_tick=False)
    kept: dict[int, list[int]] = {}
    for tick in range(126):  # 10.5 minutes at a 5 s tick, evaluated every 30 s, one step from 0 s
        now = at(tick * 5)
        if tick % 6 == 0:
            book.asked(REV, "rollout", at(0), now, starts=(at(0),), interval=30.0)
        book.record(REV, now, sample({restarted("p0"): 0.0, restarted("p1"): float(tick // 40)}))
        book.prune(now)
        kept[tick] = [round((snapshot.at - T0).total_seconds()) for snapshot in book.snapshots(REV)]
    assert kept[120] == [0, 595, 600]  # evaluated at 600 s: the start, and the last two
    assert kept[125] == [0, *range(600, 626, 5)]  # a step starting after 600 s may be read from any
    tally, _ = book.tally(REV, at(0), at(625))
    assert tally is not None and tally.requests == 3
    assert book.pods_seen(REV, at(0), at(625)) == 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**40), min_size=2, max_size=8))
def test_totals_of_any_size_are_kept_exactly(increments: list[int]) -> None:
    """Snapshots keep their totals in the narrowest array that holds them (2, 4 or 8 bytes a total):
    a total past each width is still exact."""
    book = CounterBook(tolerance=TOLERANCE)
    served = 0
    for tick, increment in enumerate(increments):
        served += increment
        assert book.record(REV, at(tick * 5), sample({ok(): float(served), err(): float(served // 7)}))
    expected = served - increments[0]  # the first sample is the baseline
    whole, _ = book.tally(REV, at(0), at(5 * (len(increments) - 1)))
    assert whole is not None and (whole.requests, whole.errors) == (
        expected + served // 7 - increments[0] // 7,
        served // 7 - increments[0] // 7,
    )
    assert sum(t.requests for t in book.count_series(REV, at(0), at(5 * len(increments))).tallies) == (
        whole.requests
    )


def _standing_for(times: list[float], start: float, end: float, tolerance: float) -> tuple[int, int] | None:
    """The snapshots standing for a range, by the definition, one snapshot at a time: the last one at
    most a tolerance after ``end``; of those up to it the nearest to ``start`` within a tolerance
    (the earliest of equals), else the last one before ``start``, else the first."""
    upto = [index for index, moment in enumerate(times) if moment <= end + tolerance]
    if not upto:
        return None
    last = upto[-1]
    near = [index for index in range(last + 1) if abs(times[index] - start) <= tolerance]
    if near:
        return min(near, key=lambda index: abs(times[index] - start)), last
    before = [index for index in range(last + 1) if times[index] < start]
    return (before[-1] if before else 0), last


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=1, max_value=12), min_size=1, max_size=30),  # seconds between samples
    st.integers(min_value=-10, max_value=200),  # the range's start and length, in half seconds
    st.integers(min_value=0, max_value=200),
)
def test_a_range_is_read_from_the_snapshots_the_definition_names(
    gaps: list[int], start: int, length: int
) -> None:
    """The book finds a range's snapshots by bisection (every evaluation reads two revisions' ranges
    from a step of snapshots); it picks the ones the definition picks."""
    times = list(itertools.accumulate(gaps))
    book = book_of(*((moment, {ok(): float(index)}) for index, moment in enumerate(times)))
    begin, finish = start / 2, (start + length) / 2
    expected = _standing_for([float(moment) for moment in times], begin, finish, TOLERANCE.total_seconds())
    tally, last = book.tally(REV, at(begin), at(finish))
    if expected is None:
        assert (tally, last) == (None, None)
        return
    assert tally is not None and last is not None
    first_index, last_index = expected
    assert (tally.start, tally.end) == (at(times[first_index]), at(times[last_index]))
    assert tally.requests == last_index - first_index


def test_pruning_keeps_the_snapshot_standing_for_the_oldest_start_between_two_samples() -> None:
    book = CounterBook(tolerance=TOLERANCE)
    book.asked(REV, "rollout", at(15), at(15))
    for seconds in range(0, 101, 10):
        book.record(REV, at(seconds), sample({ok(): float(seconds)}))
    before = book.tally(REV, at(15), at(100))[0]
    book.prune(at(100))
    after = book.tally(REV, at(15), at(100))[0]
    assert before is not None and after is not None
    # No sample within a tolerance of 15 s: the last one before it (10 s) stands for it.
    assert (after.start, after.requests) == (before.start, before.requests) == (at(10), 90)
    assert book.snapshots(REV)[0].at == at(10)


@pytest.mark.parametrize(("absent_ticks", "counted"), [(50, 5), (70, 45)])
def test_a_series_absent_longer_than_idle_is_forgotten_and_counts_whole_when_it_comes_back(
    absent_ticks: int, counted: int
) -> None:
    """p1 serves 40 requests, disappears (a pod gone from the scrape) while p0 goes on, and comes back
    at 45: within the idle time (5 min = 60 ticks) its counter goes on from 40 (5 new); after it,
    the series was forgotten and its whole 45 counts."""
    book = CounterBook(tolerance=TOLERANCE, idle=timedelta(minutes=5))
    tick = 0

    def step(values: dict[SeriesId, float]) -> None:
        nonlocal tick
        now = at(tick * 5)
        book.asked(REV, "rollout", at(0), now)
        book.record(REV, now, sample(values))
        book.prune(now)
        tick += 1

    step({ok("p0"): 0.0, ok("p1"): 0.0})
    step({ok("p0"): 0.0, ok("p1"): 40.0})
    for _ in range(absent_ticks):
        step({ok("p0"): 0.0})
    before = tick
    step({ok("p0"): 0.0, ok("p1"): 45.0})
    tally, _ = book.tally(REV, at((before - 1) * 5), at(before * 5))
    assert tally is not None and tally.requests == counted


def test_a_series_back_from_a_short_absence_is_not_forgotten_later() -> None:
    """p1 misses two samples (a slow scrape), comes back and stays: more than ``idle`` after its
    absence it still counts its increments, not its whole value."""
    book = CounterBook(tolerance=TOLERANCE, idle=timedelta(minutes=5))
    for tick in range(100):  # 5 s apart: the absence (ticks 3-4) ends 8 minutes before the last
        now = at(tick * 5)
        book.asked(REV, "rollout", at(0), now)
        values = {ok("p0"): 0.0} if tick in (3, 4) else {ok("p0"): 0.0, ok("p1"): float(1000 + tick)}
        book.record(REV, now, sample(values))
        book.prune(now)
    tally, _ = book.tally(REV, at(0), at(99 * 5))
    assert tally is not None and tally.requests == 99  # 1099 - 1000: its increments only


def test_the_newest_sample_time_travels_beside_the_counters_not_as_one() -> None:
    labels = {
        "kserve_canary_namespace": "ml",
        "kserve_canary_revision": REV.revision,
        "kserve_canary_pod": "p0",
        "kserve_canary_code_class": "2xx",
    }
    newest = {
        "kserve_canary_namespace": "ml",
        "kserve_canary_revision": REV.revision,
        "kserve_canary_field": "newest",
    }
    outcome = _vector(
        [
            {"metric": {**labels, "kserve_canary_field": "count"}, "value": [1000, "12"]},
            {"metric": newest, "value": [1000, "970.5"]},
        ]
    )
    parsed = parse_counter_vector(outcome, [REV], divisor=1000.0)
    assert not isinstance(parsed, QueryFailure)
    assert dict(parsed[REV].values) == {ok(): 12.0}
    assert parsed[REV].newest == 970.5


def test_the_counts_say_how_far_they_reach() -> None:
    # Late evidence (issue 33, item 7): a revision's counts reach its newest sample; a sample without
    # series reaches where it stands (Prometheus holds nothing newer for it up to there).
    book = CounterBook(tolerance=TOLERANCE)
    book.record(REV, at(0), RevisionSample({ok(): 1.0}, newest=at(-1).timestamp()))
    book.record(REV, at(5), RevisionSample({ok(): 9.0}, newest=at(4).timestamp()))
    assert book.count_series(REV, at(0), at(5)).newest == at(4)
    book.record(REV, at(10), RevisionSample({}))
    assert book.count_series(REV, at(0), at(10)).newest == at(10)
