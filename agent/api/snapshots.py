"""Answers built once per tick and served as bytes to every client that asks between ticks.

What `/metrics` and `/api/v1/instances` show changes when a job changes it (a probe tick, a
reconcile, a detection run): the runtime says so through `Ticks.changed()`. A `TickCache` keeps the
bytes of each variant asked for (a format, a field selection, gzip…) until the next tick, or until
they are `max_age` old, so that what changes between ticks (an age, the agent's own CPU) is never
older than that. A variant nobody asks for is never built; the variants kept are bounded, because a
client names them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class Ticks:
    """The agent's tick count: what the caches compare their answers with."""

    def __init__(self) -> None:
        self.generation = 0

    def changed(self) -> None:
        self.generation += 1


@dataclass(frozen=True, slots=True)
class _Built(Generic[T]):
    value: T
    generation: int
    at: float  # time.monotonic()


class TickCache(Generic[T]):
    """Values built by `get` at most once per tick and key; at most `size` keys kept, and no more
    than `budget` as `weigh` counts them (the newest always): the ones asked for longest ago go first."""

    def __init__(
        self,
        ticks: Ticks,
        max_age: float,
        size: int,
        budget: int | None = None,
        weigh: Callable[[T], int] | None = None,
    ) -> None:
        self.ticks = ticks
        self.max_age = max_age
        self.size = size
        self.budget = budget
        self.weigh = weigh or (lambda value: 0)
        self._lock = threading.Lock()  # one build at a time: who waits for it is served what it built
        self._built: dict[Hashable, _Built[T]] = {}

    def peek(self, key: Hashable) -> T | None:
        """The value of `key` if it is of this tick, without waiting for a build: what an event
        loop may ask (a build runs in a thread, through `get`)."""
        built = self._built.get(key)
        if built is not None and self._fresh(built, time.monotonic()):
            return built.value
        return None

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            built = self._built.pop(key, None)
            now = time.monotonic()
            if built is None or not self._fresh(built, now):
                generation = self.ticks.generation  # a tick that ends during the build is a new one
                built = _Built(build(), generation, now)
            self._built[key] = built
            weight = sum(self.weigh(b.value) for b in self._built.values())
            while len(self._built) > 1 and (
                len(self._built) > self.size or (self.budget is not None and weight > self.budget)
            ):
                weight -= self.weigh(self._built.pop(next(iter(self._built))).value)
            return built.value

    def _fresh(self, built: _Built[T], now: float) -> bool:
        return built.generation == self.ticks.generation and now - built.at < self.max_age

    def __len__(self) -> int:
        return len(self._built)
