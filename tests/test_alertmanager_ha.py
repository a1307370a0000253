"""An HA Alertmanager (`urls:` of its replicas) against two real Alertmanager 0.25 processes: every
alert goes to each replica with its own outbox queue, a replica that is stopped mid-test gets what
it missed when it is back without the other being sent it again, and silences go to one replica
that answers, the next when it is down. A single `url` still works as before."""

from __future__ import annotations

import subprocess

import pytest
from pydantic import ValidationError

from agent.config.loader import validate_config
from agent.notify.config import AlertmanagerSinkSpec, delivery_names
from agent.notify.service import Notifier
from agent.notify.sinks import create_sinks
from agent.state.eventlog import EventLog
from agent.state.store import Store
from support.notify import run_once, start_alertmanager, wait_http
from support.procs import wait_until


class Medic:
    """A store, an event log and a notifier pointed at the replicas, stepped by the test."""

    def __init__(self, state_dir, urls):
        sink = {"type": "alertmanager", "urls": urls, "repost_interval": "1s"}
        retry = {"base": "0.2s", "cap": "0.5s", "jitter": 0}  # a stopped replica is retried quickly
        config = validate_config({"notify": {"sinks": [sink], "retry": retry}}).notify
        self.store = Store(state_dir)
        self.events = EventLog(self.store)
        self.notifier = Notifier(config, self.store, self.events, labels_for=lambda name: {"fleet": "ranker"})

    def until(self, predicate, timeout=15.0):
        def stepped():
            run_once(self.notifier)
            return predicate()

        return wait_until(stepped, timeout, 0.1)

    def finding(self, instance):
        finding = {
            "id": f"{instance}:leak:1",
            "instance": instance,
            "kind": "leak",
            "severity": "warning",
            "summary": f"{instance} leaks 41 MB/h",
            "evidence": {},
        }
        return self.events.emit(
            "finding_opened", "finding opened", instance=instance, severity="warning", finding=finding
        )

    def items(self, sink):
        return [i for i in self.notifier.outbox.items(sink=sink, limit=1000) if i.kind == "finding_opened"]

    def close(self):
        for sink in self.notifier.sinks:
            sink.close()
        self.store.close()


def medic_alerts(am) -> set[str]:
    return {a["labels"]["name"] for a in am.alerts() if a["labels"].get("source") == "medic"}


def host(am) -> str:
    return am.url.removeprefix("http://")


def test_the_url_forms(tmp_path):
    one = validate_config({"notify": [{"type": "alertmanager", "url": "http://127.0.0.1:9093/"}]}).notify
    [sink] = create_sinks(one)
    assert sink.name == "alertmanager" and sink.url == "http://127.0.0.1:9093"
    two = validate_config(
        {"notify": [{"type": "alertmanager", "name": "am", "urls": ["http://a:9093", "http://b:9093"]}]}
    ).notify
    assert delivery_names(two.sinks) == ["am@a:9093", "am@b:9093"]
    assert [(s.name, s.url, s.group) for s in create_sinks(two)] == [
        ("am@a:9093", "http://a:9093", "am"),
        ("am@b:9093", "http://b:9093", "am"),
    ]
    for bad, message in (
        ({}, "give url"),
        ({"url": "http://a:9093", "urls": ["http://b:9093"]}, "not both"),
        ({"urls": []}, "at least 1"),
        ({"urls": ["http://a:9093", "http://a:9093"]}, "listed twice"),
        ({"urls": ["ftp://a"]}, "http:// or https://"),
    ):
        with pytest.raises(ValidationError, match=message):
            AlertmanagerSinkSpec.model_validate({"type": "alertmanager", **bad})


@pytest.mark.slow
def test_every_replica_gets_every_alert_and_a_stopped_one_catches_up(spawn, tmp_path):
    first = start_alertmanager(spawn, tmp_path, [], name="am1")
    second = start_alertmanager(spawn, tmp_path, [], name="am2")
    medic = Medic(tmp_path / "state", [first.url, second.url])
    try:
        one, two = f"alertmanager@{host(first)}", f"alertmanager@{host(second)}"
        medic.finding("serving-1")
        medic.until(lambda: medic_alerts(first) == medic_alerts(second) == {"serving-1"})

        second.proc.terminate()
        second.proc.wait(10)
        medic.finding("serving-2")
        medic.until(lambda: "serving-2" in medic_alerts(first))
        medic.until(lambda: any(i.attempts >= 2 for i in medic.items(two) if i.state == "pending"))
        [delivered] = [i for i in medic.items(one) if i.instance == "serving-2"]
        assert delivered.state == "delivered" and delivered.attempts == 1
        [waiting] = [i for i in medic.items(two) if i.instance == "serving-2"]
        assert waiting.state == "pending" and "cannot reach" in waiting.last_error

        again = spawn(second.proc.args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        second.proc = again
        wait_http(f"{second.url}/-/ready")
        medic.until(lambda: medic_alerts(second) >= {"serving-2"})
        [caught_up] = [i for i in medic.items(two) if i.instance == "serving-2"]
        assert caught_up.state == "delivered" and caught_up.attempts >= 3
        # the replica that accepted was not sent it again (a slow run may add the alert's periodic
        # resend, an item of its own, sent once as well)
        sent = [i for i in medic.items(one) if i.instance == "serving-2"]
        assert sent[0].attempts == 1 and all(i.attempts <= 1 for i in sent), sent
    finally:
        medic.close()


@pytest.mark.slow
def test_silences_go_to_a_replica_that_answers(spawn, tmp_path):
    first = start_alertmanager(spawn, tmp_path, [], name="am1")
    second = start_alertmanager(spawn, tmp_path, [], name="am2")
    medic = Medic(tmp_path / "state", [first.url, second.url])
    try:
        medic.finding("serving-1")
        medic.until(lambda: medic_alerts(first) == medic_alerts(second) == {"serving-1"})
        first.proc.terminate()
        first.proc.wait(10)
        medic.notifier.silence_for("serving-1", "a1", until=2e9)
        medic.until(lambda: second.active_silences())
        [row] = medic.notifier.silencer.silences("active")
        assert row["sink"] == "alertmanager" and row["instance"] == "serving-1"
        medic.notifier.unsilence("a1")
        medic.until(lambda: not second.active_silences())
    finally:
        medic.close()
