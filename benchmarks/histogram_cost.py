"""What histograms and heap profiles cost: one `jcmd` class histogram of a JVM holding 1M live objects,
parsing plus symbolizing a 10 MB heap profile, and the Python hook's type walk and allocation sites on
large Python heaps.

    python benchmarks/histogram_cost.py [--objects 1000000] [--profile-mb 10] [--repeat 5] [--json]
    python benchmarks/histogram_cost.py --only python [--python-objects 3000000,277000]

JVM part (needs a JDK): a program compiled here with javac keeps `--objects` small objects of four classes
live in a heap of `--heap`, plus churning garbage. Measured per run: wall time and CPU time of the jcmd
process (itself a JVM), for `GC.class_histogram -all`, the live `GC.class_histogram` (with the full-GC
pause the target logs with -Xlog:gc), the jvm probe's own run (heap_info + NMT + `-all` histogram in
one `jcmd -f`, parsed, and the heap's resident pages), and that read of smaps alone. Profile part (needs cc): a program with 2000 functions is started, its real memory
map and function addresses make a jemalloc heap_v2 dump of `--profile-mb` MB with 8-24-frame
backtraces; measured: parse, and parse + symbolize + aggregate by site with a cold and a warm symbol cache.

Python part: a child process builds a heap of `--python-objects` GC-tracked objects (instances with a
list each, dicts of records; below a million objects it also imports numpy, onnxruntime, FastAPI and
pydantic, for the modules and classes of a TensorFlow-sized serving process), plus a module-level
dict of 20,000 responses (`int -> bytes`, untracked), then times in the child, as the hook is timed
(CPU time of the walking thread): `gc.get_objects()`, the hook's walk at the default budget (1 s:
sampled past what fits), the whole walk (budget 10 s), and, while a tracemalloc session traces 200,000
new live allocations, the walk again and one `sites` snapshot with its holders.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from native_hooks.heapprofile import parse_heap_profile
from native_hooks.heapsites import allocation_sites
from native_hooks.symbolize import Symbolizer
from probes.linux.maps import read_maps

JAVA = r"""
import java.util.*;
public class LiveObjects {
    static final class Order { long id; double price; Order(long id) { this.id = id; } }
    static final class Item { int sku; Order order; Item(int s, Order o) { sku = s; order = o; } }
    static final class Tag { String name; Tag(String n) { name = n; } }
    static final class Point { int x, y; }
    static final List<Object> LIVE = new ArrayList<>();
    public static void main(String[] args) throws Exception {
        int n = Integer.parseInt(args[0]);
        String[] names = {"a", "b", "c", "d"};
        for (int i = 0; i < n; i++) {
            switch (i % 4) {
                case 0: LIVE.add(new Order(i)); break;
                case 1: LIVE.add(new Item(i, null)); break;
                case 2: LIVE.add(new Tag(names[i % 4])); break;
                default: LIVE.add(new Point());
            }
        }
        System.out.println("ready " + ProcessHandle.current().pid());
        System.out.flush();
        while (true) Thread.sleep(1000);  // idle: the target's CPU below is the histogram's
    }
}
"""

C_FUNCTIONS = 2000
PYTHON_HEAP = r"""
import gc, json, os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
objects, repeat, libraries = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
if libraries:
    import fastapi, numpy, onnxruntime, pydantic  # the modules and classes of a serving stack
from medic_hook import histogram, sites

class Record:
    def __init__(self, i):
        self.id, self.tags = i, [i]

