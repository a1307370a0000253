"""The durable outbox: dedup, backoff with jitter, dead letters, order, and nothing lost across restarts.

Delivery tests run the notifier's own steps against a real HTTP target that goes down, fails,
hangs and comes back.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config.loader import validate_config
from agent.notify.config import RetrySpec
from agent.notify.outbox import Outbox, backoff_delay
from agent.notify.service import Notifier
from agent.state.eventlog import EventLog
from agent.state.store import Store
from support.notify import run_once
from support.procs import wait_until

SECRET = "0123456789abcdef0123"
T0 = 1_800_000_000.0


@pytest.fixture(autouse=True)
def _secret(monkeypatch):
    monkeypatch.setenv("OUTBOX_SECRET", SECRET)


def notifier_for(state_dir, url, *, retry=None, timeout="2s", rng=lambda: 0.0):
    config = validate_config(
        {
            "notify": {
                "sinks": [{"type": "webhook", "url": url, "secret_env": "OUTBOX_SECRET", "timeout": timeout}],
                "retry": retry or {"base": "50ms", "cap": "200ms", "max_attempts": 1000, "jitter": 0.5},
            }
        }
    ).notify
    store = Store(state_dir)
    events = EventLog(store)
    return Notifier(config, store, events, rng=rng), events


def deliver_until(notifier, predicate, timeout=15.0):
    def step():
        run_once(notifier)
        return predicate()

    wait_until(step, timeout, 0.02)


# ----------------------------------------------------------------------------- pure parts
def test_dedup_keys_drop_repeats_and_replace_pending(tmp_path):
    store = Store(tmp_path)
    outbox = Outbox(store, RetrySpec())
    common = {"sink": "s", "kind": "k", "instance": None, "now": T0}
    first = outbox.put(dedup_key="event:1", payload={"n": 1}, **common)
    assert outbox.put(dedup_key="event:1", payload={"n": 2}, **common) is None
    alert = outbox.put(dedup_key="alert:a", payload={"v": 1}, replace=True, **common)
    assert outbox.put(dedup_key="alert:a", payload={"v": 2}, replace=True, **common) == alert
    items = {i.id: i for i in outbox.items()}
    assert (
        items[first].payload == {"n": 1} and items[alert].payload == {"v": 2} and items[alert].revision == 1
    )
    stale = items[alert]
    outbox.put(dedup_key="alert:a", payload={"v": 3}, replace=True, **common)
    assert outbox.delivered(stale, T0) is False  # replaced while in flight: it goes again with v3
    assert outbox.head("s").id == first
    outbox.delivered(outbox.head("s"), T0)
    assert outbox.head("s").payload == {"v": 3}
    outbox.delivered(outbox.head("s"), T0)
    assert outbox.put(dedup_key="alert:a", payload={"v": 4}, replace=True, **common) not in (None, alert)
    assert outbox.put(dedup_key="event:1", payload={"n": 3}, **common) is None  # delivered keys stay taken
    store.close()


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=200),
    st.floats(min_value=0, max_value=0.999),
    st.floats(min_value=0.01, max_value=10),
    st.floats(min_value=0.01, max_value=1000),
    st.floats(min_value=0, max_value=1),
)
def test_backoff_is_exponential_capped_and_jittered(attempt, draw, base, cap, jitter):
    retry = RetrySpec(base=base, cap=cap, jitter=jitter)
    full = min(cap, base * 2 ** (attempt - 1))
    delay = backoff_delay(attempt, retry, draw)
    assert full * (1 - jitter) - 1e-9 <= delay <= full + 1e-9
    assert backoff_delay(attempt + 1, retry, draw) >= delay - 1e-9


# ----------------------------------------------------------------------------- against a real target
def test_target_down_then_back_delivers_each_once_in_order(tmp_path, hook_server):
    server = hook_server()
    server.stop()  # down: connection refused
    notifier, events = notifier_for(tmp_path, f"{server.url}/in")
    for name in ("a", "b", "c", "d"):
        events.emit("instance_down", f"pid of {name} is gone", instance=name, severity="warning")
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # retries while the target is down
        run_once(notifier)
        time.sleep(0.02)
    head = notifier.outbox.head("webhook")
    assert head.instance == "a" and head.attempts >= 4 and "cannot reach" in head.last_error
    assert notifier.outbox.stats(["webhook"])["webhook"].pending == 4
    server.start()
    deliver_until(notifier, lambda: len(server.received) >= 4)
    time.sleep(0.3)
    run_once(notifier)
    assert [b["instance"] for b in server.bodies()] == ["a", "b", "c", "d"]
    assert len(server.received) == 4  # once each
    stats = notifier.outbox.stats(["webhook"])["webhook"]
    assert (stats.pending, stats.dead, stats.delivered_total) == (0, 0, 4)
    assert stats.failures_total == head.attempts


def test_500s_back_off_exponentially_then_dead_letter_and_the_queue_moves_on(tmp_path, hook_server):
    server = hook_server(mode="error")
    retry = {"base": "100ms", "cap": "10s", "max_attempts": 4, "jitter": 0}
    notifier, events = notifier_for(tmp_path, server.url, retry=retry)
    events.emit("instance_down", "first", instance="a")
    events.emit("instance_down", "second", instance="b")
    deliver_until(notifier, lambda: len(server.attempts) >= 4, 10)
    gaps = [later - earlier for earlier, later in zip(server.attempts, server.attempts[1:4])]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2 and gaps[2] >= 0.4, gaps
    assert gaps[2] < 3.0, gaps  # exponential, not unbounded
    dead = notifier.outbox.items(state="dead")
    assert [d.instance for d in dead] == ["a"] and dead[0].attempts == 4
    assert "answered 500" in dead[0].last_error
    [said] = notifier.store.events(kinds=["notification_dead"])
    assert said.instance == "a" and said.severity == "error" and said.data["item_id"] == dead[0].id
    assert said.message.startswith("webhook: gave up on MedicInstanceDown after 4 attempt(s): ")
    server.mode = "ok"
    deliver_until(notifier, lambda: server.received)
    assert [b["instance"] for b in server.bodies()] == ["b"]
    stats = notifier.collector.snapshot.sinks["webhook"]
    assert (stats.dead, stats.dead_total, stats.delivered_total) == (1, 1, 1)
    assert stats.failures_total == len(server.attempts) - 1  # every attempt but the last failed
    assert notifier.outbox.requeue_dead([dead[0].id], time.time()) == 1
    deliver_until(notifier, lambda: len(server.received) == 2)
    assert server.bodies()[1]["instance"] == "a"  # an operator may send a dead letter again


def test_refusals_are_dead_at_once(tmp_path, hook_server):
    server = hook_server(mode="reject")
    notifier, events = notifier_for(tmp_path, server.url)
    events.emit("instance_down", "x", instance="a")
    deliver_until(notifier, lambda: notifier.outbox.items(state="dead"))
    assert len(server.attempts) == 1
    assert "answered 400" in notifier.outbox.items(state="dead")[0].last_error


def test_timeouts_are_retried_with_the_same_delivery_id(tmp_path, hook_server):
    server = hook_server(mode="slow", slow_for=0.6)
    notifier, events = notifier_for(tmp_path, server.url, timeout="150ms")
    events.emit("instance_down", "x", instance="a")
    run_once(notifier)
    item = notifier.outbox.head("webhook")
    assert item.attempts == 1 and "did not answer within 0.15s" in item.last_error
    server.mode = "ok"
    deliver_until(notifier, lambda: notifier.outbox.head("webhook") is None)
    time.sleep(0.7)  # the hung first attempt completes at the target too: delivery is at-least-once
    ids = {r.headers["x-medic-delivery"] for r in server.received}
    assert ids == {str(item.id)}  # ... and receivers drop repeats by X-Medic-Delivery


def test_pending_items_survive_a_restart(tmp_path, hook_server):
    server = hook_server()
    server.stop()
    first, events = notifier_for(tmp_path, server.url)
    events.emit("instance_down", "gone", instance="a")
    run_once(first)
    assert first.outbox.head("webhook").attempts == 1
    first.store.close()
    server.start()
    second, _ = notifier_for(tmp_path, server.url)
    deliver_until(second, lambda: server.received)
    assert server.bodies()[0]["instance"] == "a"
    run_once(second)
    assert len(server.received) == 1
