"""What a workload's processes are known to do, learned from history, for a process with none.

The daily profile, the typical level after warm-up and the warm-up length belong to a workload
(a Deployment, a `fleet` label), not to a pid or a pod name: every rollout starts new processes,
and a new build is exactly when leaks arrive. `learn_workload` learns a compact
`WorkloadProfile` from any history of a workload (earlier lifetimes in the store, the previous
build's pods, a Prometheus pull: all are `InstanceSeries`); `merge` combines profiles learned
apart (this agent's own and its peers'); `PriorBook` holds one per workload key on the agent.

With a prior, a new process is judged from its first hours as one with days of history: its
floor is adjusted by the workload's daily profile (relative to its own level, so instances of
different sizes share one profile), and its growth is judged once the workload's warm-up is over
instead of after a whole day.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.core.figures import is_number
from agent.detect.model import RSS, InstanceSeries
from agent.detect.params import DAY, DetectParams
from agent.detect.prepared import Prepared
from agent.detect.seasonal import Profile, learn_profile
from agent.detect.trend import median

MAX_SLOTS = 1440  # a profile finer than a minute a day is not a profile (and bounds what peers send)
MAX_KEYS = 1024  # workloads one agent keeps priors for
MAX_WARMUP = 2 * DAY  # growth for longer than this after a start is not a warm-up
DIP_SHARE = 0.1  # ...and stays there but for this share of its buckets
SETTLE_TOLERANCE = 0.01  # a floor within 1 % (or 3 noise) of its settled level has warmed up


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """A workload's daily profile (one value per slot of `slot_seconds`, as a fraction of the
    level, median 0), its typical floor after warm-up, how long warm-ups last, and how much it
    stands on. Small enough to share through the coordinator (under 2 KiB as JSON)."""

    daily: tuple[float, ...]
    slot_seconds: float
    level: float
    warmup: float
    noise: float  # one slot's noise, fraction of the level
    lifetimes: int
    days: int
    learned_until: float | None = None
    """The end of the history it was learned from, when that is the judged series' own: it then
    speaks only for lifetimes that began after it. None: learned elsewhere (peers, Prometheus)."""

    def profile(self, width: float, period: float) -> Profile | None:
        """The daily profile in buckets of `width`, relative to the level (`Profile.relative`):
        None when `width` is not a whole number of slots or the slots do not tile `period`."""
        slots = len(self.daily)
        if not self.daily or abs(slots * self.slot_seconds - period) > 1e-6 * period:
            return None
        factor = width / self.slot_seconds
        per = round(factor)
        if per < 1 or abs(factor - per) > 1e-6 or slots % per:
            return None
        # a wider bucket's floor is the lowest of its slots' floors
        values = [min(self.daily[g * per : (g + 1) * per]) for g in range(slots // per)]
        centre = median(values)
        values = [v - centre for v in values]
        amplitude = max(values) - min(values)
        if amplitude <= 0:
            return Profile((0.0,) * len(values), 0.0, self.noise, self.days, relative=True)
        return Profile(tuple(values), amplitude, self.noise, self.days, relative=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "daily": [round(v, 6) for v in self.daily],
            "slot_seconds": self.slot_seconds,
            "level": self.level,
            "warmup": self.warmup,
            "noise": round(self.noise, 6),
            "lifetimes": self.lifetimes,
            "days": self.days,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> WorkloadProfile:
        """A profile as a peer or a file sent it; ValueError (one line) on anything out of bounds."""
        if not isinstance(doc, Mapping):
            raise ValueError("a workload profile must be an object")
        daily = doc.get("daily")
        if not isinstance(daily, list) or not 4 <= len(daily) <= MAX_SLOTS:
            raise ValueError(f"daily must be a list of 4 to {MAX_SLOTS} numbers")
        values = tuple(_number(v, "daily", -1.0, 1.0) for v in daily)
        slot = _number(doc.get("slot_seconds"), "slot_seconds", 1.0, DAY)
        level = _number(doc.get("level"), "level", 0.0, 2.0**50)
        warmup = _number(doc.get("warmup"), "warmup", 0.0, MAX_WARMUP)
        noise = _number(doc.get("noise"), "noise", 0.0, 1.0)
        lifetimes = int(_number(doc.get("lifetimes"), "lifetimes", 0, 10**6))
        days = int(_number(doc.get("days"), "days", 0, 10**4))
        return cls(values, slot, level, warmup, noise, lifetimes, days)


def _number(raw: Any, name: str, lo: float, hi: float) -> float:
    if not is_number(raw):
        raise ValueError(f"{name} must be a finite number")
    if not lo <= raw <= hi:
        raise ValueError(f"{name} must be between {lo:g} and {hi:g}")
    return float(raw)


def learn_workload(
    histories: Iterable[InstanceSeries], params: DetectParams, until: float | None = None
) -> WorkloadProfile | None:
    """The profile of the workload whose instances' histories these are (samples before `until`
    only); None when no instance has the three whole days a daily profile needs. It speaks for
    every lifetime (`learned_until` None): one learned from the judged series itself must say
    until when (`fleet.with_priors` does)."""
    width = params.bucket
    period = params.season
    slots = round(period / width)
    if abs(period / width - slots) > 1e-6 or not 4 <= slots <= MAX_SLOTS:
        return None
    shapes: list[list[float]] = []
    noises: list[float] = []
    levels: list[float] = []
    warmups: list[float] = []
    days = lifetimes = 0
    for series in histories:
        if until is not None:
            series = _before(series, until)
        points = series.series.get(RSS)
        if not points:
            continue
        prep = Prepared(series, params)
        env = prep.base(RSS)
        idx, lows = prep._flatten(RSS, env)
        if not idx:
            continue
        end = (idx[-1] + 1) * width
        day_start = math.floor(end / period + 1e-9) * period
        learned = learn_profile(
            idx, lows, width, day_start, params.season_days, period, prep.starts[1:], params.window
        )
        if learned is None or learned.days < 3:
            continue
        level = median(lows)
        if level <= 0:
            continue
        shapes.append([v / level for v in learned.values])
        noises.append(learned.noise / level)
        days += learned.days
        relative = [v / level for v in learned.values]
        for life in range(len(env.idx)):
            found = _lifetime(
                env.idx[life], env.lo[life], prep.starts[life], relative, learned.noise / level, params
            )
            if found is not None:
                lifetimes += 1
                levels.append(found[0])
                warmups.append(found[1])
    if not shapes:
        return None
    daily = [median(list(column)) for column in zip(*shapes, strict=True)]
    centre = median(daily)
    return WorkloadProfile(
        daily=tuple(v - centre for v in daily),
        slot_seconds=width,
        level=median(levels) if levels else 0.0,
        warmup=median(warmups) if warmups else params.warmup,
        noise=median(noises),
        lifetimes=lifetimes,
        days=days,
    )


def _lifetime(
    idx: list[int], lows: list[float], start: float, relative: list[float], noise: float, params: DetectParams
) -> tuple[float, float] | None:
    """(level after warm-up, warm-up length) of one lifetime, its floors adjusted by the daily
    profile; None when the lifetime is too short to tell (under half a period after warm-up)."""
    if not idx:
        return None
    width = params.bucket
    slots = len(relative)
    ages = [(b + 0.5) * width - start for b in idx]
    adjusted = [low / (1 + relative[b % slots]) for b, low in zip(idx, lows, strict=True)]
    span = ages[-1]
    if span < params.warmup + params.season / 2:
        return None
    # the settled level: the floor over the second half of the lifetime's first two periods
    horizon = min(span, 2 * params.season)
    settled = [a for age, a in zip(ages, adjusted, strict=True) if horizon / 2 <= age <= horizon]
    if not settled:
        return None
    level = median(settled)
    tolerance = max(SETTLE_TOLERANCE, 3 * noise) * level
    # warmed up from the first bucket after which at most a tenth of the floors dip below the
    # settled level (one dip of noise or an odd hour is not a warm-up)
    within = [
        (age, value < level - tolerance) for age, value in zip(ages, adjusted, strict=True) if age <= horizon
    ]
    suffix = [0] * (len(within) + 1)
    for k in range(len(within) - 1, -1, -1):
        suffix[k] = suffix[k + 1] + within[k][1]
    warm = params.warmup
    for k, (age, low) in enumerate(within):
        if not low and suffix[k] <= DIP_SHARE * (len(within) - k):
            warm = max(params.warmup, age - width / 2)
            break
    return level, min(warm, MAX_WARMUP)


def _before(series: InstanceSeries, until: float) -> InstanceSeries:
    from bisect import bisect_left

    cut = {m: pts[: bisect_left(pts, (until, -math.inf))] for m, pts in series.series.items()}
    restarts = None if series.restarts is None else [r for r in series.restarts if r < until]
    return InstanceSeries(series.instance, cut, restarts, series.memory_limit, series.started_at)


def merge(profiles: Iterable[WorkloadProfile | None]) -> WorkloadProfile | None:
    """One profile from several learned apart (this agent's, its peers', a Prometheus pull):
    medians slot by slot, weighted by nothing (a peer's odd week counts as one voice)."""
    found = [p for p in profiles if p is not None]
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    same = [
        p for p in found if len(p.daily) == len(found[0].daily) and p.slot_seconds == found[0].slot_seconds
    ]
    daily = [median(list(column)) for column in zip(*(p.daily for p in same), strict=True)]
    return WorkloadProfile(
        daily=tuple(daily),
        slot_seconds=same[0].slot_seconds,
        level=median([p.level for p in same]),
        warmup=median([p.warmup for p in same]),
        noise=median([p.noise for p in same]),
        lifetimes=sum(p.lifetimes for p in same),
        days=sum(p.days for p in same),
    )


def workload_key(labels: Mapping[str, str], instance: str, key_label: str = "fleet") -> str:
    """The workload an instance belongs to: its `key_label` label, else the instance itself."""
    value = labels.get(key_label)
    return value if value else instance


class PriorBook:
    """The agent's priors per workload key, from each source; thread-safe, bounded in keys.

    Sources are kept apart (`own`: learned from this agent's store, `peers`: the coordinator's
    fleet view, `prometheus`: a history pull) and merged when read, so a source refreshing its
    view replaces only its own part."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, dict[str, WorkloadProfile]] = {}
        self._max_keys = max_keys

    def offer(self, key: str, source: str, profile: WorkloadProfile | None) -> None:
        with self._lock:
            if profile is None:
                self._by_key.get(key, {}).pop(source, None)
                return
            if key not in self._by_key and len(self._by_key) >= self._max_keys:
                return  # bounded: a flood of keys must not grow the agent
            self._by_key.setdefault(key, {})[source] = profile

    def get(self, key: str) -> WorkloadProfile | None:
        with self._lock:
            sources = dict(self._by_key.get(key, {}))
        return merge(sources.values())

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._by_key)