RESPONSES = {i: os.urandom(256) for i in range(20_000)}  # untracked: found from the module's globals
HEAP = []
while (missing := objects - len(gc.get_objects())) > 0:
    HEAP += [Record(i) for i in range(min(100_000, missing // 4 + 1))]  # an instance and its list each
    HEAP += [{"a": i, "b": [i]} for i in range(min(50_000, missing // 8 + 1))]
gc.collect()

def cpu(call, times=None):
    spent, result = [], None
    for _ in range(times or repeat):
        started = time.thread_time()
        result = call()
        spent.append(time.thread_time() - started)
    return statistics.median(spent), result

def walk(times=None, **params):
    seconds, reply = cpu(lambda: histogram.type_histogram(top=50, **params), times)
    keep = ("walked", "sample_fraction", "contents_complete", "elapsed_s")
    return {"cpu_s": seconds, **{k: reply[k] for k in keep}}

out = {"gc_objects": len(gc.get_objects()), "modules": len(sys.modules)}
out["get_objects_s"] = cpu(lambda: len(gc.get_objects()))[0]
out["walk_default"] = walk(wall_s=5.0)  # what the probe allows at the default budget
out["walk_whole"] = walk(times=1 if objects > 500_000 else None, budget_s=10, wall_s=60)
sites.start(5, 3600, 256 * 2**20)
LATER = [Record(i) for i in range(100_000)]  # 200,000 traced live allocations
out["walk_tracing"] = walk(wall_s=5.0)
seconds, reply = cpu(lambda: sites.snapshot(50))
out["sites_snapshot"] = {
    "cpu_s": seconds, "tracemalloc_bytes": reply["tracemalloc_bytes"], "holders": len(reply["holders"])
}
out["sites_without_holders_s"] = cpu(lambda: sites.snapshot(50, holders=False))[0]
sites.stop()
print(json.dumps(out))
"""


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _target_cpu(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(argv: list[str], pid: int) -> tuple[float, float, float, str]:
    """Wall time, jcmd's CPU time and the target's CPU time of one command."""
    cpu, target, wall = _child_cpu(), _target_cpu(pid), time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    return time.perf_counter() - wall, _child_cpu() - cpu, _target_cpu(pid) - target, out


def _median(values: list[float]) -> float:
    return statistics.median(values)


def bench_jvm(objects: int, heap: str, repeat: int, work: Path) -> dict:
    from agent.core.records import ProbeTarget
    from probes.jvm import JvmProbe
    from probes.jvmtext import parse_class_histogram

    (work / "LiveObjects.java").write_text(JAVA)
    subprocess.run(["javac", "-d", str(work), str(work / "LiveObjects.java")], check=True, timeout=300)
    gc_log = work / "gc.log"
    argv = [
        "java",
        f"-Xmx{heap}",
        "-XX:+UseG1GC",
        "-XX:NativeMemoryTracking=summary",
        f"-Xlog:gc:file={gc_log}",
        "-cp",
        str(work),
        "LiveObjects",
        str(objects),
    ]
    jvm = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(jvm.stdout.readline().split()[1])  # type: ignore[union-attr]
        results: dict[str, dict] = {}
        all_runs, live_runs, probe_runs, parse_runs = [], [], [], []
        histogram_rows = total = 0
        for _ in range(repeat):
            wall, cpu, target_cpu, out = _timed(["jcmd", str(pid), "GC.class_histogram", "-all"], pid)
            all_runs.append((wall, cpu, target_cpu))
            started = time.perf_counter()
            parsed = parse_class_histogram(out)
            parse_runs.append(time.perf_counter() - started)
            histogram_rows, total = len(parsed.rows), parsed.total_instances
        for _ in range(repeat):
            wall, cpu, target_cpu, _out = _timed(["jcmd", str(pid), "GC.class_histogram"], pid)
            live_runs.append((wall, cpu, target_cpu))
        pauses = [
            float(m) for m in re.findall(r"Heap Inspection Initiated GC\) .*? ([\d.]+)ms", gc_log.read_text())
        ]
        probe = JvmProbe()
        target = ProbeTarget(
            "bench", pid, 1.0, {}, {"histograms": {"jvm": {"interval": 1.0, "heap_interval": 1.0}}}
        )
        for i in range(repeat):
            cpu, target_cpu, wall = _child_cpu(), _target_cpu(pid), time.perf_counter()
            result = probe.collect(target, time.time() + 2.0 * (i + 1))
            probe_runs.append((time.perf_counter() - wall, _child_cpu() - cpu, _target_cpu(pid) - target_cpu))
            assert not result.problems, result.problems
        results["class_histogram_all"] = _pair(all_runs)
        results["class_histogram_live"] = {
            **_pair(live_runs),
            "full_gc_pause_ms": _median(pauses) if pauses else None,
        }
        results["probe_run"] = _pair(probe_runs)
        results["heap_resident_ms"] = _heap_resident_ms(pid, repeat)
        results["parse_histogram_ms"] = 1000 * _median(parse_runs)
        results["histogram"] = {"classes": histogram_rows, "objects": total}
        return results
    finally:
        jvm.kill()
        jvm.wait()


def _heap_resident_ms(pid: int, repeat: int) -> float:
    """The jvm probe's read of the heap's resident pages: smaps of the range `GC.heap_info` names."""
    from probes.jvmtext import parse_heap_info
    from probes.linux.maps import resident_within

    span = parse_heap_info(
        subprocess.run(["jcmd", str(pid), "GC.heap_info"], capture_output=True, text=True).stdout
    ).span
    assert span is not None
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        resident_within(pid, *span)
        runs.append(time.perf_counter() - started)
    return 1000 * _median(runs)


def _pair(runs: list[tuple[float, float, float]]) -> dict:
    return {
        "wall_ms": 1000 * _median([r[0] for r in runs]),
        "cpu_ms": 1000 * _median([r[1] for r in runs]),
        "target_cpu_ms": 1000 * _median([r[2] for r in runs]),
    }


def bench_profile(megabytes: float, repeat: int, work: Path) -> dict:
    source = work / "many.c"
    body = ["#include <stdio.h>", "#include <unistd.h>", "#include <stdlib.h>"]
    body += [
        f"__attribute__((noinline)) void f{i}(void) {{ void *volatile p = malloc({i + 1}); free(p); }}"
        for i in range(C_FUNCTIONS)
    ]
    table = ", ".join(f"(void *)f{i}" for i in range(C_FUNCTIONS))
    body += [
        f"void *table[] = {{{table}}};",
        'int main(void) { printf("ready %d\\n", getpid()); for (int i = 0; i < '
        f'{C_FUNCTIONS}; i++) printf("%p\\n", table[i]); fflush(stdout); pause(); return 0; }}',
    ]
    source.write_text("\n".join(body) + "\n")
    binary = work / "many"
    subprocess.run(["cc", "-O1", "-o", str(binary), str(source)], check=True, timeout=300)
    proc = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline().split()[1])  # type: ignore[union-attr]
        functions = [int(proc.stdout.readline(), 16) for _ in range(C_FUNCTIONS)]  # type: ignore[union-attr]
        maps = read_maps(pid)
        maps_text = Path(f"/proc/{pid}/maps").read_text()
    finally:
        proc.kill()
        proc.wait()
    rng = random.Random(42)
    lines = ["heap_v2/524288", "  t*: 0: 0 [0: 0]", "  t0: 0: 0 [0: 0]"]
    size, stacks = 0, 0
    while size < megabytes * 1e6:
        frames = [rng.choice(functions) + rng.randrange(1, 16) for _ in range(rng.randrange(8, 25))]
        n = rng.randrange(1, 1000)
        record = [
            "@ " + " ".join(f"0x{f:x}" for f in frames),
            f"  t*: {n}: {n * 4096} [0: 0]",
            f"  t0: {n}: {n * 4096} [0: 0]",
        ]
        size += sum(len(line) + 1 for line in record)
        lines += record
        stacks += 1
    text = "\n".join(lines) + "\n\nMAPPED_LIBRARIES:\n" + maps_text
    parse, cold, warm = [], [], []
    for _ in range(repeat):
        started = time.perf_counter()
        profile = parse_heap_profile(text, "bench.heap")
        parse.append(time.perf_counter() - started)
        started = time.perf_counter()
        symbolizer = Symbolizer()
        sites = allocation_sites(parse_heap_profile(text, "bench.heap"), symbolizer, 1, maps)
        cold.append(time.perf_counter() - started)
        started = time.perf_counter()
        allocation_sites(parse_heap_profile(text, "bench.heap"), symbolizer, 1, maps)
        warm.append(time.perf_counter() - started)
    distinct = len({f for s in profile.stacks for f in s.frames})
    assert sites and sites[0].name.startswith("f"), sites[:1]
    return {
        "bytes": len(text),
        "stacks": stacks,
        "distinct_addresses": distinct,
        "sites": len(sites),
        "parse_ms": 1000 * _median(parse),
        "parse_symbolize_cold_ms": 1000 * _median(cold),
        "parse_symbolize_warm_ms": 1000 * _median(warm),
    }


def bench_python(objects: int, repeat: int) -> dict:
    """The Python hook's costs on a heap of `objects` GC-tracked objects, measured in a child."""
    libraries = "1" if objects < 1_000_000 else "0"
    argv = [sys.executable, "-c", PYTHON_HEAP, str(Path(__file__).resolve().parent.parent)]
    done = subprocess.run(
        [*argv, str(objects), str(repeat), libraries], capture_output=True, text=True, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_python(runs: dict, repeat: int) -> None:
    for figures in runs.values():
        print(
            f"Python heap of {figures['gc_objects']:,} GC objects ({figures['modules']} modules), "
            f"median CPU of {repeat}:"
        )
        print(f"  {'gc.get_objects()':<38} {1000 * figures['get_objects_s']:7.0f} ms")
        for key, label in (
            ("walk_default", "walk, budget 1 s (the default)"),
            ("walk_whole", "walk whole (budget 10 s)"),
            ("walk_tracing", "walk, budget 1 s, while tracing"),
        ):
            row = figures[key]
            print(
                f"  {label:<38} {1000 * row['cpu_s']:7.0f} ms  walked {row['walked']:,} "
                f"({100 * row['sample_fraction']:.0f} %), wall {1000 * row['elapsed_s']:.0f} ms"
                + ("" if row["contents_complete"] else ", contents cut short")
            )
        snap = figures["sites_snapshot"]
        print(
            f"  {'sites snapshot + holders':<38} {1000 * snap['cpu_s']:7.0f} ms  "
            f"({snap['tracemalloc_bytes'] / 2**20:.1f} MiB of tracemalloc tables, {snap['holders']} holders; "
            f"without holders {1000 * figures['sites_without_holders_s']:.0f} ms)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--heap", default="512m")
    parser.add_argument("--profile-mb", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--skip-jvm", action="store_true")
    parser.add_argument("--only", choices=["jvm", "profile", "python"], help="one part only")
    parser.add_argument(
        "--python-objects",
        default="3000000,277000",
        help="GC-tracked objects of each Python heap (comma-separated)",
    )
    args = parser.parse_args(argv)
    out: dict = {"cores": os.cpu_count(), "python": sys.version.split()[0]}
    wanted = {args.only} if args.only else {"jvm", "profile", "python"}
    with tempfile.TemporaryDirectory(prefix="medic-bench-") as tmp:
        work = Path(tmp)
        if "jvm" in wanted and not args.skip_jvm and shutil.which("javac") and shutil.which("jcmd"):
            out["jvm"] = bench_jvm(args.objects, args.heap, args.repeat, work)
        if "profile" in wanted:
            out["profile"] = bench_profile(args.profile_mb, args.repeat, work)
    if "python" in wanted:
        sizes = [int(n) for n in args.python_objects.split(",") if n]
        out["python_heaps"] = {str(n): bench_python(n, args.repeat) for n in sizes}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    if "python_heaps" in out:
        print_python(out["python_heaps"], args.repeat)
    if "jvm" in out:
        jvm = out["jvm"]
        print(
            f"JVM with {args.objects:,} live objects ({jvm['histogram']['objects']:,} counted, "
            f"{jvm['histogram']['classes']} classes), median of {args.repeat}:"
        )
        for key, label in (
            ("class_histogram_all", "jcmd GC.class_histogram -all"),
            ("class_histogram_live", "jcmd GC.class_histogram (live)"),
            ("probe_run", "jvm probe run (heap_info+NMT+-all)"),
        ):
            row = jvm[key]
            extra = f", full GC pause {row['full_gc_pause_ms']:.1f} ms" if row.get("full_gc_pause_ms") else ""
            print(
                f"  {label:<38} wall {row['wall_ms']:6.0f} ms  jcmd CPU {row['cpu_ms']:5.0f} ms  "
                f"JVM CPU {row['target_cpu_ms']:4.0f} ms{extra}"
            )
        print(f"  {'parse the histogram':<38} {jvm['parse_histogram_ms']:7.2f} ms")
        print(f"  {'the heap resident pages (smaps)':<38} {jvm['heap_resident_ms']:7.2f} ms")
    if "profile" not in out:
        return 0
    prof = out["profile"]
    print(
        f"heap profile of {prof['bytes'] / 1e6:.1f} MB ({prof['stacks']:,} backtraces, "
        f"{prof['distinct_addresses']:,} "
        f"addresses, {prof['sites']} sites), median of {args.repeat}:"
    )
    print(f"  {'parse':<38} {prof['parse_ms']:7.0f} ms")
    print(f"  {'parse + symbolize + sites (cold)':<38} {prof['parse_symbolize_cold_ms']:7.0f} ms")
    print(f"  {'parse + symbolize + sites (warm cache)':<38} {prof['parse_symbolize_warm_ms']:7.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
