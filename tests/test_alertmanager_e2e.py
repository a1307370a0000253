"""Acceptance: real Prometheus and Alertmanager on loopback around a real agent watching a real leak.

    leaking process ─► medic agent ─/metrics─► Prometheus (medic-rules.yml + a user rule)
                          │    ▲                    │ alerts
                          │    └──── receiver ◄──── Alertmanager ───► capture server (the test's)
                          └─ own alerts, silences ──►┘

Checked: Alertmanager's webhook payloads field by field (a user's alert on medic's metrics, a
medic rule, and medic's own pushed alert); the user's alert becoming an `external` finding through
medic's receiver while medic's own alerts are ignored there; re-posting; and the silences held
during a remediation, driven here by restart events (`remediation_restart_started` / `_succeeded`)
written into the agent's event log around a real managed restart, so that two overlapping actions
and their idempotence can be checked; `test_alertmanager_remediation.py` shows the same silences
around a restart made by the remediation engine itself.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from agent.notify.model import parse_rfc3339
from agent.state.eventlog import EventLog
from agent.state.store import Store
from support.notify import start_alertmanager, start_prometheus
from support.procs import free_port, wait_until, workload_argv

pytestmark = pytest.mark.slow
FAST = {"interval": "0.2s", "slow_interval": "1s", "discovery_interval": "0.5s", "flush_interval": "0.3s"}
RULES = os.path.join(os.path.dirname(__file__), "..", "dashboards", "prometheus", "medic-rules.yml")
USER_RULES = """
groups:
  - name: serving
    rules:
      - alert: ServingMemoryHigh
        expr: medic_rss_bytes{name="leaky"} > 40 * 1024 * 1024
        labels: {severity: page, medic_instance: leaky}
        annotations:
          summary: "leaky uses {{ $value | humanize1024 }}B"
          runbook_url: https://runbooks.example/serving-memory
"""


def get(agent, path: str, **params):
    """Like `agent.get`, with a longer timeout: this test shares two cores with everything else."""
    response = httpx.get(f"{agent.url}{path}", params=params, timeout=20)
    response.raise_for_status()
    return response.json() if "json" in response.headers.get("content-type", "") else response.text


def firing(capture, alertname: str, **labels: str) -> list[dict]:
    """The firing alerts named `alertname` (with these labels) in the capture server's payloads."""
    found = []
    for body in capture.bodies():
        for alert in body["alerts"]:
            wanted = {"alertname": alertname, **labels}
            if alert["status"] == "firing" and all(alert["labels"].get(k) == v for k, v in wanted.items()):
                found.append({**alert, "_payload": body})
    return found


