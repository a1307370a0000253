"""What the probes cost: median CPU time per probe per instance, over N real processes.

    python -m benchmarks.probe_cost                    # 50 sample workloads, every probe, then the agent
    python -m benchmarks.probe_cost --processes 10 --rounds 50 --agent-seconds 0 --json

Starts N `agent.demo.workload stable` processes, runs each probe over all of them for a number of
rounds, and times every `collect` call with `time.thread_time()` (CPU time of this thread, user plus
system, so the kernel's work behind each /proc read counts). The first round warms caches (the cgroup
probe resolves directories once per process) and is not counted. The target is ≤ 300 µs of CPU per
instance per tick for the probes on the fast schedule together.

Then it starts a real agent (`medic run`) watching the same processes by pid at `--interval` for
`--agent-seconds`, and prints the agent's RSS and CPU, all of its jobs included (reconcile, probes,
SQLite writes, scheduler). Target: agent RSS ≤ 80 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from agent.core.records import ProbeTarget
from agent.core.units import parse_duration
from probes.base import Probe
from probes.linux.procfs import process_identity, read_stat, read_status
from probes.registry import PROBES, create_probe

REPO = Path(__file__).resolve().parent.parent
FAST_TICK_TARGET_US = 300.0


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
        probe.collect(target, time.time())
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
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = args.probe or list(PROBES)
    procs = start_workloads(args.processes, args.size)
    agent: dict[str, float] | None = None
    try:
        costs = measure_probes(names, targets_for(procs), args.rounds, args.slow_rounds)
        seconds = parse_duration(args.agent_seconds)
        if seconds > 0:
            agent = measure_agent(procs, parse_duration(args.interval), seconds, progress=not args.json)
    finally:
        stop_workloads(procs)
    if args.json:
        report = {"probes": [asdict(c) for c in costs], "fast_tick_us": fast_tick_us(costs), "agent": agent}
        print(json.dumps(report, indent=2))
        return 0
    print(format_table(costs))
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
