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

from agent.detect.memory.prepared import Prepared
from agent.detect.model import RSS, InstanceSeries
from agent.detect.params import DetectParams
from agent.detect.seasonal import MAX_SLOTS, MAX_WARMUP, WorkloadProfile, learn_profile
from agent.detect.trend import median

MAX_KEYS = 1024  # workloads one agent keeps priors for
SETTLE_TOLERANCE = 0.01  # a floor within 1 % (or 3 noise) of its settled level has warmed up
DIP_SHARE = 0.1  # ...and stays there but for this share of its buckets


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
