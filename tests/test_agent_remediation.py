"""Remediation end to end in a real agent: a leaking managed instance is restarted before its limit in
enforce mode, only planned in dry-run, and left alone while paused (then restarted after resume)."""

from __future__ import annotations

import pytest

from support.compressed import DETECT, remediation
from support.procs import wait_until, workload_argv

pytestmark = pytest.mark.slow
LIMIT = 320 * 2**20


def config(mode: str) -> dict:
    return {
        "agent": {"interval": "0.2s", "slow_interval": "2s", "flush_interval": "0.3s"},
        "detect": DETECT,
        "remediation": remediation(
            mode, verify={"timeout": "10s", "stable_for": "1s"}, ladder={"clear_check": "2m"}
        ),
        "instances": [
            {
                "name": "leaky",
                "labels": {"fleet": "f"},
                "match": {
                    "command": workload_argv("leak", "--rate", "4Mi", "--every", "0.05s", "--cap", "300Mi")
                },
                "memory_limit": LIMIT,
            },
            {
                "name": "stable",
                "labels": {"fleet": "f"},
                "match": {"command": workload_argv("stable", "--size", "16Mi")},
                "memory_limit": LIMIT,
            },
        ],
    }


def restarts(agent, name: str) -> list[dict]:
    return [e for e in agent.events(kind="instance_restarted") if e["instance"] == name]


def test_enforce_restarts_the_leak_before_its_limit(agent):
    agent.start(config("enforce"))
    first_pid = agent.instance("leaky")["pid"]
    wait_until(lambda: restarts(agent, "leaky"), 120)
    assert agent.instance("leaky")["pid"] != first_pid
    peak = max(
        v for _, v in agent.get("/api/v1/instances/leaky/series", metric="rss_bytes", since="10m")["points"]
    )
    assert peak < LIMIT
    assert not restarts(agent, "stable")
    actions = agent.get("/api/v1/actions")["actions"]
    assert [a["instance"] for a in actions] == ["leaky"]
    plan = agent.cli("plan", token=False)
    assert plan.returncode == 0 and "mode: enforce" in plan.stdout


def test_dry_run_only_plans(agent):
    agent.start(config("dry-run"))
    first_pid = agent.instance("leaky")["pid"]

    def planned() -> bool:
        step = agent.get("/api/v1/plan").get("step") or {}
        return any(e["instance"] == "leaky" for e in (step.get("plan") or {}).get("entries", []))

    wait_until(planned, 90)
    wait_until(
        lambda: any(
            e["kind"].startswith("remediation_") and "dry-run" in e["message"] for e in agent.events()
        ),
        60,
    )
    assert agent.instance("leaky")["pid"] == first_pid
    assert not restarts(agent, "leaky")


def test_pause_holds_restarts_until_resume(agent):
    agent.start(config("enforce"))
    paused = agent.cli("pause", "--for", "10m", "--reason", "investigating by hand")
    assert paused.returncode == 0, paused.stderr
    first_pid = agent.instance("leaky")["pid"]
    wait_until(lambda: agent.get("/api/v1/findings", kind="leak", instance="leaky")["findings"], 90)
    wait_until(
        lambda: any("paused" in (d.get("reason") or "") for d in agent.get("/api/v1/decisions")["decisions"]),
        60,
    )
    assert agent.instance("leaky")["pid"] == first_pid and not restarts(agent, "leaky")
    assert "PAUSED" in agent.cli("plan", token=False).stdout
    resumed = agent.cli("resume")
    assert resumed.returncode == 0 and "resumed" in resumed.stdout
    wait_until(lambda: restarts(agent, "leaky"), 90)
