"""A Python allocation workload driven by commands on stdin (the same commands as alloc_target.c).

Buffers are `bytearray(size - 1)`: CPython allocates exactly `size` bytes for them with malloc
(sizes above 512 bytes bypass pymalloc), so allocator figures can be checked against known sizes.
Calls `medic_hook.autostart()`, so `MEDIC_HOOK_SOCKET` starts the in-process hook. Prints
`ready PID HOOK_PATH` first.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import medic_hook

medic_hook.autostart()  # starts the hook when MEDIC_HOOK_SOCKET is set

held: list[bytearray] = []
threads: list[threading.Thread] = []
thread_ops: list[int] = []
child = 0


def buffer(size: int) -> bytearray:
    return bytearray(max(0, size - 1))  # bytearray(n) allocates n + 1 bytes and writes them


def churn(deadline: float, slot: int) -> None:
    rng, ops = random.Random(slot), 0
    ring: list[bytes | bytearray] = [b""] * 1024
    while time.monotonic() < deadline:
        for _ in range(256):
            ring[rng.randrange(1024)] = buffer(rng.randrange(16, 4097))
            ops += 1
    thread_ops[slot] = ops


def run(words: list[str]) -> str:
    global child
    command, args = words[0], [int(w) for w in words[1:]]
    if command == "alloc":
        held.extend(buffer(args[1]) for _ in range(args[0]))
    elif command == "free":
        held.clear()
    elif command == "frag":
        count, size, keep = args
        blocks = [buffer(size) for _ in range(count)]
        held.extend(blocks[::keep])
        del blocks
    elif command == "threads":
        deadline = time.monotonic() + args[1] / 1000
        thread_ops[:] = [0] * args[0]
        threads[:] = [threading.Thread(target=churn, args=(deadline, i)) for i in range(args[0])]
        for thread in threads:
            thread.start()
    elif command == "join":
        for thread in threads:
            thread.join()
        return f"ok {sum(thread_ops)}"
    elif command == "fork":
        child = os.fork()
        if child == 0:
            time.sleep(args[0] / 1000)
            os._exit(0)
        return f"ok {child}"
    elif command == "reap":
        return f"ok {os.waitpid(child, 0)[1]}"
    elif command == "exit":
        sys.exit(0)
    else:
        return "error unknown command"
    return "ok"


def main() -> None:
    print(f"ready {os.getpid()} {medic_hook.running_path() or '-'}", flush=True)
    for line in sys.stdin:
        words = line.split()
        if words:
            print(run(words), flush=True)


if __name__ == "__main__":
    main()