def test_prometheus_alertmanager_and_medic_round_trip(agent, spawn, workload, hook_server, tmp_path):
    capture = hook_server()
    port = free_port()
    token_file = tmp_path / "admin.token"
    token_file.write_text("e2e-admin-token-0123456789abcdef\n")
    os.chmod(token_file, 0o600)
    medic_receiver = {
        "url": f"http://127.0.0.1:{port}/api/v1/alertmanager",
        "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
    }
    am = start_alertmanager(spawn, tmp_path, [{"url": f"{capture.url}/am"}, medic_receiver])

    worker = workload("stable", "--size", "4Mi")
    agent.start(
        {
            "agent": {
                **FAST,
                "listen": f"127.0.0.1:{port}",
                "token_file": str(token_file),
                "name": "e2e-agent",
            },
            "instances": [
                {
                    "name": "leaky",
                    "match": {
                        "command": workload_argv("leak", "--rate", "8Mi", "--every", "0.1s", "--cap", "48Mi")
                    },
                    "memory_limit": "64Mi",
                },
                {"name": "worker", "match": {"pid": worker.pid}, "labels": {"fleet": "ranker", "zone": "b"}},
            ],
            "notify": {
                "sinks": [
                    {
                        "type": "alertmanager",
                        "url": am.url,
                        "repost_interval": "1s",
                        "silence_max": "10m",
                        "silence_refresh": "300ms",
                    }
                ],
                "dashboard_url": "https://grafana.example/d/medic?var-name={instance}",
            },
        }
    )
    fast_rules = tmp_path / "medic-rules.yml"
    fast_rules.write_text(re.sub(r"for: \d+m", "for: 1s", Path(RULES).read_text()))
    user_rules = tmp_path / "user-rules.yml"
    user_rules.write_text(USER_RULES)
    prom = start_prometheus(spawn, tmp_path, [f"127.0.0.1:{port}"], [fast_rules, user_rules], am.url)

    # 1. A user's rule on medic's metrics fires; Alertmanager delivers it to the capture server.
    [alert] = wait_until(lambda: firing(capture, "ServingMemoryHigh")[:1], 60)
    payload = alert.pop("_payload")
    assert payload["version"] == "4" and payload["status"] == "firing" and payload["receiver"] == "hooks"
    assert payload["externalURL"] == am.url and payload["truncatedAlerts"] == 0
    assert payload["groupLabels"] == {"alertname": "ServingMemoryHigh", "instance": f"127.0.0.1:{port}"}
    assert alert["labels"] == {
        "alertname": "ServingMemoryHigh",
        "medic_instance": "leaky",
        "name": "leaky",
        "instance": f"127.0.0.1:{port}",
        "job": "medic",
        "severity": "page",
    }
    assert re.fullmatch(r"leaky uses \d+(\.\d+)?MiB", alert["annotations"]["summary"])
    assert alert["annotations"]["runbook_url"] == "https://runbooks.example/serving-memory"
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert abs(parse_rfc3339(alert["startsAt"]) - time.time()) < 60
    assert alert["generatorURL"].startswith("http://") and "/graph?g0.expr=" in alert["generatorURL"]
    assert re.fullmatch(r"[0-9a-f]{16}", alert["fingerprint"])

    # 2. The same alert reached medic's receiver and became an external finding of `leaky`.
    def external_finding():
        events = get(agent, "/api/v1/events", kind="finding_opened", limit=1000)["events"]
        return [e for e in events if e["data"]["finding"]["kind"] == "external"]

    [opened] = wait_until(external_finding, 20)
    finding = opened["data"]["finding"]
    assert (
        opened["instance"] == "leaky" and finding["instance"] == "leaky" and opened["severity"] == "critical"
    )
    assert finding["evidence"]["fingerprint"] == alert["fingerprint"]
    assert finding["evidence"]["labels"] == alert["labels"]
    assert finding["evidence"]["external_url"] == am.url and finding["evidence"]["receiver"] == "hooks"
    assert finding["id"] == f"leaky:external:{alert['fingerprint']}:{int(parse_rfc3339(alert['startsAt']))}"

    # 3. medic's own rule fires too; medic's receiver ignores it (source=medic), people get it.
    [near] = wait_until(lambda: firing(capture, "MedicMemoryNearLimit")[:1], 60)
    assert near["labels"]["source"] == "medic" and near["labels"]["name"] == "leaky"
    assert near["labels"]["agent"] == "e2e-agent"  # read from medic_build_info: the label of medic's own
    assert re.fullmatch(r"leaky uses \d+(\.\d+)?% of its memory limit", near["annotations"]["summary"])
    wait_until(lambda: 'medic_receiver_alerts_total{result="ignored"}' in get(agent, "/metrics"), 20)
    assert len(external_finding()) == 1  # duplicates from Alertmanager's re-sends open nothing new

    # 4. medic posts its own alert: the attached worker dies.
    worker.kill()
    worker.wait()

    # (Prometheus's MedicInstanceDown rule fires too, with the same name and agent, and the job and
    # instance=<agent address> of the scrape: medic's own has neither.)
    def pushed(alert: dict) -> bool:
        return "job" not in alert["labels"]

    [own] = wait_until(
        lambda: [a for a in firing(capture, "MedicInstanceDown", name="worker") if pushed(a)][:1], 30
    )
    own_payload = own.pop("_payload")
    assert own["labels"] == {
        "alertname": "MedicInstanceDown",
        "name": "worker",
        "agent": "e2e-agent",
        "fleet": "ranker",
        "zone": "b",
        "severity": "warning",
        "source": "medic",
    }
    assert own["annotations"]["summary"] == f"worker: pid {worker.pid} is gone"
    assert own["annotations"]["description"].startswith("medic finds no running process for worker.")
    assert (
        own["annotations"]["runbook_url"]
        == "https://medic.example.internal/docs/runbooks.md#medicinstancedown"
    )
    assert own["annotations"]["dashboard"] == "https://grafana.example/d/medic?var-name=worker"
    assert own["generatorURL"] == "https://grafana.example/d/medic?var-name=worker"
    assert own_payload["groupLabels"] == {"alertname": "MedicInstanceDown"}
    assert own["endsAt"] == "0001-01-01T00:00:00Z"  # Alertmanager shows firing alerts without an end

    def am_alert(name):
        return next(
            (
                a
                for a in am.alerts()
                if a["labels"]["alertname"] == name
                and a["labels"]["name"] == "worker"
                and "job" not in a["labels"]
            ),
            None,
        )

    first_seen = am_alert("MedicInstanceDown")
    ends = parse_rfc3339(first_seen["endsAt"])
    assert 0 < ends - time.time() <= 4 * 1 + 2  # lapses by itself 4 re-post intervals after the last post
    wait_until(lambda: parse_rfc3339(am_alert("MedicInstanceDown")["endsAt"]) > ends + 1, 15)  # re-posted

    # 5. A remediation of `leaky`: its firing alerts are silenced while it lasts.
    leaky_alerts = {
        a["fingerprint"]: a
        for a in am.alerts()
        if "leaky" in (a["labels"].get("medic_instance"), a["labels"].get("name"))
    }
    assert {a["labels"]["alertname"] for a in leaky_alerts.values()} >= {
        "ServingMemoryHigh",
        "MedicMemoryNearLimit",
    }
    store = Store(agent.state_dir)  # the engine's events, written into the agent's event log
    events = EventLog(store)
    started = events.emit(
        "remediation_restart_started",
        "restarting (managed): e2e",
        instance="leaky",
        severity="warning",
        action_id=77,
    )

    def medic_silences():
        return [s for s in am.active_silences() if s["createdBy"] == "sidecar-medic"]

    silences = wait_until(lambda: len(medic_silences()) >= len(leaky_alerts) and medic_silences(), 20)
    assert len(silences) == len(leaky_alerts)
    by_fingerprint = {s["comment"].rsplit("fingerprint=", 1)[1]: s for s in silences}
    assert set(by_fingerprint) == set(leaky_alerts)
    for fingerprint, silence in by_fingerprint.items():
        labels = leaky_alerts[fingerprint]["labels"]
        assert {(m["name"], m["value"]) for m in silence["matchers"]} == set(labels.items())
        assert all(m["isEqual"] and not m["isRegex"] for m in silence["matchers"])
        assert "medic is remediating leaky (action 77)" in silence["comment"]
        assert abs(parse_rfc3339(silence["endsAt"]) - (started.ts + 600)) < 2
    suppressed = [a for a in am.alerts() if a["fingerprint"] in leaky_alerts]
    assert all(a["status"]["state"] == "suppressed" for a in suppressed)
    assert am_alert("MedicInstanceDown")["status"]["state"] == "active"  # other instances still page
    wait_until(lambda: 'medic_notify_silences{sink="alertmanager"} 2.0' in get(agent, "/metrics"), 10)

    # Idempotent on the fingerprint: a second action on the same instance adds no silence ...
    events.emit("remediation_restart_started", "restarting again", instance="leaky", action_id=78)
    wait_until(lambda: len(get(agent, "/api/v1/outbox")["silences"]) == 2 * len(leaky_alerts), 10)
    assert len(medic_silences()) == len(leaky_alerts)

    old_pid = get(agent, "/api/v1/instances/leaky")["instance"]["pid"]
    os.kill(old_pid, signal.SIGTERM)  # a real managed restart: medic relaunches its child
    wait_until(
        lambda: (
            get(agent, "/api/v1/instances/leaky")["instance"]["pid"] not in (None, old_pid)
            and get(agent, "/api/v1/instances/leaky")["instance"]["status"] == "up"
        ),
        20,
    )
    assert "instance_restarted" in [
        e["kind"] for e in get(agent, "/api/v1/events", instance="leaky", limit=1000)["events"]
    ]

    # ... and one action ending keeps the silences the other still needs. (The restart itself may
    # have fired more alerts of `leaky`, e.g. MedicInstanceDown from Prometheus: they are silenced too.)
    events.emit(
        "remediation_restart_succeeded", "restart succeeded: verified", instance="leaky", action_id=77
    )

    def held_by(action):
        rows = get(agent, "/api/v1/outbox")["silences"]
        return rows if rows and {r["action_id"] for r in rows} == {action} else None

    rows = wait_until(lambda: held_by("78"), 10)
    assert {s["id"] for s in medic_silences()} == {r["silence_id"] for r in rows}
    events.emit(
        "remediation_restart_succeeded", "restart succeeded: verified", instance="leaky", action_id=78
    )
    wait_until(lambda: medic_silences() == [], 15)
    expired = [s for s in am.silences() if s["createdBy"] == "sidecar-medic"]
    assert len(expired) >= len(leaky_alerts) and all(s["status"]["state"] == "expired" for s in expired)
    assert get(agent, "/api/v1/outbox")["silences"] == []
    store.close()

    # 6. Prometheus has medic's delivery metrics too.
    depth = wait_until(lambda: prom.query('medic_notify_queue_depth{sink="alertmanager"}'), 20)
    assert depth[0]["metric"]["job"] == "medic"
    assert prom.query('medic_notify_deliveries_total{sink="alertmanager"} > 0')
