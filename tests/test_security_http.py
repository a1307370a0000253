"""The hardened HTTP API: Host check, auth before the body, body limits, header timeout, connection cap,
no 500 for odd input, no CDN pages, and an audit `by` that the client cannot choose."""

from __future__ import annotations

import hashlib
import json
import select
import socket
import subprocess
import threading
import time

import httpx
import psutil
import pytest
import uvicorn

from agent.api.guard import allowed_hosts, host_allowed, is_loopback, json_too_deep
from agent.api.server import connection_budget, server_config
from support.agent_runner import AgentRunner
from support.http_guard import TOKEN, World, admin, read_response
from support.procs import PATIENCE, wait_until

IDENTITY = "token:" + hashlib.sha256(TOKEN.encode()).hexdigest()[:8]


@pytest.fixture
def world(tmp_path, spawn):
    child = spawn(["sleep", "60"], stdout=subprocess.DEVNULL)
    made = World(tmp_path, child.pid)
    yield made
    made.close()


class Served:
    """The app on the agent's real server config (guarded protocol), in a thread on a loopback port."""

    def __init__(self, app, **limits) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        options = {"header_timeout": 10.0, "keep_alive": 5.0, "max_connections": 256, **limits}
        self.server = uvicorn.Server(server_config(app, **options))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 10)

    def connect(self, data: bytes = b"") -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if data:
            conn.sendall(data)
        return conn

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def served(world):
    made: list[Served] = []

    def serve(**limits) -> Served:
        made.append(Served(world.app, **limits))
        return made[-1]

    yield serve
    for s in made:
        s.close()


