"""A real remediation silences the instance's alerts in a real Alertmanager while it lasts.

The agent's own leak alert fires in Alertmanager; the remediation engine (enforce) restarts the
leaking instance before its limit; from `remediation_restart_started` until the restart is
verified, a silence made by medic (comment naming the action) covers that alert, and afterwards
it is expired.
"""

from __future__ import annotations

import pytest
from test_agent_remediation import config as remediation_config

from support.notify import start_alertmanager
from support.procs import wait_until

pytestmark = pytest.mark.slow


def test_a_real_restart_is_silenced_then_unsilenced(agent, spawn, hook_server, tmp_path):
    capture = hook_server()
    am = start_alertmanager(spawn, tmp_path, [{"url": f"{capture.url}/am"}])
    cfg = remediation_config("enforce")
    cfg["remediation"]["verify"] = {"timeout": "20s", "stable_for": "4s"}
    cfg["notify"] = {
        "sinks": [
            {"type": "alertmanager", "url": am.url, "repost_interval": "1s", "silence_refresh": "300ms"}
        ],
        "min_severity": "warning",
    }
    agent.start(cfg)

    def leaky_alerts() -> list[dict]:
        return [a for a in am.alerts() if a["labels"].get("name") == "leaky"]

    wait_until(leaky_alerts, 90)
    seen: list[dict] = []

    def silenced() -> bool:
        seen.extend(s for s in am.active_silences() if s["createdBy"] == "sidecar-medic")
        return bool(seen)

    wait_until(silenced, 90, interval=0.2)
    silence = seen[0]
    started = [e for e in agent.events(kind="remediation_restart_started") if e["instance"] == "leaky"]
    assert started, "a silence without a restart"
    action = started[0]["data"]["action_id"]
    assert f"action {action}" in silence["comment"]
    assert ("name", "leaky") in {(m["name"], m["value"]) for m in silence["matchers"]}

    def expired() -> bool:
        return not [s for s in am.active_silences() if s["createdBy"] == "sidecar-medic"]

    wait_until(expired, 60, interval=0.2)
    finished = [
        e for e in agent.events() if e["kind"].startswith("remediation_restart_") and e["instance"] == "leaky"
    ]
    assert any(e["kind"] in ("remediation_restart_succeeded", "remediation_restart_failed") for e in finished)
