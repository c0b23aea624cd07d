"""A refused grouped query costs only the rollouts it must.

One grouped query answers every rollout of a tick (the counter sample, the peaks, a builtin measure).
When Prometheus refuses or fails it for what the series are (an execution error such as "vector
cannot contain metrics with the same labelset" or "many-to-many matching", a query over the sample
limit, an answer too large, a bad answer), one rollout's series would hold every rollout. So the
query is asked again **split**: by namespace, and a namespace that still fails by rollout. The
rollouts answered go on; only a rollout whose own query fails is held, and its measurement says so.

A rollout held that way is asked apart from the others in the next ticks (one query of its own, the
others still together) until its own query is answered again; then it rejoins the group.

Failures that say nothing about the series (Prometheus unreachable, unavailable, timing out) are
not split: every part would fail the same way, one after the other.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from canary.evidence import ErrorClass
from canary.metrics.catalog import RevisionKey
from canary.metrics.client import QueryFailure, QueryOutcome

__all__ = ["SPLIT_ON", "Split", "Splitter", "held_apart"]

T = TypeVar("T")
Asked = tuple[QueryOutcome, Mapping[RevisionKey, T] | QueryFailure]

# What Prometheus says about the query's series, not about itself.
SPLIT_ON = frozenset(
    {
        ErrorClass.EXECUTION,
        ErrorClass.BAD_QUERY,
        ErrorClass.SERVER,
        ErrorClass.MALFORMED_RESPONSE,
        ErrorClass.UNEXPECTED_RESULT,
    }
)


def held_apart(failure: QueryFailure) -> QueryFailure:
    """The failure of a rollout's own query, once the grouped query was split."""
    detail = (
        f"{failure.detail} (the grouped query of this tick failed; asked apart, this rollout's series "
        "alone fail it, so only this rollout is held: the other rollouts were answered)"
    )
    return QueryFailure(failure.error_class, detail, failure.http_status)


@dataclass(slots=True)
class Split(Generic[T]):
    """What the parts of one grouped query answered, and what they cost."""

    answers: dict[RevisionKey, T] = field(default_factory=dict)
    failures: dict[RevisionKey, QueryFailure] = field(default_factory=dict)
    query: str = ""  # the first query asked (the grouped one)
    http_requests: int = 0
    duration: float = 0.0

    def account(self, outcome: QueryOutcome) -> None:
        self.query = self.query or outcome.promql
        self.http_requests += outcome.http_requests
        self.duration += outcome.duration


class Splitter:
    """Asks grouped queries, split when they fail; remembers per query (``key``) the rollouts held
    apart (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._apart: dict[Hashable, frozenset[Hashable]] = {}

    def ask(
        self,
        key: Hashable,
        revisions: Sequence[RevisionKey],
        owner: Callable[[RevisionKey], Hashable],
        ask: Callable[[Sequence[RevisionKey]], Asked[T]],
    ) -> Split[T]:
        """Every revision's answer or failure, from as few queries as the answers allow."""
        with self._lock:
            apart = self._apart.get(key, frozenset())
        owners = {owner(revision) for revision in revisions}
        together = [revision for revision in revisions if owner(revision) not in apart]
        parts = [together] if together else []
        parts += [
            [revision for revision in revisions if owner(revision) == one]
            for one in sorted(apart & owners, key=repr)
        ]
        split: Split[T] = Split()
        held: set[Hashable] = set()
        for part in parts:
            self._part(part, owner, ask, split, held, alone=len(part) < len(revisions))
        with self._lock:
            if held:
                self._apart[key] = frozenset(held)
            else:
                self._apart.pop(key, None)
        return split

    def _part(
        self,
        part: Sequence[RevisionKey],
        owner: Callable[[RevisionKey], Hashable],
        ask: Callable[[Sequence[RevisionKey]], Asked[T]],
        split: Split[T],
        held: set[Hashable],
        *,
        alone: bool,
    ) -> None:
        outcome, parsed = ask(part)
        split.account(outcome)
        if not isinstance(parsed, QueryFailure):
            split.answers.update(parsed)
            return
        groups = _groups(part, owner)
        if parsed.error_class in SPLIT_ON and len(groups) > 1:
            for group in groups:
                self._part(group, owner, ask, split, held, alone=True)
            return
        single = {owner(revision) for revision in part}
        failure = parsed
        if alone and len(single) == 1 and parsed.error_class in SPLIT_ON:
            held.update(single)
            failure = held_apart(parsed)
        split.failures.update(dict.fromkeys(part, failure))


def _groups(part: Sequence[RevisionKey], owner: Callable[[RevisionKey], Hashable]) -> list[list[RevisionKey]]:
    """``part`` split by namespace when it spans several, else by rollout."""
    for key in (lambda revision: revision.namespace, owner):
        groups: dict[Hashable, list[RevisionKey]] = {}
        for revision in part:
            groups.setdefault(key(revision), []).append(revision)
        if len(groups) > 1:
            return list(groups.values())
    return [list(part)]
