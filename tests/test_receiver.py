"""`POST /api/v1/alertmanager` through the agent's real FastAPI app, store and event log."""

from __future__ import annotations

import copy
import json
import logging
import os
import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.api.app import create_app
from agent.api.context import ApiContext
from agent.api.metrics import Telemetry
from agent.config.loader import validate_config
from agent.jobs.detection import Detection
from agent.notify.external import external_findings, open_external_finding
from agent.notify.inbound import InboundError, label_fingerprint, parse_webhook
from agent.notify.signing import signature_headers
from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.tracker import Tracker
from support.notify import ServedApp
from support.procs import wait_until

TOKEN = "t" * 32
SECRET = "receiver-secret-0123456789"
PATH = "/api/v1/alertmanager"
PAYLOAD = {
    "receiver": "medic",
    "status": "firing",
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": "HighLatency",
                "instance": "serving-0",
                "severity": "page",
                "job": "ranker",
            },
            "annotations": {
                "summary": "p99 above 300ms for 10m",
                "runbook_url": "https://runbooks.example/lat",
            },
            "startsAt": "2026-11-29T11:37:29.874815458Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph?g0.expr=x",
            "fingerprint": "8a2ed838d8df3d74",
        }
    ],
    "groupLabels": {"alertname": "HighLatency"},
    "commonLabels": {"alertname": "HighLatency"},
    "commonAnnotations": {},
    "externalURL": "http://alertmanager:9093",
    "version": "4",
    "groupKey": '{}:{alertname="HighLatency"}',
    "truncatedAlerts": 0,
}


class Receiver:
    def __init__(self, tmp_path, agent_name=None, **receiver):
        config = validate_config(
            {
                "instances": [
                    {"name": "serving-0", "match": {"pid": os.getpid()}},
                    {"name": "serving-1", "match": {"pid": os.getppid()}},  # one watcher per process
                ],
                "notify": {"receiver": {"secret_env": "RECEIVER_SECRET", **receiver}},
            }
        )
        self.store = Store(tmp_path / "state")
        self.events = EventLog(self.store)
        tracker = Tracker(config.instances, self.store, self.events)
        self.telemetry = Telemetry(tracker)
        detection = Detection(
            tracker, self.store, self.events, config.detect.memory_params(), config.detect.slow_params()
        )
        self.tracker, self.detection = tracker, detection
        ctx = ApiContext(
            tracker,
            self.store,
            self.telemetry,
            self.events,
            TOKEN,
            detection=detection,
            notify=config.notify,
            agent_name=agent_name,
        )
        self.served = ServedApp(create_app(ctx))
        self.client = self.served.client

    def post(self, body, *, auth=True, headers=None):
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {"Content-Type": "application/json", **(headers or {})}
        if auth:
            sent["Authorization"] = f"Bearer {TOKEN}"
        return self.client.post(PATH, content=content, headers=sent)

    def findings(self, state="open"):
        return external_findings(self.store, state=state)

    def kinds(self):
        return [e.kind for e in reversed(self.store.events(kinds=["finding_opened", "finding_resolved"]))]


@pytest.fixture
def receiver(tmp_path, monkeypatch):
    monkeypatch.setenv("RECEIVER_SECRET", SECRET)
    made = []

    def make(**options):
        made.append(Receiver(tmp_path / str(len(made)), **options))
        return made[-1]

    yield make
    for r in made:
        r.served.close()
        r.store.close()


def resolved(payload):
    body = copy.deepcopy(payload)
    body["status"] = "resolved"
    for alert in body["alerts"]:
        alert["status"] = "resolved"
        alert["endsAt"] = "2026-11-29T11:47:29Z"
    return body


def test_firing_alert_opens_an_external_finding_once(receiver):
    r = receiver()
    answer = r.post(PAYLOAD)
    assert answer.status_code == 200, answer.text
    [result] = answer.json()["results"]
    assert result["result"] == "opened" and result["instance"] == "serving-0"
    [finding] = r.findings()
    assert finding["id"] == "serving-0:external:8a2ed838d8df3d74:1795952249"
    assert finding["kind"] == "external" and finding["severity"] == "critical"  # `page` is critical
    assert finding["summary"] == "p99 above 300ms for 10m"
    evidence = finding["evidence"]
    assert evidence["alertname"] == "HighLatency" and evidence["fingerprint"] == "8a2ed838d8df3d74"
    assert evidence["labels"]["job"] == "ranker" and evidence["annotations"]["runbook_url"].startswith(
        "https://"
    )
    assert evidence["external_url"] == "http://alertmanager:9093" and evidence["receiver"] == "medic"
    [event] = r.store.events(kinds=["finding_opened"])
    assert event.instance == "serving-0" and event.severity == "critical"
    assert event.data["finding"]["id"] == finding["id"] and event.data["finding"]["kind"] == "external"

    for _ in range(3):  # Alertmanager re-sends on repeat_interval and after its own restarts
        assert r.post(PAYLOAD).json()["results"][0]["result"] == "duplicate"
    assert r.kinds() == ["finding_opened"]

    assert r.post(resolved(PAYLOAD)).json()["results"][0]["result"] == "resolved"
    assert r.post(resolved(PAYLOAD)).json()["results"][0]["result"] == "not-open"
    assert r.findings() == [] and r.findings("resolved")[0]["resolved_at"] is not None
    assert r.post(PAYLOAD).json()["results"][0]["result"] == "duplicate"  # a late copy of the old firing
    assert r.kinds() == ["finding_opened", "finding_resolved"]

    again = copy.deepcopy(PAYLOAD)
    again["alerts"][0]["startsAt"] = "2026-11-29T12:30:00Z"  # it fires anew
    assert r.post(again).json()["results"][0]["result"] == "opened"
    metrics = r.telemetry.registry.get_sample_value
    assert metrics("medic_receiver_alerts_total", {"result": "duplicate"}) == 4


