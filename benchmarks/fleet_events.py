"""The fleet simulator's events (`benchmarks/fleet_sim.py` drives them with its policies): scenarios,
the instances whose linear leaks give exact OOM and threshold times, and the event loop every
policy shares (restarts, capacity lost, peaks)."""

from __future__ import annotations

import heapq
import math
import random
import time
from dataclasses import dataclass, field

from remediation.budget import BudgetLimits
from remediation.planner import PlanSettings

HOUR = 3600.0
DAY = 24 * HOUR
FLEET = "sim"


@dataclass(frozen=True)
class Scenario:
    name: str
    leaking_share: float
    tto_median_h: float
    tto_sigma: float
    tto_min_h: float
    tto_max_h: float
    onset: str  # "start": leaks from the first process on; "random": from a random moment


SCENARIOS = {
    "lockstep": Scenario("lockstep", 0.8, 36.0, 0.1, 24.0, 48.0, "start"),
    "mixed": Scenario("mixed", 0.5, 48.0, 0.6, 6.0, 168.0, "random"),
}


@dataclass(frozen=True)
class SimConfig:
    n: int
    days: float
    seed: int
    restart: float = 180.0  # down
    warmup: float = 120.0  # warming up, not serving fully
    detect_delay: float = HOUR
    estimate_error: float = 0.05
    replan: float = HOUR
    threshold: float = 0.9
    fixed_period: float = DAY
    fixed_jitter: float = 2 * HOUR
    limits: BudgetLimits = field(default_factory=BudgetLimits)
    settings: PlanSettings = field(default_factory=PlanSettings)

    @property
    def horizon(self) -> float:
        return self.days * DAY

    @property
    def occupancy(self) -> float:
        return self.restart + self.warmup


