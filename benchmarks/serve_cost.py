"""medic beside prometheus-process-exporter over the same real processes: CPU, memory, /metrics, the API.

    apt-get install prometheus-process-exporter        # Debian's package; scripts/install-system-deps.sh
    python -m benchmarks.serve_cost                     # 50, then 200 processes
    python -m benchmarks.serve_cost --processes 50 --seconds 30s --repeat 3 --json
    python -m benchmarks.serve_cost --page-cost         # one /metrics page's CPU, against the library's

For each count it starts N `agent.demo.workload stable` processes, then medic (`medic run`, a 1 s
interval, each process an instance by pid) and process-exporter (each process a group of its own,
`{{.Comm}}-{{.PID}}`, the package's other defaults: smaps and threads gathered) watching the same
processes at the same time, and measures phase by phase:

1. unscraped, `--seconds`: CPU of each (process-exporter reads /proc only when scraped);
2. scraped every second as Prometheus scrapes (OpenMetrics, gzip), both in the same loop,
   `--seconds`: CPU, RSS, series on the page, its size, the scrape's wall time;
3. the API, `--api-seconds` each: 20 clients on keep-alive connections, accepting gzip as browsers
   and httpx do, ask `/healthz`, then `/api/v1/instances` (the whole list), then the same sending
   its ETag back; requests/s, p99, size on the wire; medic's RSS after it.

CPU is utime + stime from /proc/PID/stat over the phase; RSS is VmRSS sampled once a second. The
machine's load average is printed with each run: on a shared machine only ratios measured in the
same run mean much. Targets: medic's CPU ≤ 0.5 × process-exporter's, both scraped every second;
RSS ≤ 48 MiB at 50 instances (scraped), ≤ 64 MiB at 200 after the API load; `/api/v1/instances`
≥ 0.5 × the requests/s of `/healthz`.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from agent.core.units import parse_duration
from benchmarks.probe_cost import start_workloads, stop_workloads
from probes.linux.procfs import read_stat
from probes.linux.procstatus import read_status

REPO = Path(__file__).resolve().parent.parent
EXPORTER = "prometheus-process-exporter"
ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
CLIENTS = 20
GZIP = b"Accept-Encoding: gzip\r\n"  # as browsers and httpx (medic's CLI) send it
CPU_RATIO_TARGET = 0.5
RSS_TARGETS_MIB = {50: 48.0, 200: 64.0}  # 50: scraped, steady; 200: after the API load
API_RATIO_TARGET = 0.5


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_medic(procs: list[subprocess.Popen], workdir: Path) -> tuple[subprocess.Popen, str]:
    config = {
        "agent": {"listen": "127.0.0.1:0", "state_dir": str(workdir / "state"), "interval": 1.0},
        "instances": [{"name": f"w{i}", "match": {"pid": p.pid}} for i, p in enumerate(procs)],
    }
    (workdir / "medic.yaml").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "agent.cli.main", "run", "-c", str(workdir / "medic.yaml")]
    agent = subprocess.Popen([*argv, "--log-level", "warning"], env={**os.environ, "PYTHONPATH": str(REPO)})
    info = workdir / "state" / "agent.json"
    while not info.exists():
        if agent.poll() is not None:
            raise RuntimeError(f"medic exited with {agent.returncode}")
        time.sleep(0.1)
    return agent, json.loads(info.read_text())["url"]


def start_exporter(procs: list[subprocess.Popen], size: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which(EXPORTER)
    if binary is None:
        raise SystemExit(f"{EXPORTER} is not installed: apt-get install {EXPORTER}")
    pids = "|".join(str(p.pid) for p in procs)
    # one group per process, as medic has one instance per process; only this run's processes (their
    # size is this run's own: other workloads on a shared machine run the same module)
    matcher = rf"agent\.demo\.workload stable --size {size}$"
    (workdir / "exporter.yml").write_text(
        json.dumps({"process_names": [{"name": "{{.Comm}}-{{.PID}}", "cmdline": [matcher]}]})
    )
    port = free_port()
    exporter = subprocess.Popen(
        [binary, "-config.path", str(workdir / "exporter.yml"), "-web.listen-address", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/metrics", timeout=5).status_code == 200:
                return exporter, url
        except httpx.TransportError:
            time.sleep(0.2)
    exporter.kill()
    raise RuntimeError(f"{EXPORTER} did not answer within 30 s (pids {pids[:60]}…)")


def cpu_seconds(pid: int) -> float:
    return read_stat(pid).cpu_seconds


def rss_mib(pid: int) -> float:
    return (read_status(pid).rss_bytes or 0) / 2**20


def page_facts(body: bytes) -> tuple[int, int]:
    """(series, bytes) of an uncompressed page."""
    lines = body.decode().splitlines()
    return sum(1 for line in lines if line and not line.startswith("#")), len(body)


def phase(pids: dict[str, int], seconds: float, scrape: dict[str, str] | None) -> dict[str, Any]:
    """CPU and RSS of each process over `seconds`, scraping each URL of `scrape` once a second."""
    start = {name: cpu_seconds(pid) for name, pid in pids.items()}
    rss: dict[str, list[float]] = {name: [] for name in pids}
    walls: dict[str, list[float]] = {name: [] for name in scrape or {}}
    zipped: dict[str, int] = {}
    began = time.monotonic()
    with httpx.Client(timeout=30) as client:
        tick = began
        while time.monotonic() - began < seconds:
            for name, url in (scrape or {}).items():
                t0 = time.perf_counter()
                with client.stream(
                    "GET", f"{url}/metrics", headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"}
                ) as answer:
                    raw = b"".join(answer.iter_raw())
                walls[name].append(time.perf_counter() - t0)
                zipped[name] = len(raw)
            for name, pid in pids.items():
                rss[name].append(rss_mib(pid))
            tick += 1.0
            time.sleep(max(0.0, tick - time.monotonic()))
    elapsed = time.monotonic() - began
    out: dict[str, Any] = {}
    for name, pid in pids.items():
        out[name] = {
            "cpu_percent": 100.0 * (cpu_seconds(pid) - start[name]) / elapsed,
            "rss_median_mib": statistics.median(rss[name]),
            "rss_max_mib": max(rss[name]),
        }
        if scrape and name in scrape:
            out[name]["scrape_ms_median"] = 1000 * statistics.median(walls[name])
            out[name]["scrape_ms_max"] = 1000 * max(walls[name])
            out[name]["page_gzip_bytes"] = zipped[name]
    return out


async def _client(port: int, path: str, etag: bool, deadline: float, seen: dict[str, Any]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    tag = b""
    try:
        while time.monotonic() < deadline:
            extra = b"If-None-Match: " + tag + b"\r\n" if tag else b""
            request = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n" + GZIP + extra + b"\r\n"
            t0 = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                key, _, value = line.partition(b":")
                if key.lower() == b"content-length":
                    length = int(value)
                elif key.lower() == b"etag" and etag:
                    tag = value.strip()
            body = await reader.readexactly(length) if length else b""
            seen["latencies"].append(time.perf_counter() - t0)
            seen["statuses"][status] = seen["statuses"].get(status, 0) + 1
            if status == 200:
                seen["bytes"] = len(body)
    finally:
        writer.close()


def api_load(url: str, path: str, seconds: float, etag: bool = False) -> dict[str, Any]:
    """Requests/s and latencies of CLIENTS clients asking `path` back to back for `seconds`."""
    port = int(url.rsplit(":", 1)[1])
    seen: dict[str, Any] = {"latencies": [], "statuses": {}, "bytes": 0}

    async def run() -> None:
        deadline = time.monotonic() + seconds
        await asyncio.gather(*(_client(port, path, etag, deadline, seen) for _ in range(CLIENTS)))

    began = time.monotonic()
    asyncio.run(run())
    elapsed = time.monotonic() - began
    latencies = sorted(seen["latencies"])
    return {
        "path": path,
        "etag": etag,
        "requests_per_second": len(latencies) / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))],
        "statuses": seen["statuses"],
        "body_bytes": seen["bytes"],
    }


def run_once(count: int, seconds: float, api_seconds: float, warmup: float) -> dict[str, Any]:
    size = f"{4096 + os.getpid() % 1024}Ki"  # about 4 MiB, and this run's own (start_exporter)
    procs = start_workloads(count, size)
    workdir = Path(tempfile.mkdtemp(prefix="medic-serve-"))
    medic = exporter = None
    try:
        medic, medic_url = start_medic(procs, workdir)
        exporter, exporter_url = start_exporter(procs, size, workdir)
        time.sleep(warmup)  # start-up and the first slow probes are not the steady state
        pids = {"medic": medic.pid, "process-exporter": exporter.pid}
        urls = {"medic": medic_url, "process-exporter": exporter_url}
        load = os.getloadavg()[0]
        unscraped = phase(pids, seconds, None)
        scraped = phase(pids, seconds, urls)
        pages = {}
        for name, url in urls.items():
            body = httpx.get(f"{url}/metrics", headers={"Accept": ACCEPT}, timeout=30).content
            series, size = page_facts(body)
            pages[name] = {"series": series, "bytes": size, "gzip_bytes": len(gzip.compress(body))}
        api = [
            api_load(medic_url, "/healthz", api_seconds),
            api_load(medic_url, "/api/v1/instances", api_seconds),
            api_load(medic_url, "/api/v1/instances", api_seconds, etag=True),
        ]
        return {
            "processes": count,
            "load_average": load,
            "unscraped": unscraped,
            "scraped": scraped,
            "pages": pages,
            "api": api,
            "medic_rss_after_api_mib": rss_mib(medic.pid),
        }
    finally:
        for proc in (medic, exporter):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
        stop_workloads(procs)
        shutil.rmtree(workdir, ignore_errors=True)


def page_cost(count: int, repeat: int = 15) -> dict[str, Any]:
    """CPU ms of one `/metrics` page (OpenMetrics, gzip) of `count` instances after a probe tick, in
    this process: built as the agent builds it (agent/api/exposition.py), and by prometheus_client's
    own encoder for the same registry, as every scrape did before; medians of `repeat`."""
    from prometheus_client import disable_created_metrics
    from prometheus_client.exposition import choose_encoder

    from agent.api.exposition import PageEncoder
    from agent.api.metrics import Telemetry
    from agent.config.loader import validate_config
    from agent.state.eventlog import EventLog
    from agent.state.store import Store
    from agent.watch.collector import Collector
    from agent.watch.tracker import Tracker
    from probes.registry import PROBES, create_probe

    procs = start_workloads(count)
    workdir = Path(tempfile.mkdtemp(prefix="medic-page-"))
    try:
        disable_created_metrics()
        specs = [{"name": f"w{i}", "match": {"pid": p.pid}} for i, p in enumerate(procs)]
        store = Store(workdir / "state")
        events = EventLog(store)
        tracker = Tracker(validate_config({"instances": specs}).instances, store, events)
        telemetry = Telemetry(tracker)
        probes = [create_probe(name) for name, entry in PROBES.items() if entry.default_enabled]
        collector = Collector(tracker, store, events, probes, telemetry.observe_probe)
        tracker.reconcile(time.time(), scan=True)
        for schedule in ("fast", "slow", "fast"):
            collector.run(schedule)  # type: ignore[arg-type]
    finally:
        stop_workloads(procs)
    encoder, _ = choose_encoder(ACCEPT)
    page = PageEncoder(encoder)

    def library() -> bytes:
        return gzip.compress(encoder(telemetry.registry))

    out: dict[str, Any] = {"instances": count}
    for label, build in (
        ("page_ms", lambda: page.page(telemetry.registry.collect(), True)),
        ("library_ms", library),
    ):
        build()
        costs = []
        for _ in range(repeat):
            began = time.process_time()
            build()
            costs.append(1000 * (time.process_time() - began))
        out[label] = statistics.median(costs)
    store.close()
    shutil.rmtree(workdir, ignore_errors=True)
    return out


def report(run: dict[str, Any]) -> str:
    medic, peer = run["scraped"]["medic"], run["scraped"]["process-exporter"]
    cpu_ratio = medic["cpu_percent"] / peer["cpu_percent"] if peer["cpu_percent"] else float("inf")
    healthz, instances, etag = run["api"]
    api_ratio = instances["requests_per_second"] / healthz["requests_per_second"]
    rss_target = RSS_TARGETS_MIB.get(run["processes"])

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    rows = [
        (
            "CPU unscraped, % of a core",
            run["unscraped"]["medic"]["cpu_percent"],
            run["unscraped"]["process-exporter"]["cpu_percent"],
            "",
        ),
        (
            "CPU scraped every 1 s, % of a core",
            medic["cpu_percent"],
            peer["cpu_percent"],
            f"ratio {cpu_ratio:.2f} (≤ {CPU_RATIO_TARGET}: {verdict(cpu_ratio <= CPU_RATIO_TARGET)})",
        ),
        (
            "RSS scraped, median MiB",
            medic["rss_median_mib"],
            peer["rss_median_mib"],
            f"≤ {rss_target:.0f} at 50: {verdict(medic['rss_median_mib'] <= rss_target)}"
            if run["processes"] == 50 and rss_target
            else "",
        ),
        (
            "series on the page",
            run["pages"]["medic"]["series"],
            run["pages"]["process-exporter"]["series"],
            "",
        ),
        (
            "page KiB (gzip KiB)",
            f"{run['pages']['medic']['bytes'] / 1024:.0f} ({run['pages']['medic']['gzip_bytes'] / 1024:.0f})",
            f"{run['pages']['process-exporter']['bytes'] / 1024:.0f} ({run['pages']['process-exporter']['gzip_bytes'] / 1024:.0f})",
            "",
        ),
        (
            "scrape wall time, median (max) ms",
            f"{medic['scrape_ms_median']:.1f} ({medic['scrape_ms_max']:.0f})",
            f"{peer['scrape_ms_median']:.1f} ({peer['scrape_ms_max']:.0f})",
            "",
        ),
        (
            "/healthz req/s (p99 ms)",
            f"{healthz['requests_per_second']:.0f} ({healthz['p99_ms']:.0f})",
            "",
            "the floor",
        ),
        (
            f"/api/v1/instances req/s (p99 ms), {instances['body_bytes'] / 1024:.0f} KiB gzip",
            f"{instances['requests_per_second']:.0f} ({instances['p99_ms']:.0f})",
            "",
            f"{api_ratio:.2f} of /healthz (≥ {API_RATIO_TARGET}: {verdict(api_ratio >= API_RATIO_TARGET)})",
        ),
        (
            "  the same, ETag sent back: req/s (p99 ms)",
            f"{etag['requests_per_second']:.0f} ({etag['p99_ms']:.0f})",
            "",
            f"{etag['statuses'].get(304, 0)} of {sum(etag['statuses'].values())} answered 304",
        ),
        (
            "medic RSS after the API load, MiB",
            run["medic_rss_after_api_mib"],
            "",
            f"≤ {rss_target:.0f} at 200: {verdict(run['medic_rss_after_api_mib'] <= rss_target)}"
            if run["processes"] == 200 and rss_target
            else "",
        ),
    ]
    lines = [
        f"{run['processes']} processes, 1 s interval, medic and {EXPORTER} on the same processes at the same "
        f"time (load average {run['load_average']:.1f})",
        f"  {'figure':<44} {'medic':>16} {'process-exporter':>18}  target",
    ]
    for label, ours, theirs, target in rows:
        ours = f"{ours:.1f}" if isinstance(ours, float) else str(ours)
        theirs = f"{theirs:.1f}" if isinstance(theirs, float) else str(theirs)
        lines.append(f"  {label:<44} {ours:>16} {theirs:>18}  {target}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.serve_cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--processes", type=int, action="append", help="processes to watch (default 50 and 200)"
    )
    parser.add_argument(
        "--seconds", default="30s", help="length of the unscraped and scraped phases (default 30s)"
    )
    parser.add_argument("--api-seconds", default="10s", help="length of each API load (default 10s)")
    parser.add_argument("--warmup", default="15s", help="start-up not measured (default 15s)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each count (default 1)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--page-cost", action="store_true", help="only the CPU of one /metrics page, against the library's"
    )
    args = parser.parse_args(argv)
    if args.page_cost:
        costs = [page_cost(count) for count in args.processes or [50, 200]]
        for cost in costs if not args.json else []:
            print(
                f"{cost['instances']} instances, one /metrics page (OpenMetrics, gzip), CPU: "
                f"{cost['page_ms']:.1f} ms; prometheus_client's encoder for the same registry "
                f"{cost['library_ms']:.1f} ms"
            )
        if args.json:
            print(json.dumps(costs, indent=2))
        return 0
    runs = []
    for count in args.processes or [50, 200]:
        for _ in range(args.repeat):
            run = run_once(
                count,
                parse_duration(args.seconds),
                parse_duration(args.api_seconds),
                parse_duration(args.warmup),
            )
            runs.append(run)
            if not args.json:
                print(report(run), end="\n\n", flush=True)
    if args.json:
        print(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
