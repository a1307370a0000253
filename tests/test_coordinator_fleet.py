"""Two remediation agents in two processes share one budget, through `local` and through a real etcd.

`max_concurrent: 1` and six instances (three per agent), each asked to restart once: never more
than one restart in flight (checked from both ledgers and from the new processes' start times),
starts spaced by `min_interval`; and an agent killed while it holds the slot frees it after the TTL.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
import uuid
from itertools import pairwise
from pathlib import Path

import pytest

from remediation.coordinator.etcd import EtcdCoordinator
from remediation.coordinator.local import LocalCoordinator
from support.procs import PATIENCE, PYTHON, REPO, VERIFY_TIMEOUT, wait_until
from support.remediation import NEEDS_ETCD, etcd_server, silent_server

pytestmark = pytest.mark.slow
TTL = 3.0
MIN_INTERVAL = 0.8
STABLE_FOR = 0.3
CONFIG = {
    "mode": "enforce",
    "interval": "0.1s",
    "budget": {
        "max_concurrent": 1,
        "min_interval": f"{MIN_INTERVAL}s",
        "max_per_hour": None,
        "cooldown": "1h",
    },
    "plan": {"safety_margin": "1s", "restart_duration": "1s", "deadline_granularity": "1s"},
    "blockers": {"min_uptime": 0, "capacity": {"max_unavailable": 6}},
    "verify": {"timeout": VERIFY_TIMEOUT, "stable_for": f"{STABLE_FOR}s"},
    "coordinator": {"lease_ttl": f"{TTL}s", "fleet_ttl": "5s"},
}


@pytest.fixture(scope="module")
def etcd_url():
    with etcd_server() as url:
        yield url


@pytest.fixture(params=["local", pytest.param("etcd", marks=NEEDS_ETCD)])
def backend(request, tmp_path):
    """(coordinator argument for the agents, a client for the test to look with)."""
    if request.param == "local":
        path = tmp_path / "shared" / "coordinator.db"
        client = LocalCoordinator(path)
        yield f"local:{path}", client
    else:
        url = request.getfixturevalue("etcd_url")
        namespace = f"t{uuid.uuid4().hex[:8]}"
        client = EtcdCoordinator([url], namespace=namespace)  # the agents get the same namespace
        yield f"etcd:{url}", client
    client.close()


def start_agent(spawn, tmp_path: Path, agent: str, coordinator: str, instances: list[str], config=None):
    config = config or CONFIG
    argv = [
        PYTHON, "-m", "support.remediation", "agent", "--config", json.dumps(config), "--state", str(tmp_path / agent),
        "--agent", agent, "--coordinator", coordinator, "--instances", ",".join(instances), "--duration", "60",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    with open(tmp_path / f"{agent}.log", "wb") as log:  # the child keeps its own copy of the descriptor
        return spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def ledger(tmp_path: Path, agent: str, sql: str, args=()) -> list[tuple]:
    db = sqlite3.connect(tmp_path / agent / "medic.db")
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def namespaced(config: dict, namespace: str) -> dict:
    return {**config, "coordinator": {**config["coordinator"], "namespace": namespace}}


def test_two_agents_never_restart_two_instances_at_once(spawn, tmp_path, backend):
    coordinator, client = backend
    namespace = getattr(client, "namespace", "default")
    config = namespaced(CONFIG, namespace)
    a = start_agent(spawn, tmp_path, "agent-a", coordinator, ["a1", "a2", "a3"], config)
    b = start_agent(spawn, tmp_path, "agent-b", coordinator, ["b1", "b2", "b3"], config)
    for proc in (a, b):
        assert proc.wait(timeout=90) == 0, (tmp_path / "agent-a.log").read_text()[-3000:]

    actions = []
    for agent in ("agent-a", "agent-b"):
        actions += ledger(
            tmp_path, agent, "SELECT instance, started_at, finished_at, outcome, holder FROM remediation_actions "
            "WHERE action = 'restart'",
        )  # fmt: skip
    assert sorted(a[0] for a in actions) == ["a1", "a2", "a3", "b1", "b2", "b3"]
    assert all(a[3] == "succeeded" for a in actions), actions
    actions.sort(key=lambda a: a[1])
    for first, second in pairwise(actions):
        assert second[1] >= first[2], f"{second[0]} started while {first[0]} was in flight"
        assert second[1] - first[1] >= MIN_INTERVAL - 0.01
    assert {a[4] for a in actions} == {"agent-a", "agent-b"}  # both agents did their share

    # the kernel's view: the replacement processes started one by one, in the same order, each after the
    # one before had been verified up for `stable_for` (its restart finished before the next began).
    # (Kernel start times are boot time, a whole second, plus clock ticks: exact relative to each other,
    # up to a second off the wall clock. `min_interval` spaces the restarts' starts, checked above from
    # the ledger; a replacement is spawned once its old process has stopped, and a stop that takes
    # longer on a loaded machine moves one spawn later than the next, so spawns are not that far apart.)
    new_starts = {}
    for agent in ("agent-a", "agent-b"):
        for instance, start in ledger(
            tmp_path, agent, "SELECT instance, start_time FROM remediation_starts ORDER BY start_time"
        ):
            new_starts.setdefault(instance, []).append(start)
    assert all(len(starts) == 2 for starts in new_starts.values()), new_starts
    kernel = [new_starts[a[0]][1] for a in actions]
    assert kernel == sorted(kernel)
    tick = 0.02  # two clock ticks
    for (first, second), (spawned, next_spawned) in zip(pairwise(actions), pairwise(kernel)):
        assert next_spawned - spawned >= STABLE_FOR - tick, kernel
        assert next_spawned - spawned >= second[1] - first[2] - tick, (kernel, actions)
    for (instance, started, finished, _, _), start in zip(actions, kernel):
        assert started - 1.05 <= start <= finished + 0.05, (instance, started, finished, start)

    # and the coordinator agrees
    records = client.restarts(since=0)
    assert sorted(r.instance for r in records) == ["a1", "a2", "a3", "b1", "b2", "b3"]
    assert not any(r.in_flight for r in records)


def test_a_killed_agent_frees_its_slot_after_the_lease_ttl(spawn, tmp_path, backend):
    coordinator, client = backend
    namespace = getattr(client, "namespace", "default")
    with silent_server() as hung:
        holding = namespaced({**CONFIG, "drain": {"http": hung + "/drain", "timeout": "60s"}}, namespace)
        a = start_agent(spawn, tmp_path, "agent-a", coordinator, ["a1"], holding)
        wait_until(lambda: any(r.in_flight and r.holder == "agent-a" for r in client.restarts(since=0)), 20)
        b = start_agent(spawn, tmp_path, "agent-b", coordinator, ["b1"], namespaced(CONFIG, namespace))

        def blocked_by_a():
            try:
                rows = ledger(tmp_path, "agent-b", "SELECT code, reason FROM remediation_decisions")
            except sqlite3.Error:
                return False
            # the plan (or, at the lock, the budget) holds b1 back because a1 is in flight
            return any(code in ("scheduled", "max-concurrent") and "(a1)" in reason for code, reason in rows)

        wait_until(blocked_by_a, 20)
        killed_at = time.time()
        os.killpg(a.pid, signal.SIGKILL)
        a.wait()
        assert b.wait(timeout=60) == 0, (tmp_path / "agent-b.log").read_text()[-3000:]

    ((started, outcome),) = ledger(
        tmp_path, "agent-b", "SELECT started_at, outcome FROM remediation_actions WHERE action = 'restart'"
    )
    assert outcome == "succeeded"
    (expired,) = [r for r in client.restarts(since=0) if r.instance == "a1"]
    assert expired.outcome == "lease-expired"
    # a1's slot outlived its killed holder until its lease ran out (TTL after the last renewal) ...
    assert killed_at < expired.finished_at <= killed_at + TTL + 0.5
    # ... b1 did not start before that, and started soon after (etcd notices expiry up to ~1 s late)
    assert expired.finished_at - 0.05 <= started <= expired.finished_at + 3.0, (started, expired.finished_at)


@NEEDS_ETCD
def test_killing_the_leader_while_its_grants_are_out_never_doubles_the_budget(spawn, tmp_path, etcd_url):
    """agent-a leads and holds the only slot (a1, a drain that hangs); it has granted b1 and c1 their
    later slots. Killed there, it is replaced within the TTL; its grants count for nothing, the new
    leader grants again, and b1 and c1 restart one at a time, after a1's slot expired."""
    namespace = f"t{uuid.uuid4().hex[:8]}"
    client = EtcdCoordinator([etcd_url], namespace=namespace)
    gw, base = client.gateway, client.base
    try:
        with silent_server() as hung:
            holding = namespaced({**CONFIG, "drain": {"http": hung + "/drain", "timeout": "60s"}}, namespace)
            a = start_agent(spawn, tmp_path, "agent-a", f"etcd:{etcd_url}", ["a1"], holding)
            wait_until(
                lambda: any(r.in_flight and r.holder == "agent-a" for r in client.restarts(since=0)), 20
            )
            old = gw.get(base + "control/leader")
            assert json.loads(old["value"])["agent"] == "agent-a"
            b = start_agent(
                spawn, tmp_path, "agent-b", f"etcd:{etcd_url}", ["b1"], namespaced(CONFIG, namespace)
            )
            c = start_agent(
                spawn, tmp_path, "agent-c", f"etcd:{etcd_url}", ["c1"], namespaced(CONFIG, namespace)
            )

            def granted_by_a():
                docs = [gw.get(base + f"grants/agent-{x}") for x in "bc"]
                return all(
                    d and json.loads(d["value"])[0]["revision"] == old["create_revision"] for d in docs
                )

            wait_until(granted_by_a, 20)  # both followers hold a grant from agent-a, for later
            killed_at = time.time()
            os.killpg(a.pid, signal.SIGKILL)
            a.wait()
            while (new := gw.get(base + "control/leader")) is None or new["create_revision"] == old[
                "create_revision"
            ]:
                assert time.time() - killed_at < TTL + 5 * PATIENCE, "no new leader"
                time.sleep(0.02)
            failover = time.time() - killed_at
            assert json.loads(new["value"])["agent"] in ("agent-b", "agent-c")
            for proc, name in ((b, "agent-b"), (c, "agent-c")):
                assert proc.wait(timeout=60) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        records = client.restarts(since=0)
        client.close()
    # replaced within the lease TTL (+ etcd's expiry check, about a second, + one 0.1 s step; a busy
    # host delays the followers' steps by seconds)
    assert failover <= TTL + 1.5 * PATIENCE, failover
    by_instance = {r.instance: r for r in records}
    assert by_instance["a1"].outcome == "lease-expired"
    done = sorted((by_instance[i] for i in ("b1", "c1")), key=lambda r: r.started_at)
    assert [r.outcome for r in done] == ["succeeded", "succeeded"]
    assert done[0].started_at >= by_instance["a1"].finished_at - 0.05  # never two in flight
    assert done[1].started_at >= done[0].finished_at
