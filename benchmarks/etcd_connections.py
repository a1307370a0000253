"""What one agent's connections cost etcd's memory, apart from its keys.

    python -m benchmarks.etcd_connections [--clients 300]

A fresh etcd on loopback; N clients of the JSON gateway (httpx) each make one request and keep the
connection alive; then N more each hold a watch stream on a prefix. Prints etcd's RSS and Go heap
in use per client for each (from its `/metrics`): what an agent would cost etcd if it kept either
(the coordinator keeps neither: only the leader watches), beside which `benchmarks.coordination`
gives the whole per-agent figure.
"""

from __future__ import annotations

import argparse
import base64
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from benchmarks.coordination import GAUGES, etcd_counters  # noqa: E402
from support.remediation import etcd_server  # noqa: E402

SETTLE = 3.0  # seconds for etcd's gauges to follow the new connections


def memory_kib(url: str) -> tuple[float, float]:
    gauges = etcd_counters(url)
    return gauges[GAUGES[0]] / 1024, gauges[GAUGES[1]] / 1024


def _key(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _watch(client: httpx.Client, stop: threading.Event) -> None:
    body = {"create_request": {"key": _key("control/"), "range_end": _key("control0")}}
    try:
        with client.stream("POST", "/v3/watch", json=body, timeout=None) as answer:
            for _ in answer.iter_bytes():
                if stop.is_set():
                    return
    except httpx.HTTPError:
        return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=300)
    args = parser.parse_args(argv)
    n = args.clients
    stop = threading.Event()
    clients: list[httpx.Client] = []
    try:
        with etcd_server() as url:
            time.sleep(SETTLE)
            base = memory_kib(url)
            print(f"etcd alone: RSS {base[0] / 1024:.1f} MiB, Go heap in use {base[1] / 1024:.1f} MiB")
            for _ in range(n):
                client = httpx.Client(base_url=url)
                client.post("/v3/kv/range", json={"key": _key("control/leader")}).raise_for_status()
                clients.append(client)
            time.sleep(SETTLE)
            idle = memory_kib(url)
            print(
                f"a kept-alive connection: {(idle[0] - base[0]) / n:.1f} KiB RSS, "
                f"{(idle[1] - base[1]) / n:.1f} KiB Go heap per client ({n} clients)"
            )
            watchers = [httpx.Client(base_url=url) for _ in range(n)]
            clients += watchers
            for client in watchers:
                threading.Thread(target=_watch, args=(client, stop), daemon=True).start()
            time.sleep(SETTLE + n / 200)
            watched = memory_kib(url)
            print(
                f"a watch stream:          {(watched[0] - idle[0]) / n:.1f} KiB RSS, "
                f"{(watched[1] - idle[1]) / n:.1f} KiB Go heap per client ({n} streams)"
            )
    finally:
        stop.set()
        for client in clients:
            client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
