"""The outbox inside a real agent: notifications survive `kill -9` and go out, once and in order,
when the target is back; `medic events --outbox` shows them meanwhile."""

from __future__ import annotations

import json
import signal

import pytest

from support.procs import wait_until

pytestmark = pytest.mark.slow
FAST = {"interval": "0.2s", "slow_interval": "1s", "discovery_interval": "0.5s", "flush_interval": "0.3s"}
SECRET = "agent-outbox-secret-0123"


def test_pending_notifications_survive_kill_9_and_go_out_once_in_order(
    agent, workload, hook_server, monkeypatch
):
    monkeypatch.setenv("OUTBOX_AGENT_SECRET", SECRET)  # inherited by the agent
    target = hook_server()
    target.stop()  # the webhook target is down from the start
    first, second = workload("stable", "--size", "4Mi"), workload("stable", "--size", "4Mi")
    config = {
        "agent": FAST,
        "instances": [
            {"name": "first", "match": {"pid": first.pid}, "labels": {"fleet": "ranker"}},
            {"name": "second", "match": {"pid": second.pid}},
        ],
        "notify": {
            "sinks": [{"type": "webhook", "url": f"{target.url}/medic", "secret_env": "OUTBOX_AGENT_SECRET"}],
            "retry": {"base": "100ms", "cap": "500ms", "max_attempts": 1000},
        },
    }
    agent.start(config)
    wait_until(lambda: all(agent.instance(n)["status"] == "up" for n in ("first", "second")), 10)
    first.kill()
    first.wait()
    wait_until(lambda: agent.instance("first")["status"] == "down", 10)
    second.kill()
    second.wait()
    wait_until(lambda: agent.instance("second")["status"] == "down", 10)

    def pending() -> list[dict]:
        items = sorted(agent.get("/api/v1/outbox", state="pending")["items"], key=lambda i: i["id"])
        return items if len(items) == 2 and items[0]["attempts"] >= 2 else []

    head, behind = wait_until(pending, 15)
    assert (head["instance"], behind["instance"]) == ("first", "second")
    assert "cannot reach" in head["last_error"]
    assert behind["attempts"] == 0  # it waits behind the head: order is kept

    shown = agent.cli("events", "--outbox")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["SINK", "PENDING", "DEAD", "OLDEST"] and lines[1].split()[:3] == [
        "webhook",
        "2",
        "0",
    ]
    row = next(line for line in lines if " first " in line)
    assert "pending" in row and "MedicInstanceDown (firing)" in row and "retry in" in row
    as_json = json.loads(agent.cli("events", "--outbox", "--state", "pending", "--json").stdout)
    assert as_json["sinks"]["webhook"]["pending"] == 2 and len(as_json["items"]) == 2

    agent.proc.send_signal(signal.SIGKILL)  # no chance to flush or say goodbye
    agent.proc.wait(timeout=10)
    target.start()  # the same port: the target is back
    agent.start(config)

    wait_until(lambda: len(target.received) >= 2, 20)
    wait_until(lambda: agent.get("/api/v1/outbox", state="pending")["items"] == [], 10)
    bodies = target.bodies()
    assert [b["instance"] for b in bodies] == ["first", "second"]  # in the order they happened
    assert len(target.received) == 2  # once each, though the agent died with them in flight
    assert bodies[0]["status"] == "firing" and bodies[0]["alert"]["name"] == "MedicInstanceDown"
    assert bodies[0]["fleet"] == "ranker" and bodies[0]["event"]["kind"] == "instance_down"
    assert bodies[0]["summary"].startswith(f"first: pid {first.pid} is gone")
    metrics = agent.get("/metrics")
    assert 'medic_notify_queue_depth{sink="webhook"} 0.0' in metrics
    assert 'medic_notify_deliveries_total{sink="webhook"} 2.0' in metrics


def test_a_dead_letter_is_sent_again_with_medic_events_requeue_and_the_admin_token(
    agent, workload, hook_server, monkeypatch
):
    monkeypatch.setenv("OUTBOX_AGENT_SECRET", SECRET)  # inherited by the agent
    target = hook_server(mode="reject")  # a 400: the notification is dead at once
    stable = workload("stable", "--size", "4Mi")
    config = {
        "agent": FAST,
        "instances": [{"name": "gone", "match": {"pid": stable.pid}}],
        "notify": {
            "sinks": [{"type": "webhook", "url": f"{target.url}/medic", "secret_env": "OUTBOX_AGENT_SECRET"}]
        },
    }
    agent.start(config)
    wait_until(lambda: agent.instance("gone")["status"] == "up", 10)
    stable.kill()
    stable.wait()
    [dead] = wait_until(lambda: agent.get("/api/v1/outbox", state="dead")["items"], 15)
    assert "answered 400" in dead["last_error"]

    wrong = agent.tmp_path / "wrong.token"
    wrong.write_text("not-the-token\n")
    wrong.chmod(0o600)
    refused = agent.cli("events", "--requeue", str(dead["id"]), "--token-file", str(wrong))
    assert refused.returncode != 0 and "403" in refused.stderr and len(target.received) == 0
    not_dead = agent.cli(
        "events", "--requeue", "999999", "--token-file", str(agent.state_dir / "admin.token")
    )
    assert not_dead.returncode != 0 and "is a dead letter; `medic events --outbox" in not_dead.stderr

    target.mode = "ok"  # the operator fixed the receiver
    token = str(agent.state_dir / "admin.token")
    done = agent.cli("events", "--requeue", str(dead["id"]), "--token-file", token)
    assert done.returncode == 0, done.stderr
    assert f"queued again: {dead['id']}" in done.stdout
    wait_until(lambda: target.received, 15)
    assert target.bodies()[0]["instance"] == "gone"
    [said] = agent.events(kind="outbox_requeued")
    assert said["data"]["ids"] == [dead["id"]] and said["data"]["reason"] == "requeued with medic events"
