"""After a restart the time to OOM is unknown until the new process is measured: in a real agent, a
leaking instance with a projected OOM is restarted, and from the moment /metrics shows the new
process no scrape carries a time to OOM for it (none of the old process's, never 0) until a finding
about the new process opens; the old process's findings resolve at once ("the process restarted")."""

from __future__ import annotations

import time

import httpx
import pytest

from support.compressed import DETECT, FAST, remediation
from support.procs import wait_until, workload_argv

pytestmark = pytest.mark.slow
LIMIT = 320 * 2**20


def scrape(agent) -> tuple[float | None, float | None]:
    """(the start time of leaky's process, its time to OOM) from one scrape; None when absent."""
    text = httpx.get(f"{agent.url}/metrics", timeout=5).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        for family in ("medic_instance_start_time_seconds", "medic_time_to_oom_seconds"):
            if line.startswith(f'{family}{{name="leaky"}}'):
                found[family] = float(line.split()[-1])
    return found.get("medic_instance_start_time_seconds"), found.get("medic_time_to_oom_seconds")


def measured_anew(agent, old_start: float) -> bool:
    """Whether an open memory finding of leaky was measured on a process started after `old_start`."""
    findings = agent.get("/api/v1/findings", instance="leaky")["findings"]
    return any((f["evidence"].get("lifetime_start") or 0) > old_start + 1 for f in findings)


def test_the_time_to_oom_is_unknown_after_a_restart_until_measured(agent):
    agent.start(
        {
            "agent": FAST,
            "detect": DETECT,
            "remediation": remediation("enforce", verify={"timeout": "10s", "stable_for": "0.5s"}),
            "instances": [
                {
                    "name": "leaky",
                    "match": {
                        "command": workload_argv(
                            "leak", "--rate", "4Mi", "--every", "0.05s", "--cap", "300Mi"
                        )
                    },
                    "memory_limit": LIMIT,
                }
            ],
        }
    )
    old_start, ttoom = wait_until(
        lambda: (found := scrape(agent))[1] is not None and found, 120, interval=0.2
    )
    assert ttoom > 0
    asked = agent.cli("restart", "leaky", "--force", "--reason", "measure the new process")
    assert asked.returncode == 0, asked.stderr  # started, or already under way by its plan

    seen_new = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        start, ttoom = scrape(agent)
        if start is not None and start > old_start + 1:  # the new process
            if ttoom is not None:  # measured again: a finding about the new process
                assert ttoom > 0 and measured_anew(agent, old_start), (
                    f"a time to OOM ({ttoom}s) not measured anew"
                )
                break
            seen_new += 1
        time.sleep(0.1)
    assert seen_new >= 5, "the new process was scraped often enough before it was measured"
    resolved = [e for e in agent.events(kind="finding_resolved") if "the process restarted" in e["message"]]
    assert resolved, "the old process's findings resolve as soon as the new one is seen"
