"""Fleet simulator: N instances that leak, restart policies compared, medic's real planner and budget inside.

    python benchmarks/fleet_sim.py                      # N = 1,000 and 10,000, both scenarios
    python benchmarks/fleet_sim.py --n 1000 --scenario lockstep --days 7 --json

A discrete-event simulation (no ticking: out-of-memory and threshold times are computed exactly
from each process's linear leak). Every instance runs a process whose memory starts at a baseline
(35-50 % of its limit) and, if the build leaks, grows at a constant rate; reaching the limit is an
OOM kill. Any restart (planned or after an OOM) costs `restart` seconds down plus `warmup`
seconds warming up, both counted as capacity lost. Scenarios:

    lockstep  a new build rolled out over 2 h at t=0; 80 % of instances leak, time to OOM from a
              fresh start lognormal around 36 h (12 h .. 5 d): the whole fleet heads for the limit
              within the same day and a half (user story 2)
    mixed     half the instances start leaking at a random moment of the run (then every later
              process of theirs leaks too), time to OOM lognormal around 48 h (6 h .. 7 d)

Policies:
    medic              detection 1 h after a leak starts; deadline estimates off by up to 5 %;
                       `remediation.planner.plan` re-run every `replan` seconds on the whole
                       fleet; each restart admitted by `remediation.budget.admit` when its slot comes
    threshold          restart as soon as memory crosses 90 % of the limit, no budget
    threshold+budget   the same, but queued FIFO behind medic's budget (rate limiting without a plan)
    fixed+jitter       restart every instance every 24 h +- up to 2 h of jitter, like gunicorn's
                       max_requests + max_requests_jitter, no budget

Reported: OOM kills (and instances that had one), restarts by the policy (total, per instance),
peak restarts by the policy in flight at once, peak instances down for any reason, capacity lost
(share of instance-time down or warming up), and for medic the replans whose plan was infeasible.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from remediation.budget import BudgetLimits, BudgetState, admit  # the real budget
from remediation.model import FleetEntry, RestartRecord
from remediation.planner import PlanSettings, plan  # the real planner

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


class Threshold(Simulation):
    name = "threshold"

    def on_new_process(self, index: int, t: float) -> None:
        inst = self.fleet[index]
        self.push(max(t, inst.crosses(self.cfg.threshold)), "threshold", index, inst.version)

    def handle(self, t: float, kind: str, index: int, version: int) -> None:
        inst = self.fleet[index]
        if version == inst.version and inst.busy_until < t:
            self.begin_restart(index, t, by_policy=True)


class ThresholdWithBudget(Threshold):
    """Rate limiting without a plan: FIFO behind the same budget medic uses."""

    name = "threshold+budget"

    def setup(self) -> None:
        self.queue: deque[tuple[int, int]] = deque()
        self.state = BudgetState([], now=0.0, assumed_duration=self.cfg.occupancy)
        self.drain_at = math.inf  # the one pending retry of the queue's head

    def handle(self, t: float, kind: str, index: int, version: int) -> None:
        if kind == "threshold":
            self.queue.append((index, version))
        elif kind == "drain":
            self.drain_at = math.inf
        while self.queue:
            i, v = self.queue[0]
            inst = self.fleet[i]
            if v != inst.version or inst.busy_until >= t:
                self.queue.popleft()
                continue
            decision = admit(self.state, FLEET, str(i), t, self.cfg.limits)
            if not decision.ok:
                retry = decision.retry_at or t + 60
                if retry < self.drain_at:
                    self.drain_at = retry
                    self.push(retry, "drain")
                return
            self.queue.popleft()
            self.state.add(RestartRecord(str(i), FLEET, "sim", t, t + self.cfg.occupancy))
            self.begin_restart(i, t, by_policy=True)


class FixedWithJitter(Simulation):
    name = "fixed+jitter"

    def setup(self) -> None:
        self.rng = random.Random(self.cfg.seed + 1)

    def on_new_process(self, index: int, t: float) -> None:
        jitter = getattr(self, "rng", random.Random(index)).uniform(
            -self.cfg.fixed_jitter, self.cfg.fixed_jitter
        )
        inst = self.fleet[index]
        self.push(t + self.cfg.fixed_period + jitter, "scheduled", index, inst.version)

    def handle(self, t: float, kind: str, index: int, version: int) -> None:
        inst = self.fleet[index]
        if version == inst.version and inst.busy_until < t:
            self.begin_restart(index, t, by_policy=True)


class Medic(Simulation):
    """The real planner every `replan` seconds; each slot admitted by the real budget when it comes."""

    name = "medic"

    def setup(self) -> None:
        self.state = BudgetState([], now=0.0, assumed_duration=self.cfg.settings.restart_duration)
        self.history: deque[RestartRecord] = deque()
        self.pending: dict[int, float] = {}
        self.infeasible = 0
        self.max_late = 0.0
        self.last_replan = -math.inf
        self.replans = 0
        self.push(0.0, "replan")

    def detected(self, inst: Instance, t: float) -> bool:
        return inst.rate > 0 and inst.busy_until < t and t >= inst.leak_from() + self.cfg.detect_delay

    def estimate(self, inst: Instance, t: float) -> float:
        """The detector's projected OOM: remaining headroom over a slope that is off by `bias`."""
        return t + (1.0 - inst.usage(t)) / (inst.rate * (1.0 + inst.bias))

    def handle(self, t: float, kind: str, index: int, version: int) -> None:
        if kind == "replan":
            self.replan(t)
            self.push(t + self.cfg.replan, "replan")
            return
        inst = self.fleet[index]
        if self.pending.get(index) != version:
            return  # superseded by a later plan
        if not self.detected(inst, t):
            # the process was replaced meanwhile (OOM-killed): the agent, which replans every
            # step, would hand the slot to the next instance at once
            del self.pending[index]
            if t > self.last_replan + 60:
                self.replan(t)
            return
        decision = admit(self.state, FLEET, str(index), t, self.cfg.limits)
        if not decision.ok:
            if decision.retry_at is not None:
                self.pending[index] = self.seq + 1
                self.push(decision.retry_at, "slot", index, self.seq + 1)
            return
        del self.pending[index]
        record = RestartRecord(str(index), FLEET, "sim", t, t + self.cfg.settings.restart_duration)
        self.state.add(record)
        self.history.append(record)
        self.begin_restart(index, t, by_policy=True)

    def replan(self, t: float) -> None:
        self.last_replan = t
        keep = max(HOUR, self.cfg.limits.cooldown) + self.cfg.settings.restart_duration
        while self.history and self.history[0].started_at < t - keep:
            self.history.popleft()
        entries = [
            FleetEntry(str(i), FLEET, "sim", wants_restart=True, kind="leak", deadline=self.estimate(inst, t))
            for i, inst in enumerate(self.fleet)
            if self.detected(inst, t)
        ]
        schedule = plan(entries, list(self.history), self.cfg.limits, self.cfg.settings, t, explain=False)
        self.replans += 1
        self.infeasible += 0 if schedule.feasible else 1
        for entry in schedule.entries:
            if entry.late and not entry.hopeless and entry.latest_start is not None:
                self.max_late = max(self.max_late, entry.slot_at - entry.latest_start)
        self.pending.clear()
        for entry in schedule.entries:
            if not entry.hopeless and entry.slot_at < t + self.cfg.replan:
                index = int(entry.instance)
                self.pending[index] = self.seq + 1
                self.push(entry.slot_at, "slot", index, self.seq + 1)

    def result(self, seconds: float) -> Result:
        result = super().result(seconds)
        result.infeasible_replans = self.infeasible
        result.max_late_minutes = round(self.max_late / 60, 1)
        result.replans = self.replans
        return result