def default_config(n: int, days: float, seed: int, max_concurrent: int | None = None) -> SimConfig:
    """A budget sized to the fleet: 1 restart in flight per 200 instances, the default 1 h cooldown."""
    concurrent = max_concurrent or max(1, n // 200)
    return SimConfig(
        n=n,
        days=days,
        seed=seed,
        limits=BudgetLimits(max_concurrent=concurrent, min_interval=0.0, max_per_hour=None, cooldown=HOUR),
        settings=PlanSettings(safety_margin=HOUR, restart_duration=300.0, deadline_granularity=300.0),
    )


@dataclass
class Instance:
    baseline: float
    rate: float  # share of the limit per second; 0 for a build that does not leak
    onset: float  # when the leak begins (inf: never)
    bias: float  # this instance's deadline estimate error (medic's detector)
    start: float = 0.0  # current process start
    version: int = 0
    busy_until: float = -1.0  # restarting (down or warming up) until
    restarts: int = 0
    ooms: int = 0

    def leak_from(self) -> float:
        return max(self.start, self.onset)

    def usage(self, t: float) -> float:
        return self.baseline + self.rate * max(0.0, t - self.leak_from())

    def oom_at(self) -> float:
        return self.leak_from() + (1.0 - self.baseline) / self.rate if self.rate > 0 else math.inf

    def crosses(self, level: float) -> float:
        return self.leak_from() + (level - self.baseline) / self.rate if self.rate > 0 else math.inf


def build_fleet(scenario: Scenario, cfg: SimConfig) -> list[Instance]:
    rng = random.Random(cfg.seed)
    fleet = []
    for _ in range(cfg.n):
        baseline = rng.uniform(0.35, 0.5)
        leaks = rng.random() < scenario.leaking_share
        tto = math.exp(rng.gauss(math.log(scenario.tto_median_h), scenario.tto_sigma)) * HOUR
        tto = min(max(tto, scenario.tto_min_h * HOUR), scenario.tto_max_h * HOUR)
        rate = (1.0 - baseline) / tto if leaks else 0.0
        onset = (0.0 if scenario.onset == "start" else rng.uniform(0, cfg.horizon)) if leaks else math.inf
        bias = rng.uniform(-cfg.estimate_error, cfg.estimate_error)
        start = rng.uniform(0, 2 * HOUR) if scenario.onset == "start" else 0.0  # the rollout
        fleet.append(Instance(baseline, rate, onset, bias, start=start))
    return fleet


@dataclass
class Result:
    policy: str
    ooms: int = 0
    instances_oomed: int = 0
    restarts: int = 0
    restarts_per_instance_mean: float = 0.0
    restarts_per_instance_max: int = 0
    restarts_of_healthy: int = 0
    peak_policy_restarts: int = 0
    peak_down: int = 0
    capacity_lost_pct: float = 0.0
    infeasible_replans: int = 0
    max_late_minutes: float = 0.0  # the latest a planned slot was past its latest safe start
    replans: int = 0
    seconds: float = 0.0


class Simulation:
    """One policy on one fleet; subclasses decide when to restart."""

    name = "?"

    def __init__(self, fleet: list[Instance], cfg: SimConfig) -> None:
        self.fleet = fleet
        self.cfg = cfg
        self.events: list[tuple[float, int, int, str, int, int]] = []
        self.seq = 0
        self.lost = 0.0
        self.policy_running = 0
        self.down = 0
        self.peak_policy = 0
        self.peak_down = 0
        self.restarts_of_healthy = 0

    def push(self, t: float, kind: str, index: int = -1, version: int = -1) -> None:
        if t <= self.cfg.horizon:
            self.seq += 1
            # a restart ending at t frees its slot for one starting at t (intervals are half-open)
            heapq.heappush(self.events, (t, 0 if kind == "end" else 1, self.seq, kind, index, version))

    def run(self) -> Result:
        began = time.perf_counter()
        for i, inst in enumerate(self.fleet):
            self.push(inst.oom_at(), "oom", i, inst.version)
            self.on_new_process(i, inst.start)
        self.setup()
        while self.events:
            t, _, _, kind, index, version = heapq.heappop(self.events)
            if kind == "end":
                self.down -= 1
                if version == 1:
                    self.policy_running -= 1
                continue
            if kind == "oom":
                inst = self.fleet[index]
                if version == inst.version and inst.busy_until < t:
                    inst.ooms += 1
                    self.begin_restart(index, t, by_policy=False)
                continue
            self.handle(t, kind, index, version)
        return self.result(time.perf_counter() - began)

    def begin_restart(self, index: int, t: float, *, by_policy: bool) -> None:
        inst = self.fleet[index]
        if by_policy:
            inst.restarts += 1
            if inst.rate == 0 or t < inst.onset:
                self.restarts_of_healthy += 1
            self.policy_running += 1
            self.peak_policy = max(self.peak_policy, self.policy_running)
        self.down += 1
        self.peak_down = max(self.peak_down, self.down)
        end = t + self.cfg.occupancy
        self.lost += min(end, self.cfg.horizon) - t
        self.push(end, "end", index, 1 if by_policy else 0)
        inst.busy_until = end
        inst.version += 1
        inst.start = t + self.cfg.restart
        self.push(inst.oom_at(), "oom", index, inst.version)
        self.on_new_process(index, t)

    # hooks
    def setup(self) -> None:
        pass

    def on_new_process(self, index: int, t: float) -> None:
        pass

    def handle(self, t: float, kind: str, index: int, version: int) -> None:
        raise NotImplementedError

    def result(self, seconds: float) -> Result:
        counts = [inst.restarts for inst in self.fleet]
        return Result(
            policy=self.name,
            ooms=sum(inst.ooms for inst in self.fleet),
            instances_oomed=sum(1 for inst in self.fleet if inst.ooms),
            restarts=sum(counts),
            restarts_per_instance_mean=round(sum(counts) / len(counts), 3),
            restarts_per_instance_max=max(counts),
            restarts_of_healthy=self.restarts_of_healthy,
            peak_policy_restarts=self.peak_policy,
            peak_down=self.peak_down,
            capacity_lost_pct=round(100 * self.lost / (len(self.fleet) * self.cfg.horizon), 4),
            seconds=round(seconds, 2),
        )
