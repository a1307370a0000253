"""The shipped alerting rules in a real Prometheus scraping a real agent under the job names of
every documented scrape setup: `MedicAgentDown` fires for each once the agent is stopped, and not
for a target that never was medic."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
import yaml

from support.notify import fast_rules, firing, rules_evaluated_after, start_prometheus
from support.procs import REPO, wait_until

pytestmark = pytest.mark.slow
RULES = REPO / "dashboards" / "prometheus" / "medic-rules.yml"
SIDECAR = REPO / "deploy" / "kubernetes" / "sidecar.yaml"
FAST = {"interval": "0.5s", "slow_interval": "2s", "discovery_interval": "1s", "flush_interval": "0.5s"}


def scrape_jobs(address: str, closed: str) -> dict[str, list[str]]:
    """The job names each shipped scrape path gives: the annotations' "kubernetes-pods" job, the
    PodMonitor's "<namespace>/<name>", the ServiceMonitor's Service name. The annotation job also
    scrapes a pod that is not medic (a closed port)."""
    docs = {d["kind"]: d for d in yaml.safe_load_all(SIDECAR.read_text()) if d}
    monitoring = REPO / "deploy" / "kubernetes" / "monitoring"
    pod_monitor = yaml.safe_load((monitoring / "podmonitor.yaml").read_text())
    service_monitor = yaml.safe_load((monitoring / "servicemonitor.yaml").read_text())
    assert (
        service_monitor["spec"]["selector"]["matchLabels"].items()
        <= docs["Service"]["metadata"]["labels"].items()
    )
    return {
        "kubernetes-pods": [address, closed],
        f"ranker/{pod_monitor['metadata']['name']}": [address],
        docs["Service"]["metadata"]["name"]: [address],
    }


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_medic_agent_down_fires_under_every_scrape_setup(agent, workload, spawn, tmp_path):
    shipped, rules = fast_rules(tmp_path)
    exprs = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert [r["expr"] for g in shipped["groups"] for r in g["rules"]] == exprs, "the shipped expressions"
    stable = workload("stable", "--size", "8Mi")
    agent.start(
        {
            "agent": {**FAST, "name": "ranker-0"},
            "instances": [{"name": "stable", "match": {"pid": stable.pid}}],
        }
    )
    address = agent.url.removeprefix("http://")
    annotations = next(d for d in yaml.safe_load_all(SIDECAR.read_text()) if d and d["kind"] == "Deployment")[
        "spec"
    ]["template"]["metadata"]["annotations"]
    jobs = scrape_jobs(address, closed_port())
    prom = start_prometheus(
        spawn, tmp_path, [], [rules], None, jobs=jobs, metrics_path=annotations["prometheus.io/path"]
    )

    wait_until(lambda: len(prom.query("medic_build_info")) == len(jobs), 30, interval=0.5)
    assert {s["metric"]["job"] for s in prom.query("medic_build_info")} == set(jobs)
    # the pod that is not medic is down all along: once Prometheus has scraped it (each target at
    # its own offset in the interval) and every rule has been evaluated past the `for:` since
    down = wait_until(lambda: prom.query('up{job="kubernetes-pods"} == 0'), 15, interval=0.2)
    assert [s["metric"]["instance"] for s in down] == [jobs["kubernetes-pods"][1]]
    seen = time.time()
    wait_until(lambda: rules_evaluated_after(prom, seen + 2.0), 15, interval=0.2)
    assert [a for a in prom.alerts() if a["labels"]["alertname"] == "MedicAgentDown"] == [], (
        "a down target that never served medic_build_info is not medic"
    )
    assert httpx.get(f"{prom.url}/api/v1/rules", timeout=5).json()["status"] == "success"

    # MedicAgentDown's `agent` label reads the name the address last served, on 10-second steps of
    # the day: wait until one step has seen this agent under every job
    served = 'max_over_time(timestamp(medic_build_info{agent="ranker-0"})[1d:10s])'
    wait_until(lambda: len(prom.query(served)) == len(jobs), 30, interval=0.5)
    agent.stop()
    fired = wait_until(
        lambda: len(firing(prom, "MedicAgentDown")) == len(jobs) and firing(prom, "MedicAgentDown"),
        40,
        interval=0.5,
    )
    assert {a["labels"]["job"] for a in fired} == set(jobs)
    assert {a["labels"]["instance"] for a in fired} == {address}
    for alert in fired:
        assert alert["labels"]["severity"] == "critical" and alert["labels"]["source"] == "medic"
        assert alert["labels"]["agent"] == "ranker-0"  # the name it last served, read after it stopped
        assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks.md#medicagentdown")
        assert address in alert["annotations"]["summary"]
    wait_until(lambda: firing(prom, "MedicAgentsAbsent"), 30, interval=0.5)
