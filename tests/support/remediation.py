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
    with (
        httpx.Client() as http,
        _etcd_process(_etcd_argv("medic-test", workdir, url, peer), workdir, url, http),
    ):
        yield url


def _etcd_argv(name: str, workdir: Path, url: str, peer: int) -> list[str]:
    """A single-node etcd's arguments: clients on `url`, its peer port on plain loopback."""
    return [
        ETCD or "etcd",
        "--name", name,
        "--data-dir", str(workdir / "data"),
        "--listen-client-urls", url,
        "--advertise-client-urls", url,
        "--listen-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
        "--initial-cluster", f"{name}=http://127.0.0.1:{peer}",
        "--listen-metrics-urls", "",
    ]  # fmt: skip


@contextmanager
def _etcd_process(argv: list[str], workdir: Path, url: str, http: httpx.Client) -> Iterator[None]:
    """Run etcd until it reports healthy through `http`; stopped by pid and `workdir` removed after."""
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
                if http.get(f"{url}/health", timeout=1).json().get("health") == "true":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"etcd on {url} did not become healthy within 20s")
            time.sleep(0.1)
        yield
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
        self.fallback: tuple[int, bytes, float] = (404, b"{}", 0.0)  # paths without an answer
        self.requests: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                recorder.requests.append(
                    {"method": self.command, "path": self.path, "body": body, "headers": dict(self.headers)}
                )
                status, payload, delay = recorder.answers.get(self.path.split("?")[0], recorder.fallback)
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


@contextmanager
def dripping_server(pause: float = 0.05, chunk: bytes = b" ") -> Iterator[str]:
    """A TCP server that answers every request 200, then a JSON body that never ends: `chunk` every
    `pause` s (a slowloris endpoint that each read timeout alone never catches), or as fast as the
    socket takes it with `pause` 0 (an endless answer)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
                while not (stop.wait(pause) if pause else stop.is_set()):
                    conn.sendall(chunk)
            except OSError:
                pass

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


# ----------------------------------------------------------------------------- etcd with TLS and auth
OPENSSL = shutil.which("openssl")
_EXTENSIONS = """
[server]
subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth,clientAuth
keyUsage=digitalSignature,keyEncipherment
[client]
subjectAltName=DNS:medic-client
extendedKeyUsage=clientAuth
keyUsage=digitalSignature,keyEncipherment
"""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL or "openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_etcd_certs(directory: Path) -> dict[str, Path]:
    """A CA, etcd's server certificate (127.0.0.1, localhost), a client certificate and a second CA.

    Made with the openssl CLI (P-256 keys, 0600, valid 2 days). The client certificate has an
    empty subject: etcd's JSON gateway refuses one with a Common Name once auth is on. The server
    certificate is also a client one because the gateway presents it to etcd's own gRPC server.
    `client_cn` is a client certificate with a Common Name, `other_ca` a CA that signed nothing
    etcd knows. Keys: ca, server, server_key, client, client_key, client_cn, client_cn_key, other_ca.
    """
    if OPENSSL is None:
        pytest.skip("openssl not found: apt-get install -y openssl")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ext.cnf").write_text(_EXTENSIONS)
    for ca in ("ca", "other_ca"):
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN=medic-test-{ca}",
            cwd=directory,
        )  # fmt: skip
    for name, subject, section in (
        ("server", "/CN=etcd-test-server", "server"),
        ("client", "/", "client"),
        ("client_cn", "/CN=medic", "client"),
    ):
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject,
            cwd=directory,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", "ext.cnf", "-extensions", section,
            cwd=directory,
        )  # fmt: skip
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return {
        "ca": directory / "ca.pem",
        "other_ca": directory / "other_ca.pem",
        "server": directory / "server.pem",
        "server_key": directory / "server.key",
        "client": directory / "client.pem",
        "client_key": directory / "client.key",
        "client_cn": directory / "client_cn.pem",
        "client_cn_key": directory / "client_cn.key",
    }


@contextmanager
def etcd_tls_server(certs: dict[str, Path], *, auth_token_ttl: int = 300) -> Iterator[str]:
    """A single-node etcd serving https with `--client-cert-auth`; yields its https client URL.

    `auth_token_ttl` is etcd's `--auth-token-ttl` (seconds a simple token lives unused), for tests
    that let a token expire. Stopped by pid and its data removed after.
    """
    if ETCD is None:
        pytest.skip("etcd binary not found: apt-get install -y etcd-server (etcd 3.4+)")
    workdir = Path(tempfile.mkdtemp(prefix="medic-etcd-tls-"))
    client, peer = free_port(), free_port()
    url = f"https://127.0.0.1:{client}"
    argv = [
        *_etcd_argv("medic-tls", workdir, url, peer),
        "--cert-file", str(certs["server"]),
        "--key-file", str(certs["server_key"]),
        "--trusted-ca-file", str(certs["ca"]),
        "--client-cert-auth",
        "--auth-token-ttl", str(auth_token_ttl),
    ]  # fmt: skip
    with etcd_admin_client(certs) as admin, _etcd_process(argv, workdir, url, admin):
        yield url


def etcd_admin_client(certs: dict[str, Path]) -> httpx.Client:
    """An httpx client that etcd_tls_server accepts: its CA and the (Common-Name-less) client certificate."""
    import ssl

    context = ssl.create_default_context(cafile=str(certs["ca"]))
    context.load_cert_chain(str(certs["client"]), str(certs["client_key"]))
    return httpx.Client(verify=context, trust_env=False, timeout=5)


def enable_etcd_auth(url: str, certs: dict[str, Path], root_password: str) -> None:
    """Turn on etcd's auth through the gateway: user root with role root, then `auth/enable`."""
    with etcd_admin_client(certs) as admin:
        for path, body in (
            ("auth/user/add", {"name": "root", "password": root_password}),
            ("auth/role/add", {"name": "root"}),
            ("auth/user/grant", {"user": "root", "role": "root"}),
            ("auth/enable", {}),
        ):
            answer = admin.post(f"{url}/v3/{path}", content=json.dumps(body))
            assert answer.status_code == 200 and "error" not in answer.json(), (path, answer.text)


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
