"""How long `medic analyze` takes on 14 days × 1-minute samples × 100 instances.

    python -m benchmarks.detection.bench_analyze [--instances 100] [--days 14] [--only NAME] [--keep DIR]

Writes generated inputs and runs `python -m agent.cli.main analyze FILE --json` on each in a
fresh interpreter, pinned to one core when possible, and prints wall and CPU seconds and the peak
RSS of that process. Target: under 10 s each on one core. The inputs:

- `memory.jsonl`, `memory.prom.json`: a fleet's RSS (about 1 in 4 instances leaking) as JSON Lines
  and as a Prometheus `query_range` export (2 M points);
- `p99.prom.json`: the same fleet's `latency_p99_seconds`, one point a minute (a daily cycle,
  noise, and a few instances slow for an hour, much slower than their peers, or degrading for
  hours), judged with `--slo 250ms`;
- `buckets.prom.json`: the same latency as a histogram's cumulative `_bucket` counters
  (14 bounds and `+Inf`, about 300 requests a minute), judged the same way;
- `memory+p99.prom.json`: memory and p99 in one export (both judgements);
- `strays.prom.json`: the same with one more sample at the start of every series, stamped
  1990-01-01 (a clock not yet set): the replays skip the 36 years between, so it takes the time
  of `memory+p99.prom.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from functools import lru_cache
from pathlib import Path

from benchmarks.detection.generate import DAY, HOUR, MINUTE, T0, Trace, fleet, write_jsonl, write_prometheus

REPO = Path(__file__).resolve().parents[2]
BOUNDS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)  # + "+Inf"
SIGMA = 0.5  # spread of one interval's request latencies (log-normal)
SLO_ARGS = ("--slo", "250ms")


def latency_fleet(instances: int, days: float, seed: int = 11) -> dict[str, list[tuple[float, float]]]:
    """Per instance, its typical latency each minute (seconds): a level of 20-80 ms, a daily cycle
    (±15 %) and noise (6 %); one instance in 12 is slow for an hour (4-6× its level), one in 25
    degrades for three hours to over the SLO, and back (a deploy rolled back)."""
    out = {}
    for i in range(instances):
        rng = random.Random(f"latency/{seed}/{i}")
        level = rng.uniform(0.02, 0.08)
        phase = rng.uniform(0, 2 * math.pi)
        slow = rng.uniform(T0 + DAY, T0 + (days - 1) * DAY) if rng.random() < 1 / 12 else None
        factor = rng.uniform(4, 6)
        degrade = rng.uniform(T0 + DAY, T0 + (days - 1) * DAY) if rng.random() < 1 / 25 else None
        points = []
        for k in range(int(days * DAY / MINUTE)):
            ts = T0 + k * MINUTE
            value = level * (1 + 0.15 * math.sin(2 * math.pi * (ts - T0) / DAY + phase))
            if slow is not None and slow <= ts < slow + HOUR:
                value *= factor
            if degrade is not None and degrade <= ts < degrade + 3 * HOUR:
                value *= 1 + 4 * (ts - degrade) / (3 * HOUR)
            points.append((ts, value * math.exp(rng.gauss(0, 0.06))))
        out[f"serving-{i}"] = points
    return out


@lru_cache(maxsize=4096)
def _fractions(median_ms: int) -> tuple[float, ...]:
    """The fraction of requests at or under each bound for a log-normal latency of this median."""
    mu = math.log(median_ms / 1000)
    return tuple(0.5 * math.erfc(-(math.log(b) - mu) / (SIGMA * math.sqrt(2))) for b in BOUNDS)


def bucket_series(p99: list[tuple[float, float]], rng: random.Random) -> dict[str, list[tuple[float, float]]]:
    """Cumulative histogram counters whose interval p99 follows `p99`: ~300 requests a minute."""
    z99 = 2.326
    counts = [0] * (len(BOUNDS) + 1)
    out: dict[str, list[tuple[float, float]]] = {b: [] for b in (*map(repr, BOUNDS), "+Inf")}
    keys = list(out)
    for ts, value in p99:
        median_ms = max(1, round(value / math.exp(z99 * SIGMA) * 1000))
        requests = rng.randint(250, 350)
        below = _fractions(median_ms)
        for j, fraction in enumerate(below):
            counts[j] += round(requests * fraction)
        counts[-1] += requests
        for key, count in zip(keys, counts, strict=True):
            out[key].append((ts, count))
    return out


def _matrix(series: list[tuple[dict[str, str], list[tuple[float, float]]]]) -> dict:
    result = [
        {"metric": labels, "values": [[ts, repr(float(v))] for ts, v in points]} for labels, points in series
    ]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def write_latency(
    latency: dict[str, list[tuple[float, float]]], path: Path, memory: Path | None = None
) -> None:
    """The p99 series as a Prometheus export; with `memory`, appended to that export's series."""
    series = [
        ({"__name__": "latency_p99_seconds", "instance": name, "job": "serving"}, points)
        for name, points in latency.items()
    ]
    doc = _matrix(series)
    if memory is not None:
        doc["data"]["result"] = json.loads(memory.read_text())["data"]["result"] + doc["data"]["result"]
    path.write_text(json.dumps(doc))


