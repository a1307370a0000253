"""Re-record the real-program part of the benchmark corpus (about 10 minutes).

    python -m benchmarks.detection.record_corpus [--seconds 75] [--only NAME]

Builds the C programs (gcc) and the Java program (javac) into a temporary directory, records
each with `record.py` at 0.2 s into `corpus/NAME.jsonl.gz`, and writes `corpus/labels.json`.
A label says whether the program leaks, when it has finished starting (`start_s`, real
seconds: the trace begins there, like an agent attaching to a process that is already serving;
the seconds of loading before would look like growth to any rule), when the leak starts
(`onset_s`), the memory limit it is judged against and the time scale (300: one real second is
five production minutes). For a leaking program the limit is set just above the highest RSS of
the first 75 % of the recording, so the peaks reach it (the OOM) in the last quarter; for the
others it is 30 % above the highest RSS recorded. `--labels-only` rewrites the labels of the
files already recorded.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = HERE / "programs"
CORPUS = HERE / "corpus"
TIME_SCALE = 300.0
JEMALLOC = "libjemalloc.so.2"


@dataclass
class Recording:
    name: str
    leak: bool
    description: str
    cmd: list[str]  # {bin} is the build directory, {py} the interpreter
    env: dict[str, str] = field(default_factory=dict)
    gc_log: bool = False
    start_s: float = 1.0  # loading is over (the JVM takes a few seconds to commit its heap)


RECORDINGS = [
    Recording("c-leak-glibc", True, "C request loop leaking 3 MB/s in 256 B blocks, batch sawtooth, glibc malloc",
              ["{bin}/leak", "61440", "20", "32", "0"]),
    Recording("c-leak-jemalloc", True, "the same C leak under LD_PRELOAD jemalloc, with allocator statistics",
              ["{bin}/leak", "61440", "20", "32", "1"], env={"LD_PRELOAD": JEMALLOC}),
    Recording("c-frag-glibc", False, "C: 1.5 M small objects, 15 of 16 freed, then flat churn (glibc holes)",
              ["{bin}/frag", "frag"]),
    Recording("c-retain-jemalloc", False, "C: 300 MB of 256 KiB buffers freed, jemalloc never purging (dirty_decay_ms:-1)",
              ["{bin}/frag", "retain"], env={"LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "dirty_decay_ms:-1,muzzy_decay_ms:-1"}),
    Recording("java-sawtooth", False, "JVM with 100 MB/s of garbage: GC sawtooth, no leak",
              ["java", "-Xmx384m", "-XX:+UseG1GC", "-Xlog:gc:file={gclog}", "-cp", "{bin}", "GcWorkload", "0"],
              gc_log=True, start_s=5.0),
    Recording("java-leak", True, "JVM with GC sawtooth and a cache that never evicts (1.5 MB/s)",
              ["java", "-Xmx1g", "-XX:+UseG1GC", "-Xlog:gc:file={gclog}", "-cp", "{bin}", "GcWorkload", "1536"],
              gc_log=True, start_s=5.0),
    Recording("py-cache-warmup", False, "Python cache filling as requests arrive, then a plateau",
              ["{py}", "{programs}/cache_warmup.py", "3000", "4"]),
    Recording("py-batch-reload", False, "Python worker: 300 MB batch bursts every 4 s, a model reload step at 40 s",
              ["{py}", "{programs}/batch_bursts.py", "100", "300", "4", "40", "160"]),
]  # fmt: skip


def build(into: Path) -> None:
    for name in ("leak", "frag"):
        subprocess.run(
            ["gcc", "-O2", "-Wall", "-o", str(into / name), str(PROGRAMS / f"{name}.c"), "-ldl"], check=True
        )
    subprocess.run(["javac", "-d", str(into), str(PROGRAMS / "GcWorkload.java")], check=True)


def rss_points(path: Path) -> list[tuple[float, float]]:
    with gzip.open(path, "rt") as lines:
        rows = [json.loads(line) for line in lines]
    return [(r["ts"], r["value"]) for r in rows if r["metric"] == "rss_bytes"]


def label_for(rec: Recording, path: Path) -> dict:
    points = rss_points(path)
    start = points[0][0] + rec.start_s
    points = [(ts, v) for ts, v in points if ts >= start]
    end = points[-1][0]
    if rec.leak:
        cut = start + 0.75 * (end - start)
        limit = max(v for ts, v in points if ts <= cut) * 1.001
    else:
        limit = max(v for _, v in points) * 1.3
    return {
        "name": rec.name,
        "file": path.name,
        "leak": rec.leak,
        "start_s": rec.start_s,
        "onset_s": rec.start_s,
        "limit_bytes": round(limit),
        "time_scale": TIME_SCALE,
        "description": rec.description,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=75.0)
    parser.add_argument("--only", help="record only this one (the others keep their labels)")
    parser.add_argument(
        "--labels-only", action="store_true", help="only rewrite the labels of existing files"
    )
    args = parser.parse_args()
    CORPUS.mkdir(exist_ok=True)
    labels_path = CORPUS / "labels.json"
    labels = {lab["name"]: lab for lab in json.loads(labels_path.read_text())} if labels_path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = Path(tmp)
        if not args.labels_only:
            build(bin_dir)
        for rec in RECORDINGS:
            if args.only and rec.name != args.only:
                continue
            if args.labels_only:
                labels[rec.name] = label_for(rec, CORPUS / f"{rec.name}.jsonl.gz")
                continue
            gclog = bin_dir / f"{rec.name}.gc.log"
            cmd = [
                part.format(bin=bin_dir, py=sys.executable, programs=PROGRAMS, gclog=gclog)
                for part in rec.cmd
            ]
            out = CORPUS / f"{rec.name}.jsonl.gz"
            record_cmd = [sys.executable, "-m", "benchmarks.detection.record", "--name", rec.name, "--out", str(out),
                          "--seconds", str(args.seconds), "--interval", "0.2"]  # fmt: skip
            if rec.gc_log:
                record_cmd += ["--gc-log", str(gclog)]
            for key, value in rec.env.items():
                record_cmd += ["--env", f"{key}={value}"]
            print(f"recording {rec.name} for {args.seconds:.0f} s ...", file=sys.stderr)
            subprocess.run([*record_cmd, "--", *cmd], check=True, cwd=HERE.parents[1])
            labels[rec.name] = label_for(rec, out)
    order = [r.name for r in RECORDINGS]
    labels_path.write_text(
        json.dumps(sorted(labels.values(), key=lambda lab: order.index(lab["name"])), indent=2) + "\n"
    )
    print(f"wrote {labels_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