def test_external_findings_are_listed_and_become_remediation_requests(receiver):
    from agent.jobs.remediation import Remediation
    from remediation.config import RemediationSection

    r = receiver()
    assert r.post(PAYLOAD).status_code == 200
    listed = r.client.get("/api/v1/findings", params={"kind": "external"}).json()["findings"]
    assert listed and {f["kind"] for f in listed} == {"external"}
    assert r.client.get("/api/v1/findings").json()["findings"] == listed  # open findings of every kind
    remediation = Remediation(RemediationSection(), r.tracker, r.store, r.events, r.detection)
    try:
        requests = remediation.requests()
    finally:
        remediation.close()
    assert sorted((q.instance, q.kind, q.finding_id) for q in requests) == sorted(
        (f["instance"], "external", f["id"]) for f in listed
    )


def test_labels_map_alerts_to_instances_in_order(receiver):
    r = receiver(instance_labels=["pod", "name"])
    body = copy.deepcopy(PAYLOAD)
    body["alerts"][0]["labels"] = {
        "alertname": "X",
        "instance": "10.0.0.1:9100",
        "pod": "nope",
        "name": "serving-1",
    }
    assert r.post(body).json()["results"][0]["instance"] == "serving-1"


def test_unknown_instances_are_refused_with_what_was_tried(receiver):
    r = receiver()
    body = copy.deepcopy(PAYLOAD)
    body["alerts"][0]["labels"]["instance"] = "10.0.0.1:9100"
    answer = r.post(body)
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert "none of the labels medic_instance, instance, name names a watched instance" in error
    assert "'instance': '10.0.0.1:9100'" in error and "serving-0, serving-1" in error
    assert "notify.receiver.instance_labels" in error
    mixed = copy.deepcopy(PAYLOAD)
    mixed["alerts"].append(body["alerts"][0])
    answer = r.post(mixed)
    assert answer.status_code == 200
    assert [x["result"] for x in answer.json()["results"]] == ["opened", "unknown-instance"]


def test_an_alert_about_another_agents_replica_is_not_this_agents(receiver):
    """Replicas of a workload name their instance alike: the `agent` label says whose it is."""
    r = receiver(agent_name="ranker-a")
    body = copy.deepcopy(PAYLOAD)
    body["alerts"][0]["labels"]["agent"] = "ranker-b"
    answer = r.post(body)
    assert answer.status_code == 200
    [result] = answer.json()["results"]
    assert result["result"] == "other-agent" and result["reason"] == "about agent ranker-b, not ranker-a"
    assert r.findings() == []
    body["alerts"][0]["labels"]["agent"] = "ranker-a"
    assert r.post(body).json()["results"][0]["result"] == "opened"


def test_medics_own_alerts_are_ignored(receiver):
    r = receiver()
    body = copy.deepcopy(PAYLOAD)
    body["alerts"][0]["labels"]["source"] = "medic"
    answer = r.post(body)
    assert answer.status_code == 200 and answer.json()["results"][0]["result"] == "ignored"
    assert r.findings() == []


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"{not json", 400, "malformed JSON at line 1 column 2"),
        (b"\xff\xfe", 400, "not UTF-8"),
        (b"[]", 400, "expected a JSON object"),
        (json.dumps({**PAYLOAD, "version": "3"}).encode(), 400, "unsupported payload version '3'"),
        (json.dumps({**PAYLOAD, "version": 4}).encode(), 400, "unsupported payload version 4"),
        (json.dumps({**PAYLOAD, "alerts": "many"}).encode(), 400, "alerts: Input should be a valid list"),
        (
            json.dumps({**PAYLOAD, "alerts": [{**PAYLOAD["alerts"][0], "labels": {"severity": 3}}]}).encode(),
            400,
            "alerts[0].labels.severity: Input should be a valid string",
        ),
        (
            json.dumps({**PAYLOAD, "alerts": [{**PAYLOAD["alerts"][0], "status": "burning"}]}).encode(),
            400,
            "alerts[0].status",
        ),
        (
            json.dumps({**PAYLOAD, "alerts": [{**PAYLOAD["alerts"][0], "startsAt": "soon"}]}).encode(),
            400,
            "alerts[0].startsAt: expected an RFC 3339 time",
        ),
        (json.dumps({k: v for k, v in PAYLOAD.items() if k != "alerts"}).encode(), 400, "alerts: missing"),
    ],
)
def test_bad_payloads_get_clear_400s(receiver, body, status, message):
    r = receiver()
    answer = r.post(body)
    assert answer.status_code == status
    assert message in answer.json()["error"]
    assert r.findings() == []