def write_buckets(latency: dict[str, list[tuple[float, float]]], path: Path) -> None:
    series = []
    for name, points in latency.items():
        for le, counts in bucket_series(points, random.Random(f"buckets/{name}")).items():
            labels = {
                "__name__": "request_latency_seconds_bucket",
                "le": le,
                "instance": name,
                "job": "serving",
            }
            series.append((labels, counts))
    path.write_text(json.dumps(_matrix(series)))


def run_once(path: Path, extra: tuple[str, ...] = ()) -> tuple[float, float, int, int]:
    """(wall s, CPU s, peak RSS KiB, findings) of one `medic analyze` run, from its own rusage."""
    cmd = [sys.executable, "-m", "agent.cli.main", "analyze", str(path), "--json", *extra]
    with tempfile.TemporaryFile("w+") as out:
        start = time.perf_counter()
        # no preexec_fn: the child is spawned, not forked from this process and its gigabyte of
        # generated traces (which a fork would count in the child's peak RSS)
        child = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.DEVNULL)
        if hasattr(os, "sched_setaffinity"):  # one core, as the target says
            os.sched_setaffinity(child.pid, {sorted(os.sched_getaffinity(0))[-1]})
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            raise SystemExit(f"medic analyze {path.name} exited with {child.returncode}")
        out.seek(0)
        findings = out.read().count('"first_fired"')
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, findings


CASES = {  # name: (file, extra arguments of medic analyze)
    "memory": (("memory.jsonl", ()), ("memory.prom.json", ())),
    "p99": (("p99.prom.json", SLO_ARGS),),
    "buckets": (("buckets.prom.json", SLO_ARGS),),
    "combined": (("memory+p99.prom.json", SLO_ARGS),),
    "strays": (("strays.prom.json", SLO_ARGS),),
}
STRAY_TIME = 631_152_000  # 1990-01-01 UTC


def write_inputs(out_dir: Path, instances: int, days: float, wanted: set[str]) -> None:
    """Generate the inputs of the `wanted` cases into `out_dir`."""
    traces: list[Trace] = fleet(instances)
    points = sum(len(t.points) for t in traces)
    prom = out_dir / "memory.prom.json"
    if wanted & {"memory", "combined", "strays"}:
        write_prometheus(traces, prom)
    if "memory" in wanted:
        write_jsonl(traces, out_dir / "memory.jsonl", instance_names=True)
    print(f"{instances} instances, {points} RSS points (14 d × 1 min, some cut at their OOM)")
    if wanted & {"p99", "buckets", "combined", "strays"}:
        latency = latency_fleet(instances, days)
        print(f"latency: {sum(map(len, latency.values()))} p99 points ({days:g} d × 1 min)")
        if "p99" in wanted:
            write_latency(latency, out_dir / "p99.prom.json")
        if "buckets" in wanted:
            write_buckets(latency, out_dir / "buckets.prom.json")
        if "combined" in wanted:
            write_latency(latency, out_dir / "memory+p99.prom.json", memory=prom)
        if "strays" in wanted:
            write_latency(latency, out_dir / "strays.prom.json", memory=prom)
            with_strays(out_dir / "strays.prom.json")


def with_strays(path: Path) -> None:
    """Put one sample stamped `STRAY_TIME` at the start of every series of the export at `path`."""
    doc = json.loads(path.read_text())
    for series in doc["data"]["result"]:
        series["values"].insert(0, [STRAY_TIME, series["values"][0][1]])
    path.write_text(json.dumps(doc))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--days", type=float, default=14, help="latency inputs only (memory is 14 days)")
    parser.add_argument(
        "--only", action="append", choices=sorted(CASES), help="run only these inputs (repeatable)"
    )
    parser.add_argument(
        "--keep", type=Path, help="write the input files here instead of a temporary directory"
    )
    parser.add_argument("--write-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    wanted = set(args.only or CASES)
    if args.write_only:
        write_inputs(args.keep, args.instances, args.days, wanted)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        # generated in another process: a child inherits its parent's peak RSS into its own, and
        # this one must stay small for the figures of each `medic analyze` to be its own
        writer = [
            sys.executable,
            "-m",
            "benchmarks.detection.bench_analyze",
            "--write-only",
            "--keep",
            str(out_dir),
        ]
        writer += ["--instances", str(args.instances), "--days", str(args.days)]
        writer += [arg for name in sorted(wanted) for arg in ("--only", name)]
        subprocess.run(writer, cwd=REPO, check=True)
        print(f"{'input':<28} {'size':>9} {'wall s':>7} {'CPU s':>7} {'peak RSS':>9} {'findings':>8}")
        for name in sorted(wanted, key=list(CASES).index):
            for file, extra in CASES[name]:
                path = out_dir / file
                wall, cpu_s, rss_kib, findings = run_once(path, extra)
                size = path.stat().st_size / 1e6
                print(
                    f"{path.name:<28} {size:>7.0f}MB {wall:>7.2f} {cpu_s:>7.2f} {rss_kib / 1024:>7.0f}MB {findings:>8}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
