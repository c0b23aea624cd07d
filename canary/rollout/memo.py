"""A memo keyed by object identity, for plans derived from immutable policy objects.

Policies and their checks are frozen, so what is derived from one (limit texts, step windows) never
changes; deriving it again on every decision was most of decide()'s cost. The entry keeps its key
object alive, so an ``id`` is never reused while cached; the memo is cleared when full.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["IdentityMemo"]

K = TypeVar("K")
V = TypeVar("V")


class IdentityMemo(Generic[K, V]):
    def __init__(self, derive: Callable[[K], V], *, capacity: int) -> None:
        self._derive = derive
        self._capacity = capacity
        self._entries: dict[int, tuple[K, V]] = {}

    def __call__(self, key: K) -> V:
        entry = self._entries.get(id(key))
        if entry is not None and entry[0] is key:
            return entry[1]
        value = self._derive(key)
        if len(self._entries) >= self._capacity:
            self._entries.clear()
        self._entries[id(key)] = (key, value)
        return value
