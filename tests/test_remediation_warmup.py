"""The warm-up gate in the loop, in a real agent: a server slow for its first requests after each start
holds its restart slot until K requests in a row answer within the target, and the action's
`warmup` stage says after how many requests it was warm."""

from __future__ import annotations

import pytest

from support.procs import PYTHON, REPO, free_port, wait_until

pytestmark = pytest.mark.slow
SLOW_FIRST, SLOW = 12, 0.3  # the first 12 requests of each process take 300 ms, then ~10 ms


def config(port: int, requests_dir) -> dict:
    app = str(REPO / "tests" / "support" / "latency_app.py")
    argv = [PYTHON, app, "--mode", "slowstart", "--slow-first", str(SLOW_FIRST), "--slow", str(SLOW)]
    return {
        "agent": {"interval": "0.2s", "slow_interval": "2s", "flush_interval": "0.3s"},
        "remediation": {
            "mode": "enforce",
            "interval": "0.3s",
            "budget": {"min_interval": "0s", "cooldown": "0s", "max_per_hour": None},
            "blockers": {"min_uptime": "0s"},
            "verify": {
                "timeout": "60s",
                "stable_for": "0.5s",
                "warmup": {
                    "requests": str(requests_dir),
                    "url": f"http://127.0.0.1:{port}/",
                    "target": "100ms",
                    "consecutive": 3,
                    "deadline": "30s",
                },
            },
        },
        "instances": [{"name": "server", "match": {"command": [*argv, "--port", str(port)]}}],
    }


def test_a_slow_starting_server_holds_its_slot_until_warm(agent, tmp_path):
    requests_dir = tmp_path / "warmup"
    requests_dir.mkdir()
    (requests_dir / "work.http").write_text("GET /work\nAccept: application/json\n")
    agent.start(config(free_port(), requests_dir))
    wait_until(lambda: agent.instance("server")["status"] == "up", 20)
    asked = agent.cli(
        "restart",
        "server",
        "--reason",
        "warm-up test",
        "--token-file",
        str(agent.state_dir / "admin.token"),
    )
    assert asked.returncode == 0, asked.stderr

    def in_warmup() -> bool:
        flights = agent.get("/api/v1/plan")["restarts_in_flight"]
        return any(f["stage"] == "verify" and any(s["stage"] == "act" for s in f["stages"]) for f in flights)

    wait_until(in_warmup, 30, interval=0.1)  # restarted, the slot still held while it warms up
    shown = agent.cli("plan")
    assert "restarting now: server (action" in shown.stdout, shown.stdout

    def finished() -> dict | None:
        actions = agent.get("/api/v1/actions", instance="server")["actions"]
        waiting = ("requested", "held", "running")  # the request's action, until its restart ends
        return next((a for a in actions if a["action"] == "restart" and a["outcome"] not in waiting), None)

    action = wait_until(finished, 60, interval=0.2)
    assert action["outcome"] == "succeeded", action["stages"]
    stages = {s["stage"]: s for s in action["stages"]}
    assert list(stages) == ["evidence", "act", "verify", "warmup"]
    warm = stages["warmup"]
    assert warm["ok"] and warm["code"] == "warm"
    assert warm["data"]["requests"] >= SLOW_FIRST + 3  # the slow ones, then 3 fast in a row
    assert f"after {warm['data']['requests']} requests" in warm["reason"]
    assert warm["seconds"] >= SLOW_FIRST * SLOW * 0.9  # the slot was held through the slow requests
    wait_until(lambda: not agent.get("/api/v1/plan")["in_progress"], 5)  # released once warm
    listed = agent.cli("actions", "server")
    assert listed.returncode == 0 and f"warm after {warm['data']['requests']} requests" in listed.stdout
