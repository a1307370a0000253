"""Two real agents of one workload sharing a coordinator (a local SQLite file, a real etcd): the
first has learned the workload's profile from its instance's earlier lifetime in its store and
publishes it; the second, new, with an empty store, gets it at start (`priors_loaded`, source `peers`)."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import pytest

from agent.core.records import Sample
from agent.detect.model import RSS, START_TIME
from agent.detect.params import DetectParams
from agent.state.store import Store
from remediation.coordinator.base import Coordinator
from remediation.coordinator.etcd import EtcdCoordinator
from remediation.coordinator.local import LocalCoordinator
from support.agent_runner import AgentRunner
from support.procs import wait_until, workload_argv
from support.remediation import NEEDS_ETCD, etcd_server

SCALE = 180.0  # a day in 8 minutes (examples/lab.yaml)
PARAMS = DetectParams().scaled(SCALE)


def _config(name: str, coordinator: dict) -> dict:
    return {
        "agent": {"interval": "1s", "slow_interval": "1s", "flush_interval": "1s", "time_scale": SCALE},
        "detect": {"interval": "1s"},
        "remediation": {"mode": "dry-run", "coordinator": coordinator},
        "instances": [
            {
                "name": name,
                "labels": {"fleet": "web"},
                "match": {"command": workload_argv("stable", "--size", "16Mi")},
                "memory_limit": "512Mi",
            }
        ],
    }


def _seed_earlier_lifetime(state_dir: Path, instance: str, until: float) -> None:
    """Four (compressed) days of the instance's previous process: a daily cycle of ±8 %."""
    state_dir.mkdir(mode=0o700, parents=True)
    store = Store(state_dir)
    rnd = random.Random(7)
    start = until - 4.2 * PARAMS.season
    samples = []
    ts = start
    while ts < until:
        level = 40e6 * (1 + 0.08 * math.sin(2 * math.pi * ts / PARAMS.season)) * (1 + rnd.gauss(0, 0.002))
        samples += [Sample(instance, RSS, ts, level), Sample(instance, START_TIME, ts, start)]
        ts += 1.0
    store.add_samples(samples)
    store.flush()
    store.close()


@pytest.fixture(params=["local", pytest.param("etcd", marks=NEEDS_ETCD)])
def shared(request, tmp_path):
    """(the agents' `remediation.coordinator`, a client of it for the test)."""
    if request.param == "local":
        directory = tmp_path / "shared"
        directory.mkdir(mode=0o700)
        path = directory / "coordinator.db"
        client: Coordinator = LocalCoordinator(path)
        yield {"backend": "local", "local": {"path": str(path)}}, client
        client.close()
        return
    with etcd_server() as url:
        client = EtcdCoordinator([url], namespace="peers")
        yield {"backend": "etcd", "namespace": "peers", "etcd": {"endpoints": [url]}}, client
        client.close()


@pytest.mark.slow
def test_a_new_agent_of_the_workload_gets_the_first_agents_profile_at_start(agent, spawn, tmp_path, shared):
    section, coordinator = shared
    _seed_earlier_lifetime(agent.state_dir, "web-a", time.time() - 5)
    agent.start(_config("web-a", section))
    wait_until(lambda: coordinator.get_profiles(["web"]), 90, interval=1.0)
    published = coordinator.get_profiles(["web"])["web"]
    assert published["days"] >= 3 and len(published["daily"]) == round(PARAMS.season / PARAMS.bucket)
    assert published["by"].endswith(f":{agent.proc.pid}")

    (tmp_path / "b").mkdir()
    second = AgentRunner(spawn, tmp_path / "b")
    try:
        second.start(_config("web-b", section))

        def loaded() -> list[dict]:
            return [e for e in second.events(kind="priors_loaded") if e["data"].get("workloads")]

        wait_until(loaded, 30, interval=0.5)
        fields = loaded()[0]["data"]
        assert fields["workloads"] == ["web"] and fields["source"] == "peers"
        assert not second.events(kind="peers_unavailable")
    finally:
        second.close()
