"""Throughput of a malloc-heavy loop with and without the LD_PRELOAD shim, probed every 100 ms; and, with
`--python`, the cost of the Python hook's allocation-site tracing and type histogram.

    python benchmarks/hook_overhead.py [--allocator glibc|jemalloc|tcmalloc] [--ops 20000000] [--rounds 9]
    python benchmarks/hook_overhead.py --python [--ops 300000] [--rounds 5]

The target is tests/support/workloads/alloc_target.c (`bench OPS`: a ring of 4096 live blocks of
16-1040 bytes, one free + one malloc per op, timed inside the target). Three configurations run
interleaved, each in a fresh process under the same allocator:

    baseline   no shim
    loaded     shim preloaded and serving a socket, never asked
    probed     shim preloaded, a client sends `stats` every 100 ms during the loop

Two measurements:

* direct: the CPU time of the shim's `medic-hook` thread (from /proc/PID/task/TID/schedstat, in ns)
  over the CPU time of the loop's thread, during the probed runs; this is the hook's own cost and is
  not disturbed by other load on the machine;
* end to end: CPU time of the whole process per op (all threads), medians of interleaved rounds,
  `loaded` and `probed` against `baseline` (the target is < 1 %), with the spread; wall-clock
  figures beside. On a busy shared machine the spread of this one can exceed the effect.
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
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from native_hooks.client import HookClient
from support.workloads import TargetIO, build_c_target, target_env

CONFIGS = ("baseline", "loaded", "probed")
SITES_CONFIGS = ("off", "frames=1", "frames=5", "frames=10")
# a Python service's request loop: a cache that fills (str -> bytes) and per-request garbage, timed in
# CPU time of the process; `histogram` and `sites` are timed by the hook itself (elapsed_s)
PYTHON_TARGET = """
import gc, os, sys, time
import medic_hook
medic_hook.start()
cache, serial = {}, 0
print("ready", os.getpid(), flush=True)
for line in sys.stdin:
    ops = int(line.split()[1])
    started = time.process_time_ns()
    for _ in range(ops):
        serial += 1
        cache[f"request-{serial}"] = bytes(256)
        garbage = [{"id": serial, "items": [serial] * 4} for _ in range(4)]
    print(time.process_time_ns() - started, len(gc.get_objects()), flush=True)
