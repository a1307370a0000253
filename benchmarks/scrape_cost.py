"""CPU cost of the latency probe on a big `/metrics` page: scrape over HTTP, parse, compute quantiles.

    python benchmarks/scrape_cost.py                 # a 1 MiB exposition, 20 runs of each step
    python benchmarks/scrape_cost.py --size 4MiB --repeat 10

Builds a realistic exposition with prometheus-client (the latency histogram the probe wants, among
many other families) until it reaches `--size`, serves it from a separate process on loopback, and
times, in this process only: the whole probe (`LatencyProbe.collect`: HTTP GET, filtered parse,
interval quantiles), the filtered parse alone, a full parse, and prometheus-client's own parser
for comparison; for the text format and for OpenMetrics. CPU is `time.process_time()`; the
figures quoted in docs/latency.md come from this script.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from agent.core.records import ProbeTarget
from agent.core.units import format_bytes, parse_size
from probes.latency import LatencyProbe
from probes.promtext import parse_exposition

HISTOGRAM = "request_latency_seconds"
SERVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = open(sys.argv[1], "rb").read()
kind = sys.argv[2]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def build_registry(size: int) -> CollectorRegistry:
    """The wanted histogram (4 routes) plus other families until the text exposition reaches `size`."""
    registry = CollectorRegistry()
    latency = Histogram(HISTOGRAM, "Request latency.", ["route"], registry=registry)
    for route in ("/predict", "/embed", "/rank", "/health"):
        for i in range(200):
            latency.labels(route).observe(0.001 * (i % 97))
    family = 0
    while family % 10 or len(generate_latest(registry)) < size:  # measure every 10 families: it is slow
        name = f"model_{family}"
        Gauge(f"{name}_queue_depth", "Queue depth per worker.", ["worker", "model"], registry=registry)
        gauge = registry._names_to_collectors[f"{name}_queue_depth"]
        for worker in range(40):
            gauge.labels(str(worker), f"m{family}").set(worker)
        counter = Counter(f"{name}_batches", "Batches served.", ["worker", "status"], registry=registry)
        for worker in range(40):
            counter.labels(str(worker), "ok").inc(worker)
        hist = Histogram(f"{name}_batch_seconds", "Batch latency.", ["worker"], registry=registry)
        for worker in range(8):
            hist.labels(str(worker)).observe(0.01 * worker)
        family += 1
    return registry


def cpu_ms(fn, repeat: int) -> tuple[float, float]:
    """Median CPU and wall milliseconds of `fn()`."""
    cpu, wall = [], []
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    return statistics.median(cpu), statistics.median(wall)


def serve(body: bytes, content_type: str, directory: Path) -> tuple[subprocess.Popen, str]:
    path = directory / "exposition"
    path.write_bytes(body)
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(path), content_type], stdout=subprocess.PIPE, text=True
    )
    port = int(proc.stdout.readline())
    return proc, f"http://127.0.0.1:{port}/metrics"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="1MiB", help="exposition size to build (default 1MiB)")
    parser.add_argument("--repeat", type=int, default=20, help="runs of each step (default 20)")
    args = parser.parse_args()
    import tempfile

    registry = build_registry(parse_size(args.size))
    formats = [
        ("text 0.0.4", generate_latest(registry), "text/plain; version=0.0.4; charset=utf-8"),
        (
            "OpenMetrics",
            generate_openmetrics(registry),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    ]
    print(f"python {sys.version.split()[0]}, {args.repeat} runs each, median CPU (wall) per run")
    with tempfile.TemporaryDirectory() as tmp:
        for label, body, content_type in formats:
            lines = body.count(b"\n")
            wanted = sum(1 for line in body.split(b"\n") if line.startswith(HISTOGRAM.encode()))
            print(
                f"\n{label}: {format_bytes(len(body))}, {lines} lines, {wanted} of them the wanted histogram"
            )
            proc, url = serve(body, content_type, Path(tmp))
            try:
                probe = LatencyProbe()
                spec = {"url": url, "histogram": HISTOGRAM, "labels": {"route": "/predict"}, "timeout": 10}
                target = ProbeTarget("bench", 1, 1.0, {}, {"latency": {"prometheus": spec}})
                probe.collect(target, time.time())  # baseline and connection set-up
                steps = [
                    (
                        "probe: GET + filtered parse + quantiles",
                        lambda p=probe, t=target: p.collect(t, time.time()),
                    ),
                    (
                        "filtered parse only",
                        lambda b=body, c=content_type: parse_exposition(b, c, families={HISTOGRAM}),
                    ),
                    ("full parse (every family)", lambda b=body, c=content_type: parse_exposition(b, c)),
                ]
                if label.startswith("text"):
                    steps.append(
                        (
                            "prometheus_client parser, full",
                            lambda b=body: list(text_string_to_metric_families(b.decode())),
                        )
                    )
                for name, fn in steps:
                    cpu, wall = cpu_ms(fn, args.repeat)
                    print(
                        f"  {name:<42} {cpu:7.1f} ms CPU ({wall:6.1f} ms wall)  = {cpu / 50:5.2f} % of a core at a 5 s interval"
                    )
            finally:
                proc.kill()
                proc.wait()
                proc.stdout.close()


if __name__ == "__main__":
    main()
