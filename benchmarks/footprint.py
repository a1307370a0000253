"""The agent's memory footprint: RSS of a real `medic run` watching N processes while it is scraped.

    python -m benchmarks.footprint                     # 50 workloads, 60 s, scraped every second
    python -m benchmarks.footprint --processes 10 --seconds 20 --json
    python -m benchmarks.footprint --reader-cost       # the bounded reader cache against SQLite's default

Starts N `agent.demo.workload stable` processes and a real agent watching them by pid at a 1 s
interval; while it runs, it is scraped once a second the way Prometheus does (OpenMetrics, gzip) and
its instance list is read the way the dashboard does. The agent's RSS (VmRSS) is sampled once a
second after a warm-up. Target: ≤ 48 MiB at 50 instances (docs/performance.md; it was 64);
`python -m benchmarks.serve_cost` measures it beside process-exporter, and at 200 after API load.

With `--reader-cost`, it prints instead what a detection-sized read costs a reader connection with
its page cache bounded (`agent.state.store.READER_CACHE_KIB`) and with SQLite's 2 MiB default.

Then, to tell what to lazy-import when it is over, it prints what each layer of imports adds to a
fresh interpreter's RSS, in the order the agent imports them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from agent.cli.main import COMMANDS as SUBCOMMANDS
from agent.core.units import parse_duration
from benchmarks.probe_cost import start_workloads, stop_workloads
from benchmarks.serve_cost import ACCEPT, start_medic
from probes.linux.procstatus import read_status
from probes.registry import PROBES

REPO = Path(__file__).resolve().parent.parent
TARGET_MIB = 48.0  # at 50 instances, steady (docs/performance.md); 64 MiB at 200 after API load
# what `medic run` imports, in its order; each line's figure is what it adds to the ones above. The
# last layers are what the agent loads after its imports: the config loader, `run`'s subcommand
# module (the parser is built for it alone), the default probes, the local coordinator and what
# its routes load on first use.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("asyncio", ("asyncio",)),
    ("sqlite3", ("sqlite3",)),
    ("pydantic", ("pydantic",)),
    ("fastapi", ("fastapi",)),
    ("uvicorn", ("uvicorn",)),
    ("prometheus_client", ("prometheus_client",)),
    ("apscheduler", ("apscheduler.schedulers.asyncio",)),
    ("agent.config.model", ("agent.config.model",)),
    ("remediation.engine", ("remediation.engine",)),
    ("agent.jobs.remediation", ("agent.jobs.remediation",)),
    ("agent.notify.service", ("agent.notify.service",)),
    ("agent.api.app", ("agent.api.app",)),
    ("agent.cli.main", ("agent.cli.main",)),
    ("agent.runtime", ("agent.runtime",)),
    ("config loader (yaml)", ("agent.config.loader",)),
    ("agent.cli.run (only subcommand)", (SUBCOMMANDS["run"],)),
    ("default probes", tuple(entry.module for entry in PROBES.values() if entry.default_enabled)),
    ("local coordinator", ("remediation.coordinator.local",)),
    ("anyio worker threads", ("anyio._backends._asyncio",)),
)
# imported by the agent only when something configured needs them (a sink, an HTTP actuator, etcd,
# a `match.cmdline`, listening on every address)
NOT_AT_START = ("httpx", "pydantic.v1", "psutil")
_LAYER_SCRIPT = """
import importlib, json, re, sys
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
layers, late = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = [("python", rss())]
for label, names in layers:
    for name in names:
        importlib.import_module(name)
    out.append((label, rss()))
