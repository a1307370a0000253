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
import json
import math
import random
import sys
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.fleet_events import (
    FLEET,
    HOUR,
    SCENARIOS,
    Instance,
    Result,
    SimConfig,
    Simulation,
    build_fleet,
    default_config,
)
from remediation.budget import BudgetState, admit  # the real budget
from remediation.model import FleetEntry, RestartRecord
from remediation.planner import plan  # the real planner


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
