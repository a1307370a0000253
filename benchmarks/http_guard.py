"""What hostile HTTP clients cost a running agent: a huge unauthenticated body, and half-open connections.

    python -m benchmarks.http_guard                     # 200 MiB bodies, 300 half-open connections
    python -m benchmarks.http_guard --body-mib 500 --connections 600 --json

Starts a real `medic run` on loopback (one watched `sleep`, `agent.http.header_timeout` 1 s), then:

1. sends `--body-mib` MiB without a token to `POST /api/v1/pause`, chunked and with Content-Length,
   and prints the agent's peak RSS growth (sampled every 20 ms) and how many bytes it accepted
   before it answered 401 and closed;
2. opens `--connections` connections that send a request line and never finish their headers,
   and prints how long until the agent has closed them all, and how long `/healthz` then takes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent


def start_agent(workdir: Path, header_timeout: str) -> tuple[subprocess.Popen, subprocess.Popen, str]:
    target = subprocess.Popen(["sleep", "3600"])
    state = workdir / "state"
    config = {
        "agent": {
            "listen": "127.0.0.1:0",
            "state_dir": str(state),
            "http": {"header_timeout": header_timeout},
        },
        "instances": [{"name": "svc", "match": {"pid": target.pid}}],
    }
    path = workdir / "medic.yaml"
    path.write_text(yaml.safe_dump(config))
    log = open(workdir / "agent.log", "ab")  # noqa: SIM115 - the agent's log for its lifetime
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent.cli.main", "run", "--config", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    info = state / "agent.json"
    deadline = time.monotonic() + 60
    while not info.exists():
        if agent.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the agent did not start; see {workdir / 'agent.log'}")
        time.sleep(0.1)
    url = json.loads(info.read_text())["url"]
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return agent, target, url


class PeakRss:
    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.before = self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def send_unauthenticated(host: str, port: int, size: int, chunked: bool) -> int:
    """Bytes of body the agent took before it closed the connection."""
    chunk = b"x" * 2**20
    conn = socket.create_connection((host, port), timeout=10)
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    conn.sendall(f"POST /api/v1/pause HTTP/1.1\r\nHost: {host}:{port}\r\n{framing}\r\n\r\n".encode())
    sent = 0
    try:
        while sent < size:
            piece = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") if chunked else chunk
            conn.sendall(piece)
            sent += len(chunk)
    except OSError:
        pass
    finally:
        conn.close()
    return sent


def half_open(host: str, port: int, count: int) -> tuple[float, float]:
    """Seconds until the agent closed `count` half-open connections; then /healthz's latency."""
    held = []
    for _ in range(count):
        conn = socket.create_connection((host, port), timeout=5)
        conn.sendall(b"GET /healthz HTTP/1.1\r\n")
        held.append(conn)
    started = time.monotonic()
    for conn in held:
        conn.settimeout(30)
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass
    closed_after = time.monotonic() - started
    began = time.monotonic()
    httpx.get(f"http://{host}:{port}/healthz", timeout=5).raise_for_status()
    healthz = time.monotonic() - began
    for conn in held:
        conn.close()
    return closed_after, healthz


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--body-mib", type=int, default=200)
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="medic-bench-http-") as tmp:
        agent, target, url = start_agent(Path(tmp), "1s")
        host, port = url.removeprefix("http://").rsplit(":", 1)
        try:
            results: dict[str, float] = {}
            for chunked in (True, False):
                with PeakRss(agent.pid) as rss:
                    taken = send_unauthenticated(host, int(port), args.body_mib * 2**20, chunked)
                kind = "chunked" if chunked else "content_length"
                results[f"{kind}_rss_growth_mib"] = round((rss.peak - rss.before) / 2**20, 2)
                results[f"{kind}_body_mib_sent_before_close"] = round(taken / 2**20, 3)
            closed_after, healthz = half_open(host, int(port), args.connections)
            results["half_open_connections"] = args.connections
            results["half_open_closed_after_seconds"] = round(closed_after, 2)
            results["healthz_after_seconds"] = round(healthz, 4)
        finally:
            agent.terminate()
            agent.wait(10)
            target.kill()
            target.wait()
    if args.json:
        print(json.dumps(results))
    else:
        for key, value in results.items():
            print(f"{key:40} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
