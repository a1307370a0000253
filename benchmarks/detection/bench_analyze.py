"""How long `medic analyze` takes on 14 days × 1-minute samples × 100 instances (2 M points).

    python -m benchmarks.detection.bench_analyze [--instances 100] [--keep DIR]

Writes a generated fleet (about 1 in 4 instances leaking) as JSON Lines and as a Prometheus
`query_range` export, then runs `python -m agent.cli.main analyze FILE --json` on each in a
fresh interpreter, pinned to one core when possible, and prints wall and CPU seconds and the
peak RSS of that process. Target: under 10 s on one core.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.detection.generate import fleet, write_jsonl, write_prometheus

REPO = Path(__file__).resolve().parents[2]


def run_once(path: Path) -> tuple[float, float, int, int]:
    """(wall s, CPU s, peak RSS KiB, findings) of one `medic analyze` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cmd = [sys.executable, "-m", "agent.cli.main", "analyze", str(path), "--json"]
    if hasattr(os, "sched_setaffinity"):
        cpu = sorted(os.sched_getaffinity(0))[-1]
        preexec = lambda: os.sched_setaffinity(0, {cpu})  # noqa: E731 - one core, as the target says
    else:
        preexec = None
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, preexec_fn=preexec, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    findings = out.stdout.count('"first_fired"')
    return wall, cpu_s, after.ru_maxrss, findings


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument(
        "--keep", type=Path, help="write the input files here instead of a temporary directory"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = args.keep or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        traces = fleet(args.instances)
        points = sum(len(t.points) for t in traces)
        jsonl, prom = out_dir / "fleet.jsonl", out_dir / "fleet.prom.json"
        write_jsonl(traces, jsonl, instance_names=True)
        write_prometheus(traces, prom)
        print(f"{args.instances} instances, {points} RSS points (14 d × 1 min, some cut at their OOM)")
        print(f"{'input':<28} {'size':>9} {'wall s':>7} {'CPU s':>7} {'peak RSS':>9} {'findings':>8}")
        for path in (jsonl, prom):
            wall, cpu_s, rss_kib, findings = run_once(path)
            size = path.stat().st_size / 1e6
            print(
                f"{path.name:<28} {size:>7.0f}MB {wall:>7.2f} {cpu_s:>7.2f} {rss_kib / 1024:>7.0f}MB {findings:>8}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
