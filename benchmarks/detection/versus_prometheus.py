"""`medic analyze` against Prometheus's own `predict_linear` over the same fleet, in one run.

    python -m benchmarks.detection.versus_prometheus [--instances 100] [--range 6h] [--keep DIR]

The fleet of `bench_analyze` (100 instances × 14 days × 1 min, about 1 in 4 leaking) is written
twice: as the `query_range` export `medic analyze` reads, and as OpenMetrics that `promtool`
backfills into a local Prometheus. Then:

- `medic analyze memory.prom.json` in a fresh interpreter pinned to one core (its own rusage);
- Prometheus evaluates `predict_linear(process_resident_memory_bytes[6h], 4h) > memory_limit` at every
  minute of the 14 days, as a rule evaluated every minute would (`query_range`, step 60 s, in
  requests of at most 10,080 steps), and its CPU is read from /proc before and after.

Prints both CPU figures and their ratio (the goal: medic at most 1×, aim 0.5×).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from benchmarks.detection.bench_analyze import run_once
from benchmarks.detection.generate import Trace, fleet, write_prometheus
from support.history import prometheus_with_history

STEP = 60
CHUNK_STEPS = 10_080  # under Prometheus's 11,000 points per series and query
HORIZON = 4 * 3600


def write_openmetrics(traces: list[Trace], path: Path) -> int:
    """RSS and the limit of every trace, one series' samples together and in time order."""
    samples = 0
    with open(path, "w") as out:
        out.write("# TYPE process_resident_memory_bytes gauge\n")
        for trace in traces:
            name = f'process_resident_memory_bytes{{instance="{trace.name}",job="serving"}}'
            out.writelines(f"{name} {v:.0f} {ts:.0f}\n" for ts, v in trace.points)
            samples += len(trace.points)
        out.write("# TYPE memory_limit_bytes gauge\n")
        for trace in traces:
            name = f'memory_limit_bytes{{instance="{trace.name}",job="serving"}}'
            out.writelines(f"{name} {trace.limit:.0f} {ts:.0f}\n" for ts, _ in trace.points)
            samples += len(trace.points)
        out.write("# EOF\n")
    return samples


def cpu_seconds(pid: int) -> float:
    """User and system CPU of a process from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def prometheus_pid(data_dir: Path) -> int:
    """The Prometheus serving `data_dir` (started by `prometheus_with_history`)."""
    wanted = f"--storage.tsdb.path={data_dir}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if wanted in (entry / "cmdline").read_bytes().split(b"\0"):
                    return int(entry.name)
            except OSError:
                continue
    raise SystemExit(f"no Prometheus process serves {data_dir}")


def evaluate_rule(url: str, query: str, start: float, end: float) -> int:
    """`query` at every STEP from `start` to `end`; returns how many (series, step) values fired."""
    fired = 0
    with httpx.Client(base_url=url, timeout=600) as client:
        at = start
        while at <= end:
            last = min(end, at + (CHUNK_STEPS - 1) * STEP)
            answer = client.get(
                "/api/v1/query_range", params={"query": query, "start": at, "end": last, "step": STEP}
            )
            answer.raise_for_status()
            fired += sum(len(s["values"]) for s in answer.json()["data"]["result"])
            at = last + STEP
    return fired


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--range", default="6h", help="predict_linear's range (a PromQL duration)")
    parser.add_argument("--keep", type=Path, help="keep the inputs and the TSDB here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        home = args.keep or Path(tmp)
        home.mkdir(parents=True, exist_ok=True)
        traces = fleet(args.instances)
        export, openmetrics = home / "memory.prom.json", home / "memory.om"
        write_prometheus(traces, export)
        samples = write_openmetrics(traces, openmetrics)
        start = min(t.points[0][0] for t in traces)
        end = max(t.points[-1][0] for t in traces)
        print(
            f"{args.instances} instances, {samples} samples (RSS and limit), {export.stat().st_size / 1e6:.0f} MB export"
        )

        wall, medic_cpu, rss_kib, findings = run_once(export)
        print(
            f"medic analyze:   {medic_cpu:6.2f} s CPU ({wall:.2f} s wall, {rss_kib / 1024:.0f} MB peak), {findings} findings"
        )

        began = time.monotonic()
        with prometheus_with_history(openmetrics, home / "prometheus") as url:
            print(f"backfilled in {time.monotonic() - began:.1f} s")
            pid = prometheus_pid(home / "prometheus" / "data")
            query = (
                f"predict_linear(process_resident_memory_bytes[{args.range}], {HORIZON}) "
                "> on(instance, job) memory_limit_bytes"
            )
            evaluate_rule(url, "up", start, start + STEP)  # warm the HTTP path, not the data
            before, began = cpu_seconds(pid), time.monotonic()
            fired = evaluate_rule(url, query, start, end)
            prom_cpu, prom_wall = cpu_seconds(pid) - before, time.monotonic() - began
        print(
            f"predict_linear:  {prom_cpu:6.2f} s CPU of Prometheus ({prom_wall:.2f} s wall), {fired} firing steps"
        )
        print(f"medic / predict_linear: {medic_cpu / prom_cpu:.2f}× (goal ≤ 1×, aim 0.5×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