"""


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """On-CPU nanoseconds per thread name (`main` for the thread whose tid is the pid)."""
    times: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            ns = int(f.read().split()[0])
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            name = "main" if int(tid) == pid else f.read().strip()
        times[name] = times.get(name, 0) + ns
    return times


def run_once(
    binary: str, config: str, allocator: str, ops: int, sock_dir: str, period: float
) -> tuple[float, float, int, float | None]:
    """One fresh target; returns (CPU ns per op, wall ns per op, stats requests answered during the
    loop, hook thread CPU / loop thread CPU during the loop or None without a hook)."""
    socket_template = f"{sock_dir}/bench.%p.sock" if config != "baseline" else None
    env = target_env(allocator, socket_template, shim=config != "baseline")
    proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        target = TargetIO(proc, timeout=600)
        answered = 0
        stop = threading.Event()

        def probe() -> None:
            nonlocal answered
            path = f"{sock_dir}/bench.{target.pid}.sock"
            with HookClient(path, timeout=5) as client:
                while not stop.wait(period):
                    client.request("stats")
                    answered += 1

        prober = threading.Thread(target=probe, daemon=True) if config == "probed" else None
        before = thread_cpu_ns(target.pid)
        if prober:
            prober.start()
        wall, cpu = (float(x) for x in target.command(f"bench {ops}").split())
        stop.set()
        if prober:
            prober.join(timeout=10)
        after = thread_cpu_ns(target.pid)
        target.exit()
        share = None
        if "medic-hook" in after:
            hook = after["medic-hook"] - before.get("medic-hook", 0)
            share = hook / max(1, after["main"] - before["main"])
        return cpu, wall, answered, share
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream:
                stream.close()


def python_sites(ops: int, rounds: int) -> dict:
    """Per-op CPU time of PYTHON_TARGET with tracing off and at 1, 5 and 10 frames (interleaved, each
    run in a fresh process); the cost of one `sites` snapshot and tracemalloc's memory after a run;
    a type histogram with and without counting the largest dicts' contents."""
    work = tempfile.mkdtemp(prefix="mp-", dir="/tmp")
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": root, "MEDIC_HOOK_SOCKET": f"{work}/p.%p.sock"}
    per_op: dict[str, list[float]] = {c: [] for c in SITES_CONFIGS}
    snapshot_s: list[float] = []
    tracemalloc_bytes: list[int] = []
    histogram_s: dict[str, list[float]] = {"contents=8": [], "contents=0": []}
    objects: list[int] = []
    try:
        for _ in range(rounds):
            for config in SITES_CONFIGS:
                proc = subprocess.Popen(
                    [sys.executable, "-c", PYTHON_TARGET],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                )
                try:
                    assert proc.stdin is not None and proc.stdout is not None
                    pid = int(proc.stdout.readline().split()[1])
                    with HookClient(f"{work}/p.{pid}.sock", timeout=30, pid=pid) as client:
                        if config != "off":
                            client.request("sites_start", frames=int(config.split("=")[1]), max_memory=2**28)
                        proc.stdin.write(f"bench {ops}\n")
                        proc.stdin.flush()
                        ns, live = proc.stdout.readline().split()
                        per_op[config].append(int(ns) / ops)
                        objects.append(int(live))
                        if config == "frames=5":
                            reply = client.request("sites", top=50)
                            snapshot_s.append(reply["elapsed_s"])
                            tracemalloc_bytes.append(reply["tracemalloc_bytes"])
                        if config == "off":
                            for contents in (8, 0):
                                reply = client.request("histogram", top=50, contents=contents, budget_s=10)
                                # the walk's own CPU when the hook reports it: a busy host stretches wall time
                                histogram_s[f"contents={contents}"].append(
                                    reply.get("cpu_s", reply["elapsed_s"])
                                )
                finally:
                    proc.kill()
                    proc.wait()
                    for stream in (proc.stdin, proc.stdout):
                        if stream:
                            stream.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    medians = {c: statistics.median(v) for c, v in per_op.items()}
    return {
        "ops": ops,
        "rounds": rounds,
        "cpu_ns_per_op": {c: round(m, 1) for c, m in medians.items()},
        "slowdown_percent": {
            c: round(100 * (m / medians["off"] - 1), 1) for c, m in medians.items() if c != "off"
        },
        "spread_cpu_ns_per_op": {c: [round(min(v), 1), round(max(v), 1)] for c, v in per_op.items()},
        "sites_snapshot_s": round(statistics.median(snapshot_s), 4),
        "tracemalloc_mib_after_run": round(statistics.median(tracemalloc_bytes) / 2**20, 1),
        "histogram_s": {k: round(statistics.median(v), 4) for k, v in histogram_s.items()},
        "gc_objects": int(statistics.median(objects)),
        "host": {"cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S")},
    }


