"""The built-in demo (`medic run` with no config: `make run`) in dry-run ends in one story, told alike by the
dashboard Chromium renders, `medic leaks`, `medic plan` and a real Prometheus evaluating the shipped
rules: demo-leaky stopped growing above the limit only its config sets; its oom-risk finding is open
and says so (the kernel does not enforce that limit: no time to OOM is made up); Prometheus pages
for the memory above the limit, and nothing says it runs out of memory in 0 s or is "not projected to
reach" a limit it is past; dry-run shows the restart it would have made, not a lost cause.

The demo's own settings, with its leak 16 times faster, so that its end comes within a minute."""

from __future__ import annotations

import re
import time

import pytest

from agent.cli.run import DEMO_AGENT, DEMO_DETECT, DEMO_REMEDIATION, demo_instances
from support.browser import Dom, dump_dom, needs_chromium
from support.notify import fast_rules, firing, rules_evaluated_after, start_prometheus
from support.procs import wait_until

pytestmark = [pytest.mark.slow, needs_chromium]
MiB = 2**20
NOT_ENFORCED = "a limit set only in medic's config, which the kernel does not enforce"


def demo_config() -> dict:
    return {
        "agent": dict(DEMO_AGENT),
        "detect": dict(DEMO_DETECT),
        "remediation": {**DEMO_REMEDIATION, "mode": "dry-run"},  # `make run` restarts; dry-run lets it end
        "instances": demo_instances(rate="8Mi"),
    }


def told_by_the_agent(agent) -> set[str]:
    findings = agent.get("/api/v1/findings", instance="demo-leaky")["findings"]
    above = [f for f in findings if f["kind"] == "oom-risk" and f["evidence"].get("above_limit")]
    assert not agent.get("/api/v1/findings", instance="demo-stable")["findings"]
    return {f["kind"] for f in findings} if above else set()


def told_by_medic_leaks(agent) -> set[str]:
    shown = agent.cli("leaks", "demo-leaky", token=False)
    assert shown.returncode == 0, shown.stderr
    assert "not projected" not in shown.stdout and NOT_ENFORCED in shown.stdout, shown.stdout
    table = shown.stdout.split("\n\n")[0]  # the notes under the table follow a blank line
    rows = [line for line in table.splitlines()[1:] if line.startswith("demo-leaky")]
    assert all("past its limit" in row for row in rows), shown.stdout  # its TIME-TO-OOM
    return {row.split()[1] for row in rows}


def told_by_the_dashboard(agent, profile) -> set[str]:
    dom = Dom(dump_dom(agent.url + "/", profile))
    rows = {r["attrs"]["data-instance"]: r for r in dom.find("tr", "instance-row")}
    assert "none" in rows["demo-stable"]["text"]
    assert dom.find("td", "tto", within=rows["demo-leaky"])[0]["text"] == "past its limit"
    cards = {c["attrs"]["data-kind"]: c for c in dom.find("article", "finding")}  # the selected one's
    summary = dom.find("p", "summary", within=cards["oom-risk"])[0]["text"]
    assert re.search(r"RSS peaks [\d.]+ MiB are above its memory limit 160\.0 MiB", summary), summary
    assert NOT_ENFORCED in summary and "unknown: past a limit" in cards["oom-risk"]["text"]
    assert not any("No open findings" in p["text"] for p in dom.find("p", "muted"))
    plan = dom.find("div", id="plan")[0]["text"]
    if "CANNOT BE SAVED" in plan or "would restart" not in plan:
        # a plan made while the leak still grew towards its limit, with another instance's would-be
        # restart holding the one slot past the projected OOM: true then; the next step plans anew
        return set()
    return set(cards)


def told_by_prometheus(prom, since: float) -> set[str]:
    if not rules_evaluated_after(prom, since):
        return set()
    assert not prom.query('medic_time_to_oom_seconds{name="demo-leaky"}')  # unknown, not 0
    for rule in ("MedicOOMImminent", "MedicLeakOOMWithinHorizon"):
        assert not [a for a in prom.alerts() if a["labels"]["alertname"] == rule], rule
    near = [a for a in firing(prom, "MedicMemoryNearLimit") if a["labels"]["name"] == "demo-leaky"]
    if not near:
        return set()
    assert re.match(
        r"demo-leaky uses 1\d\d(\.\d+)?% of its memory limit",  # past it: the leak stops at its cap
        near[0]["annotations"]["summary"],
    )
    assert not [a for a in prom.alerts() if a["labels"].get("name") == "demo-stable"]
    return {s["metric"]["kind"] for s in prom.query('medic_findings{name="demo-leaky"}')}


def test_the_demo_ends_telling_one_story_everywhere(agent, spawn, tmp_path):
    agent.start(demo_config())
    _, rules = fast_rules(tmp_path)
    prom = start_prometheus(spawn, tmp_path, [agent.url.removeprefix("http://")], [rules], None)
    # the end: the leak stopped at its cap, past the limit, and the finding says so
    wait_until(lambda: agent.instance("demo-leaky")["rss_bytes"] >= 200 * MiB, 60, interval=0.5)
    wait_until(lambda: told_by_the_agent(agent), 60, interval=0.5)

    def agreed() -> set[str] | None:
        since = time.time()
        kinds = told_by_the_agent(agent)
        told = [
            told_by_medic_leaks(agent),
            told_by_the_dashboard(agent, tmp_path / "profile"),
            told_by_prometheus(prom, since),
            told_by_the_agent(agent),
        ]
        return kinds if kinds and all(t == kinds for t in told) else None

    kinds = wait_until(agreed, 90, interval=0.5)
    assert "oom-risk" in kinds

    # demo-slow's would-be restart may hold the one slot first (as enforce's restart would), for a while
    def leaky_row() -> tuple[str, str]:
        plan = agent.cli("plan", token=False).stdout
        return plan, next(line for line in plan.splitlines() if line.startswith("demo-leaky"))

    wait_until(lambda: "would restart (dry-run)" in leaky_row()[1], 60, interval=0.5)
    plan, row = leaky_row()
    assert "would restart (dry-run)" in row and "nothing was restarted" in row, plan
    assert "CANNOT BE SAVED" not in plan and "hopeless" not in plan
    (action,) = agent.get("/api/v1/actions", instance="demo-leaky")["actions"]
    assert action["outcome"] == "would-restart" and action["old_pid"] == agent.instance("demo-leaky")["pid"]
