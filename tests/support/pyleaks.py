"""Python services that leak through what holds their objects, for the live tests of the type walk's
containers and of the holders of allocation sites. Each is a module written into a directory and run
as `python -c "import NAME; NAME.main()" MODE SIZE PER_SECOND`, so that its globals live in a module
of that name (`cache_service.CACHE`), as in a real service. Each starts medic's in-process hook
(`MEDIC_HOOK_SOCKET`), prints `ready PID`, then handles PER_SECOND requests a second, each of SIZE
bytes of payload:

- `cache_service`: `dict` every rendered response (bytes) kept by request id in a module-level dict;
  `list` every request's log line (a str) appended to a module-level list; `lru` the same responses
  in a bounded LRU of 64 entries (the healthy twin); `local` the responses kept in a dict that only a
  running function's frame holds (no module global reaches it: the type view cannot explain it);
- `events_service`: every request subscribes a closure holding its payload to a module-level event
  bus (`BUS.subscribe(...)`) that never unsubscribes;
- `numpy_service`: every request's batch (a numpy array) appended to a module-level list.

`line(path, marker)` gives `file:line` of the line ending with `# marker`.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from support.procs import PYTHON, REPO

CACHE_SERVICE = """
import os, sys, time
from collections import OrderedDict

import medic_hook

CACHE = {}  # request id -> rendered response, never trimmed
NAMES = []  # every request's log line, never trimmed
RECENT = OrderedDict()  # the same responses, at most 64 of them


def render(request_id, size):
    return os.urandom(size)  # renders


def remember(request_id, size):
    CACHE[request_id] = render(request_id, size)  # fills the cache


def log_line(request_id, size):
    NAMES.append(f"request {request_id} " + "x" * size)  # appends the line


def remember_recent(request_id, size):
    RECENT[request_id] = render(request_id, size)  # fills the lru
    if len(RECENT) > 64:
        RECENT.popitem(last=False)


def serve(mode, size, per_second):
    handle = {"dict": remember, "list": log_line, "lru": remember_recent}.get(mode)
    kept = {}
    request_id = 0
    while True:
        for _ in range(per_second // 10):
            request_id += 1
            if handle is not None:
                handle(request_id, size)
            else:
                kept[request_id] = os.urandom(size)  # keeps it locally
        time.sleep(0.1)


def main():
    mode, size, per_second = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    medic_hook.start()
    print("ready", os.getpid(), flush=True)
    serve(mode, size, per_second)
"""

EVENTS_SERVICE = '''
import os, sys, time

import medic_hook


class Bus:
    """Callbacks to run when an event comes; nothing ever unsubscribes."""

    def __init__(self):
        self._subscribers = []

    def subscribe(self, callback):
        self._subscribers.append(callback)


BUS = Bus()


def on_request(request_id, size):
    payload = bytearray(size)  # the payload

    def done(event):
        return len(payload) + event

    BUS.subscribe(done)  # registers


def main():
    size, per_second = int(sys.argv[2]), int(sys.argv[3])
    medic_hook.start()
    print("ready", os.getpid(), flush=True)
    request_id = 0
    while True:
        for _ in range(per_second // 10):
            request_id += 1
            on_request(request_id, size)
        time.sleep(0.1)
'''

NUMPY_SERVICE = """
import os, sys, time

import numpy as np

import medic_hook

ARRAYS = []  # every request's batch, never trimmed


def keep_batch(rng, size):
    batch = rng.standard_normal(size // 8)  # makes the batch
    ARRAYS.append(batch)  # appends the batch


def main():
    size, per_second = int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(5)
    medic_hook.start()
    print("ready", os.getpid(), flush=True)
    while True:
        for _ in range(per_second // 10):
            keep_batch(rng, size)
        time.sleep(0.1)
"""

SERVICES = {"cache_service": CACHE_SERVICE, "events_service": EVENTS_SERVICE, "numpy_service": NUMPY_SERVICE}


def write_services(out_dir: Path) -> Path:
    """Write every service module into `out_dir`; returns it."""
    for name, source in SERVICES.items():
        (out_dir / f"{name}.py").write_text(textwrap.dedent(source).lstrip())
    return out_dir


def command(out_dir: Path, module: str, mode: str, size: int, per_second: int) -> list[str]:
    """The argv that runs `module` from `out_dir` with medic's hook importable."""
    code = f"import sys; sys.path[:0] = [{str(out_dir)!r}, {str(REPO)!r}]; import {module}; {module}.main()"
    return [PYTHON, "-c", code, mode, str(size), str(per_second)]


def line(path: Path, marker: str) -> str:
    """`file:line` of the line of `path` that ends with `# marker`."""
    lines = path.read_text().splitlines()
    number = next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))
    return f"{path}:{number}"
