"""A coordinator at work against a real etcd is quiet. It says nothing at INFO: httpx's one line per
request is the agent's logging setup's to silence, and medic's coordinator keeps its steady state to
DEBUG. And a follower holds nothing open in etcd between steps (no connection, no watch stream: each
costs etcd tens of KiB per agent): one read a step answers all of that step's questions."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.cli.run import QUIET_LOGGERS, configure_logging
from remediation.coordinator.base import SlotRequest
from remediation.coordinator.etcd import EtcdCoordinator
from remediation.coordinator.etcd_store import RECENT
from remediation.model import Decision, FleetEntry
from support.procs import wait_until
from support.remediation import NEEDS_ETCD, etcd_server


@pytest.fixture
def logging_setup():
    """Run `configure_logging` and put the loggers' levels back after (pytest owns the root's handlers,
    so `basicConfig` adds none here)."""
    saved = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    root = logging.getLogger().level
    yield configure_logging
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)
    logging.getLogger().setLevel(root)


def test_the_logging_setup_quiets_the_http_libraries():
    """In a fresh interpreter, as `medic run` starts: the root logger has no handler yet."""
    code = (
        "import logging\n"
        "from agent.cli.run import configure_logging\n"
        "configure_logging('info')\n"
        "for name in ('httpx', 'httpcore', 'apscheduler', 'medic.remediation'):\n"
        "    logging.getLogger(name).info('hello from %s', name)\n"
        "logging.getLogger('httpx').warning('httpx warns')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert [line.split(" INFO ")[1] for line in lines if " INFO " in line] == ["hello from medic.remediation"]
    assert any(line.endswith("WARNING httpx warns") for line in lines)


def steady_state(url: str) -> None:
    """What an agent's coordinator does between incidents and through one restart."""
    coordinator = EtcdCoordinator([url], namespace=f"q{uuid.uuid4().hex[:8]}")
    try:
        for _ in range(3):
            coordinator.publish("agent-a", [FleetEntry("serving-1", "f", "agent-a")], 60)
            coordinator.fleet()
            coordinator.restarts(since=0)
        request = SlotRequest(instance="serving-1", fleet="f", holder="agent-a", ttl=5.0)
        result = coordinator.acquire(request, lambda records, now: Decision.allow("budget", "test"))
        assert result.granted
        coordinator.renew(result.grant)
        coordinator.release(result.grant, "succeeded")
    finally:
        coordinator.close()


@NEEDS_ETCD
@pytest.mark.slow
def test_the_etcd_coordinator_logs_nothing_at_info(logging_setup, caplog):
    with etcd_server() as url:
        caplog.set_level(logging.INFO)
        steady_state(url)
        said = {r.name for r in caplog.records}
        assert "httpx" in said  # the test sees httpx when nothing quiets it
        caplog.clear()

        logging_setup("info")
        caplog.set_level(logging.INFO)
        steady_state(url)
        assert [f"{r.name}: {r.getMessage()}" for r in caplog.records] == []


def etcd_figures(url: str) -> dict[str, float]:
    """The Txn calls etcd has started and the watch streams it holds, from its own /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    figures = {"txns": 0.0, "watch_streams": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "grpc_server_started_total" and sample.labels.get("grpc_method") == "Txn":
                figures["txns"] += sample.value
            elif sample.name == "etcd_debugging_mvcc_watch_stream_total":
                figures["watch_streams"] = sample.value
    return figures


def open_connections_to(url: str) -> int:
    port = int(url.rsplit(":", 1)[1])
    held = psutil.Process().net_connections(kind="tcp")
    return sum(1 for c in held if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


@NEEDS_ETCD
@pytest.mark.slow
def test_a_follower_holds_nothing_open_and_reads_once_a_step():
    namespace = f"q{uuid.uuid4().hex[:8]}"
    with etcd_server() as url:
        others = open_connections_to(url)  # the fixture's own
        leader = EtcdCoordinator([url], namespace=namespace)
        follower = EtcdCoordinator([url], namespace=namespace)
        try:
            assert leader.campaign("agent-a", ttl=10) is not None
            # the leader's stream on fleet/, which it reads every step, is the one connection it holds
            assert open_connections_to(url) == others + 1
            streams = etcd_figures(url)["watch_streams"]

            def follower_step(wanting: bool) -> None:  # what a follower asks in one engine step
                follower.publish("agent-b", [FleetEntry("serving-2", "f", "agent-b")], 60)
                assert follower.campaign("agent-b", ttl=10) is None
                assert follower.leader() == "agent-a"
                assert follower.fleet_pause() is None
                if wanting:
                    assert follower.grants("agent-b") == []

            def txns_of_a_step(wanting: bool) -> float:
                time.sleep(RECENT)  # the step before's copy has aged, as between two engine steps
                before = etcd_figures(url)["txns"]
                follower_step(wanting)
                return etcd_figures(url)["txns"] - before

            follower_step(wanting=True)  # its first: the entry written
            assert txns_of_a_step(wanting=False) == 1  # steady: one read answers the step's questions
            assert txns_of_a_step(wanting=True) == 2  # and one more for its grants while it wants a restart
            assert etcd_figures(url)["watch_streams"] == streams
            assert open_connections_to(url) == others + 1

            pause = {"reason": "change freeze", "by": "oncall", "since": 0.0, "until": None}
            follower.set_fleet_pause(pause)  # what it writes, it reads at once
            assert (follower.fleet_pause() or {}).get("reason") == "change freeze"
            leader.set_fleet_pause(None)  # another agent's write: seen within a second
            wait_until(lambda: follower.fleet_pause() is None, timeout=5)
        finally:
            follower.close()
            leader.close()
