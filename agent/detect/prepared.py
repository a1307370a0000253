"""One instance's series made ready for judging at any tick: lifetimes, envelopes, profiles.

Built once per `evaluate` call online, and once per instance for a whole offline replay; the
judgement at a tick reads only buckets that ended before it, so both give the same answer.
"""

from __future__ import annotations

import math
from bisect import bisect_left

from agent.detect.envelope import Bucketed, Envelope, bucketize, build_envelope, infer_restarts
from agent.detect.model import LIMIT_METRICS, RSS, InstanceSeries
from agent.detect.params import DetectParams
from agent.detect.seasonal import Profile, learn_profile


class Prepared:
    def __init__(self, series: InstanceSeries, params: DetectParams) -> None:
        self.instance = series.instance
        self.series = series
        self.params = params
        first = series.first_ts()
        self.starts: list[float] = []
        self._rss: Bucketed | None = None
        if first is not None:
            origin = min(first, series.started_at) if series.started_at is not None else first
            if series.restarts is None and series.series.get(RSS):
                self._rss = bucketize(series.series[RSS], params.bucket)  # shared with the envelope
            restarts = infer_restarts(series, params, self._rss)
            self.starts = [origin] + [r for r in restarts if r > first]
        self._base: dict[str, Envelope] = {}
        self._long: dict[str, Envelope] = {}
        self._flat: dict[tuple[str, float], tuple[list[int], list[float]]] = {}
        self._profiles: dict[tuple[str, float, float], Profile | None] = {}
        self.cache: dict[tuple, object] = {}  # judgements that only change when a long bucket completes
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

    def profile(self, metric: str, tick: float, env: Envelope) -> Profile | None:
        """The daily profile of `metric` in buckets of `env` for the period containing `tick`
        (None: not learned yet). Each bucket width learns its own: a wider bucket's floor sits
        at a different phase of the cycle than the floors of the buckets it spans."""
        period = self.params.season
        day_start = math.floor(tick / period + 1e-9) * period
        key = (metric, env.width, day_start)
        if key not in self._profiles:
            idx, lows = self._flatten(metric, env)
            self._profiles[key] = learn_profile(
                idx, lows, env.width, day_start, self.params.season_days, period
            )
        return self._profiles[key]

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
        if flat is None:
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
