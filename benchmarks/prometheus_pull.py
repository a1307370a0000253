"""How long a `query_range` history pull takes from a local Prometheus: N instances x D days x one
sample per step, backfilled with `promtool tsdb create-blocks-from openmetrics`, then read with
`agent.series.prometheus_pull.pull_range` at the agent's chunk size and at `medic analyze`'s.

    python -m benchmarks.prometheus_pull --instances 100 --days 14 --step 60 [--workdir DIR]

Prints one JSON object: samples, the backfill time, and per chunk size the pull's seconds, the
bytes read and the samples per second. `--workdir` keeps the TSDB for the next run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from agent.series.prometheus_pull import PullSpec, pull_range
from support.history import prometheus_with_history, write_leaking_openmetrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=100)
    parser.add_argument("--days", type=float, default=14)
    parser.add_argument("--step", type=float, default=60.0)
    parser.add_argument("--chunks", default="1440,10080", help="chunk sizes in steps, comma-separated")
    parser.add_argument("--workdir", type=Path, help="keep the backfilled TSDB here (reused when present)")
    args = parser.parse_args(argv)

    home = args.workdir or Path(tempfile.mkdtemp(prefix="medic-bench-prom-"))
    home.mkdir(parents=True, exist_ok=True)
    marker = home / "range.json"
    figures: dict = {"instances": args.instances, "days": args.days, "step_seconds": args.step}
    openmetrics: Path | None = None
    if marker.exists():
        spans = json.loads(marker.read_text())
        start, end = spans["start"], spans["end"]
        figures["backfill_seconds"] = spans["backfill_seconds"]
    else:
        end = (time.time() // 3600) * 3600
        start = end - args.days * 86400
        openmetrics = home / "history.om"
        began = time.monotonic()
        write_leaking_openmetrics(
            openmetrics, instances=args.instances, start=start, days=args.days, step=args.step
        )
        figures["openmetrics_bytes"] = openmetrics.stat().st_size
    began = time.monotonic()
    try:
        with prometheus_with_history(openmetrics, home) as url:
            if openmetrics is not None:
                figures["backfill_seconds"] = round(time.monotonic() - began, 1)
                marker.write_text(
                    json.dumps({"start": start, "end": end, "backfill_seconds": figures["backfill_seconds"]})
                )
                openmetrics.unlink()
            figures["pulls"] = []
            for size in (int(part) for part in args.chunks.split(",")):
                spec = PullSpec(
                    url, "rss_bytes", start, end - args.step, step=args.step, chunk_points=size,
                    max_samples=100_000_000, max_bytes=1 << 34, deadline=3600,
                )  # fmt: skip
                began = time.monotonic()
                result = pull_range(spec)
                seconds = time.monotonic() - began
                figures["samples"] = result.points
                figures["pulls"].append(
                    {
                        "chunk_points": size,
                        "requests": -(-round((end - start) / args.step) // size),
                        "seconds": round(seconds, 2),
                        "samples_per_second": round(result.points / seconds),
                    }
                )
    finally:
        if args.workdir is None:
            shutil.rmtree(home, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
