"""The Alertmanager sink and silences against a real Alertmanager 0.25 (no agent: the notifier's own steps)."""

from __future__ import annotations

import time

import pytest

from agent.config.loader import validate_config
from agent.notify.model import parse_rfc3339
from agent.notify.service import Notifier
from agent.state.eventlog import EventLog
from agent.state.store import Store
from support.notify import active_alerts, run_once, start_alertmanager
from support.procs import wait_until

pytestmark = pytest.mark.slow


class Medic:
    """A store, an event log and a notifier pointed at a real Alertmanager, stepped by the test."""

    def __init__(self, state_dir, am_url, agent="ranker-0", **sink):
        config = validate_config(
            {"notify": [{"type": "alertmanager", "url": am_url, "repost_interval": "1s", **sink}]}
        ).notify
        self.store = Store(state_dir)
        self.events = EventLog(self.store)
        self.notifier = Notifier(
            config, self.store, self.events, labels_for=lambda name: {"fleet": "ranker"}, agent=agent
        )

    def step(self):
        run_once(self.notifier)

    def until(self, predicate, timeout=15.0):
        def stepped():
            self.step()
            return predicate()

        return wait_until(stepped, timeout, 0.1)

    def finding(self, change, severity="warning", instance="serving-7"):
        finding = {
            "id": f"{instance}:leak:1",
            "instance": instance,
            "kind": "leak",
            "severity": severity,
            "summary": f"{instance} leaks 41 MB/h",
            "evidence": {"slope_bytes_per_second": 11400.0},
        }
        return self.events.emit(
            f"finding_{change}", f"finding {change}", instance=instance, severity=severity, finding=finding
        )

    def close(self):
        for sink in self.notifier.sinks:
            sink.close()
        self.store.close()


def medic_alerts(am):
    return [a for a in am.alerts() if a["labels"].get("source") == "medic"]


def test_alerts_fire_update_and_resolve(spawn, tmp_path, hook_server):
    capture = hook_server()
    am = start_alertmanager(spawn, tmp_path, [{"url": f"{capture.url}/am"}])
    medic = Medic(tmp_path / "state", am.url)
    medic.finding("opened")
    [alert] = medic.until(lambda: medic_alerts(am))
    assert alert["labels"] == {
        "alertname": "MedicLeak",
        "name": "serving-7",
        "agent": "ranker-0",
        "fleet": "ranker",
        "severity": "warning",
        "kind": "leak",
        "source": "medic",
    }
    assert alert["annotations"]["summary"] == "serving-7 leaks 41 MB/h"
    assert set(alert["annotations"]) == {"summary", "description", "runbook_url", "finding_id"}
    assert alert["annotations"]["runbook_url"].endswith("/docs/runbooks.md#medicleak")
    ends = parse_rfc3339(alert["endsAt"])
    assert 2 < ends - time.time() <= 4.5  # 4 re-post intervals of 1s
    medic.until(lambda: parse_rfc3339(medic_alerts(am)[0]["endsAt"]) > ends + 0.5)  # re-posted while active
    [webhook] = wait_until(lambda: capture.bodies(), 10)
    assert webhook["alerts"][0]["labels"] == alert["labels"] and webhook["status"] == "firing"

    medic.finding("updated", severity="critical")  # severity is a label: a new alert, the old one ends
    medic.until(lambda: [a["labels"]["severity"] for a in medic_alerts(am)] == ["critical"])
    critical = medic_alerts(am)[0]
    assert critical["startsAt"] == alert["startsAt"]

    resolved = medic.finding("resolved", severity="critical")
    medic.until(lambda: medic_alerts(am) == [])

    def resolved_webhook():
        return [
            a
            for body in capture.bodies()
            for a in body["alerts"]
            if a["status"] == "resolved" and a["labels"]["severity"] == "critical"
        ]

    [gone] = wait_until(resolved_webhook, 10)
    assert abs(parse_rfc3339(gone["endsAt"]) - resolved.ts) < 0.01
    assert active_alerts(medic.notifier.router.store) == []
    medic.close()


def test_silence_for_and_unsilence_directly_idempotent_and_found_again_after_a_crash(spawn, tmp_path):
    am = start_alertmanager(spawn, tmp_path, [])
    medic = Medic(tmp_path / "state", am.url, silence_refresh="200ms")
    medic.finding("opened")
    medic.events.emit("instance_down", "pid 9 is gone", instance="serving-7", severity="warning")
    medic.finding("opened", instance="other")
    medic.until(lambda: len(medic_alerts(am)) == 3)
    replica = Medic(tmp_path / "replica-state", am.url, agent="ranker-1")  # the same workload, another pod
    replica.finding("opened")
    replica.until(lambda: len(medic_alerts(am)) == 4)

    until = time.time() + 300
    medic.notifier.silence_for("serving-7", 501, until)
    medic.notifier.silence_for("serving-7", 501, until)  # twice: still one silence per alert
    silences = medic.until(lambda: len(am.active_silences()) == 2 and am.active_silences())
    assert {s["comment"].split("fingerprint=")[1] for s in silences} == {
        a["fingerprint"]
        for a in medic_alerts(am)
        if a["labels"]["name"] == "serving-7" and a["labels"]["agent"] == "ranker-0"
    }
    assert all(abs(parse_rfc3339(s["endsAt"]) - until) < 0.01 for s in silences)
    other = next(a for a in medic_alerts(am) if a["labels"]["name"] == "other")
    assert other["status"]["state"] == "active"
    mirror = next(a for a in medic_alerts(am) if a["labels"]["agent"] == "ranker-1")
    assert mirror["labels"]["name"] == "serving-7" and mirror["status"]["state"] == "active"  # a replica's

    # A new agent with an empty state (its store lost) finds medic's silences again by their comment.
    crashed = Medic(tmp_path / "fresh-state", am.url, silence_refresh="200ms")
    crashed.notifier.silence_for("serving-7", 502, until)
    crashed.until(lambda: len(crashed.notifier.silencer.silences()) == 2)
    assert {s["silence_id"] for s in crashed.notifier.silencer.silences()} == {s["id"] for s in silences}
    assert len(am.active_silences()) == 2

    medic.notifier.unsilence(501)
    medic.notifier.unsilence(501)
    medic.until(lambda: am.active_silences() == [])
    assert medic.notifier.silencer.silences() == []
    assert medic.notifier.collector.snapshot.silences == {}
    crashed.close()
    replica.close()
    medic.close()


def test_alertmanager_down_is_retried_and_odd_label_names_are_made_valid(spawn, tmp_path):
    am = start_alertmanager(spawn, tmp_path, [])
    medic = Medic(tmp_path / "state", am.url.replace(am.url.rsplit(":", 1)[1], "1"))  # nothing listens on :1
    medic.finding("opened")
    medic.step()
    item = medic.notifier.outbox.head("alertmanager")
    assert item.attempts == 1 and "cannot reach" in item.last_error
    medic.close()

    medic = Medic(tmp_path / "state2", am.url)
    medic.events.emit("instance_down", "gone", instance="serving-7")
    medic.notifier.router.labels_for = lambda name: {"bad label": "x", "9": "y"}  # made valid, not refused
    medic.step()
    [alert] = medic.until(lambda: medic_alerts(am))
    assert alert["labels"]["bad_label"] == "x" and alert["labels"]["_9"] == "y"
    medic.close()
