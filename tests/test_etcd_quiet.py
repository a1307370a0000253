"""A coordinator at work against a real etcd says nothing at INFO: httpx's one line per request is
the agent's logging setup's to silence, and medic's coordinator keeps its steady state to DEBUG."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid

import pytest

from agent.cli.run import QUIET_LOGGERS, configure_logging
from remediation.coordinator.base import SlotRequest
from remediation.coordinator.etcd import EtcdCoordinator
from remediation.model import Decision, FleetEntry
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
