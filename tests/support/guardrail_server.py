"""The demo's real onnxruntime server with the behaviours the guardrail tests need, and medic's
in-process allocator hook started, so that the guardrail reads allocator figures from it.

    python tests/support/guardrail_server.py --model M.onnx --port 8601 --behaviour slower

- `healthy`, `leak`: the demo's own behaviours (`agent.demo.behaviours`); the leak keeps every
  request's embedding (16 KiB per row), so its rate is the request rate times the rows, divided
  by `--leak-every` (keep one request in N).
- `slower`: each prediction waits `--slower` times the time the server spent on it so far, so
  the build is that much slower at every quantile, with no extra CPU.
- `fragment`: glibc fragmentation without a leak. Trim is off (`M_TRIM_THRESHOLD`), and after each
  prediction the server touches a fresh `--fragment-chunk` of the heap top, frees it, then takes a
  32-byte block aligned to the chunk size (`memalign`): glibc frees the aligned block's leader,
  which leaves a resident hole of almost a chunk between two live 32-byte blocks. The next chunk
  cannot fit in a hole, so RSS grows by a chunk per request while the live bytes grow by 48.

Kept out of `agent/demo` because a demo user never needs these builds.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import medic_hook
from agent.core.units import parse_size
from agent.demo import behaviours
from agent.demo.server import Handler, Model, Server

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
_started = threading.local()


class TimedHandler(Handler):
    """Remembers when each request began, for the `slower` behaviour."""

    def do_POST(self) -> None:
        _started.at = time.perf_counter()
        super().do_POST()


class Slower(behaviours.Behaviour):
    name: ClassVar[str] = "slower"

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def delay(self) -> float:
        return self.factor * (time.perf_counter() - getattr(_started, "at", time.perf_counter()))


class SparseLeak(behaviours.Leak):
    """The demo's leak, keeping only every `every`-th request's embedding: a smaller leak."""

    def __init__(self, every: int, cap: int) -> None:
        super().__init__(cap=cap)
        self.every, self.seen = every, 0

    def keep(self, outputs: dict[str, Any]) -> None:
        self.seen += 1
        if self.seen % self.every == 0:
            super().keep(outputs)


class Fragment(behaviours.Behaviour):
    name: ClassVar[str] = "fragment"

    def __init__(self, chunk: int, cap: int) -> None:
        self.libc = ctypes.CDLL(None)
        self.libc.malloc.restype = ctypes.c_void_p
        self.libc.malloc.argtypes = [ctypes.c_size_t]
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.libc.memalign.restype = ctypes.c_void_p
        self.libc.memalign.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
        self.libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        self.chunk, self.cap = chunk, cap
        self.pins: list[int] = []
        self._lock = threading.Lock()

    def keep(self, outputs: dict[str, Any]) -> None:
        with self._lock:
            if len(self.pins) * self.chunk >= self.cap:
                return
            scratch = self.libc.malloc(self.chunk + 64)
            if not scratch:
                return
            ctypes.memset(scratch, 1, self.chunk + 64)
            self.libc.free(scratch)
            pin = self.libc.memalign(self.chunk, 32)
            if pin:
                self.pins.append(pin)

    def held_bytes(self) -> int:
        return len(self.pins) * 48


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--behaviour", choices=("healthy", "leak", "slower", "fragment"), default="healthy")
    parser.add_argument("--slower", type=float, default=0.3)
    parser.add_argument("--fragment-chunk", default="64Ki")
    parser.add_argument("--cap", default="1Gi")
    parser.add_argument("--leak-every", type=int, default=1, help="leak: keep every N-th embedding")
    args = parser.parse_args(argv)
    behaviour: behaviours.Behaviour
    if args.behaviour == "slower":
        behaviour = Slower(args.slower)
    elif args.behaviour == "fragment":
        behaviour = Fragment(parse_size(args.fragment_chunk), parse_size(args.cap))
        libc = behaviour.libc
        libc.mallopt(M_ARENA_MAX, 1)  # every thread in the brk heap, where the holes stay
        libc.mallopt(M_MMAP_THRESHOLD, 4 * 2**20)
        libc.mallopt(M_TRIM_THRESHOLD, 2**30)
    elif args.behaviour == "leak" and args.leak_every > 1:
        behaviour = SparseLeak(args.leak_every, parse_size(args.cap))
    else:
        behaviour = behaviours.create(args.behaviour, cap=parse_size(args.cap), growth=0.0, max_delay=0.0)
    medic_hook.start()
    server = Server(args.port, Model(args.model, behaviour))
    server.RequestHandlerClass = TimedHandler

    def stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"ready {server.server_address[1]} pid {os.getpid()}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
