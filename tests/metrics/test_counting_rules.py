"""The counter book's fast store against the rules on plain dicts (canary.metrics.counting.rules).

The book keeps a revision's snapshots as packed columns over shared layouts, widens them as totals
grow, and builds tallies when they are read; the rules state the same counts as dicts of clean
totals per key and a tally as their difference. Whatever the samples (counter resets, pods and
response classes appearing mid-range, buckets appearing, totals past 65,535 and 2**32), both must
give the same totals, tallies and sums.
"""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from canary.evidence import CountSeries, Tally
from canary.metrics.catalog import RevisionKey
from canary.metrics.counting.book import CounterBook
from canary.metrics.counting.rules import Key, RevisionSample, SeriesId, clean_totals, tally
from canary.metrics.tick_queries import BUCKET_FIELD, COUNTER_FIELD

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
REV = RevisionKey("ml", "llama-predictor-00002")
PODS = ("p0", "p1", "p2")
TTFT = "bucket:ttft"

# Requests of one pod in one tick: few, past what 2 bytes hold, past what 4 bytes hold.
_served = st.one_of(st.integers(0, 30), st.integers(0, 70_000), st.integers(0, 2**33))
_pod_tick = st.tuples(
    st.booleans(),  # present in the sample (p0 always is)
    st.booleans(),  # restarted since the previous tick: its counters start from zero
    _served,  # 2xx
    st.integers(0, 5),  # 5xx: the series appears with the first one
    st.integers(0, 3),  # 4xx: likewise
)
_tick = st.tuples(
    st.lists(_pod_tick, min_size=len(PODS), max_size=len(PODS)),
    st.booleans(),  # a finer latency bucket is exported from this tick on
    st.booleans(),  # vLLM's TTFT histogram is exported from this tick on
)


def at(tick: int) -> datetime:
    return T0 + timedelta(seconds=5 * tick)


def _samples(
    ticks: list[tuple[list[tuple[bool, bool, int, int, int]], bool, bool]],
) -> list[dict[SeriesId, float]]:
    """Each tick's sample: per pod its counters by response class and its cumulative buckets."""
    counts: dict[str, dict[Key, int]] = {}
    finer = ttft = False
    samples = []
    for pods, finer_now, ttft_now in ticks:
        finer, ttft = finer or finer_now, ttft or ttft_now
        values: dict[SeriesId, float] = {}
        for pod, (present, restarted, served, errors, client) in zip(PODS, pods, strict=True):
            if not present and pod != PODS[0]:
                continue
            mine = counts.setdefault(pod, {})
            if restarted:
                mine.clear()
            for key, add in (
                (("", "2xx"), served),
                (("", "5xx"), errors),
                (("", "4xx"), client),
                (("latency", 0.1), served // 4 if finer else 0),
                (("latency", 0.5), served // 2),
                (("latency", math.inf), served + errors + client),
                (("ttft", 1.0), served // 3 if ttft else 0),
                (("ttft", math.inf), served if ttft else 0),
            ):
                mine[key] = mine.get(key, 0) + add
            values.update(_series(pod, mine, finer=finer, ttft=ttft))
        samples.append(values)
    return samples


def _series(pod: str, counts: dict[Key, int], *, finer: bool, ttft: bool) -> dict[SeriesId, float]:
    """A pod's series: a response class once it has a request, a bucket once it is exported."""
    values: dict[SeriesId, float] = {}
    for (measure, bound), count in counts.items():
        if not measure:
            if count or bound == "2xx":
                values[SeriesId(COUNTER_FIELD, pod, str(bound))] = float(count)
        elif (measure == "ttft" and ttft) or (measure == "latency" and (finer or bound != 0.1)):
            kind = TTFT if measure == "ttft" else BUCKET_FIELD
            values[SeriesId(kind, pod, "", float(bound))] = float(count)
    return values


def _fields(found: Tally | None) -> tuple[Any, ...] | None:
    if found is None:
        return None
    return (found.start, found.end, found.requests, found.errors, found.client_errors, dict(found.histograms))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(_tick, min_size=2, max_size=20),
    st.booleans(),  # counted from birth (a canary's restart counters count their first sample whole)
    st.data(),
)
def test_the_store_reads_what_the_rules_define(
    ticks: list[tuple[list[tuple[bool, bool, int, int, int]], bool, bool]], born: bool, data: st.DataObject
) -> None:
    samples = _samples(ticks)
    book = CounterBook(tolerance=timedelta(seconds=2.5))
    if born:
        book.asked(REV, "rollout", at(0), at(0), born=True)
    for tick, values in enumerate(samples):
        assert book.record(REV, at(tick), RevisionSample(values))
    plain = clean_totals(((at(tick), values) for tick, values in enumerate(samples)), from_birth=born)

    # The snapshots hold the clean totals exactly, whatever width their columns took.
    snapshots = book.snapshots(REV)
    assert [(s.at, dict(zip(s.layout.keys, s.totals, strict=False))) for s in snapshots] == [
        (moment, totals) for moment, totals, _ in plain
    ]
    # Consecutive tallies are the differences of consecutive snapshots.
    last = len(samples) - 1
    series = book.count_series(REV, at(0), at(last))
    defined = [tally(a, before, b, after) for (a, before, _), (b, after, _) in itertools.pairwise(plain)]
    assert [_fields(one) for one in series.tallies] == [_fields(one) for one in defined]
    # What adds a range's tallies up is what adding them one by one gives.
    start = data.draw(st.integers(0, last), label="range start")
    assert _fields(series.total_since(at(start))) == _fields(CountSeries.total(defined[start:]))
    # A whole range is the difference of its end snapshots (from zero, counted from birth).
    end = data.draw(st.integers(start, last), label="range end")
    whole, final = book.tally(REV, at(start), at(end), from_birth=born)
    base = {} if born else plain[start][1]
    assert _fields(whole) == _fields(tally(at(0) if born else at(start), base, at(end), plain[end][1]))
    assert final is not None and final.at == at(end)
