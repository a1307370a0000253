"""Online detection in a real agent: one leak finding for the leaking process, none for the stable one,
with a time-to-OOM against the configured limit; findings survive an agent restart."""

from __future__ import annotations

import os
import subprocess

import pytest

from support.compressed import DETECT
from support.procs import PYTHON, REPO, wait_until, workload_argv

pytestmark = pytest.mark.slow
LIMIT = 320 * 2**20


def config(leaky_pid: int) -> dict:
    return {
        "agent": {"interval": "0.2s", "slow_interval": "2s", "flush_interval": "0.3s"},
        "detect": DETECT,
        "instances": [
            {
                "name": "leaky",  # started by the test: its process outlives the agent's restart
                "match": {"pid": leaky_pid},
                "memory_limit": LIMIT,
            },
            {
                "name": "stable",
                "match": {"command": workload_argv("stable", "--size", "16Mi")},
                "memory_limit": LIMIT,
            },
        ],
    }


def test_one_leak_finding_with_time_to_oom(agent, workload):
    leaky = workload("leak", "--rate", "2Mi", "--every", "0.05s", "--cap", "200Mi")
    agent.start(config(leaky.pid))
    wait_until(lambda: agent.get("/api/v1/findings", kind="leak")["findings"], 90)
    findings = agent.get("/api/v1/findings")["findings"]
    leaks = [f for f in findings if f["kind"] == "leak"]
    assert [f["instance"] for f in leaks] == ["leaky"]
    assert not [f for f in findings if f["instance"] == "stable"]
    leak = leaks[0]
    evidence = leak["evidence"]
    assert leak["verdict"] == "leak" and leak["state"] == "open"
    assert evidence["limit_bytes"] == LIMIT
    slope = evidence["slope_bytes_per_second"]
    assert 1.0 * 2**20 < slope < 3.0 * 2**20, slope  # the workload leaks 2 MiB/s
    rss = agent.instance("leaky")["rss_bytes"]
    expected = (LIMIT - rss) / slope
    assert 0.5 * expected < evidence["time_to_oom_seconds"] < 1.5 * expected

    metrics = agent.get("/metrics")
    assert 'medic_findings{kind="leak",name="leaky",severity=' in metrics
    assert 'medic_time_to_oom_seconds{name="leaky"}' in metrics
    assert 'medic_leak_slope_bytes_per_second{name="leaky"}' in metrics
    opened = [e for e in agent.events(kind="finding_opened")]
    assert [e["instance"] for e in opened if e["data"]["finding"]["kind"] == "leak"] == ["leaky"]

    leaks_cli = subprocess.run(
        [PYTHON, "-m", "agent.cli.main", "leaks", "--url", agent.url],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=10,
    )
    assert leaks_cli.returncode == 0, leaks_cli.stderr
    rows = [line for line in leaks_cli.stdout.splitlines() if line.startswith("leaky")]
    leak_row = next(row for row in rows if row.split()[1] == "leak")
    assert "iB/h" in leak_row and leak_row.split()[2] == "leak"
    assert not any(line.startswith("stable") for line in leaks_cli.stdout.splitlines())

    assert agent.stop() == 0
    agent.start(config(leaky.pid))
    still = agent.get("/api/v1/findings", kind="leak")["findings"]
    assert [f["id"] for f in still] == [leak["id"]]  # restored (the same process), not re-opened


def test_a_leak_that_stops_is_resolved_although_its_flat_memory_is_no_longer_stored_each_tick(agent):
    """Unchanged values are stored sparingly; with short windows they must still fill every
    detection bucket, or the detectors see no data once growth stops and the finding never clears."""
    agent.start(
        {
            "agent": {"interval": "0.2s", "slow_interval": "2s", "flush_interval": "0.3s"},
            "detect": {
                "interval": "0.5s",
                "memory": {
                    "window": "6s",
                    "long_window": "12s",
                    "warmup": "1s",
                    "season": "2s",
                    "horizon": "30m",
                },
            },
            "instances": [
                {
                    "name": "capped",
                    "match": {
                        "command": workload_argv("leak", "--rate", "4Mi", "--every", "0.05s", "--cap", "80Mi")
                    },
                    "memory_limit": 100 * 2**20,
                }
            ],
        }
    )
    wait_until(lambda: agent.get("/api/v1/findings", kind="leak", state="open")["findings"], 60)
    resolved = wait_until(
        lambda: [e for e in agent.events(kind="finding_resolved") if e["data"]["finding"]["kind"] == "leak"],
        60,
    )
    assert resolved[0]["instance"] == "capped"
    assert "no steady growth" in resolved[0]["message"] or "levelling off" in resolved[0]["message"]