print(json.dumps({"layers": out, "loaded": [name for name in late if sys.modules.get(name) is not None]}))
"""


def measure_agent(procs: list[subprocess.Popen], seconds: float, warmup: float) -> dict[str, float]:
    """RSS of a real agent watching `procs`, scraped every second."""
    agent, url = start_medic(procs, Path(tempfile.mkdtemp(prefix="medic-footprint-")))
    try:
        time.sleep(0.2)
        rss: list[int] = []
        started = time.monotonic()
        with httpx.Client(base_url=url, timeout=10) as client:
            while time.monotonic() - started < warmup + seconds:
                client.get("/metrics", headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"})
                client.get("/api/v1/instances")
                if time.monotonic() - started >= warmup:
                    rss.append(read_status(agent.pid).rss_bytes or 0)
                time.sleep(1.0)
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    return {
        "processes": len(procs),
        "seconds": seconds,
        "rss_median_mib": statistics.median(rss) / 2**20,
        "rss_max_mib": max(rss) / 2**20,
    }


def reader_cost(instances: int = 50, hours: float = 3.0, passes: int = 5) -> dict[str, float]:
    """CPU ms of one detection-sized pass (every instance's rss series over `hours`, raw samples at
    1 s) through one reader connection: with the store's bounded cache and with SQLite's default."""
    from agent.core.records import Sample
    from agent.state.store import READER_CACHE_KIB, Store

    store = Store(Path(tempfile.mkdtemp(prefix="medic-reader-")) / "state")
    now = 1_800_000_000.0
    points = int(hours * 3600)
    for i in range(instances):
        store.add_samples(Sample(f"w{i}", "rss_bytes", now - points + t, float(t)) for t in range(points))
        store.flush()
    result: dict[str, float] = {}
    for label, kib in (("bounded", READER_CACHE_KIB), ("sqlite_default", 2000)):
        store.query(f"PRAGMA cache_size=-{kib}")  # the calling thread's reader
        costs = []
        for _ in range(passes):
            began = time.process_time()
            for i in range(instances):
                store.series(f"w{i}", "rss_bytes", now - hours * 3600, now, now=now)
            costs.append((time.process_time() - began) * 1000)
        result[f"{label}_ms"] = statistics.median(costs[1:])  # the first pass warms the cache
    store.close()
    return {"instances": instances, "hours": hours, "cache_kib": READER_CACHE_KIB, **result}


def import_layers() -> tuple[list[tuple[str, float]], list[str]]:
    """(layer, MiB it adds) for each layer of LAYERS in a fresh interpreter, and which of
    NOT_AT_START they loaded after all (none, unless a module imports them at module level again)."""
    done = subprocess.run(
        [sys.executable, "-c", _LAYER_SCRIPT, json.dumps(LAYERS), json.dumps(NOT_AT_START)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    answer = json.loads(done.stdout)
    points = answer["layers"]
    layers = [(points[0][0], points[0][1] / 2**20)]
    layers += [(name, (now - before) / 2**20) for (_, before), (name, now) in itertools.pairwise(points)]
    return layers, answer["loaded"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.footprint", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--processes", type=int, default=50, help="real processes to watch (default 50)")
    parser.add_argument("--seconds", default="60s", help="how long to sample the agent (default 60s)")
    parser.add_argument("--warmup", default="10s", help="start-up not sampled (default 10s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--reader-cost",
        action="store_true",
        help="only the CPU cost of detection reads, bounded cache vs default",
    )
    args = parser.parse_args(argv)
    if args.reader_cost:
        cost = reader_cost()
        print(
            json.dumps(cost, indent=2)
            if args.json
            else f"{cost['instances']} instances x {cost['hours']:.0f} h of 1 s samples, one pass (CPU):\n"
            f"  reader cache {cost['cache_kib']} KiB: {cost['bounded_ms']:.0f} ms; "
            f"SQLite's default 2000 KiB: {cost['sqlite_default_ms']:.0f} ms"
        )
        return 0
    procs = start_workloads(args.processes)
    try:
        agent = measure_agent(procs, parse_duration(args.seconds), parse_duration(args.warmup))
    finally:
        stop_workloads(procs)
    layers, loaded = import_layers()
    if args.json:
        result = {"agent": agent, "imports_mib": layers, "loaded_late": loaded, "target_mib": TARGET_MIB}
        print(json.dumps(result, indent=2))
        return 0
    verdict = "within" if agent["rss_max_mib"] <= TARGET_MIB else "OVER"
    print(
        f"agent watching {agent['processes']} processes for {agent['seconds']:.0f}s, scraped every second:\n"
        f"  RSS median {agent['rss_median_mib']:.1f} MiB, max {agent['rss_max_mib']:.1f} MiB "
        f"({verdict} the {TARGET_MIB:.0f} MiB target)\n\nwhat each import layer adds to RSS:"
    )
    for name, mib in layers:
        print(f"  {name:34s} {mib:6.1f} MiB")
    print(f"  {'(all imports)':34s} {sum(m for _, m in layers):6.1f} MiB")
    print(f"  not loaded at start: {', '.join(n for n in NOT_AT_START if n not in loaded) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
