"""The agent's own cost while it watches N real processes: RSS and CPU of the `medic run` process.

    python benchmarks/agent_footprint.py --processes 50 --interval 1s --duration 60s

Starts N real sample workloads, a real agent watching them by pid at the given interval, samples
the agent's RSS and CPU time once a second, and prints the figures quoted in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from agent.units import format_bytes, parse_duration  # noqa: E402
from probes.linux.procfs import read_stat, read_status  # noqa: E402


def start_workloads(count: int, env: dict[str, str]) -> list[subprocess.Popen]:
    procs = []
    for _ in range(count):
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.sample_workload", "stable", "--size", "4Mi"],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    return procs


def measure(count: int, interval: float, duration: float, progress: bool = True) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workloads = start_workloads(count, env)
    state = Path(tempfile.mkdtemp(prefix="medic-bench-"))
    config = {
        "agent": {"listen": "127.0.0.1:0", "state_dir": str(state / "state"), "interval": interval},
        "instances": [{"name": f"w{i}", "match": {"pid": p.pid}} for i, p in enumerate(workloads)],
    }
    (state / "medic.yaml").write_text(json.dumps(config))
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "run",
            "--config",
            str(state / "medic.yaml"),
            "--log-level",
            "warning",
        ],
        env=env,
    )
    try:
        while not (state / "state" / "agent.json").exists():
            time.sleep(0.1)
        time.sleep(min(5.0, duration / 4))  # let start-up and the first slow probes pass
        rss, cpu_start, t_start = [], read_stat(agent.pid).cpu_seconds, time.monotonic()
        while time.monotonic() - t_start < duration:
            rss.append(read_status(agent.pid).rss_bytes)
            if progress:
                elapsed = time.monotonic() - t_start
                print(f"\r  measuring: {elapsed:4.0f}/{duration:.0f}s", end="", file=sys.stderr, flush=True)
            time.sleep(1.0)
        cpu = read_stat(agent.pid).cpu_seconds - cpu_start
        wall = time.monotonic() - t_start
        if progress:
            print(file=sys.stderr)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
        for proc in workloads:
            proc.kill()
            proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
    ticks = wall / interval
    return {
        "processes": count,
        "interval_s": interval,
        "duration_s": wall,
        "agent_rss_median_bytes": statistics.median(rss),
        "agent_rss_max_bytes": max(rss),
        "agent_cpu_percent": 100.0 * cpu / wall,
        "agent_cpu_us_per_instance_per_tick": 1e6 * cpu / (ticks * count),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=50)
    parser.add_argument("--interval", default="1s")
    parser.add_argument("--duration", default="60s")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = measure(args.processes, parse_duration(args.interval), parse_duration(args.duration))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"agent watching {result['processes']} processes at {result['interval_s']}s for {result['duration_s']:.0f}s:"
    )
    print(
        f"  RSS median {format_bytes(result['agent_rss_median_bytes'])}, max {format_bytes(result['agent_rss_max_bytes'])}"
    )
    print(f"  CPU {result['agent_cpu_percent']:.1f}% of one core")
    print(
        f"  CPU per instance per tick (all jobs included): {result['agent_cpu_us_per_instance_per_tick']:.0f} µs"
    )


if __name__ == "__main__":
    main()
