"""The CLI sends the admin token to a loopback address only when the socket listening there is the
agent's user's: a local user who binds the agent's port while it is down must not collect it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.core.errors import ProbeError
from probes.linux.nettcp import parse_tcp_listeners
from support.agent_runner import medic_cli
from support.procs import free_port

NOBODY = 65534
TOKEN = "s3cret-admin-token-for-the-test"

# binds PORT on 127.0.0.1 as nobody, says so, and prints every byte a client sends until killed
IMPOSTOR = """
import os, socket, sys
os.setgroups([]); os.setgid(65534); os.setuid(65534)
server = socket.socket(); server.bind(("127.0.0.1", int(sys.argv[1]))); server.listen()
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    conn.settimeout(2)
    try:
        print(conn.recv(65536).hex(), flush=True)
    except OSError:
        pass
    conn.close()
"""

HEADER = b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def test_listeners_parsed_from_proc_net_tcp_lines() -> None:
    listen = b"   0: 0100007F:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000 0 1 1\n"
    established = b"   1: 0100007F:2328 0100007F:C350 01 00000000:00000000 00:00000000 00000000  0 0 2 1\n"
    v6 = b"   0: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 0:0 0:0 0 33 0 3\n"
    (first,) = parse_tcp_listeners(HEADER + listen + established)
    assert (str(first.address), first.port, first.uid) == ("127.0.0.1", 9000, 1000)
    (second,) = parse_tcp_listeners(HEADER + v6)
    assert (str(second.address), second.port, second.uid) == ("::1", 80, 33)


@given(st.binary(max_size=400))
def test_junk_in_proc_net_tcp_is_a_probe_error_never_a_crash(junk: bytes) -> None:
    try:
        parse_tcp_listeners(HEADER + junk)
    except ProbeError:
        pass


def private_state_dir(tmp_path: Path, port: int) -> Path:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "agent.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}"}))
    (state / "admin.token").write_text(TOKEN + "\n")
    for name in ("agent.json", "admin.token"):
        os.chmod(state / name, 0o600)
    return state


@pytest.mark.slow
@pytest.mark.root
def test_the_token_is_not_sent_to_a_listener_of_another_user(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to listen as another user")
    port = free_port()
    state = private_state_dir(tmp_path, port)
    impostor = subprocess.Popen(
        [sys.executable, "-c", IMPOSTOR, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert impostor.stdout is not None and impostor.stdout.readline().strip() == "ready"
        for argv in (
            ["pause", "--reason", "maintenance", "--state-dir", str(state)],
            ["--url", f"http://localhost:{port}", "resume", "--state-dir", str(state)],
        ):
            result = medic_cli(*argv, env={"MEDIC_TOKEN": None, "MEDIC_URL": None})
            assert result.returncode == 2, result
            message = result.stderr.strip()
            assert f"belongs to uid {NOBODY}" in message and "admin token is not sent" in message
            assert "Traceback" not in result.stderr and len(message.splitlines()) == 1
    finally:
        impostor.kill()
        received, _ = impostor.communicate(timeout=10)
    assert TOKEN.encode().hex() not in received and received.strip() == ""


def test_nothing_listening_is_an_unreachable_agent(tmp_path: Path) -> None:
    state = private_state_dir(tmp_path, free_port())
    result = medic_cli("pause", "--reason", "x", "--state-dir", str(state), env={"MEDIC_TOKEN": None})
    assert result.returncode == 3, result
    assert "nothing listens at 127.0.0.1" in result.stderr
