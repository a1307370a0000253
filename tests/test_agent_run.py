"""`medic run` end to end: a real agent process watching real processes that leak, stay flat, die and restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from support.procs import PATIENCE, PYTHON, REPO, wait_until, workload_argv

pytestmark = pytest.mark.slow
FAST = {"interval": "0.2s", "slow_interval": "1s", "discovery_interval": "0.5s", "flush_interval": "0.3s"}


def kinds(events: list[dict], instance: str | None = None) -> list[str]:
    return [e["kind"] for e in reversed(events) if instance is None or e["instance"] == instance]


def rss_points(agent, name: str) -> list[float]:
    return [
        v for _, v in agent.get(f"/api/v1/instances/{name}/series", metric="rss_bytes", since="5m")["points"]
    ]


def test_records_rising_and_flat_memory_and_serves_it(agent, workload):
    stable = workload("stable", "--size", "24Mi")
    agent.start(
        {
            "agent": FAST,
            "instances": [
                {
                    "name": "leaky",
                    "match": {"command": workload_argv("leak", "--rate", "8Mi", "--every", "0.05s")},
                },
                {"name": "stable", "match": {"pid": stable.pid}, "labels": {"fleet": "test"}},
            ],
        }
    )
    wait_until(lambda: len(rss_points(agent, "leaky")) >= 12 and rss_points(agent, "stable"), 20)
    leaky, flat = rss_points(agent, "leaky"), rss_points(agent, "stable")
    assert leaky[-1] - leaky[1] > 8 * 2**20, leaky  # ~8 MiB/s over more than 2 s
    assert max(flat) - min(flat) < 2 * 2**20, flat
    assert 24 * 2**20 < flat[-1] < 64 * 2**20

    listing = {i["name"]: i for i in agent.get("/api/v1/instances")["instances"]}
    assert listing["stable"]["pid"] == stable.pid and listing["stable"]["status"] == "up"
    assert listing["stable"]["labels"] == {"fleet": "test"}
    assert listing["leaky"]["mode"] == "managed"
    assert listing["leaky"]["memory_limit_source"] in ("cgroup", "host")
    detail = agent.instance("stable")
    assert {"rss_bytes", "cpu_seconds_total", "threads", "open_fds", "memory_limit_bytes"} <= set(
        detail["metrics"]
    )

    metrics = agent.get("/metrics")
    assert f'medic_rss_bytes{{name="stable"}} {flat[-1]:.0f}' in metrics.replace(".0\n", "\n") or (
        'medic_rss_bytes{name="stable"}' in metrics
    )
    assert 'medic_instance_up{name="leaky"} 1.0' in metrics
    assert 'medic_probe_duration_seconds_count{probe="process"}' in metrics
    assert 'medic_probe_errors_total{name="stable",probe="process"} 0.0' in metrics
    assert "\nprocess_resident_memory_bytes " in metrics and "medic_agent_process" not in metrics

    status = subprocess.run(
        [PYTHON, "-m", "agent.cli.main", "status", "--url", agent.url],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=10,
    )
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].split()[:3] == ["INSTANCE", "PID", "STATUS"]
    row = next(line for line in lines if line.startswith("stable"))
    assert str(stable.pid) in row and " up " in row


def test_follows_restarts_and_survives_kill_9(agent, workload, spawn, tmp_path):
    attached = workload("stable", "--size", "8Mi")
    pidfile = tmp_path / "served.pid"
    first = workload("stable", "--size", "8Mi")
    pidfile.write_text(f"{first.pid}\n")
    agent.start(
        {
            "agent": FAST,
            "instances": [
                {"name": "managed", "match": {"command": workload_argv("stable", "--size", "8Mi")}},
                {"name": "attached", "match": {"pid": attached.pid}},
                {"name": "served", "match": {"pidfile": str(pidfile)}},
            ],
        }
    )
    wait_until(
        lambda: all(agent.instance(n)["status"] == "up" for n in ("managed", "attached", "served")), 10
    )
    old_managed = agent.instance("managed")["pid"]

    os.kill(old_managed, signal.SIGKILL)
    attached.kill()
    first.kill()
    second = workload("stable", "--size", "8Mi")
    pidfile.write_text(f"{second.pid}\n")

    def restarted() -> bool:
        managed = agent.instance("managed")
        return (
            managed["status"] == "up"
            and managed["pid"] != old_managed
            and agent.instance("served")["pid"] == second.pid
        )

    wait_until(restarted, 15)
    managed, served = agent.instance("managed"), agent.instance("served")
    assert managed["restarts"] == 1 and served["restarts"] == 1
    wait_until(lambda: agent.instance("attached")["status"] == "down", 5)
    events = agent.events()
    assert kinds(events, "managed")[-3:-1] == ["instance_exited", "instance_restarted"] or (
        "instance_exited" in kinds(events, "managed") and "instance_restarted" in kinds(events, "managed")
    )
    exited = next(e for e in events if e["kind"] == "instance_exited" and e["instance"] == "managed")
    assert exited["data"]["exit_status"] == 128 + signal.SIGKILL
    assert "instance_restarted" in kinds(events, "served")
    assert "instance_down" in kinds(events, "attached")
    names = {i["name"] for i in agent.get("/api/v1/instances")["instances"]}
    assert names == {"managed", "attached", "served"}  # restarts are events, not new instances
    assert agent.get("/healthz")["status"] == "ok"


def test_cmdline_instances_newest_and_all(agent, spawn):
    # one process has one watcher (two specs on one regex are refused): each spec has its own processes
    marker = f"medic-test-{os.getpid()}-{time.monotonic_ns()}"
    argv = [PYTHON, "-c", "import time; time.sleep(120)", f"{marker}-newest"]
    every = [PYTHON, "-c", "import time; time.sleep(120)", f"{marker}-every"]
    spawn(argv)  # the older match: `newest` must take the other
    two = spawn(argv)
    first, second = spawn(every), spawn(every)
    agent.start(
        {
            "agent": FAST,
            "instances": [
                {"name": "newest", "match": {"cmdline": f"{marker}-newest"}},
                {"name": "every", "match": {"cmdline": f"{marker}-every", "select": "all"}},
            ],
        }
    )
    wait_until(lambda: agent.instance("newest")["status"] == "up", 10)
    assert agent.instance("newest")["pid"] == two.pid
    wait_until(
        lambda: (
            {agent.instance("every-0")["pid"], agent.instance("every-1")["pid"]} == {first.pid, second.pid}
        ),
        10,
    )
    # the next match runs (Popen returns once it has exec'd) before the watched one dies: a tick
    # between the two would rightly take the older match, and watch it while it lives
    three = spawn(argv)
    two.kill()
    wait_until(lambda: agent.instance("newest")["pid"] == three.pid, 10)
    second.kill()
    third = spawn(every)
    slots = {agent.instance(f"every-{i}")["pid"] for i in range(2)}
    wait_until(lambda: {agent.instance(f"every-{i}")["pid"] for i in range(2)} == {first.pid, third.pid}, 10)
    assert len(slots) == 2
    assert "every-2" not in {i["name"] for i in agent.get("/api/v1/instances")["instances"]}
    assert not [e for e in agent.events() if e["kind"] == "instance_overlap"]


def test_history_and_identity_survive_an_agent_restart(agent, workload):
    target = workload("stable", "--size", "8Mi")
    config = {"agent": FAST, "instances": [{"name": "svc", "match": {"pid": target.pid}}]}
    agent.start(config)
    wait_until(lambda: agent.instance("svc")["probes"].get("process", {}).get("last_success"), 10)
    wait_until(lambda: rss_points(agent, "svc"), 5)
    before = rss_points(agent, "svc")
    first_ts = agent.get("/api/v1/instances/svc/series", metric="rss_bytes", since="5m")["points"][0][0]
    started = time.monotonic()
    assert agent.stop() == 0
    assert time.monotonic() - started < 5.0 * PATIENCE
    agent.start(config)
    series = agent.get("/api/v1/instances/svc/series", metric="rss_bytes", since="5m")["points"]
    assert series[0][0] == first_ts and len(series) >= len(before)
    wait_until(lambda: "instance_resumed" in kinds(agent.events(), "svc"), 5)
    all_kinds = kinds(agent.events())
    assert all_kinds.count("agent_started") == 2 and "agent_stopped" in all_kinds
    assert "instance_restarted" not in all_kinds
    assert agent.instance("svc")["restarts"] == 0


def test_probe_permission_error_is_recorded_and_the_agent_keeps_going(agent, spawn):
    """The agent runs as uid 0 without capabilities; the target runs as `nobody`, so its fd table and
    smaps_rollup are closed to the agent while statm/status stay readable."""
    if os.geteuid() != 0:
        pytest.skip("needs root to start a target as another user")
    target = spawn(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sleep", "120"])
    no_caps = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
    agent.start(
        {"agent": FAST, "instances": [{"name": "locked", "match": {"pid": target.pid}}]}, prefix=no_caps
    )
    wait_until(lambda: "probe_error" in kinds(agent.events(), "locked"), 10)
    errors = [e for e in agent.events() if e["kind"] == "probe_error"]
    assert {e["data"]["reason"] for e in errors} == {"permission"}
    assert any("smaps" in e["message"] or "fd" in e["message"] for e in errors)
    wait_until(lambda: agent.instance("locked")["rss_bytes"], 5)
    detail = agent.instance("locked")
    assert detail["status"] == "up" and detail["probe_errors_total"] >= 1
    count = detail["probe_errors_total"]
    wait_until(lambda: agent.instance("locked")["probe_errors_total"] > count, 5)  # counted every tick
    assert len([e for e in agent.events() if e["kind"] == "probe_error"]) == len(errors)  # evented once
    assert "medic_probe_errors_total" in agent.get("/metrics")


def test_managed_command_mode_exit_status_and_signal_forwarding(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    base = [PYTHON, "-m", "agent.cli.main", "run", "--listen", "127.0.0.1:0", "--interval", "0.2s"]
    done = subprocess.run(
        [
            *base,
            "--state-dir",
            str(tmp_path / "a"),
            "--",
            PYTHON,
            "-c",
            "import time, sys; time.sleep(1); sys.exit(3)",
        ],
        env=env,
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 3, done.stderr.decode()
    never = subprocess.run(  # a command that cannot start: 127 as a shell says it, never a success
        [*base, "--state-dir", str(tmp_path / "c"), "--", str(tmp_path / "no-such-program")],
        env=env,
        capture_output=True,
        timeout=30,
    )
    assert never.returncode == 127 and "cannot start" in never.stderr.decode()

    proc = subprocess.Popen(
        [*base, "--state-dir", str(tmp_path / "b"), "--", *workload_argv("stable", "--size", "4Mi")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline().startswith("ready")  # the child's own stdout passes through
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=10) == 0  # the workload exits 0 on SIGTERM; medic mirrors it
        assert time.monotonic() - started < 5 * PATIENCE
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_cli_without_an_agent_says_how_to_start_one():
    result = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "status", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=10,
    )
    assert result.returncode == 3
    assert result.stderr.startswith("medic: error: cannot reach the agent at http://127.0.0.1:9")
    assert "medic run" in result.stderr


def test_busy_listen_address_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = subprocess.run(
            [
                PYTHON,
                "-m",
                "agent.cli.main",
                "run",
                "--listen",
                f"127.0.0.1:{port}",
                "--state-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=20,
        )
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_a_second_agent_on_a_running_agents_state_dir_is_refused_and_harms_nothing(agent, tmp_path):
    agent.start(
        {"agent": FAST, "instances": [{"name": "managed", "match": {"command": workload_argv("stable")}}]}
    )
    wait_until(lambda: agent.instance("managed")["status"] == "up", 10)
    managed = agent.instance("managed")["pid"]
    info = (agent.state_dir / "agent.json").read_bytes()
    token = (agent.state_dir / "admin.token").read_bytes()
    result = subprocess.run(
        [
            PYTHON,
            "-m",
            "agent.cli.main",
            "run",
            "--config",
            str(tmp_path / "medic.yaml"),
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=30,
    )
    assert result.returncode == 2, result.stderr
    assert (
        f"agent.state_dir {agent.state_dir} is in use by another medic (pid {agent.proc.pid}, API {agent.url})"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    # the running agent's instance, address file and token are as they were; it still answers
    assert agent.instance("managed")["pid"] == managed and agent.instance("managed")["restarts"] == 0
    assert (agent.state_dir / "agent.json").read_bytes() == info
    assert (agent.state_dir / "admin.token").read_bytes() == token
    assert "instance_adopted" not in kinds(agent.events())
    assert agent.stop() == 0
    agent.start({"agent": FAST, "instances": []})  # once it stopped, the state dir is free again