def test_size_limits(receiver):
    r = receiver(max_body="4Ki", max_alerts=2)
    huge = json.dumps({**PAYLOAD, "padding": "x" * 8192}).encode()
    answer = r.post(huge)
    assert answer.status_code == 413 and "more than the 4096 allowed" in answer.json()["error"]

    def chunks():  # no Content-Length: counted while streaming
        for _ in range(10):
            yield b" " * 1024

    answer = r.client.post(PATH, content=chunks(), headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 413 and "exceeds the 4096 bytes" in answer.json()["error"]
    many = {**PAYLOAD, "alerts": PAYLOAD["alerts"] * 3}
    answer = r.post(many)
    assert answer.status_code == 413 and "3 alerts in one payload, at most 2" in answer.json()["error"]
    assert r.telemetry.registry.get_sample_value("medic_receiver_rejected_total", {"reason": "size"}) == 3


def test_a_sender_that_hangs_up_mid_body_is_refused_without_a_traceback(receiver, caplog):
    r = receiver()
    port = int(r.served.url.rsplit(":", 1)[1])
    body = json.dumps(PAYLOAD).encode()
    for sent in (0, 10, len(body) - 1):  # the connection closes before the promised length arrived
        with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
            conn.sendall(
                f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                + body[:sent]
            )
    wait_until(
        lambda: (
            r.telemetry.registry.get_sample_value("medic_receiver_rejected_total", {"reason": "json"}) == 3
        ),
        10,
    )
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert r.post(PAYLOAD).status_code == 200 and len(r.findings()) == 1


def test_authentication(receiver):
    r = receiver()
    body = json.dumps(PAYLOAD).encode()
    answer = r.post(body, auth=False)
    assert answer.status_code == 401 and "admin token" in answer.json()["error"]
    answer = r.post(body, auth=False, headers={"Authorization": "Bearer wrong-token-wrong-token"})
    assert answer.status_code == 403
    signed = signature_headers(SECRET, body, time.time())
    assert r.post(body, auth=False, headers=signed).status_code == 200
    forged = signature_headers("not-the-secret-not-the-secret", body, time.time())
    answer = r.post(body, auth=False, headers=forged)
    assert answer.status_code == 403 and "does not match" in answer.json()["error"]
    stale = signature_headers(SECRET, body, time.time() - 3600)
    answer = r.post(body, auth=False, headers=stale)
    assert answer.status_code == 403 and "replay" in answer.json()["error"]
    tampered = r.post(body.replace(b"p99", b"p50"), auth=False, headers=signed)
    assert tampered.status_code == 403


def test_hmac_needs_a_configured_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("RECEIVER_SECRET", SECRET)
    r = Receiver(tmp_path, secret_env=None)
    body = json.dumps(PAYLOAD).encode()
    answer = r.post(body, auth=False, headers=signature_headers(SECRET, body, time.time()))
    assert answer.status_code == 401 and "not enabled" in answer.json()["error"]
    r.served.close()
    r.store.close()


def test_open_external_finding_is_callable_directly_and_idempotent(tmp_path):
    from agent.notify.external import ExternalAlert

    store = Store(tmp_path)
    events = EventLog(store)
    alert = ExternalAlert("serving-0", "abc", "Probe", "warning", "probe failed", 1_800_000_000.0)
    first, opened = open_external_finding(store, events, alert, 1_800_000_010.0)
    again, reopened = open_external_finding(store, events, alert, 1_800_000_020.0)
    assert opened and not reopened and first["id"] == again["id"]
    assert again["evidence"]["last_seen"] == 1_800_000_010.0  # the stored row, before this sighting
    assert external_findings(store)[0]["evidence"]["last_seen"] == 1_800_000_020.0
    assert len(store.events(kinds=["finding_opened"])) == 1
    store.close()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=5),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        _json, st.fixed_dictionaries({"version": st.just("4")}, optional={"alerts": _json, "status": _json})
    )
)
def test_parser_only_raises_inbound_errors(data):
    try:
        parse_webhook(json.dumps(data).encode(), 100)
    except InboundError as exc:
        assert exc.status in (400, 413) and str(exc)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_parser_survives_arbitrary_bytes(body):
    try:
        parse_webhook(body, 100)
    except InboundError as exc:
        assert exc.status == 400


def test_fingerprint_fallback_is_stable():
    a = label_fingerprint({"b": "2", "a": "1"})
    assert a == label_fingerprint({"a": "1", "b": "2"}) and len(a) == 16
    assert a != label_fingerprint({"a": "1", "b": "3"})
    body = copy.deepcopy(PAYLOAD)
    del body["alerts"][0]["fingerprint"]
    _, [alert] = parse_webhook(json.dumps(body).encode(), 10)
    assert alert.fingerprint == label_fingerprint(PAYLOAD["alerts"][0]["labels"])