def request_head(path: str, port: int, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# ----------------------------------------------------------------------------- Host and docs
def test_host_header_must_name_this_agent(world):
    assert world.request("GET", "/healthz").status_code == 200  # Host: 127.0.0.1:9464
    for host in ("localhost:9464", "[::1]:9464", "127.0.0.1"):
        assert world.request("GET", "/healthz", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example:9464", "evil.example", "127.0.0.1:1234", "127.0.0.1.evil.example:9464"):
        answer = world.request("GET", "/api/v1/instances", headers={"Host": host})
        assert answer.status_code == 421, host
        assert "agent.allowed_hosts" in answer.json()["error"]


def test_allowed_hosts_derive_from_listen():
    assert host_allowed("localhost:80", allowed_hosts("127.0.0.1"), 80)
    assert not host_allowed("medic.example:80", allowed_hosts("127.0.0.1"), 80)
    configured = allowed_hosts("0.0.0.0", ["medic.example", "proxy.example:8443"])
    assert host_allowed("medic.example:9464", configured, 9464)
    assert host_allowed("proxy.example:8443", configured, 9464)
    assert not host_allowed("rebind.attacker.example:9464", configured, 9464)
    everywhere = allowed_hosts("0.0.0.0")
    assert socket.gethostname().lower() in everywhere and "127.0.0.1" in everywhere
    assert host_allowed("anything:1", allowed_hosts("0.0.0.0", ["*"]), 9464)
    assert is_loopback("127.0.0.2") and is_loopback("::1") and not is_loopback("0.0.0.0")


def test_no_page_loads_from_a_cdn(world):
    for path in ("/api/docs", "/docs", "/redoc", "/api/redoc"):
        assert world.request("GET", path).status_code == 404, path
    schema = world.request("GET", "/openapi.json")
    assert schema.status_code == 200 and "/api/v1/pause" in schema.json()["paths"]


# ----------------------------------------------------------------------------- odd input: 400, not 500
def test_reported_inputs_give_400(world):
    answer = world.request("GET", "/api/v1/events", params={"after_id": "9" * 23})
    assert answer.status_code == 400 and "after_id" in answer.json()["error"]
    for value in ("inf", "nan", "-inf", "1e309"):
        answer = world.request("GET", "/api/v1/instances/svc/attribution", params={"since": value})
        assert answer.status_code == 400 and value in answer.json()["error"], value
    answer = world.request("GET", "/api/v1/actions", params={"since": "inf"})
    assert answer.status_code == 400
    deep = b"[" * 100_000 + b"]" * 100_000
    headers = {**admin(), "Content-Type": "application/json"}
    answer = world.request("POST", "/api/v1/alertmanager", content=deep[:500_000], headers=headers)
    assert answer.status_code == 400 and "deeper than 32" in answer.json()["error"]
    assert json_too_deep(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}') is False


# ----------------------------------------------------------------------------- audit identity
def test_audit_by_is_the_authenticated_identity(world):
    paused = world.request(
        "POST", "/api/v1/pause", json={"reason": "deploy", "duration": "10m", "by": "root"}, headers=admin()
    )
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"]["by"] == f"{IDENTITY} (note: root)"
    [event] = world.store.events(kinds=["remediation_paused"])
    assert event.data["by"].startswith(IDENTITY)
    resumed = world.request("POST", "/api/v1/resume", json={"note": "alice"}, headers=admin())
    assert resumed.status_code == 200 and resumed.json()["resumed"]
    [event] = world.store.events(kinds=["remediation_resumed"])
    assert event.data["by"] == f"{IDENTITY} (note: alice)"
    restart = world.request(
        "POST", "/api/v1/instances/svc/restart", json={"reason": "by hand", "by": "admin"}, headers=admin()
    )
    assert restart.status_code in (200, 409), restart.text
    [event] = world.store.events(kinds=["remediation_requested"])
    assert event.data["by"] == f"{IDENTITY} (note: admin)"
    assert world.request("POST", "/api/v1/resume", headers=admin()).status_code == 200


# ----------------------------------------------------------------------------- bodies on the real server
def test_unauthenticated_body_is_refused_before_it_is_read(served):
    s = served()
    for framing in ("Content-Length: 100000000", "Transfer-Encoding: chunked"):
        conn = s.connect(request_head("/api/v1/pause", s.port, framing))
        status, body, closed = read_response(conn)
        assert status == 401 and closed, framing
        assert "admin token" in json.loads(body)["error"]
        conn.close()
    conn = s.connect(
        request_head("/api/v1/pause", s.port, "Content-Length: 100000000", "Authorization: Bearer x")
    )
    status, _, closed = read_response(conn)
    conn.close()
    assert status == 403 and closed


def test_body_limits_apply_while_reading(served):
    s = served()
    auth = f"Authorization: Bearer {TOKEN}"
    conn = s.connect(request_head("/api/v1/pause", s.port, "Content-Length: 100000000", auth))
    status, body, closed = read_response(conn)
    conn.close()
    assert status == 413 and closed and "accepts 65536" in json.loads(body)["error"]
    conn = s.connect(request_head("/api/v1/pause", s.port, "Transfer-Encoding: chunked", auth))
    chunk = b"x" * 8192
    for _ in range(9):  # 72 KiB, over the 64 KiB limit; then nothing more
        conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    status, body, closed = read_response(conn)
    conn.close()
    assert status == 413 and closed and "exceeds the 65536 bytes" in json.loads(body)["error"]


def test_headers_must_arrive_in_time(served):
    s = served(header_timeout=0.5)
    conn = s.connect(b"GET /healthz HTTP/1.1\r\n")
    started = time.monotonic()
    assert read_response(conn) == (0, b"", True)
    conn.close()
    assert time.monotonic() - started < 3 * PATIENCE
    with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", timeout=5) as client:
        assert client.get("/healthz").status_code == 200
        time.sleep(0.8)  # longer than the header timeout: an idle keep-alive connection is fine
        assert client.get("/healthz").status_code == 200


def test_a_body_that_trickles_in_is_cut_off_with_408(served):
    s = served(header_timeout=0.5)
    auth = f"Authorization: Bearer {TOKEN}"
    conn = s.connect(request_head("/api/v1/pause", s.port, "Content-Length: 1000", auth))
    started = time.monotonic()
    while time.monotonic() - started < 5:  # a byte at a time, never the promised 1000, until it answers
        if select.select([conn], [], [], 0.05)[0]:
            break
        conn.sendall(b" ")
    status, body, closed = read_response(conn)
    conn.close()
    assert status == 408 and closed and "did not arrive in time" in json.loads(body)["error"]
    assert time.monotonic() - started < 3 * PATIENCE
    with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", timeout=5) as client:  # slow handlers are fine
        paused = client.post(
            "/api/v1/pause",
            json={"duration": "1h", "reason": "a test"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert paused.status_code == 200, paused.text
        time.sleep(1.2)  # past twice the header timeout on the same keep-alive connection
        assert client.post("/api/v1/resume", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_connections_beyond_the_cap_are_refused(served):
    s = served(max_connections=8)
    held = [s.connect(b"GET /healthz HTTP/1.1\r\n") for _ in range(8)]
    wait_until(lambda: len(s.server.server_state.connections) == 8, 5)
    refused = s.connect(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    status, body, closed = read_response(refused)
    refused.close()
    assert status == 503 and closed and "too many open connections" in body.decode()
    for conn in held:
        conn.close()
    wait_until(lambda: not s.server.server_state.connections, 5)
    assert httpx.get(f"http://127.0.0.1:{s.port}/healthz", timeout=5).status_code == 200


def test_connection_budget_fits_the_fd_limit():
    assert connection_budget(256, 4096) == 256
    assert connection_budget(256, 400) == 144
    assert connection_budget(256, 100) == 8


# ----------------------------------------------------------------------------- acceptance: a real agent
def start_agent(agent: AgentRunner, spawn, **http) -> psutil.Process:
    child = spawn(["sleep", "120"], stdout=subprocess.DEVNULL)
    agent.start(
        {
            "agent": {"interval": "0.2s", "flush_interval": "0.3s", "http": http},
            "instances": [{"name": "svc", "match": {"pid": child.pid}}],
        }
    )
    assert agent.proc is not None
    return psutil.Process(agent.proc.pid)


@pytest.fixture
def agent(spawn, tmp_path):
    runner = AgentRunner(spawn, tmp_path)
    yield runner
    runner.close()


class PeakRss:
    """The highest RSS of a process, sampled every 20 ms while the block runs."""

    def __init__(self, process: psutil.Process) -> None:
        self.process, self.peak, self._stop = process, process.memory_info().rss, threading.Event()

    def __enter__(self) -> PeakRss:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.slow
def test_huge_unauthenticated_body_leaves_the_agent_memory_flat(agent, spawn):
    process = start_agent(agent, spawn)
    port = int(agent.url.rsplit(":", 1)[1])
    size = 200 * 2**20
    chunk = b"x" * 2**20
    before = process.memory_info().rss

    def body():
        for _ in range(size // len(chunk)):
            yield chunk

    with PeakRss(process) as rss:
        try:
            answer = httpx.post(f"{agent.url}/api/v1/pause", content=body(), timeout=30)
            assert answer.status_code == 401
        except httpx.TransportError:
            pass  # the agent answered 401 and closed while the body was still being sent
        conn = socket.create_connection(("127.0.0.1", port), timeout=5)
        conn.sendall(request_head("/api/v1/pause", port, f"Content-Length: {size}"))
        status, _, closed = read_response(conn)
        assert status == 401 and closed
        sent = 0
        with pytest.raises(OSError):
            while sent < size:
                sent += conn.send(chunk)
        conn.close()
    assert rss.peak - before < 20 * 2**20, f"RSS grew by {(rss.peak - before) / 2**20:.1f} MiB"
    assert agent.get("/healthz")["status"] == "ok"


@pytest.mark.slow
def test_half_open_connections_are_dropped(agent, spawn):
    start_agent(agent, spawn, header_timeout="1s")
    port = int(agent.url.rsplit(":", 1)[1])
    log_before = agent.log.stat().st_size
    wait_until(lambda: agent.instance("svc")["status"] == "up", 10)
    events_before = {e["id"] for e in agent.events()}
    held = []
    try:
        for _ in range(300):
            conn = socket.create_connection(("127.0.0.1", port), timeout=5)
            conn.sendall(b"GET /healthz HTTP/1.1\r\n")
            held.append(conn)
        time.sleep(1.5)
        for i, conn in enumerate(held):
            conn.settimeout(2)
            status, _, closed = read_response(conn)
            assert closed and status in (0, 503), f"connection {i} still open"  # timed out, or over the cap
        started = time.monotonic()
        assert httpx.get(f"{agent.url}/healthz", timeout=1).status_code == 200
        assert time.monotonic() - started < 1 * PATIENCE
    finally:
        for conn in held:
            conn.close()
    time.sleep(1.0)  # a probe round or five: an fd shortage would show as instance events
    new = [e for e in agent.events() if e["id"] not in events_before]
    assert not [e for e in new if e["kind"].startswith("instance_")], new
    assert agent.instance("svc")["status"] == "up"
    assert agent.log.stat().st_size - log_before < 20_000, agent.log.read_text()[-2000:]


@pytest.mark.slow
def test_a_listen_address_off_loopback_is_announced(agent, spawn):
    child = spawn(["sleep", "60"], stdout=subprocess.DEVNULL)
    agent.start(
        {"agent": {"listen": "0.0.0.0:0"}, "instances": [{"name": "svc", "match": {"pid": child.pid}}]}
    )
    [event] = agent.events(kind="api_exposed")
    assert event["severity"] == "warning" and "reachable from other hosts" in event["message"]
    assert "api_exposed" in agent.log.read_text()
    answer = httpx.get(
        agent.url.replace("0.0.0.0", "127.0.0.1") + "/healthz", headers={"Host": "evil.example"}
    )
    assert answer.status_code == 421
