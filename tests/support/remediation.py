"""Real servers for the remediation tests: an etcd on a free loopback port, and small HTTP servers.

`etcd_server` starts the Debian `etcd` binary (package `etcd-server`) in a temp dir and stops it by
pid; tests that need it are skipped with the reason when the binary is missing. `HttpRecorder`
is a loopback HTTP server whose answers a test sets and whose requests it reads back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from support.procs import free_port

ETCD = shutil.which("etcd")
NEEDS_ETCD = pytest.mark.skipif(
    ETCD is None, reason="etcd binary not found: apt-get install -y etcd-server (etcd 3.4+)"
)


@contextmanager
def etcd_server() -> Iterator[str]:
    """A single-node etcd on loopback; yields its client URL; stopped and its data removed after."""
    if ETCD is None:
        pytest.skip("etcd binary not found: apt-get install -y etcd-server (etcd 3.4+)")
    workdir = Path(tempfile.mkdtemp(prefix="medic-etcd-"))
    client, peer = free_port(), free_port()
    url = f"http://127.0.0.1:{client}"
    argv = [
        ETCD,
        "--name", "medic-test",
        "--data-dir", str(workdir / "data"),
        "--listen-client-urls", url,
        "--advertise-client-urls", url,
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"medic-test=http://127.0.0.1:{peer}",
        "--listen-metrics-urls", "",
    ]  # fmt: skip
    log = open(workdir / "etcd.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError(
                    f"etcd exited with {proc.returncode}: {(workdir / 'etcd.log').read_text()[-2000:]}"
                )
            try:
                if httpx.get(f"{url}/health", timeout=1).json().get("health") == "true":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError("etcd did not become healthy within 20s")
            time.sleep(0.1)
        yield url
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)


class HttpRecorder:
    """A loopback HTTP server: `respond(path, status, body)` sets answers; `requests` holds what came in."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, bytes, float]] = {}
        self.requests: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                recorder.requests.append(
                    {"method": self.command, "path": self.path, "body": body, "headers": dict(self.headers)}
                )
                status, payload, delay = recorder.answers.get(self.path.split("?")[0], (404, b"{}", 0.0))
                if delay:
                    time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = do_PUT = _serve

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def respond(self, path: str, status: int = 200, body: object = None, delay: float = 0.0) -> None:
        payload = body if isinstance(body, bytes) else json.dumps(body if body is not None else {}).encode()
        self.answers[path] = (status, payload, delay)

    def __enter__(self) -> HttpRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers: a hung coordinator or endpoint."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


# ----------------------------------------------------------------------------- a remediation agent process


def _agent_main(argv: list[str]) -> int:
    """`python -m support.remediation agent --config JSON ...`: an Engine in its own process.

    It launches its instances as children in its own process group (so killing the group kills
    them too), submits one manual restart request for each, and steps the engine every 0.1 s until
    every instance has been restarted once or `--duration` passes.
    """
    import argparse
    import sys

    from agent.state.eventlog import EventLog
    from agent.state.store import Store
    from agent.watch.discovery import by_pid
    from remediation.config import RemediationSection
    from remediation.coordinator.etcd import EtcdCoordinator
    from remediation.coordinator.local import LocalCoordinator
    from remediation.engine import Engine, EngineHooks
    from remediation.model import InstanceView, RemediationRequest

    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--coordinator", required=True)  # local:PATH or etcd:URL
    parser.add_argument("--instances", required=True)  # comma-separated
    parser.add_argument("--duration", type=float, default=60.0)
    args = parser.parse_args(argv)

    children: dict[str, subprocess.Popen] = {}
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]

    def launch(name: str) -> int:
        children[name] = subprocess.Popen(sleeper)
        return children[name].pid

    def restart(name: str, timeout: float) -> int:
        children[name].terminate()
        children[name].wait(timeout)
        return launch(name)

    def locate(name: str):
        child = children.get(name)
        return by_pid(child.pid) if child is not None and child.poll() is None else None

    names = args.instances.split(",")
    for name in names:
        launch(name)
    config = RemediationSection.model_validate(json.loads(args.config))
    kind, _, where = args.coordinator.partition(":")
    namespace = config.coordinator.namespace
    if kind == "local":
        coordinator = LocalCoordinator(where, namespace=namespace, timeout=2)
    else:
        coordinator = EtcdCoordinator([where], namespace=namespace, timeout=2)
    store = Store(args.state)
    engine = Engine(
        config,
        store=store,
        events=EventLog(store),
        coordinator=coordinator,
        agent_id=args.agent,
        state_dir=store.dir,
        hooks=EngineHooks(locate=locate, managed_restart=restart),
        background=True,
    )
    for name in names:
        engine.submit(RemediationRequest(name, "manual", f"roll-{name}", "rolling restart test"))

    def views() -> list[InstanceView]:
        out = []
        for name in names:
            identity = locate(name)
            out.append(
                InstanceView(
                    name,
                    identity.pid if identity else None,
                    identity.start_time if identity else None,
                    labels={"fleet": "shared"},
                    ready=identity is not None,
                    managed=True,
                )
            )
        return out

    end = time.monotonic() + args.duration
    try:
        while time.monotonic() < end:
            engine.step(time.time(), [], views())
            done = {a["instance"] for a in engine.ledger.actions() if a["outcome"] == "succeeded"}
            if done >= set(names):
                engine.step(time.time(), [], views())  # records the last new process's start
                break
            time.sleep(0.1)
    finally:
        engine.close(timeout=5)
        coordinator.close()
        store.close()
        for child in children.values():
            child.kill()
            child.wait()
    return 0


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["agent"]:
        sys.exit(_agent_main(sys.argv[2:]))
    sys.exit(
        f"usage: {sys.argv[0]} agent --config JSON --state DIR --agent ID --coordinator local:PATH|etcd:URL ..."
    )
