"""The three formats, field by field, sent to a real HTTP server; signatures checked independently."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config.loader import validate_config
from agent.notify.model import Notification, parse_rfc3339, rfc3339
from agent.notify.signing import SignatureError, sign, signature_headers, verify
from agent.notify.sinks import DeliveryError, create_sinks
from agent.notify.sinks.alertmanager import label_name, postable_alert
from agent.notify.sinks.slack import slack_message
from support.procs import PATIENCE

T0 = 1_800_000_000.0
SECRET = "0123456789abcdef0123"
NOTE = Notification(
    key="finding/serving-7/leak",
    status="firing",
    event_kind="finding_opened",
    event_id=42,
    ts=T0,
    severity="warning",
    summary="serving-7 leaks 41 MB/h; projected OOM in 5h40m",
    message="finding opened",
    alertname="MedicLeak",
    instance="serving-7",
    agent="ranker-7f9c",
    fleet="ranker",
    kind="leak",
    evidence={"slope_bytes_per_second": 11400.0},
    labels={"fleet": "ranker", "zone": "b", "app.kubernetes.io/name": "ranker", "severity": "ignored"},
    finding_id="serving-7:leak:1",
    starts_at=T0 - 60,
    link="https://grafana.example/d/medic?var-name=serving-7",
    runbook="https://docs.example/medic/runbooks.md#medicleak",
    description="medic found serving-7's memory growing steadily.",
)


def sinks_for(*specs):
    return create_sinks(validate_config({"notify": list(specs)}).notify)


def test_alertmanager_alert_fields():
    alert = postable_alert(NOTE, now=T0, repost_interval=60.0)
    assert alert["labels"] == {  # the label model of the shipped rules (docs/alerts.md)
        "alertname": "MedicLeak",
        "name": "serving-7",
        "agent": "ranker-7f9c",
        "fleet": "ranker",
        "severity": "warning",  # medic's, not the instance label of the same name
        "kind": "leak",
        "source": "medic",
        "zone": "b",
        "app_kubernetes_io_name": "ranker",
    }
    assert alert["annotations"] == {  # for a person to read: the evidence stays in medic
        "summary": NOTE.summary,
        "description": "medic found serving-7's memory growing steadily.",
        "runbook_url": "https://docs.example/medic/runbooks.md#medicleak",
        "dashboard": NOTE.link,
        "finding_id": "serving-7:leak:1",
    }
    assert alert["startsAt"] == rfc3339(T0 - 60)
    assert alert["endsAt"] == rfc3339(T0 + 240)  # 4 re-post intervals: lapses by itself if medic stops
    assert alert["generatorURL"] == NOTE.link
    resolved = postable_alert(
        Notification(**{**NOTE.to_dict(), "status": "resolved", "ends_at": T0 + 5}),
        now=T0 + 99,
        repost_interval=60.0,
    )
    assert resolved["endsAt"] == rfc3339(T0 + 5) and resolved["labels"] == alert["labels"]
    assert label_name("9lives") == "_9lives"


def test_webhook_document_and_signature(hook_server):
    server = hook_server()
    [sink] = sinks_for({"type": "webhook", "url": f"{server.url}/in", "secret_env": "NOTIFY_TEST_SECRET"})
    sink.send(NOTE, delivery_id=7, now=T0 + 1)
    [got] = server.received
    doc = got.json()
    assert doc["version"] == "1"
    assert doc["delivery_id"] == 7 and doc["sent_at"] == rfc3339(T0 + 1)
    assert (doc["status"], doc["severity"], doc["instance"], doc["fleet"], doc["kind"]) == (
        "firing",
        "warning",
        "serving-7",
        "ranker",
        "leak",
    )
    assert doc["summary"] == NOTE.summary and doc["message"] == "finding opened"
    assert doc["event"] == {
        "id": 42,
        "kind": "finding_opened",
        "source_kind": "finding_opened",
        "ts": rfc3339(T0),
    }
    assert doc["alert"] == {
        "name": "MedicLeak",
        "key": "finding/serving-7/leak",
        "starts_at": rfc3339(T0 - 60),
        "ends_at": None,
    }
    assert doc["finding_id"] == "serving-7:leak:1" and doc["action_id"] is None
    assert doc["evidence"] == {"slope_bytes_per_second": 11400.0} and doc["link"] == NOTE.link
    assert set(doc["agent"]) == {"name", "host", "version"} and doc["agent"]["name"] == "ranker-7f9c"
    assert doc["runbook_url"] == NOTE.runbook
    assert got.headers["content-type"] == "application/json"
    assert got.headers["x-medic-event"] == "finding_opened" and got.headers["x-medic-delivery"] == "7"
    timestamp = got.headers["x-medic-timestamp"]
    expected = hmac.new(SECRET.encode(), timestamp.encode() + b"." + got.body, hashlib.sha256).hexdigest()
    assert got.headers["x-medic-signature"] == f"sha256={expected}"
    assert timestamp == str(int(T0 + 1))
    sink.close()


def test_slack_message_escapes_and_links(hook_server):
    server = hook_server()
    note = Notification(**{**NOTE.to_dict(), "summary": "a <b> & c"})
    message = slack_message(note)
    assert message["text"].startswith(
        ":rotating_light: *[FIRING] MedicLeak* · serving-7 on ranker-7f9c (fleet ranker) · warning\n"
    )
    assert "a &lt;b&gt; &amp; c" in message["text"]
    assert message["blocks"][1]["elements"][0]["text"].endswith(
        f"<{NOTE.link}|dashboard> · <{NOTE.runbook}|runbook>"
    )
    [sink] = sinks_for({"type": "slack", "url": f"{server.url}/services/T/B/x"})
    sink.send(note, 1, T0)
    assert server.received[0].json() == message and server.received[0].path == "/services/T/B/x"
    info = slack_message(
        Notification(**{**NOTE.to_dict(), "status": "info", "alertname": None, "event_kind": "paused"})
    )
    assert info["text"].startswith(":information_source: *paused* · serving-7")
    sink.close()


@pytest.mark.parametrize(
    ("mode", "retryable", "text"), [("error", True, "answered 500"), ("reject", False, "not retried")]
)
def test_error_answers_are_classified(hook_server, mode, retryable, text):
    server = hook_server(mode=mode)
    [sink] = sinks_for({"type": "slack", "url": server.url})
    with pytest.raises(DeliveryError) as info:
        sink.send(NOTE, 1, T0)
    assert info.value.retryable is retryable and text in str(info.value)
    sink.close()


def test_unreachable_and_slow_targets_are_retryable(hook_server):
    server = hook_server()
    server.stop()
    [down] = sinks_for({"type": "slack", "url": server.url})
    with pytest.raises(DeliveryError, match="cannot reach") as info:
        down.send(NOTE, 1, T0)
    assert info.value.retryable
    slow = hook_server(mode="slow", slow_for=1.0)
    [sink] = sinks_for({"type": "slack", "url": slow.url, "timeout": "200ms"})
    with pytest.raises(DeliveryError, match=r"did not answer within 0\.2s") as info:
        sink.send(NOTE, 1, T0)
    assert info.value.retryable
    down.close()
    sink.close()


def test_a_receiver_that_drips_its_answer_is_retried_after_the_deadline_not_waited_for(hook_server):
    server = hook_server(mode="drip", slow_for=30.0)  # each byte well within the read timeout
    [sink] = sinks_for({"type": "slack", "url": server.url, "timeout": "200ms"})
    started = time.monotonic()
    with pytest.raises(DeliveryError, match=r"did not answer within 0\.2s") as info:
        sink.send(NOTE, 1, T0)
    assert info.value.retryable and time.monotonic() - started < 3 * PATIENCE  # the drip takes 30 s
    sink.close()


def test_verify_accepts_own_signatures_and_refuses_the_rest():
    body = b'{"version":"4"}'
    headers = signature_headers(SECRET, body, T0)
    verify(SECRET, headers["X-Medic-Timestamp"], headers["X-Medic-Signature"], body, T0 + 10, 300)
    cases = [
        (None, headers["X-Medic-Signature"], body, T0, "send both"),
        ("soon", headers["X-Medic-Signature"], body, T0, "must be unix seconds"),
        (
            headers["X-Medic-Timestamp"],
            headers["X-Medic-Signature"],
            body,
            T0 + 301,
            "away from the agent's clock",
        ),
        (headers["X-Medic-Timestamp"], "md5=abc", body, T0, "sha256=<hex>"),
        (headers["X-Medic-Timestamp"], headers["X-Medic-Signature"], body + b" ", T0, "does not match"),
        (
            headers["X-Medic-Timestamp"],
            sign("another-secret-entirely", int(T0), body),
            body,
            T0,
            "does not match",
        ),
    ]
    for timestamp, signature, payload, now, message in cases:
        with pytest.raises(SignatureError, match=message):
            verify(SECRET, timestamp, signature, payload, now, 300)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=512), st.integers(min_value=0, max_value=2**40))
def test_sign_verify_roundtrip(body, timestamp):
    signature = sign(SECRET, timestamp, body)
    verify(SECRET, str(timestamp), signature, body, float(timestamp), 1)
    with pytest.raises(SignatureError):
        verify(SECRET, str(timestamp), signature, body + b"x", float(timestamp), 1)


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=0, max_value=4e9, allow_nan=False))
def test_rfc3339_roundtrip(ts):
    assert parse_rfc3339(rfc3339(ts)) == pytest.approx(ts, abs=1e-3)


def test_parse_rfc3339_forms():
    assert parse_rfc3339("2026-11-29T11:37:29.874815458Z") == pytest.approx(1795952249.874815, abs=1e-6)
    assert parse_rfc3339("2026-11-29T12:37:29+01:00") == parse_rfc3339("2026-11-29T11:37:29Z")
    assert parse_rfc3339("2026-11-29T11:37:29.8Z") == pytest.approx(1795952249.8)
    assert parse_rfc3339("0001-01-01T00:00:00Z") is None
    assert parse_rfc3339("yesterday") is None
    assert json.loads(json.dumps(NOTE.to_dict())) == NOTE.to_dict()
    assert Notification.from_dict({**NOTE.to_dict(), "future_field": 1}) == NOTE


@pytest.fixture(autouse=True)
def _secret(monkeypatch):
    monkeypatch.setenv("NOTIFY_TEST_SECRET", SECRET)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=500) | st.integers(-(10**400), 10**400).map(str) | st.just("9" * 4400))
def test_any_timestamp_header_is_accepted_or_refused_as_a_signature_error(timestamp):
    """The header comes from whoever connects: 400 digits (a float overflow) or 4400 (past int()'s
    limit) are a refusal like any other, never another exception."""
    signature = sign(SECRET, int(T0), b"{}")
    try:
        verify(SECRET, timestamp, signature, b"{}", T0, 300)
    except SignatureError as exc:
        assert str(exc)
    else:
        assert timestamp.strip() == str(int(T0))
