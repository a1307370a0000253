"""Seeded generator of long labelled memory traces: 14 days at 1-minute resolution.

Each scenario mixes what production RSS looks like: a daily traffic cycle in the floor and in
the GC/batch sawtooth above it, noise, deploy restarts with warm-ups, model reloads (level
steps), long batch bursts, slow wander, caches that fill for hours then plateau, and, for the
leak scenarios, a leak of 0.05 to 1 %/h of the base that starts at a labelled onset and runs
until the peaks reach the memory limit (the trace ends there: the process would be OOM-killed).

    python -m benchmarks.detection.generate --out DIR      # writes one JSONL file per trace
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

GiB = 2**30
MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
T0 = 1_767_571_200.0  # 2026-01-05 00:00 UTC, a Monday
DAYS = 14


@dataclass
class Trace:
    """A labelled memory trace: RSS points, the limit, and for leaks the onset and OOM time."""

    name: str
    leak: bool
    description: str
    points: list[tuple[float, float]]
    limit: float
    onset: float | None = None  # when the leak starts
    oom: float | None = None  # first sample at or above the limit (the trace ends there)
    extra: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    time_scale: float = 1.0  # recorded traces: production seconds per real second
    restarts: list[float] = field(default_factory=list)  # process restarts (the store's events)

    @property
    def start(self) -> float:
        return self.points[0][0]

    @property
    def end(self) -> float:
        return self.points[-1][0]


@dataclass
class Scenario:
    """Knobs of one generated trace; `build` turns them into points."""

    rng: random.Random
    base: float = 3 * GiB
    season: float = 0.03  # daily rise of the floor, fraction of base
    saw: float = 0.06  # sawtooth height, fraction of base (scales with traffic)
    saw_period: float = 6 * MINUTE
    noise: float = 0.002
    restarts: list[float] = field(default_factory=list)
    warm_depth: float = 0.35  # a new process starts this fraction below its working set
    warm_tau: float = 20 * MINUTE
    fill: float = 0.0  # a cache that fills after each start, fraction of base
    fill_tau: float = 3 * HOUR
    steps: list[tuple[float, float]] = field(default_factory=list)  # (time, fraction of base), persist
    bursts: list[tuple[float, float, float]] = field(default_factory=list)  # (start, duration, height)
    wander: float = 0.0  # amplitude of a mean-reverting drift, fraction of base
    wander_tau: float = 6 * HOUR
    ratchet: bool = False  # the floor never comes down within a lifetime (glibc arenas keep peak)
    leak_rate: float = 0.0  # %/h of base
    onset: float | None = None
    leak_resets: bool = True  # a restart frees the leaked memory
    stair: float = 0.0  # leak in chunks every `stair` seconds (0: smooth)
    headroom: float = 1.25  # limit = this × the highest healthy peak

    def build(self, name: str, leak: bool, description: str) -> Trace:
        rng = self.rng
        n = int(DAYS * DAY / MINUTE)
        phase = rng.uniform(0, DAY)
        saw_phase = rng.uniform(0, self.saw_period)
        wander = 0.0
        decay = math.exp(-MINUTE / self.wander_tau)
        restarts = sorted(self.restarts)
        life_start = T0
        r_i = 0
        floor_max = 0.0
        healthy_peak = 0.0
        values: list[tuple[float, float, float]] = []  # (ts, healthy value, leak bytes)
        for i in range(n):
            ts = T0 + i * MINUTE
            while r_i < len(restarts) and ts >= restarts[r_i]:
                life_start = restarts[r_i]
                r_i += 1
                floor_max = 0.0
            traffic = 0.5 + 0.5 * math.sin(2 * math.pi * (ts - phase) / DAY)
            floor = self.base * (1 + self.season * traffic)
            if self.ratchet:
                floor_max = max(floor_max, floor)
                floor = floor_max
            age = ts - life_start
            floor *= 1 - self.warm_depth * math.exp(-age / self.warm_tau)
            floor += self.fill * self.base * (1 - math.exp(-age / self.fill_tau))
            floor += sum(frac * self.base for t_step, frac in self.steps if ts >= t_step)
            wander = wander * decay + rng.gauss(0, self.wander * self.base * math.sqrt(1 - decay * decay))
            cycle = ((ts + saw_phase) % self.saw_period) / self.saw_period
            value = floor + wander + self.saw * self.base * (0.5 + traffic) * cycle
            value += sum(h * self.base for start, dur, h in self.bursts if start <= ts < start + dur)
            value += rng.gauss(0, self.noise * self.base)
            healthy_peak = max(healthy_peak, value)
            leaked = 0.0
            if self.onset is not None and ts >= self.onset:
                since = ts - (max(self.onset, life_start) if self.leak_resets else self.onset)
                if self.stair:
                    since = math.floor(since / self.stair) * self.stair
                leaked = self.leak_rate / 100 / HOUR * self.base * since
            values.append((ts, value, leaked))
        limit = self.headroom * healthy_peak
        points: list[tuple[float, float]] = []
        oom = None
        for ts, value, leaked in values:
            total = value + leaked
            points.append((ts, round(total)))
            if total >= limit:
                oom = ts
                break
        trace = Trace(name, leak, description, points, limit, self.onset if leak else None, oom)
        trace.restarts = [r for r in restarts if r <= points[-1][0]]
        return trace


def _days(rng: random.Random, lo: float, hi: float) -> float:
    return T0 + rng.uniform(lo, hi) * DAY


def deploys(rng: random.Random, every: tuple[float, float], days: float = DAYS) -> list[float]:
    """Deploy times over `days` from T0, each `every` (lo, hi) days after the last."""
    out, ts = [], T0
    while True:
        ts += rng.uniform(*every) * DAY
        if ts >= T0 + days * DAY:
            return out
        out.append(ts)


def _bursts(
    rng: random.Random, per_day: float, height: tuple[float, float], dur: tuple[float, float]
) -> list:
    count = int(per_day * DAYS)
    return [
        (T0 + rng.uniform(0, DAYS * DAY), rng.uniform(*dur) * MINUTE, rng.uniform(*height))
        for _ in range(count)
    ]


def _base(rng: random.Random) -> Scenario:
    return Scenario(
        rng,
        base=rng.uniform(1.5, 6) * GiB,
        season=rng.uniform(0.0, 0.06),
        saw=rng.uniform(0.02, 0.12),
        saw_period=rng.uniform(2, 10) * MINUTE,
        noise=rng.uniform(0.001, 0.003),
        headroom=rng.uniform(1.15, 1.5),
    )


def healthy_steady(rng: random.Random) -> Scenario:
    return _base(rng)


def healthy_near_limit(rng: random.Random) -> Scenario:
    s = _base(rng)
    s.season, s.headroom = rng.uniform(0.05, 0.08), rng.uniform(1.03, 1.08)
    return s


def healthy_deploys(rng: random.Random) -> Scenario:
    s = _base(rng)
    s.restarts = deploys(rng, (1.0, 3.0))
    s.warm_depth, s.warm_tau = rng.uniform(0.3, 0.6), rng.uniform(10, 60) * MINUTE
    return s


def healthy_reloads(rng: random.Random) -> Scenario:
    s = _base(rng)
    s.steps = [(_days(rng, 0.5, 13.5), rng.choice([-1, 1, 1]) * rng.uniform(0.05, 0.15)) for _ in range(3)]
    return s


def healthy_bursts(rng: random.Random) -> Scenario:
    s = _base(rng)
    s.bursts = _bursts(rng, rng.uniform(2, 6), (0.1, 0.3), (5, 45))
    s.headroom = rng.uniform(1.05, 1.2)
    return s


def healthy_cache_fill(rng: random.Random) -> Scenario:
    s = _base(rng)
    s.restarts = deploys(rng, (2.0, 4.0))
    s.fill, s.fill_tau = rng.uniform(0.15, 0.3), rng.uniform(1, 3) * HOUR
    return s


def healthy_ratchet(rng: random.Random) -> Scenario:
    s = _base(rng)
    s.season, s.ratchet = rng.uniform(0.05, 0.1), True
    s.restarts = deploys(rng, (2.0, 5.0))
    return s


def healthy_wander(rng: random.Random) -> Scenario:
    s = _base(rng)
    s.wander, s.wander_tau = rng.uniform(0.01, 0.025), rng.uniform(3, 10) * HOUR
    return s


def _leak(s: Scenario, rng: random.Random, rate: tuple[float, float], onset: tuple[float, float]) -> Scenario:
    s.leak_rate = rng.uniform(*rate)
    s.onset = _days(rng, *onset)
    return s


def leak_fast(rng: random.Random) -> Scenario:
    return _leak(_base(rng), rng, (0.4, 1.0), (1, 8))


def leak_slow(rng: random.Random) -> Scenario:
    return _leak(_base(rng), rng, (0.05, 0.2), (0.5, 4))


def leak_early(rng: random.Random) -> Scenario:
    return _leak(_base(rng), rng, (0.3, 1.0), (0.1, 1.5))


def leak_with_deploys(rng: random.Random) -> Scenario:
    s = _leak(_base(rng), rng, (0.3, 1.0), (1, 5))
    s.restarts = deploys(rng, (2.0, 4.0))
    return s


def leak_after_reload(rng: random.Random) -> Scenario:
    s = _base(rng)
    reload = _days(rng, 2, 6)
    s.steps = [(reload, rng.uniform(0.05, 0.15))]
    s.leak_rate, s.onset = rng.uniform(0.2, 0.8), reload
    return s


def leak_bursty(rng: random.Random) -> Scenario:
    s = _leak(_base(rng), rng, (0.2, 1.0), (1, 6))
    s.bursts = _bursts(rng, rng.uniform(2, 6), (0.1, 0.25), (5, 45))
    return s


def leak_staircase(rng: random.Random) -> Scenario:
    s = _leak(_base(rng), rng, (0.2, 0.8), (1, 6))
    s.stair = rng.uniform(1, 3) * HOUR
    return s


SCENARIOS: dict[str, tuple[bool, str, Callable[[random.Random], Scenario]]] = {
    "steady": (False, "daily cycle, GC sawtooth, noise", healthy_steady),
    "near-limit": (False, "strong daily cycle peaking 3-8 % under the limit", healthy_near_limit),
    "deploys": (False, "deploy restarts every 1-3 days with warm-ups", healthy_deploys),
    "reloads": (False, "model reloads: level steps up and down that stay", healthy_reloads),
    "bursts": (False, "long batch bursts of +10-30 % for 5-45 min", healthy_bursts),
    "cache-fill": (False, "a cache filling for hours after each start, then a plateau", healthy_cache_fill),
    "ratchet": (False, "floor ratchets up with the first traffic peaks, then stays", healthy_ratchet),
    "wander": (False, "slow mean-reverting drift of 1-2.5 %", healthy_wander),
    "leak-fast": (True, "leak of 0.4-1 %/h", leak_fast),
    "leak-slow": (True, "leak of 0.05-0.2 %/h", leak_slow),
    "leak-early": (True, "leak of 0.3-1 %/h starting in the first 1.5 days", leak_early),
    "leak-deploys": (True, "leak of 0.3-1 %/h, reset by deploys every 2-4 days", leak_with_deploys),
    "leak-after-reload": (True, "a model reload step, then a leak of 0.2-0.8 %/h", leak_after_reload),
    "leak-bursty": (True, "leak of 0.2-1 %/h among long batch bursts", leak_bursty),
    "leak-staircase": (True, "leak of 0.2-0.8 %/h in chunks every 1-3 h", leak_staircase),
}


def generate(seeds: int = 3) -> list[Trace]:
    """Every scenario with `seeds` seeds each; the same call always returns the same traces."""
    traces = []
    for name, (leak, description, make) in SCENARIOS.items():
        for seed in range(seeds):
            rng = random.Random(f"{name}/{seed}")
            traces.append(make(rng).build(f"gen/{name}-{seed}", leak, description))
    return traces


def fleet(instances: int = 100, seed: int = 7) -> list[Trace]:
    """A fleet for the speed benchmark: scenarios drawn at random (about 1 in 4 leaking)."""
    rng = random.Random(seed)
    names = list(SCENARIOS)
    out = []
    for i in range(instances):
        name = rng.choice(names)
        leak, description, make = SCENARIOS[name]
        out.append(make(random.Random(f"fleet/{seed}/{i}")).build(f"serving-{i}", leak, description))
    return out


def write_jsonl(traces: list[Trace], path: Path, instance_names: bool = False) -> None:
    """All traces in one JSON Lines file, time-ordered like a recorder writes them."""
    rows = []
    for trace in traces:
        instance = trace.name if instance_names else trace.name.replace("/", "-")
        rows.extend((ts, instance, "rss_bytes", v) for ts, v in trace.points)
        rows.append((trace.start, instance, "memory_limit_bytes", round(trace.limit)))
        rows.extend((ts, instance, "process_start_time_seconds", start) for ts, start in _start_times(trace))
    rows.sort(key=lambda r: r[0])
    with path.open("w") as out:
        for ts, instance, metric, value in rows:
            out.write(json.dumps({"ts": ts, "instance": instance, "metric": metric, "value": value}) + "\n")


def _start_times(trace: Trace, every: float = 15 * MINUTE) -> list[tuple[float, float]]:
    """`process_start_time_seconds` samples: at each process start, then every `every`."""
    starts = [trace.start, *trace.restarts]
    out = []
    for i, start in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else trace.end + 1
        ts = start
        while ts < end:
            out.append((ts, start))
            ts += every
    return out


def write_prometheus(traces: list[Trace], path: Path) -> None:
    """All traces as one Prometheus `query_range` matrix export."""
    result = []
    for trace in traces:
        labels = {"instance": trace.name, "job": "serving"}
        result.append(
            {
                "metric": {"__name__": "process_resident_memory_bytes", **labels},
                "values": [[ts, str(v)] for ts, v in trace.points],
            }
        )
        result.append(
            {
                "metric": {"__name__": "memory_limit_bytes", **labels},
                "values": [[trace.start, str(round(trace.limit))]],
            }
        )
        result.append(
            {
                "metric": {"__name__": "process_start_time_seconds", **labels},
                "values": [[ts, str(start)] for ts, start in _start_times(trace)],
            }
        )
    path.write_text(json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="directory for the JSONL files")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for trace in generate(args.seeds):
        write_jsonl([trace], args.out / (trace.name.split("/")[-1] + ".jsonl"))
    print(f"wrote {len(SCENARIOS) * args.seeds} traces to {args.out}")


if __name__ == "__main__":
    main()
