"""A Python service written for the hook tests, run as a program: it starts medic's in-process hook
(`MEDIC_HOOK_SOCKET`) and then, in its main thread, handles one request every `--every` seconds:

    leak     an unbounded dict cache of str -> bytes (the most common Python cache leak)
    bounded  the same payloads behind functools.lru_cache(maxsize=32): its memory stays flat
    idle     no requests

It prints `ready PID`. With stdin a pipe it answers line commands: `count` prints the host's GC
objects as JSON (`{"objects": N, "types": {name: count}, "tracing": bool}`), after a collection
unless the collector is off; `gc off` collects and then turns the collector off (so that garbage in
reference cycles stays countable), `gc on` turns it back on; `fill N` handles N requests at once. SIGUSR1 stops the hook (its socket goes away) and the next SIGUSR1
starts it again: an outage of the hook while the process runs.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import select
import signal
import sys
import time
from collections import Counter

import medic_hook

CACHE: dict[str, bytes] = {}


def fill_cache(key: str, size: int) -> None:
    CACHE[key] = os.urandom(size)  # fills the cache


@functools.lru_cache(maxsize=32)
def render(key: str, size: int) -> bytes:
    return os.urandom(size)  # bounded: at most 32 payloads live


def handle(mode: str, serial: int, size: int) -> None:
    key = f"request-{serial}"
    if mode == "leak":
        fill_cache(key, size)
    elif mode == "bounded":
        render(key, size)


def counts() -> dict:
    import tracemalloc

    if gc.isenabled():
        gc.collect()
    objects = gc.get_objects()
    types = Counter(type(o).__qualname__ for o in objects)
    total = len(objects)
    del objects
    return {"objects": total, "types": dict(types), "tracing": tracemalloc.is_tracing()}


def toggle_hook(signum: int, frame: object) -> None:
    if medic_hook.running_path():
        medic_hook.stop()
    else:
        medic_hook.start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["leak", "bounded", "idle"])
    parser.add_argument("--size", type=int, default=64 * 1024, help="bytes per payload")
    parser.add_argument("--every", type=float, default=0.05, help="seconds between requests")
    args = parser.parse_args()
    medic_hook.start()
    signal.signal(signal.SIGUSR1, toggle_hook)
    print(f"ready {os.getpid()}", flush=True)
    serial = 0
    stdin_open = not sys.stdin.closed  # /dev/null (a managed instance) reads as EOF at once
    while True:
        if stdin_open and select.select([sys.stdin], [], [], args.every)[0]:
            line = sys.stdin.readline()
            if not line:
                stdin_open = False
                continue
            command = line.split()
            if command[:1] == ["count"]:
                print(json.dumps(counts()), flush=True)
            elif command[:1] == ["gc"]:
                gc.collect()
                gc.disable() if command[1:] == ["off"] else gc.enable()
                print("ok", flush=True)
            elif command[:1] == ["fill"]:
                for _ in range(int(command[1])):
                    serial += 1
                    handle(args.mode, serial, args.size)
                print("ok", flush=True)
            continue
        if not stdin_open:
            time.sleep(args.every)
        serial += 1
        handle(args.mode, serial, args.size)


if __name__ == "__main__":
    main()
