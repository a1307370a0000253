"""What the probes cost: median CPU time per probe per instance, over N real processes, and the
agent's whole fast tick per instance beside the floor of reading the same files.

    python -m benchmarks.probe_cost                    # 50 sample workloads, every probe, the tick, the agent
    python -m benchmarks.probe_cost --processes 10 --rounds 50 --agent-seconds 0 --json
    python -m benchmarks.probe_cost --probe process --rounds 1 --agent-seconds 0   # the tick and its floor

Starts N `agent.demo.workload stable` processes, runs each probe over all of them for a number of
rounds, and times every `collect` call with `time.thread_time()` (CPU time of this thread, user plus
system, so the kernel's work behind each /proc read counts). The first round warms caches (the cgroup
probe resolves directories once per process) and is not counted. The target is ≤ 300 µs of CPU per
instance per tick for the probes on the fast schedule together.

Then the fast tick as the agent runs it (`Agent._fast_tick` and the flush job): `Tracker.reconcile`,
`Collector.run("fast")` with the default probes (process, cgroup, allocator, latency, canary: those
without data for an instance back off as in the agent), the instance's tree figures, the samples
handed to the store's buffer, and `Store.flush` every `agent.flush_interval`, on a simulated clock
that advances `--interval` a tick. It is timed over windows of one keepalive (60 s of ticks, in which
every series is stored again once), so the flush of unchanged values is amortized; each tick is
followed by one pass of the floor (`benchmarks.probe_floor`) over the same processes, so both see the
same load. Target: the tick ≤ 3 × the Python floor.

Then it starts a real agent (`medic run`) watching the same processes by pid at `--interval` for
`--agent-seconds`, and prints the agent's RSS and CPU, all of its jobs included (reconcile, probes,
SQLite writes, scheduler). Target: agent RSS ≤ 80 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python benchmarks/probe_cost.py` too

from agent.api.metrics import Telemetry
from agent.config.loader import validate_config
from agent.core.records import ProbeTarget
from agent.core.units import parse_duration
from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.collector import KEEPALIVE, SAMPLES_PER_BUCKET, Collector
from agent.watch.tracker import Tracker
from benchmarks import probe_floor
from probes.base import Probe
from probes.linux.procfs import process_identity, read_stat
from probes.linux.procstatus import read_status
from probes.registry import PROBES, create_probe

REPO = Path(__file__).resolve().parent.parent
FAST_TICK_TARGET_US = 300.0
FLOOR_RATIO_TARGET = 3.0
WARM_UP = 90.0  # simulated seconds before the tick is timed: past the probes' grace and back-offs


@dataclass(frozen=True, slots=True)
class ProbeCost:
    probe: str
    schedule: str
    instances: int
    calls: int
    median_us: float
    p90_us: float
    max_us: float
    failures: int


def start_workloads(count: int, size: str = "4Mi") -> list[subprocess.Popen]:
    """Start `count` stable sample workloads and wait until each printed `ready`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "agent.demo.workload", "stable", "--size", size]
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(
                subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
            )
        for proc in procs:
            line = proc.stdout.readline() if proc.stdout else ""
            if not line.startswith("ready"):
                raise RuntimeError(f"workload {proc.pid} did not start: {line!r}, exit={proc.poll()}")
    except BaseException:
        stop_workloads(procs)
        raise
    return procs


