"""A small real HTTP server with a real prometheus-client latency histogram, for the latency tests.

    python tests/support/latency_app.py --mode healthy --base 0.01 --load 20
    python tests/support/latency_app.py --mode degrading --base 0.01 --growth 0.05
    python tests/support/latency_app.py --mode slowstart --slow-first 5 --slow 0.3

It listens on a free loopback port and prints `ready <port>`. Each request to `/work` sleeps for
the mode's latency (`?ms=N` forces N ms, `?fail=1` answers 500), observes the time it really
took in `request_latency_seconds{route="/work"}` (a histogram), in `request_duration_seconds`
(a summary, as MLServer keeps it) and in `inference_latency_microseconds` with `inference_requests`
(two counters, as TorchServe keeps them), and counts `requests_total` and `request_errors_total`. `/metrics` serves the exposition (OpenMetrics when asked for), `/observed`
the raw latencies in order (for checking quantiles), `/stats` how many `/work` requests started and the
most ever in progress at once, `/garbage`, `/hang`, `/drip` and `/close` misbehave
the ways a broken target does. `--load R` sends R requests a second to itself over HTTP.

Modes: `healthy` (base latency ± 20 %), `degrading` (base + growth × seconds since start),
`slowstart` (the first `--slow-first` requests take `--slow` seconds, then base). With `--burn`
the latency is spent as CPU time, so that a cgroup CPU quota slows the server down.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import socket
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, Counter, Histogram, Summary, generate_latest
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OM_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

REGISTRY = CollectorRegistry()
LATENCY = Histogram("request_latency_seconds", "Time to answer a request.", ["route"], registry=REGISTRY)
REQUESTS = Counter("requests", "Requests answered.", ["code"], registry=REGISTRY)
ERRORS = Counter("request_errors", "Requests that failed.", registry=REGISTRY)
DURATION = Summary("request_duration_seconds", "Time to answer a request.", ["route"], registry=REGISTRY)
SPENT = Counter("inference_latency_microseconds", "Time spent answering.", ["model"], registry=REGISTRY)
ANSWERED = Counter("inference_requests", "Requests answered.", ["model"], registry=REGISTRY)


class App:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.served = 0
        self.in_progress = 0
        self.max_in_progress = 0  # the most `/work` requests ever handled at once
        self.observed: list[float] = []

    def latency(self) -> float:
        args = self.args
        with self.lock:
            self.served += 1
            nth = self.served
        if args.mode == "degrading":
            return args.base + args.growth * (time.monotonic() - self.started)
        if args.mode == "slowstart" and nth <= args.slow_first:
            return args.slow
        return args.base * random.uniform(0.8, 1.2)


class Handler(BaseHTTPRequestHandler):
    app: App
    protocol_version = "HTTP/1.1"
    wbufsize = 65536  # headers and body leave in one write (no Nagle / delayed-ACK stalls)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/metrics":
            if "application/openmetrics-text" in self.headers.get("Accept", ""):
                self.reply(200, generate_openmetrics(REGISTRY), OM_TYPE)
            else:
                self.reply(200, generate_latest(REGISTRY), "text/plain; version=0.0.4; charset=utf-8")
        elif url.path == "/observed":
            with self.app.lock:
                self.reply(200, json.dumps(self.app.observed).encode())
        elif url.path == "/stats":
            with self.app.lock:
                stats = {
                    "started": len(self.app.observed) + self.app.in_progress,
                    "max_in_progress": self.app.max_in_progress,
                }
            self.reply(200, json.dumps(stats).encode())
        elif url.path == "/garbage":
            self.reply(200, b"<!DOCTYPE html><html><body>Welcome to nginx!</body></html>\n", "text/html")
        elif url.path == "/hang":
            time.sleep(60)
        elif url.path == "/drip":  # a 200 whose body comes a byte every 0.1 s, for ever (a slowloris page)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                for _ in range(600):
                    self.wfile.write(b"#")
                    self.wfile.flush()
                    time.sleep(0.1)
            except OSError:
                pass
        elif url.path == "/close":
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
        else:
            self.work(query)

    do_POST = do_GET

    def work(self, query: dict[str, list[str]]) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        with self.app.lock:
            self.app.in_progress += 1
            self.app.max_in_progress = max(self.app.max_in_progress, self.app.in_progress)
        started = time.perf_counter()
        wanted = float(query["ms"][0]) / 1000 if "ms" in query else self.app.latency()
        if self.app.args.burn:  # CPU work instead of waiting: a CPU quota slows it down
            until = time.thread_time() + wanted
            while time.thread_time() < until:
                pass
        else:
            time.sleep(wanted)
        failed = "fail" in query
        elapsed = time.perf_counter() - started
        LATENCY.labels("/work").observe(elapsed)
        DURATION.labels("/work").observe(elapsed)
        SPENT.labels("ranker").inc(elapsed * 1e6)
        ANSWERED.labels("ranker").inc()
        REQUESTS.labels("500" if failed else "200").inc()
        if failed:
            ERRORS.inc()
        with self.app.lock:
            self.app.observed.append(elapsed)
            self.app.in_progress -= 1
        self.reply(500 if failed else 200, json.dumps({"latency": elapsed, "echo": len(body)}).encode())


def load(port: int, rate: float) -> None:
    """Send `rate` requests a second to this server's `/work`, one at a time, over real HTTP."""
    url = f"http://127.0.0.1:{port}/work"
    while True:
        started = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                response.read()
        except OSError:
            pass
        time.sleep(max(0.0, 1.0 / rate - (time.monotonic() - started)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["healthy", "degrading", "slowstart"], default="healthy")
    parser.add_argument("--base", type=float, default=0.01, help="base latency, seconds")
    parser.add_argument("--growth", type=float, default=0.02, help="degrading: seconds added per second")
    parser.add_argument("--slow-first", type=int, default=5)
    parser.add_argument("--slow", type=float, default=0.3)
    parser.add_argument("--load", type=float, default=0.0, help="requests a second sent to itself")
    parser.add_argument(
        "--burn", action="store_true", help="spend the latency as CPU time instead of sleeping"
    )
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    Handler.app = App(args)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    if args.load > 0:
        threading.Thread(target=load, args=(port, args.load), daemon=True).start()
    print(f"ready {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()


# ------------------------------------------------------------------------------- for the tests
class RunningApp:
    """A started `latency_app` process: its port and helpers to reach it."""

    def __init__(self, proc, port: int) -> None:
        self.proc = proc
        self.port = port

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def observed(self) -> list[float]:
        with urllib.request.urlopen(self.url("/observed"), timeout=5) as response:
            return json.loads(response.read())

    def stats(self) -> dict:
        with urllib.request.urlopen(self.url("/stats"), timeout=5) as response:
            return json.loads(response.read())


def start_app(spawn, *args: str) -> RunningApp:
    """Start the app with `spawn` (the conftest fixture, which reaps it) and wait for its port."""
    import subprocess
    from pathlib import Path

    from support.procs import wait_ready  # not at the top: this file also runs as a script

    proc = spawn([sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE, text=True)
    return RunningApp(proc, int(wait_ready(proc)[1]))
