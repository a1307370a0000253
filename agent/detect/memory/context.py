"""What every detector needs to know about one instance at one tick, and the level its earlier
lifetimes settled at (a lifetime below it is refilling: `refilling`; one above it has outgrown its
fill: `lifetimes.outgrown`)."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.core.units import format_bytes
from agent.detect.memory.fit import Fit
from agent.detect.memory.growth import PEAK_BUCKETS, early_cycle, fits, peak, time_to_limit, warm_bucket
from agent.detect.memory.jvm import DIRECT, HEAP_MAX, HEAP_USABLE, LAYERS, METASPACE, NATIVE, value_at
from agent.detect.memory.prepared import Prepared
from agent.detect.model import JVM_HEAP_AFTER_GC, RSS, Observation, State, Verdict
from agent.detect.params import DetectParams

if TYPE_CHECKING:
    from agent.core.types import Kind, Severity


@dataclass(frozen=True, slots=True)
class Projection:
    """Where a growing series is projected to (`limit`) from where it is now (`start`), how that
    ceiling reads (`against`), and what reaching it does (`ends`; None: the memory limit's kill, as for
    any process). `ceiling` is the ceiling as set (the heap is projected to a share of it)."""

    limit: float | None
    start: float | None
    against: str
    ends: str | None = None
    ceiling: float | None = None
    layer: str | None = None

    def time_to(self, slope: float) -> float | None:
        return time_to_limit(self.limit, self.start, slope)


OUTGROWN_MARGIN = 0.03  # above the highest level the earlier lifetimes held by 3 % of it...
OUTGROWN_FOR = 4  # ...in each of the newest buckets (an hour at the defaults): not a burst

_LAST = ("context",)  # the key of the last context made, in `Prepared.cache`


class Context:
    __slots__ = ("_fits", "_peak", "_projections", "life", "prep", "tick")

    def __init__(self, prep: Prepared, life: int, tick: float) -> None:
        self.prep = prep
        self.life = life
        self.tick = tick
        self._fits: dict[str, list[Fit]] = {}
        self._peak: float | bool | None = False
        self._projections: dict[str, Projection] = {}

    @classmethod
    def at(cls, prep: Prepared, tick: float) -> Context | None:
        """The context of `prep` at `tick`; the last one made is kept with `prep` and given again for
        the same tick, with the fits it made (a replay judges a quiet instance again in full when
        its fleet's evidence reads it)."""
        kept = prep.cache.get(_LAST)
        if isinstance(kept, Context) and kept.tick == tick:
            return kept
        life = prep.life_at(tick)
        if life < 0:
            return None
        made = prep.cache[_LAST] = cls(prep, life, tick)
        return made

    @property
    def params(self) -> DetectParams:
        return self.prep.params

    @property
    def limit(self) -> float | None:
        return self.prep.limit_at(self.tick)

    @property
    def peak(self) -> float | None:
        """Where the RSS peaks are now."""
        if self._peak is False:
            self._peak = peak(self.prep, RSS, self.life, self.tick)
        return self._peak

    @property
    def lifetime_start(self) -> float:
        return self.prep.starts[self.life]

    def ceiling(self, metric: str) -> float | None:
        """The newest value of a ceiling series in this process lifetime (a JVM's `-Xmx`)."""
        return value_at(self.prep.series, metric, self.lifetime_start, self.tick)

    def projection(self, metric: str) -> Projection:
        """The ceiling growth of `metric` hits first: the memory limit for the process's memory, the
        layer's own for a JVM's heap, direct buffers and metaspace (agent/detect/memory/jvm.py)."""
        found = self._projections.get(metric)
        if found is None:
            found = self._projections[metric] = self._project(metric)
        return found

    def _project(self, metric: str) -> Projection:
        limit = self.limit
        container = Projection(limit, self.peak, format_bytes(limit))
        layer = LAYERS.get(metric)
        if layer is None:
            return container
        heap_max = self.ceiling(HEAP_MAX)
        if metric == NATIVE:
            if heap_max is None or limit is None or heap_max >= limit:
                return container  # the heap may not reach -Xmx before the kill: RSS against the limit
            return Projection(
                limit - heap_max,
                self.peak_of(metric),
                f"the memory limit {format_bytes(limit)} less -Xmx {format_bytes(heap_max)}",
                layer.ends,
                limit,
                layer.name,
            )
        ceiling = self.ceiling(layer.ceiling)
        if ceiling is None:
            if metric == JVM_HEAP_AFTER_GC:  # flags unread: the container's limit, and say so
                return Projection(
                    limit, self.peak, f"{format_bytes(limit)} (the JVM's heap ceiling is unknown)"
                )
            return Projection(None, None, f"no {layer.flag}", None, None, layer.name)
        heap = metric == JVM_HEAP_AFTER_GC
        return Projection(
            ceiling * HEAP_USABLE if heap else ceiling,
            self.floor_of(metric) if heap else self.peak_of(metric),
            f"{layer.flag} {format_bytes(ceiling)}",
            layer.ends,
            ceiling,
            layer.name,
        )

    def peak_of(self, metric: str) -> float | None:
        """Where the peaks of `metric` are now (the median of its last bucket maxima)."""
        return peak(self.prep, metric, self.life, self.tick)

    def floor_of(self, metric: str) -> float | None:
        """Where the floor of `metric` is now (the median of its last bucket minima)."""
        env = self.prep.base(metric)
        end = math.floor(self.tick / env.width + 1e-9)
        _, lows, _ = env.select(self.life, end - PEAK_BUCKETS, end)
        return sorted(lows)[len(lows) // 2] if lows else None

    def present(self, metric: str) -> bool:
        """Whether `metric` has samples in the current lifetime before this tick."""
        return self.prep.first_in_life(metric, self.life) < self.tick

    def fits(self, metric: str) -> list[Fit]:
        found = self._fits.get(metric)
        if found is None:
            found = fits(self.prep, metric, self.life, self.tick)
            if any(early_cycle(f, self.params) for f in found) and refilling(self, metric):
                found = [f for f in found if not early_cycle(f, self.params)]
            self._fits[metric] = found
        return found

    def observation(
        self,
        kind: Kind,
        state: State,
        summary: str,
        severity: Severity = "info",
        verdict: Verdict | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> Observation:
        return Observation(
            instance=self.prep.instance,
            kind=kind,
            state=state,
            tick=self.tick,
            lifetime_start=self.lifetime_start,
            summary=summary,
            severity=severity,
            verdict=verdict,
            evidence=evidence or {},
        )


def _held_after_warmup(ctx: Context, metric: str, life: int) -> tuple[list[int], list[float]]:
    """(bucket indices, the highest level held from each of them to the end) of lifetime `life`
    after its warm-up, a level held being the lowest floor of `OUTGROWN_FOR` buckets in a row (as
    `above_settled` asks of the current lifetime: a burst in an earlier one raises no bar).
    Cached per lifetime."""
    key = ("held-after-warmup", metric, life)
    prep = ctx.prep
    found = prep.cache.get(key)
    if found is None:
        env = prep.base(metric)
        idx, lows = env.idx[life], env.lo[life]
        first = bisect_left(idx, warm_bucket(prep, life, env.width))
        idx, lows = idx[first:], lows[first:]
        held = [min(lows[k : k + OUTGROWN_FOR]) for k in range(len(lows) - OUTGROWN_FOR + 1)]
        for k in range(len(held) - 2, -1, -1):
            held[k] = max(held[k], held[k + 1])
        found = prep.cache[key] = (idx[: len(held)], held)
    return found  # type: ignore[return-value]


def settled_level(ctx: Context, metric: str) -> float | None:
    """The highest level the earlier lifetimes held after their warm-up, among those that ran
    a whole period and at least as long as this one has (a lifetime growing like log(t) for
    longer than its predecessors is not above them at their age), within the history a
    judgement reads; None without such a lifetime."""
    p, prep = ctx.params, ctx.prep
    width = prep.base(metric).width
    age = ctx.tick - ctx.lifetime_start
    oldest = math.ceil((ctx.tick - p.history) / width - 1e-9)
    level = None
    for life in range(ctx.life):
        idx, held = _held_after_warmup(ctx, metric, life)
        first = bisect_left(idx, oldest)
        if first >= len(idx) or (idx[-1] + OUTGROWN_FOR - idx[first]) * width < max(p.season, age):
            continue
        level = held[first] if level is None else max(level, held[first])
    return level


def above_settled(ctx: Context, metric: str) -> float | None:
    """The earlier lifetimes' `settled_level` when each of this lifetime's newest `OUTGROWN_FOR`
    buckets (complete at the tick, after its warm-up) has a floor above it by `OUTGROWN_MARGIN`;
    None otherwise. Cheap: the judgement of a quiet instance asks it, and a full one asks it again
    (`outgrown`), answered from the last answer kept with `prep`."""
    if ctx.life == 0:
        return None
    prep = ctx.prep
    key = ("above-settled", metric)
    kept = prep.cache.get(key)
    if isinstance(kept, tuple) and kept[0] == ctx.tick:
        return kept[1]  # type: ignore[no-any-return]
    env = prep.base(metric)
    done = math.floor(ctx.tick / env.width + 1e-9)  # the first bucket not complete at the tick
    idx, lows = env.floors(ctx.life, done - OUTGROWN_FOR, done)
    level = None
    if len(idx) == OUTGROWN_FOR and idx[0] >= warm_bucket(prep, ctx.life, env.width):
        level = settled_level(ctx, metric)
        if level is not None and min(lows) <= level * (1 + OUTGROWN_MARGIN):
            level = None
    prep.cache[key] = (ctx.tick, level)
    return level


def refilling(ctx: Context, metric: str) -> bool:
    """Whether this lifetime is still below the level its earlier lifetimes settled at (not
    `above_settled`): what it has grown so far is its fill. Over half a period a sine bends to fit a
    fill as well as a daily rise on a line, so the cycle scale's early judgement says nothing here
    (`growth.early_cycle`); from three quarters of a period it speaks as in any lifetime."""
    return ctx.life > 0 and settled_level(ctx, metric) is not None and above_settled(ctx, metric) is None


def leak_layers(ctx: Context) -> list[str] | None:
    """The layers a JVM's leak is judged in, when its memory outside the heap is known (else None):
    the heap and what lies outside it, and direct buffers and metaspace when they have a ceiling."""
    if not ctx.present(NATIVE):
        return None
    extra = [m for m in (DIRECT, METASPACE) if ctx.present(m) and ctx.projection(m).limit]
    return [JVM_HEAP_AFTER_GC, NATIVE, *extra]


def oom_series(ctx: Context) -> list[str]:
    """What oom-risk projects: RSS to the memory limit; for a JVM whose `-Xmx` fits under that limit,
    its native memory to what the heap leaves (RSS cannot outgrow `-Xmx` through the heap), plus each
    layer with a ceiling of its own."""
    if not ctx.present(JVM_HEAP_AFTER_GC):
        return [RSS]
    layers = leak_layers(ctx) or [JVM_HEAP_AFTER_GC]
    native = NATIVE in layers and ctx.projection(NATIVE).layer is not None
    own = [m for m in layers if m != NATIVE and ctx.projection(m).layer is not None]
    return [NATIVE if native else RSS, *own]
