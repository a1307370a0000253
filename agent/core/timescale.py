"""One time scale for every duration medic judges or waits by (`agent.time_scale`), with floors in
probe intervals so that a compressed window still holds the samples it judges.

A lab, a test or a demo runs production's durations on a shorter axis: every record that holds
such durations (`DetectParams`, `SlowParams`, an instance's SLO window, the `remediation:`
section) puts each of them through `TimeScale.span`, the one rule: divided by `factor`, and, when
that compresses it, held at its floor (a few `agent.interval`s: a window shorter than the samples
it needs judges nothing, or judges one late sample as if it were evidence). Compression never
lengthens a duration: one already shorter than its floor is taken as written, and the config
refuses it when it cannot judge at all. Not scaled: what happens in real time (timeouts of real
operations, a process's start-up, replayed requests, leases, schedules, retention, the wall
clock's maintenance windows); docs/detection.md lists both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

STALE_SAMPLES = 3  # a value still holds after this many probe intervals without a new one
WINDOW_SAMPLES = 10  # a judged window (peer level, SLO `for`, likely causes) spans this many samples
EVIDENCE_SAMPLES = 5  # the judgements that open a finding (open_after x step) span this many
RECHECK_SAMPLES = 2 * (WINDOW_SAMPLES + EVIDENCE_SAMPLES)  # a restart is checked as long as the
# slow detector needs, twice over, to find its finding again on the new process


@dataclass(frozen=True, slots=True)
class TimeScale:
    """`factor` production seconds pass in one real second; `interval` is the probes' period
    (`agent.interval`), the unit of the floors (0: none, as for a replay of recorded series)."""

    factor: float = 1.0
    interval: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ValueError(f"a time scale is a finite factor of at least 1, got {self.factor!r}")
        if not (math.isfinite(self.interval) and self.interval >= 0):
            raise ValueError(f"a probe interval is finite and not negative, got {self.interval!r}")

    @classmethod
    def of(cls, scale: TimeScale | float) -> TimeScale:
        """A bare factor is a scale without floors (tests, benchmarks, recorded traces)."""
        return scale if isinstance(scale, TimeScale) else cls(float(scale))

    @property
    def compressed(self) -> bool:
        return self.factor > 1

    def samples(self, count: float) -> float:
        """`count` probe intervals, in seconds."""
        return count * self.interval

    def span(self, seconds: float, floor: float = 0.0) -> float:
        """`seconds` of production time on this axis: divided by `factor`, held at `floor` seconds
        when that compresses it further, and never longer than `seconds` itself."""
        if not self.compressed:
            return seconds
        return max(seconds / self.factor, min(seconds, floor))

    def optional(self, seconds: float | None, floor: float = 0.0) -> float | None:
        return None if seconds is None else self.span(seconds, floor)

    def capped(self, seconds: float, floor: float) -> TimeScale:
        """This scale, or a gentler one that compresses `seconds` to `floor` and no further: for a
        record whose durations are tied to one another and must all shrink alike."""
        if not self.compressed or floor <= 0 or seconds / self.factor >= floor:
            return self
        return replace(self, factor=max(1.0, seconds / floor))