def print_python(summary: dict) -> None:
    print(f"Python hook, {summary['ops']} requests per run, {summary['rounds']} interleaved rounds")
    print(f"{'tracing':<10} {'CPU ns/op':>9} {'slowdown':>9} {'spread':>16}")
    for config in SITES_CONFIGS:
        slowdown = summary["slowdown_percent"].get(config)
        low, high = summary["spread_cpu_ns_per_op"][config]
        print(
            f"{config:<10} {summary['cpu_ns_per_op'][config]:>9.1f} "
            f"{'' if slowdown is None else f'{slowdown:+.1f}%':>9} {f'{low:.1f}-{high:.1f}':>16}"
        )
    print(
        f"one sites snapshot (frames=5): {summary['sites_snapshot_s'] * 1000:.1f} ms, tracemalloc's own "
        f"memory {summary['tracemalloc_mib_after_run']} MiB after a run"
    )
    hist = summary["histogram_s"]
    print(
        f"type histogram of {summary['gc_objects']} GC objects (CPU): {hist['contents=0'] * 1000:.1f} ms, "
        f"{hist['contents=8'] * 1000:.1f} ms counting the longest containers' contents"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--allocator", choices=["glibc", "jemalloc", "tcmalloc"], default="glibc")
    parser.add_argument(
        "--python", action="store_true", help="the Python hook: allocation-site tracing and histograms"
    )
    parser.add_argument("--ops", type=int, default=None, help="malloc/free pairs (Python: requests) per run")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved runs per configuration")
    parser.add_argument("--period", type=float, default=0.1, help="seconds between probes (default 0.1)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.python:
        python_summary = python_sites(args.ops or 300_000, args.rounds)
        if args.json:
            print(json.dumps(python_summary, indent=2))
        else:
            print_python(python_summary)
        return 0
    args.ops = args.ops or 20_000_000

    work = tempfile.mkdtemp(prefix="mb-", dir="/tmp")
    try:
        binary = build_c_target(work)
        results: dict[str, list[float]] = {c: [] for c in CONFIGS}
        walls: dict[str, list[float]] = {c: [] for c in CONFIGS}
        probes: list[int] = []
        shares: dict[str, list[float]] = {"loaded": [], "probed": []}
        for _ in range(args.rounds):
            for config in CONFIGS:
                cpu, wall, answered, share = run_once(
                    binary, config, args.allocator, args.ops, work, args.period
                )
                results[config].append(cpu)
                walls[config].append(wall)
                if share is not None:
                    shares[config].append(share)
                if config == "probed":
                    probes.append(answered)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    medians = {c: statistics.median(v) for c, v in results.items()}
    wall_medians = {c: statistics.median(v) for c, v in walls.items()}
    summary = {
        "allocator": args.allocator,
        "ops": args.ops,
        "rounds": args.rounds,
        "probe_period_s": args.period,
        "probes_per_run": statistics.median(probes) if probes else 0,
        "hook_thread_cpu_percent": {c: round(100 * statistics.median(v), 4) for c, v in shares.items() if v},
        "cpu_ns_per_op": {c: round(m, 3) for c, m in medians.items()},
        "mops_per_cpu_s": {c: round(1e3 / m, 2) for c, m in medians.items()},
        "slowdown_percent": {
            c: round(100 * (medians[c] / medians["baseline"] - 1), 2) for c in CONFIGS if c != "baseline"
        },
        "spread_cpu_ns_per_op": {c: [round(min(v), 2), round(max(v), 2)] for c, v in results.items()},
        "wall_ns_per_op": {c: round(m, 3) for c, m in wall_medians.items()},
        "wall_slowdown_percent": {
            c: round(100 * (wall_medians[c] / wall_medians["baseline"] - 1), 2)
            for c in CONFIGS
            if c != "baseline"
        },
        "host": {"cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S")},
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"allocator {args.allocator}, {args.ops} ops per run, {args.rounds} interleaved rounds, "
        f"probe every {args.period * 1000:.0f} ms ({summary['probes_per_run']} stats requests per probed run)"
    )
    direct = summary["hook_thread_cpu_percent"]
    print(
        f"direct: the hook thread used {direct.get('probed', 0):.4f}% of the loop thread's CPU when probed, "
        f"{direct.get('loaded', 0):.4f}% when idle"
    )
    print("end to end (CPU time of the whole process per op; medians):")
    print(
        f"{'config':<10} {'CPU ns/op':>9} {'Mops/CPU-s':>10} {'slowdown':>9} {'CPU spread':>14}   {'wall ns/op':>10}"
    )
    for config in CONFIGS:
        slowdown = summary["slowdown_percent"].get(config)
        low, high = summary["spread_cpu_ns_per_op"][config]
        print(
            f"{config:<10} {medians[config]:>9.2f} {1e3 / medians[config]:>10.2f} "
            f"{'' if slowdown is None else f'{slowdown:+.2f}%':>9} {f'{low:.2f}-{high:.2f}':>14}   "
            f"{wall_medians[config]:>10.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