def stop_workloads(procs: list[subprocess.Popen]) -> None:
    """Kill and reap the workloads this benchmark started."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


def targets_for(procs: list[subprocess.Popen]) -> list[ProbeTarget]:
    return [
        ProbeTarget(f"bench-{i}", proc.pid, process_identity(proc.pid).start_time)
        for i, proc in enumerate(procs)
    ]


def measure_probe(probe: Probe, targets: list[ProbeTarget], rounds: int) -> ProbeCost:
    """Time `rounds` collects of every target (after one warm-up round); CPU µs per call."""
    for target in targets:
        try:  # a probe without data here (no hook, no latency source) says so on every call
            probe.collect(target, time.time())
        except Exception:
            pass
    costs: list[float] = []
    failures = 0
    for _ in range(rounds):
        for target in targets:
            now = time.time()
            started = time.thread_time()
            try:
                probe.collect(target, now)
            except Exception:
                failures += 1
            costs.append((time.thread_time() - started) * 1e6)
    costs.sort()
    return ProbeCost(
        probe=probe.name,
        schedule=probe.schedule,
        instances=len(targets),
        calls=len(costs),
        median_us=statistics.median(costs),
        p90_us=costs[int(0.9 * (len(costs) - 1))],
        max_us=costs[-1],
        failures=failures,
    )


def measure_probes(
    names: list[str], targets: list[ProbeTarget], rounds: int, slow_rounds: int
) -> list[ProbeCost]:
    results = []
    for name in names:
        probe = create_probe(name)
        results.append(measure_probe(probe, targets, rounds if probe.schedule == "fast" else slow_rounds))
    return results


def fast_tick_us(costs: list[ProbeCost]) -> float:
    """CPU per instance per tick of the probes on the fast schedule (sum of their medians)."""
    return sum(cost.median_us for cost in costs if cost.schedule == "fast")


@dataclass(frozen=True, slots=True)
class TickCost:
    """CPU µs per instance per tick: the agent's fast tick and the floors measured beside it (medians
    over windows); `c_floor_us` is None without a C compiler."""

    instances: int
    windows: int
    ticks_per_window: int
    tick_us: float
    floor_us: float
    floor_proc_us: float
    c_floor_us: float | None

    @property
    def ratio(self) -> float:
        return self.tick_us / self.floor_us


def measure_tick(procs: list[subprocess.Popen], interval: float, windows: int) -> TickCost:
    """The agent's fast tick over `procs` beside the floor (see the module's docstring)."""
    state = Path(tempfile.mkdtemp(prefix="medic-tick-"))
    instances = [{"name": f"w{i}", "match": {"pid": p.pid}} for i, p in enumerate(procs)]
    config = validate_config({"agent": {"state_dir": str(state)}, "instances": instances})
    store = Store(state)
    try:
        events = EventLog(store)
        tracker = Tracker(config.instances, store, events)
        keepalive = min(KEEPALIVE, config.detect.memory_params().bucket / SAMPLES_PER_BUCKET)
        probes = [create_probe(name) for name, entry in PROBES.items() if entry.default_enabled]
        collector = Collector(
            tracker, store, events, probes, Telemetry(tracker).observe_probe, keepalive=keepalive
        )
        files = [probe_floor.floor_files(proc.pid) for proc in procs]
        clock = {"now": time.time(), "flushed": 0.0}
        tracker.reconcile(clock["now"], scan=True)  # the agent's first pass
        collector.run("fast", clock["now"])
        collector.run("slow", clock["now"])
        store.flush()

        def tick() -> None:
            now = clock["now"] = clock["now"] + interval
            tracker.reconcile(now)
            collector.run("fast", now)
            if now - clock["flushed"] >= config.agent.flush_interval:
                clock["flushed"] = now
                store.flush()

        for _ in range(int(WARM_UP / interval)):
            tick()
        per_window = max(1, round(KEEPALIVE / interval))
        ticks, floors, procs_only = [], [], []
        for _ in range(windows):
            spent = floor = proc_floor = 0.0
            for _ in range(per_window):
                started = time.thread_time()
                tick()
                spent += time.thread_time() - started
                floor += probe_floor.python_pass(files)
                proc_floor += probe_floor.python_pass(files, cgroup=False)
            ticks.append(spent * 1e6 / (per_window * len(procs)))
            floors.append(floor / per_window)
            procs_only.append(proc_floor / per_window)
        c_floor = probe_floor.c_floor(files, rounds=windows * per_window)
    finally:
        store.close()
        shutil.rmtree(state, ignore_errors=True)
    return TickCost(
        instances=len(procs),
        windows=windows,
        ticks_per_window=per_window,
        tick_us=statistics.median(ticks),
        floor_us=statistics.median(floors),
        floor_proc_us=statistics.median(procs_only),
        c_floor_us=statistics.median(c_floor) if c_floor else None,
    )


def format_tick(cost: TickCost) -> str:
    c_floor = (
        f"; in C {cost.c_floor_us:.1f} µs ({cost.tick_us / cost.c_floor_us:.1f} × that)"
        if cost.c_floor_us
        else "; no C compiler for the C floor"
    )
    verdict = "within" if cost.ratio <= FLOOR_RATIO_TARGET else "OVER"
    return (
        f"\nfast tick of the agent per instance ({cost.instances} instances, 0 workers; median of "
        f"{cost.windows} windows of {cost.ticks_per_window} ticks):\n"
        f"  tick  {cost.tick_us:7.1f} µs CPU (reconcile, fast probes, tree figures, store buffer, flush)\n"
        f"  floor {cost.floor_us:7.1f} µs CPU reading the same files in a tight Python loop "
        f"({cost.floor_proc_us:.1f} of it /proc){c_floor}\n"
        f"  tick / floor = {cost.ratio:.2f} ({verdict} the target of {FLOOR_RATIO_TARGET:.0f}); "
        f"tick / /proc part of the floor = {cost.tick_us / cost.floor_proc_us:.2f}"
    )


def format_table(costs: list[ProbeCost]) -> str:
    lines = [
        f"{'probe':<10} {'schedule':<9} {'instances':>9} {'calls':>6} {'median µs':>10} {'p90 µs':>9} {'max µs':>9}"
    ]
    for cost in costs:
        lines.append(
            f"{cost.probe:<10} {cost.schedule:<9} {cost.instances:>9} {cost.calls:>6} "
            f"{cost.median_us:>10.1f} {cost.p90_us:>9.1f} {cost.max_us:>9.1f}"
            + (f"  ({cost.failures} failed)" if cost.failures else "")
        )
    tick = fast_tick_us(costs)
    verdict = "within" if tick <= FAST_TICK_TARGET_US else "OVER"
    lines.append(
        f"fast schedule per instance per tick: {tick:.1f} µs CPU ({verdict} the {FAST_TICK_TARGET_US:.0f} µs target)"
    )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.probe_cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--processes", type=int, default=50, help="real processes to watch (default 50)")
    parser.add_argument("--size", default="4Mi", help="memory each workload holds (default 4Mi)")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds for fast probes (default 20)")
    parser.add_argument("--slow-rounds", type=int, default=5, help="timed rounds for slow probes (default 5)")
    parser.add_argument(
        "--probe", action="append", choices=sorted(PROBES), help="probe to measure (repeatable)"
    )
    parser.add_argument("--interval", default="1s", help="agent probe interval (default 1s)")
    parser.add_argument(
        "--agent-seconds", default="60s", help="how long to measure the running agent (default 60s; 0 skips)"
    )
    parser.add_argument(
        "--windows",
        type=int,
        default=5,
        help="timed windows of the fast tick, 60 s of ticks each (default 5)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = args.probe or list(PROBES)
    procs = start_workloads(args.processes, args.size)
    agent: dict[str, float] | None = None
    try:
        costs = measure_probes(names, targets_for(procs), args.rounds, args.slow_rounds)
        tick = measure_tick(procs, parse_duration(args.interval), args.windows)
        seconds = parse_duration(args.agent_seconds)
        if seconds > 0:
            agent = measure_agent(procs, parse_duration(args.interval), seconds, progress=not args.json)
    finally:
        stop_workloads(procs)
    if args.json:
        report = {
            "probes": [asdict(c) for c in costs],
            "fast_tick_us": fast_tick_us(costs),
            "tick": {**asdict(tick), "ratio": tick.ratio},
            "agent": agent,
        }
        print(json.dumps(report, indent=2))
        return 0
    print(format_table(costs))
    print(format_tick(tick))
    if agent:
        print(format_agent(agent))
    return 0


def measure_agent(
    procs: list[subprocess.Popen], interval: float, duration: float, progress: bool = True
) -> dict[str, float]:
    """RSS and CPU of a real `medic run` watching `procs` by pid, sampled once a second."""
    state = Path(tempfile.mkdtemp(prefix="medic-bench-"))
    config = {
        "agent": {"listen": "127.0.0.1:0", "state_dir": str(state / "state"), "interval": interval},
        "instances": [{"name": f"w{i}", "match": {"pid": p.pid}} for i, p in enumerate(procs)],
    }
    (state / "medic.yaml").write_text(json.dumps(config))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [
        sys.executable,
        "-m",
        "agent.cli.main",
        "run",
        "-c",
        str(state / "medic.yaml"),
        "--log-level",
        "warning",
    ]
    agent = subprocess.Popen(argv, env=env)
    try:
        while not (state / "state" / "agent.json").exists():
            if agent.poll() is not None:
                raise RuntimeError(f"the agent exited with {agent.returncode}")
            time.sleep(0.1)
        time.sleep(min(5.0, duration / 4))  # start-up and the first slow probes are not the steady state
        rss, cpu_start, started = [], read_stat(agent.pid).cpu_seconds, time.monotonic()
        while time.monotonic() - started < duration:
            rss.append(read_status(agent.pid).rss_bytes or 0)
            if progress:
                print(
                    f"\r  agent: {time.monotonic() - started:4.0f}/{duration:.0f}s", end="", file=sys.stderr
                )
            time.sleep(1.0)
        cpu, wall = read_stat(agent.pid).cpu_seconds - cpu_start, time.monotonic() - started
        if progress:
            print(file=sys.stderr)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    return {
        "processes": len(procs),
        "interval_s": interval,
        "seconds": wall,
        "rss_median_bytes": statistics.median(rss),
        "rss_max_bytes": max(rss),
        "cpu_percent": 100.0 * cpu / wall,
        "cpu_us_per_instance_per_tick": 1e6 * cpu / (wall / interval * len(procs)),
    }


def format_agent(agent: dict[str, float]) -> str:
    mib = 2**20
    return (
        f"\nagent watching {agent['processes']:.0f} processes every {agent['interval_s']:g}s "
        f"for {agent['seconds']:.0f}s:\n"
        f"  RSS median {agent['rss_median_bytes'] / mib:.1f} MiB, max {agent['rss_max_bytes'] / mib:.1f} MiB "
        f"(target ≤ 80 MB)\n"
        f"  CPU {agent['cpu_percent']:.1f}% of one core; {agent['cpu_us_per_instance_per_tick']:.0f} µs per "
        "instance per tick, every job included"
    )


if __name__ == "__main__":
    sys.exit(main())
