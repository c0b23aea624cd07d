"""A refused grouped query (canary.metrics.split): asked again by namespace, then by rollout; only the
rollout whose own part fails is held, asked apart until it is answered again; failures that say
nothing about the series are not split."""

from __future__ import annotations

from collections.abc import Sequence

from canary.evidence import ErrorClass
from canary.metrics.catalog import RevisionKey
from canary.metrics.client import QueryFailure, QueryOutcome
from canary.metrics.split import Splitter

A1, A1S = RevisionKey("team-a", "fraud-2"), RevisionKey("team-a", "fraud-1")
A2 = RevisionKey("team-a", "greedy-2")
B1 = RevisionKey("team-b", "search-2")
OWNERS = {A1: "fraud", A1S: "fraud", A2: "greedy", B1: "search"}
REVISIONS = sorted(OWNERS)
REFUSED = QueryFailure(ErrorClass.EXECUTION, "HTTP 422 execution: too many samples", 422)


class Prometheus:
    """Refuses (``failure``) any query that includes one of ``bad``; records what was asked."""

    def __init__(self, bad: set[RevisionKey], failure: QueryFailure = REFUSED) -> None:
        self.bad, self.failure, self.asked = bad, failure, []

    def __call__(
        self, part: Sequence[RevisionKey]
    ) -> tuple[QueryOutcome, dict[RevisionKey, int] | QueryFailure]:
        self.asked.append(tuple(part))
        outcome = QueryOutcome(f"q{len(self.asked)}", None, None, 1, 0.1)
        if self.bad & set(part):
            return outcome, self.failure
        return outcome, {revision: 1 for revision in part}


def test_only_the_rollout_whose_own_query_fails_is_held_and_it_is_asked_apart_until_answered() -> None:
    splitter, prometheus = Splitter(), Prometheus({A2})
    split = splitter.ask("counters", REVISIONS, OWNERS.__getitem__, prometheus)
    assert set(split.answers) == {A1, A1S, B1}
    assert set(split.failures) == {A2}
    assert "only this rollout is held" in split.failures[A2].detail
    # The group, team-a (refused), its two rollouts, then team-b: 5 queries, all accounted for.
    assert [len(part) for part in prometheus.asked] == [4, 3, 2, 1, 1]
    assert (split.http_requests, split.query) == (5, "q1")
    # The next tick asks the held rollout apart at once: two queries.
    prometheus.asked.clear()
    again = splitter.ask("counters", REVISIONS, OWNERS.__getitem__, prometheus)
    assert set(again.failures) == {A2} and prometheus.asked == [(A1S, A1, B1), (A2,)]
    # Answered again, it rejoins the group.
    prometheus.bad = set()
    splitter.ask("counters", REVISIONS, OWNERS.__getitem__, prometheus)
    prometheus.asked.clear()
    splitter.ask("counters", REVISIONS, OWNERS.__getitem__, prometheus)
    assert prometheus.asked == [tuple(REVISIONS)]


def test_a_prometheus_that_is_down_is_not_asked_again_part_by_part() -> None:
    down = QueryFailure(ErrorClass.UNREACHABLE, "connection refused")
    prometheus = Prometheus(set(REVISIONS), down)
    split = Splitter().ask("counters", REVISIONS, OWNERS.__getitem__, prometheus)
    assert len(prometheus.asked) == 1
    assert split.failures == dict.fromkeys(REVISIONS, down)  # every rollout held, as it was