POLICIES = [Medic, Threshold, ThresholdWithBudget, FixedWithJitter]


def simulate(scenario: str, cfg: SimConfig, policies=POLICIES) -> list[Result]:
    return [policy(build_fleet(SCENARIOS[scenario], cfg), cfg).run() for policy in policies]


def acceptance(results: list[Result], cfg: SimConfig) -> list[str]:
    """What docs/remediation.md promises; empty when all holds."""
    by = {r.policy: r for r in results}
    medic = by["medic"]
    problems = []
    if medic.infeasible_replans == 0 and medic.ooms:
        problems.append(f"medic had {medic.ooms} OOM(s) although every plan was feasible")
    if medic.peak_policy_restarts > cfg.limits.max_concurrent:
        problems.append(
            f"medic had {medic.peak_policy_restarts} restarts in flight, budget {cfg.limits.max_concurrent}"
        )
    if medic.restarts_of_healthy:
        problems.append(f"medic restarted {medic.restarts_of_healthy} healthy instance(s)")
    for naive in ("threshold", "fixed+jitter"):
        other = by.get(naive)
        if other is None:
            continue
        if medic.restarts >= other.restarts:
            problems.append(f"medic restarted {medic.restarts} times, {naive} {other.restarts}")
        if medic.capacity_lost_pct >= other.capacity_lost_pct:
            problems.append(
                f"medic lost {medic.capacity_lost_pct}% capacity, {naive} {other.capacity_lost_pct}%"
            )
    return problems


