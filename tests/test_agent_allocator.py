"""The agent and a real allocator hook: figures in the API, `medic purge` with the admin token, `medic doctor NAME`."""

from __future__ import annotations

import subprocess
import tempfile

import httpx
import pytest

from support.compressed import FAST
from support.procs import wait_until
from support.workloads import TargetIO, build_c_target, target_env

pytestmark = [pytest.mark.native, pytest.mark.slow]
MiB = 2**20


def test_purge_through_the_agent_returns_memory_and_is_guarded(agent, spawn, tmp_path):
    sock_dir = tempfile.mkdtemp(prefix="mh-", dir="/tmp")
    template = f"{sock_dir}/serving.%p.sock"
    binary = build_c_target(tmp_path)
    proc = spawn(
        [binary],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=target_env("jemalloc", template, shim=True),
    )
    target = TargetIO(proc)
    target.command(f"frag {100 * 1024} 1024 64")  # 100 MiB in 1 KiB blocks, keep 1 in 64: fragmented
    agent.start(
        {
            "agent": FAST,
            "instances": [{"name": "serving", "match": {"pid": target.pid}, "hook": {"socket": template}}],
        }
    )
    wait_until(lambda: agent.instance("serving")["latest"].get("allocator_resident_bytes"), 10)
    latest = agent.instance("serving")["latest"]
    assert latest["allocator_allocated_bytes"] < 10 * MiB < latest["allocator_resident_bytes"]

    url = f"{agent.url}/api/v1/instances/serving/purge"
    assert httpx.post(url, timeout=10).status_code == 401
    assert (
        httpx.post(url, headers={"Authorization": "Bearer nope-nope-nope-nope"}, timeout=10).status_code
        == 403
    )
    token_file = agent.state_dir / "admin.token"
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"

    result = agent.cli("purge", "serving", "--token-file", str(token_file), "--json")
    assert result.returncode == 0, result.stderr
    import json

    purge = json.loads(result.stdout)["purge"]
    assert purge["allocator"] == "jemalloc"
    assert purge["returned_bytes"] > 50 * MiB
    assert purge["rss_after"] < purge["rss_before"]
    event = next(e for e in agent.events() if e["kind"] == "purge")
    assert event["instance"] == "serving" and event["data"]["returned_bytes"] == purge["returned_bytes"]

    denied = agent.cli("purge", "serving", env={"MEDIC_TOKEN": "x" * 32})
    assert denied.returncode == 4 and "wrong admin token" in denied.stderr

    doctor = agent.cli("doctor", "serving")
    assert doctor.returncode == 0, doctor.stderr
    assert "jemalloc" in doctor.stdout


def test_purge_without_a_hook_is_refused_clearly(agent, workload):
    plain = workload("stable", "--size", "4Mi")
    agent.start({"agent": FAST, "instances": [{"name": "plain", "match": {"pid": plain.pid}}]})
    # "no hook" is said only after the start-up grace (PROBE_GRACE) of the process
    wait_until(lambda: agent.instance("plain")["probes"].get("allocator", {}).get("unavailable"), 30)
    token = (agent.state_dir / "admin.token").read_text().strip()
    reply = httpx.post(
        f"{agent.url}/api/v1/instances/plain/purge", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert reply.status_code == 409
    assert "no allocator hook" in reply.json()["error"]
    assert agent.instance("plain")["probe_errors_total"] == 0  # no hook is not an error
    assert any(e["kind"] == "probe_unavailable" for e in agent.events())
