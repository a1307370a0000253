"""Slow traces: fleets of p99 latency series, scored as `medic analyze` judges latency.

    python -m benchmarks.detection.slow_traces        # also run by `python -m benchmarks.detection.score`

Each family is a seeded fleet of 6 instances with a p99 (`latency_p99_seconds`, one sample every
15 s for 8 h) around 80-120 ms with noise, an SLO of 250 ms (p99, for 5 min), and one instance that
goes wrong at a labelled onset: slower than its peers but under the SLO (`peer-outlier`), over the
SLO (`slo-breach`), or degrading by 40 ms/h (`degrading`). Healthy fleets: noise only, a load spike
that slows every instance together for 20 min, and one-minute spikes of single instances.
medic's alert is the first `slow` finding of an instance (`agent.detect.slow.replay.analyze_slow`,
the agent's rules and lifecycle); the baselines are Prometheus rules `p99 > SLO for 5m` and
`predict_linear(p99[1h], 4h) > SLO for 10m`, evaluated every 30 s. A finding on a healthy instance,
or before the onset, is a false positive; the delay is from the onset to the first finding.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.core.units import format_duration
from agent.detect.model import InstanceAnalysis, InstanceSeries
from agent.detect.slow.detector import DEFAULT_SLOW
from agent.detect.slow.replay import analyze_slow
from agent.detect.slow.rules import Slo
from benchmarks.detection.baselines import predict_linear_alert
from benchmarks.detection.generate import HOUR, MINUTE, T0

P99 = "latency_p99_seconds"
SLO = Slo(quantile=0.99, threshold=0.25, window=5 * MINUTE)
SPAN = 8 * HOUR
EVERY = 15.0
SIZE = 6


@dataclass
class SlowFleet:
    name: str
    family: str
    series: list[InstanceSeries]
    bad: str | None  # the instance that goes wrong
    onset: float | None


@dataclass
class Cell:
    cases: int = 0
    found: int = 0
    fp: int = 0
    delays: list[float] = field(default_factory=list)


def _fleet(family: str, seed: int, shape: Callable[[random.Random, int, float], float]) -> SlowFleet:
    rng = random.Random(f"slow/{family}/{seed}")
    onset = T0 + rng.uniform(2, 4) * HOUR if family in BAD else None
    series = []
    for i in range(SIZE):
        base = rng.uniform(0.08, 0.12)
        points = []
        for k in range(int(SPAN / EVERY)):
            ts = T0 + k * EVERY
            value = base * math.exp(rng.gauss(0, 0.05)) * shape(rng, i, ts)
            if onset is not None and i == 0 and ts >= onset:
                value = BAD[family](value, ts - onset)
            points.append((ts, value))
        series.append(InstanceSeries(f"{family}-{seed}/i{i}", {P99: points}))
    return SlowFleet(f"{family}/{seed}", family, series, series[0].instance if onset else None, onset)


BAD: dict[str, Callable[[float, float], float]] = {
    "peer-outlier": lambda v, _age: 2.2 * v,  # 180-260 ms: slower than every peer, mostly under the SLO
    "slo-breach": lambda v, _age: v + 0.25,
    "degrading": lambda v, age: v + 0.04 * age / HOUR,
}


def _quiet(_rng: random.Random, _i: int, _ts: float) -> float:
    return 1.0


def _load_spike(_rng: random.Random, _i: int, ts: float) -> float:
    return 1.8 if T0 + 4 * HOUR <= ts < T0 + 4 * HOUR + 20 * MINUTE else 1.0


def _blips(rng: random.Random, _i: int, _ts: float) -> float:
    return 3.0 if rng.random() < 1 / 240 else 1.0  # about one 15-s sample an hour, per instance


FAMILIES: dict[str, Callable[[random.Random, int, float], float]] = {
    "peer-outlier": _quiet,
    "slo-breach": _quiet,
    "degrading": _quiet,
    "healthy-noise": _quiet,
    "healthy-load-spike": _load_spike,
    "healthy-blips": _blips,
}


def _static_alert(points: list[tuple[float, float]], threshold: float, for_s: float) -> list[float]:
    alerts, since, active = [], None, False
    for ts, value in points:
        if value > threshold:
            since = ts if since is None else since
            if not active and ts - since >= for_s:
                alerts.append(ts)
                active = True
        else:
            since, active = None, False
    return alerts


def _medic(fleet: SlowFleet) -> dict[str, list[float]]:
    analyses = {
        s.instance: InstanceAnalysis(s.instance, [], [], [], s.first_ts(), s.last_ts()) for s in fleet.series
    }
    analyze_slow([fleet.series], analyses, DEFAULT_SLOW, slos={s.instance: SLO for s in fleet.series})
    return {
        name: sorted(f.opened_at for f in a.findings if f.kind == "slow" and f.opened_at is not None)
        for name, a in analyses.items()
    }


def score(seeds: int = 2) -> dict[str, dict[str, Cell]]:
    table: dict[str, dict[str, Cell]] = {}
    for family, shape in FAMILIES.items():
        cells = table.setdefault(
            family, {"medic": Cell(), "p99 > SLO for 5m": Cell(), "predict_linear": Cell()}
        )
        for seed in range(seeds):
            fleet = _fleet(family, seed, shape)
            medic = _medic(fleet)
            for s in fleet.series:
                points = s.series[P99]
                alerts = {
                    "medic": medic.get(s.instance, []),
                    "p99 > SLO for 5m": _static_alert(points, SLO.threshold, 5 * MINUTE),
                    "predict_linear": predict_linear_alert(points, SLO.threshold, every=30.0),
                }
                for name, times in alerts.items():
                    cell = cells[name]
                    if s.instance != fleet.bad or fleet.onset is None:
                        cell.fp += len(times)
                        continue
                    cell.cases += 1
                    cell.fp += sum(1 for t in times if t < fleet.onset)
                    after = [t for t in times if t >= fleet.onset]
                    if after:
                        cell.found += 1
                        cell.delays.append(after[0] - fleet.onset)
    return table


def render(table: dict[str, dict[str, Cell]]) -> str:
    header = f"{'family':<20} {'detector':<18} {'slow':>5} {'found':>6} {'FP':>4} {'median delay':>13}"
    lines = [header, "-" * len(header)]
    for family, cells in table.items():
        for name, c in cells.items():
            delay = format_duration(statistics.median(c.delays)) if c.delays else "-"
            lines.append(f"{family:<20} {name:<18} {c.cases:>5} {c.found:>6} {c.fp:>4} {delay:>13}")
    return "\n".join(lines)


def main(seeds: int = 2) -> list[tuple[str, bool, str]]:
    table = score(seeds)
    print(render(table))
    medic = [cells["medic"] for cells in table.values()]
    missed = sum(c.cases - c.found for c in medic)
    fp = sum(c.fp for c in medic)
    met = [
        ("every slow instance found", missed == 0, f"{missed} missed"),
        ("zero false slow findings", fp == 0, f"{fp}"),
    ]
    print()
    for goal, ok, figures in met:
        print(f"goal {'MET ' if ok else 'NOT MET'}: {goal}: {figures}")
    return met


if __name__ == "__main__":
    main()