def table(scenario: str, cfg: SimConfig, results: list[Result]) -> str:
    lines = [
        f"scenario {scenario}: N={cfg.n:,}, {cfg.days:g} days, seed {cfg.seed}; budget max_concurrent "
        f"{cfg.limits.max_concurrent}, cooldown {cfg.limits.cooldown / HOUR:g}h; restart {cfg.restart:g}s "
        f"+ warm-up {cfg.warmup:g}s",
        f"{'policy':<18}{'OOMs':>7}{'inst.OOM':>9}{'restarts':>10}{'per inst':>9}{'max':>5}{'healthy':>8}"
        f"{'peak restarts':>14}{'peak down':>10}{'capacity lost':>14}{'late plans (max)':>18}",
    ]
    for r in results:
        infeasible = (
            f"{r.infeasible_replans}/{r.replans} ({r.max_late_minutes:g}m)" if r.policy == "medic" else "-"
        )
        lines.append(
            f"{r.policy:<18}{r.ooms:>7}{r.instances_oomed:>9}{r.restarts:>10}{r.restarts_per_instance_mean:>9.2f}"
            f"{r.restarts_per_instance_max:>5}{r.restarts_of_healthy:>8}{r.peak_policy_restarts:>14}"
            f"{r.peak_down:>10}{r.capacity_lost_pct:>13.3f}%{infeasible:>18}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--n", type=int, action="append", help="fleet size (repeatable); default 1000 and 10000"
    )
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append", help="default: all")
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-concurrent", type=int, help="override the budget (default N/200)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    failed = False
    out = []
    for n in args.n or [1000, 10000]:
        for scenario in args.scenario or sorted(SCENARIOS):
            cfg = default_config(n, args.days, args.seed, args.max_concurrent)
            results = simulate(scenario, cfg)
            problems = acceptance(results, cfg)
            failed |= bool(problems)
            if args.json:
                out.append(
                    {"scenario": scenario, "n": n, "days": args.days, "seed": args.seed,
                     "max_concurrent": cfg.limits.max_concurrent,
                     "results": [r.__dict__ for r in results], "problems": problems}
                )  # fmt: skip
            else:
                print(table(scenario, cfg, results))
                print("acceptance: " + ("; ".join(problems) if problems else "ok") + "\n", flush=True)
    if args.json:
        print(json.dumps(out, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
