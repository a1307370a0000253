"""Small real workloads for the built-in demo and the tests: a process that leaks at a known rate,
one that stays flat, one with a GC-like sawtooth.

    python -m agent.demo.workload leak --rate 1Mi --every 0.1 --cap 256Mi [--hook]
    python -m agent.demo.workload stable --size 32Mi --port 8601 --delay 150ms [--hook]
    python -m agent.demo.workload sawtooth --size 32Mi --peak 96Mi --period 5

Each prints `ready <pid>` on stdout once its initial memory is in place, then keeps going until
SIGTERM/SIGINT. Memory is written byte by byte or page by page so it counts in RSS. The leak is a
response cache that nothing reads back or evicts (`RESPONSES`, one `bytes` per request): it stops
growing at `--cap` so that a forgotten demo cannot take the host down. With `--port`, it also answers
HTTP on 127.0.0.1:PORT (`GET /`: 200 after `--delay`), for a latency canary to time. With `--hook` the
workload starts medic's in-process hook (`medic_hook`, socket `auto`), so that medic's type histograms
and allocation sites name what grows: `bytes` in the cache, and the line that fills it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent.core.units import parse_duration, parse_size

_PAGE = 4096


def _touched(size: int) -> bytearray:
    """A buffer whose every page is written, so it is resident rather than only reserved."""
    buf = bytearray(size)
    for offset in range(0, size, _PAGE):
        buf[offset] = 1
    return buf


def _stop(signum: int, frame: object) -> None:
    sys.exit(0)


RESPONSES: dict[str, bytes] = {}  # the leak: every response kept, never read back nor evicted


def remember(key: str, size: int) -> None:
    RESPONSES[key] = b"r" * size  # leaks: a response cache that nothing reads back or evicts


def run_leak(rate: int, every: float, cap: int, base: int) -> None:
    kept = _touched(base) if base else None  # noqa: F841 - held on purpose
    announce()
    held = serial = 0
    chunk = max(_PAGE, int(rate * every))
    while True:
        if held + chunk <= cap:
            serial += 1
            remember(f"request-{serial}", chunk)
            held += chunk
        time.sleep(every)


def run_stable(size: int) -> None:
    kept = _touched(size)  # noqa: F841 - held on purpose
    announce()
    while True:
        time.sleep(3600)


def run_sawtooth(size: int, peak: int, period: float) -> None:
    kept = _touched(size)  # noqa: F841 - held on purpose
    announce()
    garbage: list[bytearray] = []
    step = max(_PAGE, (peak - size) // 20)
    while True:
        for _ in range(20):
            garbage.append(_touched(step))
            time.sleep(period / 20)
        garbage.clear()


def announce() -> None:
    print(f"ready {os.getpid()}", flush=True)


def serve(port: int, delay: float) -> None:
    """Answer `GET /` on 127.0.0.1:`port` after `delay` seconds, in a daemon thread."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            time.sleep(delay)
            self.send_response(200)
            self.send_header("Content-Length", "3")
            self.end_headers()
            self.wfile.write(b"ok\n")

        def log_message(self, format: str, *args: object) -> None:
            pass

    ThreadingHTTPServer.allow_reuse_address = True  # a relaunch binds the port its predecessor held
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="serve", daemon=True).start()


def start_hook() -> None:
    """medic's in-process hook, as a Python service would start it (docs/allocators.md)."""
    import medic_hook

    medic_hook.start()  # MEDIC_HOOK_SOCKET, else `auto`: where medic looks for it


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agent.demo.workload", description=__doc__.split("\n")[0])
    http = argparse.ArgumentParser(add_help=False)
    http.add_argument("--port", type=int, help="also answer GET / on 127.0.0.1:PORT")
    http.add_argument("--delay", default="0s", help="after this long, e.g. 150ms")
    sub = parser.add_subparsers(dest="mode", required=True)
    leak = sub.add_parser("leak", parents=[http], help="grow by --rate bytes per second up to --cap")
    leak.add_argument("--rate", default="1Mi", help="bytes per second, e.g. 512Ki")
    leak.add_argument("--every", default="0.1s", help="allocation period")
    leak.add_argument("--cap", default="256Mi", help="stop growing at this many leaked bytes")
    leak.add_argument("--base", default="8Mi", help="allocated once at start")
    stable = sub.add_parser("stable", parents=[http], help="allocate --size once and hold it")
    stable.add_argument("--size", default="32Mi")
    saw = sub.add_parser(
        "sawtooth", parents=[http], help="hold --size, grow garbage to --peak, drop it, repeat"
    )
    for mode in (leak, stable):
        mode.add_argument("--hook", action="store_true", help="start medic's in-process hook")
    saw.add_argument("--size", default="32Mi")
    saw.add_argument("--peak", default="96Mi")
    saw.add_argument("--period", default="5s")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if args.port is not None:
        serve(args.port, parse_duration(args.delay))
    if getattr(args, "hook", False):
        start_hook()
    if args.mode == "leak":
        run_leak(
            parse_size(args.rate), parse_duration(args.every), parse_size(args.cap), parse_size(args.base)
        )
    elif args.mode == "stable":
        run_stable(parse_size(args.size))
    else:
        run_sawtooth(parse_size(args.size), parse_size(args.peak), parse_duration(args.period))


if __name__ == "__main__":
    main()
