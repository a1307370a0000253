"""Precision families: growth that stops, lifetimes cut short, and latency under a fleet-wide swing.

    python -m benchmarks.detection.precision               # development seeds
    python -m benchmarks.detection.precision --held-out    # the held-out seeds (score them last)
    python -m benchmarks.detection.precision --seeds 1000-1002  # any other seeds

Each memory family is one workload drawn per seed, judged twice: as it is (the healthy twin) and
with a leak added from a labelled onset (the leak twin), each in mild and in harsh noise. Series
are 60 s samples over 4 to 14 days, limits 4 to 16 GiB, judged as `medic analyze` judges one
instance (`analyze_fleet`, its own earlier lifetimes as its prior). Families:

- `ttl-6h`, `ttl-12h`: a cache whose entries live 6 h (12 h) fills after every deploy, concave
  (hits slow the inserts), and then holds, its peaks at 80-89 % of the limit;
- `frag-log`: glibc fragmentation growing like log(t) over the lifetime, no allocator statistics;
- `cache-days`: a cache filling for days (time constant 1-2 days) towards 85-90 % of the limit;
- `traffic-2d`: traffic (and memory with it) growing for two days after a launch, then flat;
- `restart-20h`: an orchestrator restarts the process every 17-23 h; RSS falls only to about
  60 % (no start time, no restart events: medic must infer them); the leak twin leaks a little
  every lifetime and is restarted before it reaches the limit (found: within three lifetimes; "later
  lives" counts the lifetimes after the onset that got a finding of their own).

Latency: fleets of 12 pods whose p99 swings 2-3× a day together; the leak twin has one pod
creeping from a labelled onset (+25-50 % of its level per hour). `latency-swing` scales each pod's
own latency with the traffic; in `latency-queue` the pods differ more (0.5-1.4× their median) and share a
queueing delay that follows the traffic, so a fast pod's ratio to its peers moves with the day.

On a healthy twin every `leak`/`oom-risk` (`slow` for latency) finding is false; a critical one
is what remediation would act on. On a leak twin the first such finding after the onset and
before the OOM is a hit; `lead` is the time from it to the OOM over onset→OOM; "critical before
OOM" counts the leak twins that reach their OOM and were made critical between the onset and it
(the lead of that critical finding likewise).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from itertools import pairwise

from agent.core.units import format_duration
from agent.detect import DetectParams, InstanceSeries
from agent.detect.memory.fleet import analyze_fleet
from agent.detect.model import InstanceAnalysis
from agent.detect.slow.detector import DEFAULT_SLOW
from agent.detect.slow.replay import analyze_slow
from agent.detect.slow.rules import Slo
from benchmarks.detection.generate import DAY, HOUR, MINUTE, T0, GiB

MEMORY_KINDS = ("leak", "oom-risk")
NOISES = ("mild", "harsh")
DEV_SEEDS = range(3)
HELD_OUT_SEEDS = range(2000, 2005)  # scored once, at the end (1000-1002, scored before, are spent)
LIFETIMES_TO_FIND = 3  # a leak cut short by restarts: found within this many lifetimes of its onset
LEAD_GOAL = 0.4
CREEP_GOAL = 2 * HOUR
P99 = "latency_p99_seconds"
LATENCY_FAMILIES = ("latency-swing", "latency-queue")
SLO = Slo(quantile=0.99, threshold=0.25, window=5 * MINUTE)


@dataclass
class Case:
    family: str
    noise: str
    seed: int
    leak: bool
    series: list[InstanceSeries]
    onset: float | None = None
    oom: float | None = None
    bad: str | None = None  # the instance that leaks or creeps
    lifetime: float | None = None  # the restart period of a family whose lifetimes are cut short

    @property
    def name(self) -> str:
        return f"{self.family}/{self.noise}/{self.seed}/{'leak' if self.leak else 'healthy'}"


@dataclass
class Workload:
    """The knobs of one memory workload; `floor_at(t, age)` is its healthy floor in bytes."""

    rng: random.Random
    noise: str
    limit: float
    days: float
    level: float  # the settled floor without the family's own growth
    restarts: list[float] = field(default_factory=list)
    restart_floor: float | None = None  # RSS falls to this fraction after a restart (else a cold start)
    growth: Callable[[float, float], float] = lambda _ts, _age: 0.0  # the family's own bytes
    start_series: bool = True  # process_start_time_seconds is scraped

    def build(
        self, name: str, onset: float | None, rate: float, resets: bool = True
    ) -> tuple[InstanceSeries, float | None]:
        """The series, with a leak of `rate` bytes/s from `onset`; (series, OOM time or None)."""
        rng = self.rng
        harsh = self.noise == "harsh"
        season = self.level * rng.uniform(0.05, 0.1) if harsh else self.level * rng.uniform(0.01, 0.04)
        saw = self.level * (rng.uniform(0.06, 0.12) if harsh else rng.uniform(0.02, 0.04))
        saw_period = rng.uniform(3, 10) * MINUTE
        sigma = self.level * (0.012 if harsh else 0.003)
        wander_amp = self.level * (0.012 if harsh else 0.0)
        wander_tau = rng.uniform(4, 8) * HOUR
        bursts = (
            [
                (T0 + rng.uniform(0, self.days * DAY), rng.uniform(10, 40) * MINUTE, rng.uniform(0.05, 0.12))
                for _ in range(int(3 * self.days))
            ]
            if harsh
            else []
        )
        phase = rng.uniform(0, DAY)
        decay = math.exp(-MINUTE / wander_tau)
        wander = 0.0
        warm_tau = rng.uniform(10, 40) * MINUTE
        restarts = sorted(self.restarts)
        life_start, r_i = T0, 0
        rss: list[tuple[float, float]] = []
        starts: list[tuple[float, float]] = []
        oom = None
        for i in range(int(self.days * DAY / MINUTE)):
            ts = T0 + i * MINUTE
            while r_i < len(restarts) and ts >= restarts[r_i]:
                life_start = restarts[r_i]
                r_i += 1
            age = ts - life_start
            traffic = 0.5 + 0.5 * math.sin(2 * math.pi * (ts - phase) / DAY)
            settled = self.level + season * traffic + self.growth(ts, age)
            if self.restart_floor is not None and life_start > T0:
                start_frac = self.restart_floor
                warm = 1 - (1 - start_frac) * math.exp(-age / (3 * HOUR))
            else:
                warm = 1 - 0.35 * math.exp(-age / warm_tau)
            floor = settled * warm
            wander = wander * decay + rng.gauss(0, wander_amp * math.sqrt(1 - decay * decay))
            cycle = ((ts + phase) % saw_period) / saw_period
            value = floor + wander + saw * (0.5 + traffic) * cycle + rng.gauss(0, sigma)
            value += sum(h * self.level for b, d, h in bursts if b <= ts < b + d)
            if onset is not None and ts >= onset:
                value += rate * (ts - (max(onset, life_start) if resets else onset))
            rss.append((ts, round(value)))
            if self.start_series and i % 15 == 0:
                starts.append((ts, life_start))
            if value >= self.limit:
                oom = ts
                break
        series = {"rss_bytes": rss, "memory_limit_bytes": [(T0, self.limit)]}
        if self.start_series:
            series["process_start_time_seconds"] = starts
        return InstanceSeries(name, series), oom


def _deploys(rng: random.Random, days: float, every: tuple[float, float]) -> list[float]:
    out, ts = [], T0
    while True:
        ts += rng.uniform(*every) * DAY
        if ts >= T0 + days * DAY:
            return out
        out.append(ts)


def _workload(rng: random.Random, noise: str, days: tuple[float, float] = (4, 14)) -> Workload:
    limit = rng.uniform(4, 16) * GiB
    return Workload(rng, noise, limit, rng.uniform(*days), limit * rng.uniform(0.4, 0.5))


def _ttl(hours: float) -> Callable[[random.Random, str], Workload]:
    def make(rng: random.Random, noise: str) -> Workload:
        w = _workload(rng, noise)
        w.restarts = _deploys(rng, w.days, (1.5, 3.5))
        size = w.limit * rng.uniform(0.80, 0.89) - w.level * 1.15  # the plateau's peaks at 80-89 %
        tau = hours * HOUR / 3  # concave: 95 % full after one TTL
        w.growth = lambda _ts, age: size * (1 - math.exp(-age / tau))
        return w

    return make


def _frag_log(rng: random.Random, noise: str) -> Workload:
    w = _workload(rng, noise)
    w.restarts = _deploys(rng, w.days, (3, 6))
    tau0 = rng.uniform(20, 60) * MINUTE
    reach = math.log1p(6 * DAY / tau0)
    size = (w.limit * rng.uniform(0.82, 0.88) - w.level * 1.15) / reach
    w.growth = lambda _ts, age: size * math.log1p(age / tau0)
    return w


def _cache_days(rng: random.Random, noise: str) -> Workload:
    w = _workload(rng, noise, (6, 14))
    tau = rng.uniform(1, 2) * DAY
    size = w.limit * rng.uniform(0.85, 0.9) - w.level * 1.15
    w.growth = lambda _ts, age: size * (1 - math.exp(-age / tau))
    return w


def _traffic_2d(rng: random.Random, noise: str) -> Workload:
    w = _workload(rng, noise, (5, 14))
    launch = T0 + rng.uniform(0.5, 2) * DAY
    rise = w.level * rng.uniform(0.4, 0.6)
    w.growth = lambda ts, _age: rise * min(1.0, max(0.0, (ts - launch) / (2 * DAY)))
    return w


def _restart_20h(rng: random.Random, noise: str) -> Workload:
    w = _workload(rng, noise, (5, 10))
    ts, restarts = T0, []
    while True:
        ts += rng.uniform(17, 23) * HOUR
        if ts >= T0 + w.days * DAY:
            break
        restarts.append(ts)
    w.restarts = restarts
    w.restart_floor = rng.uniform(0.55, 0.65)
    w.start_series = False
    return w


MEMORY_FAMILIES: dict[str, Callable[[random.Random, str], Workload]] = {
    "ttl-6h": _ttl(6),
    "ttl-12h": _ttl(12),
    "frag-log": _frag_log,
    "cache-days": _cache_days,
    "traffic-2d": _traffic_2d,
    "restart-20h": _restart_20h,
}


def memory_cases(family: str, seed: int, noise: str) -> list[Case]:
    """The healthy twin and the leak twin of one workload."""
    make = MEMORY_FAMILIES[family]
    out = []
    for leak in (False, True):
        rng = random.Random(f"precision/{family}/{noise}/{seed}")  # the same workload for both twins
        w = make(rng, noise)
        onset = rate = None
        cut_short = family == "restart-20h"
        if leak:
            leak_rng = random.Random(f"precision/{family}/{noise}/{seed}/leak")
            onset = T0 + leak_rng.uniform(0.5, max(0.6, w.days - 3.5)) * DAY
            if cut_short:  # a lifetime adds 20-35 % of the limit: restarted before it gets there
                rate = w.limit * leak_rng.uniform(0.2, 0.35) / (20 * HOUR)
            else:  # OOM 1-3 days after the onset
                rate = w.limit * leak_rng.uniform(0.45, 0.6) / (leak_rng.uniform(1, 3) * DAY)
        name = f"{family}-{noise}-{seed}-{'leak' if leak else 'ok'}"
        series, oom = w.build(name, onset, rate or 0.0)
        if cut_short:
            series.restarts = None
        out.append(
            Case(
                family,
                noise,
                seed,
                leak,
                [series],
                onset,
                oom,
                name if leak else None,
                20 * HOUR if cut_short else None,
            )
        )
    return out


def latency_cases(seed: int, noise: str, size: int = 12, family: str = "latency-swing") -> list[Case]:
    """A fleet whose p99 swings 2-3× a day together; the leak twin with one pod creeping.

    `latency-swing`: each pod's p99 is its own base times the daily factor, so its ratio to its
    peers holds. `latency-queue`: pods at 0.5-1.4× the fleet's median base latency share a queueing delay that
    follows the traffic, so a fast pod's ratio to its peers rises and falls with the day (from 0.5×
    at night towards 0.8× at the peak) without anything being wrong with it."""
    out = []
    queue = family == "latency-queue"
    key = "latency" if family == "latency-swing" else family  # the seeds' series as first scored
    for creep in (False, True):
        rng = random.Random(f"precision/{key}/{noise}/{seed}")
        swing = rng.uniform(2.0, 3.0)
        phase = rng.uniform(0, DAY)
        days, every = 2.0, 30.0
        sigma = 0.15 if noise == "harsh" else 0.05
        bases = [rng.uniform(0.5, 1.5) if queue else rng.uniform(0.03, 0.06) for _ in range(size)]
        if queue:  # 0.5-1.4× the fleet's median: a pod twice its peers' latency is slow, not healthy
            middle = statistics.median(bases)
            bases = [0.045 * min(1.4, max(0.5, b / middle)) for b in bases]
        typical = statistics.median(bases)
        crng = random.Random(f"precision/{key}/{noise}/{seed}/creep")
        onset = T0 + crng.uniform(0.6, 1.4) * DAY
        rate = crng.uniform(0.25, 0.5)
        series = []
        for i, base in enumerate(bases):
            points = []
            for k in range(int(days * DAY / every)):
                ts = T0 + k * every
                load = 0.5 + 0.5 * math.sin(2 * math.pi * (ts - phase) / DAY)
                daily = base + typical * (swing - 1) * load if queue else base * (1 + (swing - 1) * load)
                value = daily * math.exp(rng.gauss(0, sigma))
                if noise == "harsh" and rng.random() < 1 / 120:
                    value *= rng.uniform(1.5, 3.0)
                if creep and i == 0 and ts >= onset:
                    value *= 1 + rate * (ts - onset) / HOUR
                points.append((ts, value))
            series.append(
                InstanceSeries(f"{family}-{noise}-{seed}-{'creep' if creep else 'ok'}/p{i}", {P99: points})
            )
        out.append(
            Case(
                family,
                noise,
                seed,
                creep,
                series,
                onset if creep else None,
                None,
                series[0].instance if creep else None,
            )
        )
    return out


@dataclass
class Cell:
    healthy: int = 0  # healthy instances judged
    false: int = 0  # false findings on them
    false_critical: int = 0
    leaks: int = 0
    found: int = 0
    leads: list[float] = field(default_factory=list)  # (OOM - finding) / (OOM - onset)
    delays: list[float] = field(default_factory=list)  # finding - onset
    late: int = 0  # found, but later than the family's goal
    misses: list[str] = field(default_factory=list)
    falses: list[str] = field(default_factory=list)
    hits: list[str] = field(default_factory=list)  # each leak twin found: delay and lead
    later: int = 0  # lifetimes cut short that began after the onset (restarted families)...
    later_found: int = 0  # ...with a finding of their own
    ooms: int = 0  # leak twins that reach their OOM...
    critical_leads: list[float] = field(default_factory=list)  # ...made critical before it: its lead


def _critical(analysis: InstanceAnalysis, kinds: tuple[str, ...]) -> bool:
    if any(
        f.kind in kinds and f.severity == "critical" and f.opened_at is not None for f in analysis.findings
    ):
        return True
    return any(
        t.finding.kind in kinds and t.finding.severity == "critical" and t.change in ("opened", "updated")
        for t in analysis.transitions
    )


def _critical_at(
    analysis: InstanceAnalysis, kinds: tuple[str, ...], since: float, until: float
) -> float | None:
    """When a finding of `kinds` was first made critical (opened or updated) in [since, until)."""
    times = [
        t.ts
        for t in analysis.transitions
        if t.finding.kind in kinds
        and t.finding.severity == "critical"
        and t.change in ("opened", "updated")
        and since <= t.ts < until
    ]
    return min(times, default=None)


def judge_memory(case: Case, params: DetectParams, cell: Cell) -> None:
    [analysis] = analyze_fleet(case.series, params)
    findings = sorted(
        (f for f in analysis.findings if f.kind in MEMORY_KINDS and f.opened_at is not None),
        key=lambda f: f.opened_at or 0.0,
    )
    _score(case, cell, analysis, findings, MEMORY_KINDS)
    if case.leak and case.onset is not None and case.oom is not None:
        cell.ooms += 1
        made = _critical_at(analysis, MEMORY_KINDS, case.onset, case.oom)
        if made is not None:
            cell.critical_leads.append((case.oom - made) / (case.oom - case.onset))


def _score(
    case: Case, cell: Cell, analysis: InstanceAnalysis, findings: list, kinds: tuple[str, ...]
) -> None:
    bad = case.bad == analysis.instance
    if not bad:
        cell.healthy += 1
        cell.false += len(findings)
        if findings:
            cell.falses.append(
                f"{analysis.instance}: "
                + ", ".join(
                    f"{f.kind}:{f.severity}:{f.verdict or '-'}@{format_duration(f.opened_at - analysis.first_ts)}"
                    for f in findings
                )
            )
        cell.false_critical += int(_critical(analysis, kinds))
        return
    assert case.onset is not None
    cell.leaks += 1
    before = [f for f in findings if f.opened_at < case.onset]
    cell.false += len(before)
    after = [
        f for f in findings if f.opened_at >= case.onset and (case.oom is None or f.opened_at < case.oom)
    ]
    if not after:
        cell.misses.append(case.name)
        return
    cell.found += 1
    delay = after[0].opened_at - case.onset
    cell.delays.append(delay)
    if case.lifetime:  # evidence carried across lifetimes: each later lifetime is found again
        ends = [*analysis.restarts, analysis.last_ts or 0.0]
        for start, end in pairwise(ends):
            if start >= case.onset and end - start >= case.lifetime / 2:  # not one the series cuts
                cell.later += 1
                cell.later_found += any(start <= f.opened_at < end for f in after)
    lead = None if case.oom is None else (case.oom - after[0].opened_at) / (case.oom - case.onset)
    if lead is not None:
        cell.leads.append(lead)
    cell.hits.append(
        f"{case.name}: {after[0].kind}:{after[0].severity} after {format_duration(delay)}"
        + (f", lead {lead:.2f} of {format_duration(case.oom - case.onset)}" if case.oom is not None else "")
    )
    limit = (
        LIFETIMES_TO_FIND * case.lifetime
        if case.lifetime
        else CREEP_GOAL
        if case.family.startswith("latency")
        else None
    )
    if limit is not None and delay > limit:
        cell.late += 1
        cell.misses.append(f"{case.name} late: {format_duration(delay)}")


def judge_latency(case: Case, cell: Cell) -> None:
    analyses = {
        s.instance: InstanceAnalysis(s.instance, [], [], [], s.first_ts(), s.last_ts()) for s in case.series
    }
    analyze_slow([case.series], analyses, DEFAULT_SLOW, slos={s.instance: SLO for s in case.series})
    for analysis in analyses.values():
        findings = sorted(
            (f for f in analysis.findings if f.kind == "slow" and f.opened_at is not None),
            key=lambda f: f.opened_at or 0.0,
        )
        _score(case, cell, analysis, findings, ("slow",))


def _score_one(task: tuple[str, str, int, DetectParams]) -> tuple[str, Cell]:
    family, noise, seed, params = task
    cell = Cell()
    if family in LATENCY_FAMILIES:
        for case in latency_cases(seed, noise, family=family):
            judge_latency(case, cell)
    else:
        for case in memory_cases(family, seed, noise):
            judge_memory(case, params, cell)
    return f"{family}/{noise}", cell


def score(
    seeds: range, families: list[str] | None = None, params: DetectParams | None = None, jobs: int = 1
) -> dict[str, Cell]:
    params = params or DetectParams()
    tasks = [
        (family, noise, seed, params)
        for family in [*MEMORY_FAMILIES, *LATENCY_FAMILIES]
        if not families or any(f in family for f in families)
        for noise in NOISES
        for seed in seeds
    ]
    table: dict[str, Cell] = {}
    with ProcessPoolExecutor(jobs) if jobs > 1 else nullcontext() as pool:
        results = pool.map(_score_one, tasks) if pool is not None else map(_score_one, tasks)
        for name, one in results:
            cell = table.setdefault(name, Cell())
            for f in fields(Cell):
                setattr(cell, f.name, getattr(cell, f.name) + getattr(one, f.name))
    return table


def render(table: dict[str, Cell], verbose: bool = True, hits: bool = False) -> str:
    header = (
        f"{'family/noise':<22} {'healthy':>7} {'false':>6} {'critical':>8} {'leaks':>6} {'found':>6} "
        f"{'late':>5} {'lead median (min)':>18} {'delay median (max)':>20} {'later lives':>11} "
        f"{'critical before OOM, lead median':>33}"
    )
    lines = [header, "-" * len(header)]
    for name, c in table.items():
        lead = f"{statistics.median(c.leads):.2f} ({min(c.leads):.2f})" if c.leads else "-"
        delay = (
            f"{format_duration(statistics.median(c.delays))} ({format_duration(max(c.delays))})"
            if c.delays
            else "-"
        )
        later = f"{c.later_found}/{c.later}" if c.later else "-"
        made = (
            f"{len(c.critical_leads)}/{c.ooms}"
            + (f" {statistics.median(c.critical_leads):.2f}" if c.critical_leads else "")
            if c.ooms
            else "-"
        )
        lines.append(
            f"{name:<22} {c.healthy:>7} {c.false:>6} {c.false_critical:>8} {c.leaks:>6} {c.found:>6} "
            f"{c.late:>5} {lead:>18} {delay:>20} {later:>11} {made:>33}"
        )
    if verbose:
        for name, c in table.items():
            for text in c.falses:
                lines.append(f"  false {name}: {text}")
            for text in c.misses:
                lines.append(f"  miss  {name}: {text}")
            if hits:
                for text in c.hits:
                    lines.append(f"  hit   {name}: {text}")
    return "\n".join(lines)


def goals(table: dict[str, Cell]) -> list[tuple[str, bool, str]]:
    critical = sum(c.false_critical for c in table.values())
    missed = sum(c.leaks - c.found + c.late for c in table.values())
    slow_false = sum(c.false for name, c in table.items() if name.startswith("latency"))
    leads = {name: statistics.median(c.leads) for name, c in table.items() if c.leads}
    short = [name for name, lead in leads.items() if lead < LEAD_GOAL]
    return [
        ("no critical finding on a healthy twin", critical == 0, f"{critical}"),
        (
            "every leak found (cut-short ones within 3 lifetimes, creeping within 2 h)",
            missed == 0,
            f"{missed} missed or late",
        ),
        (f"lead median >= {LEAD_GOAL} of onset->OOM in every family", not short, ", ".join(short) or "all"),
        ("no false slow finding on a fleet-wide swing", slow_false == 0, f"{slow_false}"),
    ]


def _seed_range(text: str) -> range:
    first, _, last = text.partition("-")
    try:
        return range(int(first), int(last or first) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected FIRST-LAST, e.g. 1000-1002, not {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--held-out", action="store_true", help="score the held-out seeds instead")
    parser.add_argument("--seeds", type=_seed_range, help="seeds FIRST-LAST instead (e.g. 1000-1002)")
    parser.add_argument("--only", action="append", help="families whose name contains this")
    parser.add_argument("--jobs", type=int, default=1, help="score the seeds in this many processes")
    parser.add_argument("--hits", action="store_true", help="list each leak twin found, its delay and lead")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every goal holds")
    args = parser.parse_args(argv)
    table = score(args.seeds or (HELD_OUT_SEEDS if args.held_out else DEV_SEEDS), args.only, jobs=args.jobs)
    print(render(table, hits=args.hits))
    met = goals(table)
    print()
    for goal, ok, figures in met:
        print(f"goal {'MET ' if ok else 'NOT MET'}: {goal}: {figures}")
    return 1 if args.check and not all(ok for _, ok, _ in met) else 0


if __name__ == "__main__":
    sys.exit(main())
