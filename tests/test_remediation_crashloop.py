"""Crash loops in a real agent: a `command:` instance that dies a moment after each start gets a
`crash-loop` finding of its own and an escalation after K crashes, is then not relaunched (the
supervisor included) until a person clears it, and runs again once cleared. Its relaunch back-off
grows past `reset_after` on the way (1 s, 2 s, 4 s against 2 s): real uptimes still count every crash."""

from __future__ import annotations

import stat
import time

import pytest

from support.procs import PYTHON, wait_until

pytestmark = pytest.mark.slow
CRASHES = 4


def crashing(starts_file) -> list[str]:
    """Writes a line per start (the test's own count of launches), prints, and exits 3 after 0.3 s."""
    code = (
        "import sys, time\n"
        f"open({str(starts_file)!r}, 'a').write('start\\n')\n"
        "print('serving, for a moment', flush=True)\n"
        "time.sleep(0.3)\n"
        "sys.exit(3)\n"
    )
    return [PYTHON, "-c", code]


def config(starts_file) -> dict:
    return {
        "agent": {"interval": "0.2s", "slow_interval": "2s", "flush_interval": "0.3s"},
        "remediation": {
            "mode": "enforce",
            "interval": "0.3s",
            "ladder": {"crash_loop": {"max_restarts": CRASHES, "window": "10m", "reset_after": "2s"}},
        },
        "instances": [{"name": "crashy", "match": {"command": crashing(starts_file)}}],
    }


def starts(path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_crash_loop_is_found_escalated_held_and_released_by_a_person(agent, tmp_path):
    starts_file = tmp_path / "starts"
    agent.start(config(starts_file))

    def escalated() -> list[dict]:
        return agent.get("/api/v1/plan")["escalations"]

    wait_until(escalated, 60, interval=0.2)
    found = agent.get("/api/v1/findings", kind="crash-loop", instance="crashy")["findings"]
    assert len(found) == 1 and found[0]["severity"] == "critical"
    evidence = found[0]["evidence"]
    assert evidence["crashes"] >= CRASHES and evidence["longest_uptime_seconds"] < 2
    assert {r["exit_status"] for r in evidence["runs"]} == {3}
    assert escalated()[0]["code"] == "crash-loop" and "medic clear crashy" in escalated()[0]["hold"]
    kinds = [e["kind"] for e in agent.events()]
    assert "finding_opened" in kinds and "remediation_escalated" in kinds
    assert "instance_relaunch_held" in kinds

    held_at = starts(tmp_path / "starts")
    assert CRASHES <= held_at <= CRASHES + 1  # at most the launch already under way when it escalated
    time.sleep(10)  # the back-off (8 s by now) would have relaunched it meanwhile
    assert starts(starts_file) == held_at
    assert agent.instance("crashy")["status"] == "exited"
    assert "not relaunched" in agent.instance("crashy")["status_reason"]
    plan = agent.cli("plan")
    assert plan.returncode == 0 and "escalated: crashy" in plan.stdout and "medic clear crashy" in plan.stdout

    refused = agent.cli("clear", "crashy", "--token-file", "/dev/null", token=False)  # needs the admin token
    assert refused.returncode != 0 and starts(starts_file) == held_at
    cleared = agent.cli("clear", "crashy", "--token-file", str(agent.state_dir / "admin.token"))
    assert cleared.returncode == 0, cleared.stderr
    wait_until(lambda: starts(starts_file) > held_at, 15)
    wait_until(
        lambda: not agent.get("/api/v1/findings", kind="crash-loop", instance="crashy")["findings"], 10
    )
    events = agent.events()
    assert any(e["kind"] == "remediation_escalation_cleared" for e in events)
    assert any(e["kind"] == "finding_resolved" and e["instance"] == "crashy" for e in events)
    again = agent.cli("clear", "crashy", "--token-file", str(agent.state_dir / "admin.token"))
    assert again.returncode != 0 and "no escalation" in again.stderr

    log = agent.state_dir / "logs" / "crashy.log"  # the target's output, not medic's
    assert "serving, for a moment" in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert "serving, for a moment" not in agent.log.read_text().splitlines()
    assert f"(output: {log})" in agent.log.read_text()
