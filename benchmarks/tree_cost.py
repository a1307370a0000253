"""What an instance of several processes costs to probe: a server alone, with 1 worker, with 8.

    python -m benchmarks.tree_cost                      # 0, 1 and 8 workers, 300 rounds each
    python -m benchmarks.tree_cost --workers 0 1 8 32 --rounds 100 --json

Starts a real forking server per case (a parent with 32 MiB that its workers share copy-on-write,
and 8 MiB of each worker's own), then times with `time.thread_time()` (CPU time of this thread,
user plus system, so the kernel's work behind each /proc read counts), per round:

- `table`: one pass over `/proc/*/stat` (who descends from whom): made by the discovery job (every
  10 s) for every instance together, and on a fast tick only when a server is new or a worker gone;
  it depends on how many processes the machine runs (printed), not on the instance;
- `alive`: whether each worker still runs (one `stat` read each), on every fast tick;
- `process`: the `process` probe over the server and its workers;
- `tree`: the instance's figures made of them (`ProcessTree.observe` and `samples`) and whether it
  owns its cgroup (one `cgroup.procs` read);
- `fast`: `alive`, `process` and `tree` together, the fast schedule's cost for the instance (the
  `cgroup` probe, which reads the cgroup once whatever the number of processes, is not in it);
- `smaps`: the `smaps` probe over all of them, on the slow schedule (every 60 s by default).

The first round warms caches and is not counted. Prints the median and 90th percentile in µs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from agent.core.records import ProbeTarget
from agent.watch.discovery import by_pid
from agent.watch.tree import CgroupOwnership, ProcessTree
from probes.linux.procfs import process_identity
from probes.linux.proctree import read_process_table
from probes.process import ProcessProbe
from probes.smaps import SmapsProbe

REPO = Path(__file__).resolve().parent.parent
SERVER = """
import os, signal, sys
shared = bytearray(32 << 20); shared[::4096] = b"s" * len(shared[::4096])
kids = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        own = bytearray(8 << 20); own[::4096] = b"o" * len(own[::4096])
        while True:
            signal.pause()
    kids.append(pid)
print("ready", *kids, flush=True)
while True:
    signal.pause()
"""


def start_server(workers: int) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(workers)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("ready"):
        raise RuntimeError(f"the server did not start: {line!r}, exit={proc.poll()}")
    time.sleep(0.5)  # the workers touch their own pages after the parent printed their pids
    return proc, [int(word) for word in line.split()[1:]]


def timed(rounds: int, work: Callable[[], object]) -> list[float]:
    work()  # warm
    spent = []
    for _ in range(rounds):
        start = time.thread_time()
        work()
        spent.append((time.thread_time() - start) * 1e6)
    return spent


def measure(workers: int, rounds: int) -> dict[str, object]:
    proc, kids = start_server(workers)
    try:
        server = process_identity(proc.pid)
        target = ProbeTarget(
            "bench", server.pid, server.start_time, workers=tuple(process_identity(k) for k in kids)
        )
        tree = ProcessTree()
        tree.reset(server, "server", 0.0)
        tree.update(((w, server.pid, "worker") for w in target.workers), 0.0, lambda item: item)
        process, smaps, ownership = ProcessProbe(), SmapsProbe(), CgroupOwnership()
        tree.observe(0.0, process.collect(target, 0.0).processes)  # RSS first: PSS then says what is shared
        tree.observe(0.0, smaps.collect(target, 0.0).processes)
        now = [1.0]

        def tree_step() -> None:
            now[0] += 1.0
            tree.observe(now[0], process.collect(target, now[0]).processes)
            ownership.owns(server, list(tree.members), now[0])
            tree.samples("bench", now[0], None)

        def alive() -> None:
            for worker in target.workers:
                by_pid(worker.pid)

        def fast() -> None:
            alive()
            tree_step()

        figures = {
            "table": timed(rounds, read_process_table),
            "alive": timed(rounds, alive),
            "process": timed(rounds, lambda: process.collect(target, 0.0)),
            "tree": timed(
                rounds,
                lambda: (ownership.owns(server, list(tree.members), 0.0), tree.samples("b", 0.0, None)),
            ),
            "fast": timed(rounds, fast),
            "smaps": timed(max(10, rounds // 10), lambda: smaps.collect(target, 0.0)),
        }
        memory = {s.metric: s.value for s in tree.samples("bench", now[0], None)}
        return {
            "workers": workers,
            "processes_on_machine": len(read_process_table().entries),
            **{f"{k}_median_us": round(statistics.median(v), 1) for k, v in figures.items()},
            **{f"{k}_p90_us": round(statistics.quantiles(v, n=10)[-1], 1) for k, v in figures.items()},
            "tree_rss_mib": round(memory.get("tree_rss_bytes", 0) / 2**20, 1),
            "tree_memory_mib": round(memory.get("tree_memory_bytes", 0) / 2**20, 1),
        }
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if proc.stdout:
            proc.stdout.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 8])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = [measure(count, args.rounds) for count in args.workers]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    columns = ("table", "alive", "process", "tree", "fast", "smaps")
    print(f"{'workers':>7} " + " ".join(f"{c:>9}" for c in columns) + "  (µs of CPU, median/p90)")
    for r in results:
        cells = [f"{r[f'{k}_median_us']:.0f}/{r[f'{k}_p90_us']:.0f}" for k in columns]
        memory = f"RSS summed {r['tree_rss_mib']} MiB, counted once {r['tree_memory_mib']} MiB"
        print(f"{r['workers']:>7} " + " ".join(f"{c:>9}" for c in cells) + "   " + memory)
    print(f"processes on this machine: {results[-1]['processes_on_machine']} (the table pass reads each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
