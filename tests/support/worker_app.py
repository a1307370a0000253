"""A tiny web app for worker-based servers (uvicorn `--workers`, gunicorn), where one worker leaks.

Every worker imports this module. The first one to create `$LEAK_DIR/leaker` (O_EXCL: exactly one
wins) writes its pid there and leaks `$LEAK_RATE` bytes every `$LEAK_EVERY` seconds in a thread, up
to `$LEAK_CAP`; the others hold still. Without `LEAK_DIR` no worker leaks. `app` is ASGI (uvicorn),
`wsgi` is WSGI (gunicorn); both answer `ok` with the worker's pid.
"""

from __future__ import annotations

import os
import threading
import time

_held: list[bytearray] = []


def _leak(rate: int, every: float, cap: int) -> None:
    while len(_held) * rate < cap:
        block = bytearray(rate)
        block[::4096] = b"x" * len(block[::4096])  # touch every page: resident, not only reserved
        _held.append(block)
        time.sleep(every)
    threading.Event().wait()


def _maybe_leak() -> None:
    folder = os.environ.get("LEAK_DIR")
    if not folder:
        return
    try:
        fd = os.open(os.path.join(folder, "leaker"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    rate = int(os.environ.get("LEAK_RATE", str(1 << 20)))
    every = float(os.environ.get("LEAK_EVERY", "0.05"))
    cap = int(os.environ.get("LEAK_CAP", str(200 << 20)))
    threading.Thread(target=_leak, args=(rate, every, cap), daemon=True, name="leak").start()


_maybe_leak()


async def app(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = f"ok {os.getpid()}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


def wsgi(environ, start_response):  # type: ignore[no-untyped-def]
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [f"ok {os.getpid()}".encode()]
