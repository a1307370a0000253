"""One instance's series made ready for judging at any tick: lifetimes, envelopes, profiles.

Built once per `evaluate` call online, and once per instance for a whole offline replay; the
judgement at a tick reads only buckets that ended before it, so both give the same answer.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import pairwise
from typing import TYPE_CHECKING

from agent.detect.memory.envelope import Bucketed, Envelope, bucketize, build_envelope, infer_restarts
from agent.detect.model import LIMIT_METRICS, RSS, InstanceSeries
from agent.detect.params import DetectParams
from agent.detect.seasonal import Profile, learn_profile

if TYPE_CHECKING:
    from agent.detect.seasonal import WorkloadProfile

WARMUP_SHARE = 0.5  # a warm-up learned from a prior is judged past after this share of a period


class Prepared:
    def __init__(
        self, series: InstanceSeries, params: DetectParams, same_samples: Prepared | None = None
    ) -> None:
        """`same_samples`: a `Prepared` of the same samples (the series before its prior was set),
        whose lifetimes and bucketed RSS are taken as they are instead of inferred again."""
        self.instance = series.instance
        self.series = series
        self.params = params
        first = series.first_ts()
        self.starts: list[float] = []
        self._rss: Bucketed | None = None
        if same_samples is not None:
            self.starts, self._rss = same_samples.starts, same_samples._rss
        elif first is not None:
            origin = min(first, series.started_at) if series.started_at is not None else first
            if series.restarts is None and series.series.get(RSS):
                self._rss = bucketize(series.series[RSS], params.bucket)  # shared with the envelope
            restarts = infer_restarts(series, params, self._rss)
            self.starts = [origin] + [r for r in restarts if r > first]
        self._base: dict[str, Envelope] = {}
        self._long: dict[str, Envelope] = {}
        self._flat: dict[tuple[str, float], tuple[list[int], list[float]]] = {}
        self._profiles: dict[tuple[str, float, float, bool], Profile | None] = {}
        # judgements that only change when a long bucket completes
        self.cache: dict[tuple[object, ...], object] = {}
        self._limit = self._limit_points(series)

    def first_in_life(self, metric: str, life: int) -> float:
        """Start of the first bucket of `metric` in lifetime `life` (inf when it has none)."""
        key = ("first", metric, life)
        first = self.cache.get(key)
        if first is None:
            env = self.base(metric)
            idx = env.idx[life] if life < len(env.idx) else []
            first = self.cache[key] = idx[0] * env.width if idx else float("inf")
        return first  # type: ignore[return-value]

    def base(self, metric: str) -> Envelope:
        env = self._base.get(metric)
        if env is None:
            points = self.series.series.get(metric) or []
            bucketed = self._rss if metric == RSS else None
            env = self._base[metric] = build_envelope(points, self.params.bucket, self.starts, bucketed)
        return env

    def stepped(self, metric: str) -> Envelope:
        """The envelope in buckets of one judgement step (two base buckets)."""
        key = ("stepped", metric)
        env = self.cache.get(key)
        if env is None:
            env = self.cache[key] = self.base(metric).coarse(2)
        return env  # type: ignore[return-value]

    def long(self, metric: str) -> Envelope:
        env = self._long.get(metric)
        if env is None:
            env = self._long[metric] = self.base(metric).coarse(self.params.long_factor)
        return env

    def life_at(self, tick: float) -> int:
        """Index of the lifetime the judgement at `tick` is about (-1 before any data)."""
        return bisect_left(self.starts, tick) - 1

    def profile(self, metric: str, tick: float, env: Envelope, life: int) -> Profile | None:
        """The daily profile of `metric` in buckets of `env` for the period containing `tick`
        (None: not learned yet). Each bucket width learns its own: a wider bucket's floor sits
        at a different phase of the cycle than the floors of the buckets it spans. Until the
        series has taught its own, a lifetime with a prior uses its workload's."""
        period = self.params.season
        day_start = math.floor(tick / period + 1e-9) * period
        prior = self.prior_for(life)
        key = (metric, env.width, day_start, prior is not None)
        if key not in self._profiles:
            idx, lows = self._flatten(metric, env)
            learned = learn_profile(
                idx,
                lows,
                env.width,
                day_start,
                self.params.season_days,
                period,
                self.starts[1:],
                self.params.window,
            )
            if learned is None and prior is not None and metric == RSS:
                learned = prior.profile(env.width, period)  # relative: scaled by each fit's level
            self._profiles[key] = learned
        return self._profiles[key]

    def prior_for(self, life: int) -> WorkloadProfile | None:
        """The workload's prior, for a lifetime it may speak for: one learned from this very
        series' history speaks only for the lifetimes that began after that history."""
        prior = self.series.prior
        if prior is None or life < 0:
            return None
        if prior.learned_until is not None and self.starts[life] < prior.learned_until - 1e-6:
            return None
        return prior

    def warmup(self, life: int) -> float:
        """How long growth after a start is a warm-up: `params.warmup`, or the workload's own when
        a prior knows it (a cache that fills for hours after every start is not a leak)."""
        prior = self.prior_for(life)
        if prior is None:
            return self.params.warmup
        return max(self.params.warmup, min(prior.warmup, WARMUP_SHARE * self.params.season))

    def settle(self, life: int) -> float:
        """How long a lifetime must have run before growth that is not urgent may be judged: a
        whole period without a prior (in its first day a working set ratchets up with the traffic
        peak), the workload's warm-up and one window with one."""
        if self.prior_for(life) is None:
            return self.params.season
        return min(self.params.season, self.warmup(life) + self.params.window)

    def limit_at(self, tick: float) -> float | None:
        if self.series.memory_limit is not None:
            return self.series.memory_limit
        times, values = self._limit
        i = bisect_left(times, tick)
        return values[i - 1] if i else None

    def _flatten(self, metric: str, env: Envelope) -> tuple[list[int], list[float]]:
        """Every bucket of every lifetime, in time order (the daily cycle spans lifetimes)."""
        key = (metric, env.width)
        flat = self._flat.get(key)
        if flat is not None:
            return flat
        lives = [idx for idx in env.idx if idx]
        if all(prev[-1] < nxt[0] for prev, nxt in pairwise(lives)):
            # the lifetimes' buckets follow each other: their concatenation is in order already
            flat = self._flat[key] = (
                [b for idx in env.idx for b in idx],
                [low for lo in env.lo for low in lo],
            )
        else:
            pairs = sorted(
                (b, low)
                for idx, lo in zip(env.idx, env.lo, strict=True)
                for b, low in zip(idx, lo, strict=True)
            )
            flat = self._flat[key] = ([b for b, _ in pairs], [v for _, v in pairs])
        return flat

    @staticmethod
    def _limit_points(series: InstanceSeries) -> tuple[list[float], list[float]]:
        for name in LIMIT_METRICS:
            points = series.series.get(name)
            if points:
                valid = [(ts, v) for ts, v in points if v > 0 and math.isfinite(v)]
                return [ts for ts, _ in valid], [v for _, v in valid]
        return [], []
