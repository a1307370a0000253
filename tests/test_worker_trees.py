"""An instance is a process tree: real worker-based servers (uvicorn `--workers 2`, gunicorn `--workers 2`)
and real forking processes watched by a real agent.

A worker's leak is a finding on its instance, judged against the instance's limit and naming the
worker; a gunicorn matched by its command line is one instance (its workers carry the same command
line); a killed worker is a worker's restart, not the instance's; two specs never watch one process;
a tree of a thousand children is bounded with an event; orphaned workers are reported and never
adopted as a server; a restart restarts the server with its workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from test_dashboard_web import Dom, dump_dom, needs_chromium

from support.compressed import DETECT, FAST
from support.procs import PYTHON, REPO, free_port, wait_ready, wait_until

pytestmark = pytest.mark.slow
SUPPORT = REPO / "tests" / "support"
FORKER = str(SUPPORT / "forker.py")
MiB = 2**20


def uvicorn_argv(workers: int = 2) -> list[str]:
    return [
        PYTHON, "-m", "uvicorn", "--workers", str(workers), "--port", "0",
        "--app-dir", str(SUPPORT), "--log-level", "warning", "worker_app:app",
    ]  # fmt: skip


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def forker(spawn, children: int, tag: str) -> tuple[subprocess.Popen, list[int]]:
    proc = spawn([PYTHON, FORKER, "--children", str(children), tag], stdout=subprocess.PIPE, text=True)
    words = wait_ready(proc, timeout=60)
    return proc, [int(word) for word in words[2:]]


def kinds(agent, kind: str, instance: str | None = None) -> list[dict]:
    return [e for e in agent.events(kind=kind) if instance is None or e["instance"] == instance]


def test_a_worker_leak_is_found_on_its_instance_against_the_shared_limit_naming_the_worker(agent, tmp_path):
    limit = 360 * MiB
    leak_dir = tmp_path / "leak"
    leak_dir.mkdir()
    agent.start(
        {
            "agent": FAST,
            "detect": DETECT,
            "instances": [
                {
                    "name": "uv",
                    "match": {
                        "command": uvicorn_argv(),
                        "env": {
                            "LEAK_DIR": str(leak_dir),
                            "LEAK_RATE": str(MiB),
                            "LEAK_EVERY": "0.5",
                            "LEAK_CAP": str(240 * MiB),
                        },
                    },
                    "memory_limit": limit,
                }
            ],
        }
    )
    leaker = int(wait_until(lambda: (leak_dir / "leaker").exists() and (leak_dir / "leaker").read_text(), 60))
    detail = wait_until(lambda: (d := agent.instance("uv")).get("workers", 0) >= 2 and d, 60)
    processes = agent.get("/api/v1/instances/uv")["instance"]["processes"]
    assert processes[0]["role"] == "server" and processes[0]["pid"] == detail["pid"]
    assert leaker in [p["pid"] for p in processes if p["role"] == "worker"]
    assert all(
        "--multiprocessing-fork" in p["command"] or "resource_tracker" in p["command"] for p in processes[1:]
    )

    wait_until(lambda: agent.get("/api/v1/findings", kind="leak")["findings"], 150)
    leak = agent.get("/api/v1/findings", kind="leak")["findings"][0]
    assert leak["instance"] == "uv"
    evidence = leak["evidence"]
    assert evidence["limit_bytes"] == limit  # the instance's limit: the server and all its workers
    assert evidence["process"]["pid"] == leaker and evidence["process"]["role"] == "worker"
    assert evidence["process"]["growth_bytes"] > 10 * MiB
    assert f"it grows in worker pid {leaker}" in leak["summary"]
    assert "in the memory of its" in leak["summary"] and "rss_bytes" not in leak["summary"]
    opened = [e for e in kinds(agent, "finding_opened", "uv") if e["data"]["finding"]["kind"] == "leak"]
    assert f"worker pid {leaker}" in opened[0]["message"]
    assert opened[0]["message"].count("confidence") == 1  # the summary said once

    detail = agent.instance("uv")
    assert detail["memory_source"] == "pss" and detail["restarts"] == 0
    assert detail["memory_bytes"] > detail["rss_bytes"]  # the workers' memory is the instance's
    metrics = agent.get("/metrics")
    assert 'medic_tree_memory_bytes{name="uv"}' in metrics and 'medic_tree_processes{name="uv"}' in metrics
    assert "pid=" not in metrics  # a per-process label would make a new series at every restart

    shown = agent.cli("status", "uv")
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if line.split()[:2] == [str(leaker), "worker"])
    assert "multiprocessing-fork" in row
    assert "server + workers" in shown.stdout or "PSS" in shown.stdout
    fleet = agent.cli("status")
    assert fleet.returncode == 0 and "PROCS" in fleet.stdout.splitlines()[0]


def gunicorn(spawn, port: int, workers: int = 2) -> subprocess.Popen:
    argv = [
        PYTHON, "-m", "gunicorn", "--workers", str(workers), "--bind", f"127.0.0.1:{port}",
        "--chdir", str(SUPPORT), "--graceful-timeout", "2", "worker_app:wsgi",
    ]  # fmt: skip
    proc = spawn(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    wait_until(answers, 60, interval=0.2)
    return proc


def test_gunicorn_matched_by_its_command_line_is_one_instance_and_a_killed_worker_is_the_worker_restart(
    agent, spawn
):
    port = free_port()
    master = gunicorn(spawn, port)
    agent.start(
        {
            "agent": FAST,
            "instances": [
                {"name": "gu", "match": {"cmdline": f"gunicorn .*127\\.0\\.0\\.1:{port}", "select": "all"}},
            ],
        }
    )
    detail = wait_until(lambda: (d := agent.instance("gu-0")).get("workers") == 2 and d, 30)
    assert detail["pid"] == master.pid  # the master, never a worker with the same command line
    names = [i["name"] for i in agent.get("/api/v1/instances")["instances"]]
    assert names == ["gu-0"]  # its workers are in its tree, not instances of their own
    workers = [p["pid"] for p in agent.get("/api/v1/instances/gu-0")["instance"]["processes"][1:]]

    os.kill(workers[0], signal.SIGKILL)  # gunicorn replaces it: a worker's restart
    changed = wait_until(
        lambda: [
            e for e in kinds(agent, "instance_workers_changed", "gu-0") if workers[0] in e["data"]["ended"]
        ],
        30,
    )
    assert "the server" in changed[0]["message"]
    wait_until(lambda: agent.instance("gu-0").get("workers") == 2, 30)
    detail = agent.instance("gu-0")
    assert detail["pid"] == master.pid and detail["restarts"] == 0 and detail["status"] == "up"
    assert detail["worker_restarts"] >= 1
    assert not kinds(agent, "instance_restarted")
    assert [i["name"] for i in agent.get("/api/v1/instances")["instances"]] == ["gu-0"]


def test_two_specs_never_watch_one_process(agent, spawn):
    server, children = forker(spawn, 2, f"overlap-{os.getpid()}")
    agent.start(
        {
            "agent": FAST,
            "instances": [
                {"name": "by-pid", "match": {"pid": server.pid}},
                {"name": "by-regex", "match": {"cmdline": f"forker\\.py --children 2 overlap-{os.getpid()}"}},
                {"name": "one-worker", "match": {"pid": children[0]}, "memory_limit": "1Gi"},
            ],
        }
    )
    wait_until(lambda: agent.instance("by-pid")["status"] == "up", 20)
    overlap = wait_until(lambda: kinds(agent, "instance_overlap", "by-regex"), 20)
    assert overlap[0]["data"]["other"] == "by-pid" and f"pid {server.pid}" in overlap[0]["message"]
    assert agent.instance("by-regex")["status"] != "up"
    assert "watched by instance 'by-pid'" in agent.instance("by-regex")["status_reason"]
    # a worker that another instance watches itself stays that one's, and leaves the tree above it
    wait_until(lambda: kinds(agent, "instance_overlap", "one-worker"), 20)
    tree = agent.get("/api/v1/instances/by-pid")["instance"]["processes"]
    assert [p["pid"] for p in tree] == [server.pid, children[1]]
    assert agent.instance("one-worker")["pid"] == children[0]
    assert len(kinds(agent, "instance_overlap")) == 2  # said once each, not at every tick


def test_a_thousand_children_are_bounded_with_one_event_and_the_agent_carries_on(agent, spawn):
    server, _ = forker(spawn, 1000, "bomb")
    agent.start({"agent": FAST, "instances": [{"name": "bomb", "match": {"pid": server.pid}}]})
    capped = wait_until(lambda: kinds(agent, "instance_tree_capped", "bomb"), 60)
    assert capped[0]["data"] == {"max_children": 256, "not_followed": 744}
    detail = wait_until(lambda: (d := agent.instance("bomb")).get("workers") == 256 and d, 30)
    assert detail["workers_not_followed"] == 744 and detail["status"] == "up"
    wait_until(lambda: agent.instance("bomb")["latest"].get("tree_processes") == 257, 30)
    assert len(kinds(agent, "instance_tree_capped")) == 1
    assert agent.get("/healthz")["status"] == "ok"


def test_orphaned_workers_are_reported_and_never_adopted_as_the_server(agent, spawn):
    tag = f"orphans-{os.getpid()}"
    server, children = forker(spawn, 2, tag)
    try:
        agent.start(
            {
                "agent": FAST,
                "instances": [{"name": "srv", "match": {"cmdline": f"forker\\.py --children 2 {tag}"}}],
            }
        )
        detail = wait_until(lambda: (d := agent.instance("srv")).get("workers") == 2 and d, 20)
        assert detail["pid"] == server.pid  # its children match the regex too, and are its workers
        os.kill(server.pid, signal.SIGKILL)  # the server dies; its workers run on, reparented
        server.wait(timeout=10)
        orphans = wait_until(lambda: kinds(agent, "instance_orphans", "srv"), 40)
        assert sorted(e["data"]["pid"] for e in orphans) == sorted(children)
        assert all(alive(pid) for pid in children)
        detail = agent.instance("srv")
        assert detail["status"] == "down" and detail["pid"] == server.pid
        assert not kinds(agent, "instance_restarted")  # no worker became "the server" of the instance
    finally:
        for pid in children:  # orphans leave the session's group when their leader is gone
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_restart_restarts_the_server_and_its_workers_together(agent):
    agent.start(
        {
            "agent": FAST,
            "instances": [{"name": "uv", "match": {"command": uvicorn_argv()}}],
            "remediation": {"mode": "enforce"},
        }
    )
    before = wait_until(lambda: (d := agent.instance("uv")).get("workers", 0) >= 2 and d, 60)
    old = [p["pid"] for p in agent.get("/api/v1/instances/uv")["instance"]["processes"]]
    done = agent.cli("restart", "uv", "--force", "--reason", "worker tree test")
    assert done.returncode == 0, done.stderr
    after = wait_until(
        lambda: (d := agent.instance("uv"))["restarts"] == 1 and d.get("workers", 0) >= 2 and d, 60
    )
    assert after["pid"] != before["pid"]
    new = [p["pid"] for p in agent.get("/api/v1/instances/uv")["instance"]["processes"]]
    assert not set(old) & set(new)
    wait_until(lambda: not any(alive(pid) for pid in old), 20)  # no worker of the old server left behind
    assert not kinds(agent, "instance_orphans")


MEMORY_ROOT = Path("/sys/fs/cgroup/memory")  # cgroup v1 memory controller


@pytest.fixture
def memory_group():
    """A fresh v1 memory cgroup with a 512 MiB limit, removed at teardown (its processes moved out first)."""
    if os.geteuid() != 0 or not (MEMORY_ROOT / "memory.limit_in_bytes").exists():
        pytest.skip("needs root and the cgroup v1 memory controller")
    group = MEMORY_ROOT / f"medic-tree-{os.getpid()}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(512 * MiB))
    yield group
    for pid in (group / "cgroup.procs").read_text().split():
        try:
            (MEMORY_ROOT / "cgroup.procs").write_text(pid)
        except OSError:
            pass  # it exited meanwhile
    wait_until(lambda: not (group / "cgroup.procs").read_text().split(), 10)
    group.rmdir()


@pytest.mark.root
def test_an_instance_that_owns_its_cgroup_is_judged_on_the_cgroup_and_its_limit(agent, spawn, memory_group):
    tag = f"cgroup-{os.getpid()}"
    argv = ["sh", "-c", f"echo $$ > {memory_group}/cgroup.procs && exec {PYTHON} {FORKER} --children 2 {tag}"]
    server = spawn(argv, stdout=subprocess.PIPE, text=True)
    wait_ready(server, timeout=30)
    agent.start({"agent": FAST, "instances": [{"name": "cg", "match": {"pid": server.pid}}]})
    detail = wait_until(lambda: (d := agent.instance("cg")).get("memory_source") == "cgroup" and d, 30)
    assert detail["workers"] == 2
    assert (detail["memory_limit_source"], detail["memory_limit_bytes"]) == ("cgroup", 512 * MiB)
    latest = detail["latest"]
    assert latest["tree_memory_bytes"] == latest["cgroup_memory_working_set_bytes"]
    # another process in the cgroup: the cgroup is no longer the instance's alone
    stranger = spawn(["sh", "-c", f"echo $$ > {memory_group}/cgroup.procs && exec sleep 600"])
    wait_until(lambda: agent.instance("cg").get("memory_source") == "pss", 30)
    stranger.kill()


@needs_chromium
def test_the_dashboard_lists_the_processes_of_an_instance(agent, tmp_path):
    tag = f"dashboard-{os.getpid()}"
    agent.start(
        {
            "agent": FAST,
            "instances": [{"name": "srv", "match": {"command": [PYTHON, FORKER, "--children", "2", tag]}}],
        }
    )
    detail = wait_until(lambda: (d := agent.instance("srv")).get("workers") == 2 and d, 30)
    wait_until(lambda: agent.instance("srv")["latest"].get("tree_memory_bytes"), 30)
    dom = Dom(dump_dom(agent.url + "/#instance=srv", tmp_path / "profile"))
    rows = dom.find("tr", "process-server") + dom.find("tr", "process-worker")
    assert len(rows) == 3 and str(detail["pid"]) in rows[0]["text"] and "server" in rows[0]["text"]
    assert all("worker" in row["text"] and tag in row["text"] for row in rows[1:])
    facts = " ".join(e["text"] for e in dom.find("div", "fact"))
    assert "server + workers" in facts
    assert dom.find("polyline", "series-tree")  # the instance's memory beside the server's RSS
