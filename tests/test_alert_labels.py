"""One label model: medic's own alerts and the shipped rules' alerts about one instance share `agent`
and `name`, so a real Alertmanager groups them in one notification and lets one inhibit the other;
replicas of a workload (two agents, an instance of the same name each) stay separate alerts.

    workload A ─► agent pod-a ─/metrics─► Prometheus (shipped rules) ─┐
                      └──── own alerts ──────────────────────────────┼─► Alertmanager "grouping" ─► capture
    workload B ─► agent pod-b ── own alerts ──────────────────────────┴─► Alertmanager "inhibiting" ─► capture
"""

from __future__ import annotations

import pytest

from support.agent_runner import AgentRunner
from support.notify import fast_rules, start_alertmanager, start_prometheus
from support.procs import wait_until

pytestmark = pytest.mark.slow
FAST = {"interval": "0.2s", "slow_interval": "1s", "discovery_interval": "0.5s", "flush_interval": "0.3s"}
GROUP_BY = ["agent", "name"]
# the inhibit rules of docs/alerts.md, "One label model"
INHIBIT = [
    {
        "source_matchers": ['alertname="MedicInstanceDown"', 'job=""'],
        "target_matchers": ['alertname="MedicInstanceDown"', 'job!=""'],
        "equal": ["agent", "name"],
    },
    {
        "source_matchers": ['alertname="MedicOOMImminent"'],
        "target_matchers": ['alertname=~"MedicLeak|MedicOOMRisk|MedicLeakOOMWithinHorizon"'],
        "equal": ["agent", "name"],
    },
]


def agent_config(name: str, pid: int, alertmanagers: list[str]) -> dict:
    return {
        "agent": {**FAST, "name": name},
        "instances": [{"name": "ranker", "match": {"pid": pid}, "labels": {"fleet": "ranker"}}],
        "notify": {"sinks": [{"type": "alertmanager", "urls": alertmanagers, "repost_interval": "1s"}]},
    }


def down_alerts(am) -> list[dict]:
    return [a for a in am.alerts() if a["labels"]["alertname"] == "MedicInstanceDown"]


def test_both_paths_group_and_inhibit_and_replicas_stay_apart(agent, spawn, workload, hook_server, tmp_path):
    grouped, inhibited = hook_server(), hook_server()
    grouping = start_alertmanager(
        spawn, tmp_path, [{"url": f"{grouped.url}/am"}], name="grouping", group_by=GROUP_BY
    )
    inhibiting = start_alertmanager(
        spawn, tmp_path, [{"url": f"{inhibited.url}/am"}], "inhibiting", GROUP_BY, INHIBIT
    )
    urls = [grouping.url, inhibiting.url]
    work_a, work_b = workload("stable", "--size", "4Mi"), workload("stable", "--size", "4Mi")
    agent.start(agent_config("pod-a", work_a.pid, urls))
    replica = AgentRunner(spawn, tmp_path / "replica")
    (tmp_path / "replica").mkdir()
    try:
        replica.start(agent_config("pod-b", work_b.pid, urls))
        prom = start_prometheus(
            spawn, tmp_path, [agent.url.removeprefix("http://")], [fast_rules(tmp_path)[1]], urls
        )
        wait_until(lambda: prom.query('medic_build_info{agent="pod-a"}'), 30, interval=0.5)

        work_a.kill()
        work_b.kill()
        work_a.wait()
        work_b.wait()

        # Grouping: the rule's alert and medic's own about pod-a's ranker come in one notification.
        def group_of_a() -> list[dict]:
            return [
                body
                for body in grouped.bodies()
                if body["groupLabels"] == {"agent": "pod-a", "name": "ranker"} and len(body["alerts"]) == 2
            ]

        [body, *_] = wait_until(group_of_a, 60, interval=0.5)
        rule, own = sorted(body["alerts"], key=lambda a: "job" in a["labels"], reverse=True)
        assert rule["labels"]["job"] == "medic" and "job" not in own["labels"]
        shared = {"alertname": "MedicInstanceDown", "agent": "pod-a", "name": "ranker", "fleet": "ranker"}
        assert shared.items() <= rule["labels"].items() and shared.items() <= own["labels"].items()
        assert shared.items() <= body["commonLabels"].items()
        for alert in (rule, own):
            assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks.md#medicinstancedown")
            assert alert["annotations"]["summary"] and alert["annotations"]["description"]
            assert "evidence" not in alert["annotations"]

        # Replicas: pod-b's ranker is its own alert (and its own group), not merged into pod-a's.
        pushed = wait_until(
            lambda: (
                {a["labels"]["agent"] for a in down_alerts(grouping) if "job" not in a["labels"]}
                == {"pod-a", "pod-b"}
            ),
            30,
            interval=0.5,
        )
        assert pushed
        wait_until(
            lambda: any(b["groupLabels"] == {"agent": "pod-b", "name": "ranker"} for b in grouped.bodies()),
            30,
        )

        # Inhibition: in the other Alertmanager, medic's own alert makes the rule's quiet, and only
        # for its own agent's instance.
        def states() -> dict[tuple[str, bool], dict]:
            return {(a["labels"]["agent"], "job" in a["labels"]): a for a in down_alerts(inhibiting)}

        found = wait_until(
            lambda: (
                (s := states()).get(("pod-a", True), {}).get("status", {}).get("state") == "suppressed" and s
            ),
            30,
            interval=0.5,
        )
        source = found[("pod-a", False)]
        assert found[("pod-a", True)]["status"]["inhibitedBy"] == [source["fingerprint"]]
        assert (
            source["status"]["state"] == "active" and found[("pod-b", False)]["status"]["state"] == "active"
        )
        delivered = {
            (a["labels"]["agent"], "job" in a["labels"]) for b in inhibited.bodies() for a in b["alerts"]
        }
        assert ("pod-a", False) in delivered and ("pod-b", False) in delivered
    finally:
        replica.close()
