"""Record the memory of a real child process as JSON Lines, the input `medic analyze` reads.

    python -m benchmarks.detection.record --name NAME --out FILE.jsonl.gz --seconds 60 \\
        [--interval 0.2] [--gc-log FILE] [--env K=V ...] -- CMD ARGS...

Samples `/proc/PID/statm` of the child every `--interval` seconds (resident pages × page size →
`rss_bytes`). Lines the child prints as `M <metric> <value>` (allocator statistics it reads about
itself) are recorded with the time they arrive; with `--gc-log`, the heap after each GC in a JVM
unified GC log (`-Xlog:gc:file=...`) becomes `jvm_heap_after_gc_bytes`. The child is started in
its own session, stopped after `--seconds` (TERM, then KILL) and always reaped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
GC_LINE = re.compile(r"Pause .*?\s(\d+)([KMG])->(\d+)([KMG])\(\d+[KMG]\)")
UNITS = {"K": 2**10, "M": 2**20, "G": 2**30}


def rss_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return None


class Recorder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.rows: list[dict] = []
        self.lock = threading.Lock()

    def add(self, metric: str, value: float, ts: float | None = None) -> None:
        with self.lock:
            self.rows.append(
                {
                    "ts": round(ts if ts is not None else time.time(), 3),
                    "instance": self.name,
                    "metric": metric,
                    "value": value,
                }
            )

    def read_stdout(self, stream) -> None:
        for line in stream:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "M":
                try:
                    self.add(parts[1], float(parts[2]))
                except ValueError:
                    pass

    def tail_gc_log(self, path: Path, stop: threading.Event) -> None:
        offset = 0
        while not stop.is_set():
            try:
                with path.open() as f:
                    f.seek(offset)
                    for line in f:
                        match = GC_LINE.search(line)
                        if match:
                            after = int(match.group(3)) * UNITS[match.group(4)]
                            self.add("jvm_heap_after_gc_bytes", after)
                    offset = f.tell()
            except OSError:
                pass
            stop.wait(0.1)


def record(
    cmd: list[str], name: str, seconds: float, interval: float, env: dict, gc_log: Path | None
) -> Recorder:
    rec = Recorder(name)
    child = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, **env}, start_new_session=True
    )
    stop = threading.Event()
    threads = [threading.Thread(target=rec.read_stdout, args=(child.stdout,), daemon=True)]
    if gc_log is not None:
        threads.append(threading.Thread(target=rec.tail_gc_log, args=(gc_log, stop), daemon=True))
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + seconds
        next_at = time.monotonic()
        while time.monotonic() < deadline and child.poll() is None:
            rss = rss_of(child.pid)
            if rss is not None:
                rec.add("rss_bytes", rss)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
    finally:
        stop.set()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)
            try:
                child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        for t in threads:
            t.join(timeout=2)
    return rec


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--name", required=True, help="instance name written in each record")
    parser.add_argument("--out", type=Path, required=True, help="output .jsonl or .jsonl.gz")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--gc-log", type=Path, help="JVM unified GC log to follow")
    parser.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="extra environment for the child"
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("give the command after --")
    env = dict(item.split("=", 1) for item in args.env)
    if args.gc_log is not None and args.gc_log.exists():
        args.gc_log.unlink()
    rec = record(cmd, args.name, args.seconds, args.interval, env, args.gc_log)
    rec.rows.sort(key=lambda r: r["ts"])
    opener = gzip.open if args.out.suffix == ".gz" else open
    with opener(args.out, "wt") as out:
        for row in rec.rows:
            out.write(json.dumps(row) + "\n")
    print(f"{args.out}: {len(rec.rows)} samples", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
