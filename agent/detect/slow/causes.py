"""Likely causes of a slow instance, read from the series the cgroup and process probes store.

Each cause is a dict with `cause` (a stable key), its figures and a `text` for people:
`cpu_throttling` (CFS throttled periods or seconds), `memory_pressure` (PSI `some` stall time),
`memory_near_limit` (RSS against the limit) and `major_faults` (pages read back from disk).
Counters are read as increases over the window, a decrease being a reset from zero.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any, Protocol

from agent.detect.model import InstanceSeries, Points


class CauseThresholds(Protocol):
    """What `likely_causes` reads of the slow detector's params (read-only: `SlowParams` is frozen)."""

    @property
    def throttle_ratio(self) -> float:
        """Throttled in this fraction of CFS periods (or seconds per second)."""

    @property
    def pressure_ratio(self) -> float:
        """PSI memory `some` stall seconds per second."""

    @property
    def near_limit(self) -> float:
        """RSS over this fraction of the memory limit."""

    @property
    def major_faults_rate(self) -> float:
        """Major page faults per second."""


def likely_causes(
    series: InstanceSeries, since: float, tick: float, limits: CauseThresholds
) -> list[dict[str, Any]]:
    """The causes present in [since, tick], most specific first."""
    causes: list[dict[str, Any]] = []
    get = series.series.get
    periods, _ = increase(get("cgroup_cpu_periods_total"), since, tick)
    throttled, _ = increase(get("cgroup_cpu_throttled_periods_total"), since, tick)
    throttled_seconds = rate(get("cgroup_cpu_throttled_seconds_total"), since, tick)
    ratio = throttled / periods if periods > 0 else None
    if (ratio is not None and ratio >= limits.throttle_ratio) or (
        throttled_seconds or 0
    ) >= limits.throttle_ratio:
        text = "CPU throttled by its cgroup quota" + (
            f" in {ratio:.0%} of periods" if ratio is not None else ""
        )
        causes.append(
            {
                "cause": "cpu_throttling",
                "throttled_period_ratio": ratio,
                "throttled_seconds_per_second": throttled_seconds,
                "text": text,
            }
        )
    stall = rate(get("cgroup_memory_pressure_some_seconds_total"), since, tick)
    if stall is not None and stall >= limits.pressure_ratio:
        text = f"tasks stalled on memory {stall:.0%} of the time (PSI)"
        causes.append({"cause": "memory_pressure", "stall_seconds_per_second": stall, "text": text})
    rss = last(get("rss_bytes"), tick)
    limit = (
        series.memory_limit
        or last(get("memory_limit_bytes"), tick)
        or last(get("cgroup_memory_limit_bytes"), tick)
    )
    if rss and limit and rss / limit >= limits.near_limit:
        text = f"memory at {rss / limit:.0%} of its limit"
        causes.append({"cause": "memory_near_limit", "used_ratio": rss / limit, "text": text})
    faults = rate(get("major_faults_total"), since, tick)
    if faults is not None and faults >= limits.major_faults_rate:
        causes.append(
            {"cause": "major_faults", "per_second": faults, "text": f"{faults:.0f} major page faults/s"}
        )
    return causes


def increase(points: Points | None, since: float, tick: float) -> tuple[float, float]:
    """(increase of a counter, seconds spanned) over [since, tick]."""
    inside = [(ts, v) for ts, v in points or [] if since <= ts <= tick]
    total = 0.0
    for (_, before), (_, after) in pairwise(inside):
        total += after - before if after >= before else after
    return total, (inside[-1][0] - inside[0][0]) if len(inside) >= 2 else 0.0


def rate(points: Points | None, since: float, tick: float) -> float | None:
    total, seconds = increase(points, since, tick)
    return total / seconds if seconds > 0 else None


def last(points: Points | None, tick: float) -> float | None:
    before = [v for ts, v in points or [] if ts <= tick]
    return before[-1] if before else None
