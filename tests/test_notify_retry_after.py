"""`Retry-After` on a 429 or 503: the sink is not asked again sooner, whatever medic's own backoff says.

Delivery runs the notifier's own steps against a real HTTP target that rate-limits its first request.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from email.utils import format_datetime, parsedate_to_datetime

import pytest

from agent.config.loader import validate_config
from agent.notify.model import Notification
from agent.notify.service import Notifier
from agent.notify.sinks import DeliveryError, create_sinks
from agent.notify.sinks.base import MAX_RETRY_AFTER, retry_after
from agent.state.eventlog import EventLog
from agent.state.store import Store
from support.notify import run_once
from support.procs import wait_until

SECRET = "0123456789abcdef0123"
FAST = {"base": "50ms", "cap": "200ms", "max_attempts": 1000, "jitter": 0}
NOTE = Notification(
    key="event/1",
    status="info",
    event_kind="instance_down",
    event_id=1,
    ts=1_800_000_000.0,
    severity="warning",
    summary="pid of a is gone",
    message="pid of a is gone",
    instance="a",
)


@pytest.fixture(autouse=True)
def _secret(monkeypatch):
    monkeypatch.setenv("RETRY_AFTER_SECRET", SECRET)


def slack_notifier(state_dir, url, retry=FAST):
    config = validate_config({"notify": {"sinks": [{"type": "slack", "url": url}], "retry": retry}}).notify
    store = Store(state_dir)
    events = EventLog(store)
    return Notifier(config, store, events, rng=lambda: 0.0), events


def deliver_until(notifier, predicate, timeout=15.0):
    def step():
        run_once(notifier)
        return predicate()

    wait_until(step, timeout, 0.02)


def http_date(seconds_from_now: float) -> str:
    return format_datetime(datetime.fromtimestamp(time.time() + seconds_from_now, timezone.utc), usegmt=True)


def _not_before(first_attempt: float, header: str) -> float:
    """When a sink that answered `Retry-After: header` to the first attempt may be asked again:
    seconds count from that answer, an HTTP date names the instant itself (whole seconds)."""
    if header.isdigit():
        return first_attempt + int(header)
    return parsedate_to_datetime(header).timestamp()


@pytest.mark.parametrize(
    ("status", "header"),
    [(429, lambda: "2"), (503, lambda: http_date(3))],
    ids=["429-seconds", "503-http-date"],
)
def test_slack_is_not_asked_again_before_its_retry_after(tmp_path, hook_server, status, header):
    value = header()  # an HTTP date is made now: the instant it names does not move with the load
    server = hook_server(answers=[(status, {"Retry-After": value})])
    notifier, events = slack_notifier(tmp_path, server.url)
    events.emit("instance_down", "pid of a is gone", instance="a", severity="warning")
    deliver_until(notifier, lambda: server.received)
    first, second = server.attempts
    due = _not_before(first, value)
    assert second >= due - 0.05, (
        second - first,
        due - first,
    )  # the 50 ms backoff would have gone long before
    assert second < max(due, first) + 1.5  # a date already past when it was read: asked again at once
    [item] = notifier.outbox.items()
    assert item.state == "delivered" and item.attempts == 2
    stats = notifier.outbox.stats(["slack"])["slack"]
    assert (stats.failures_total, stats.delivered_total) == (1, 1)


def test_a_garbled_retry_after_falls_back_to_the_normal_backoff(tmp_path, hook_server):
    server = hook_server(answers=[(429, {"Retry-After": "in a bit"})])
    notifier, events = slack_notifier(tmp_path, server.url)
    events.emit("instance_down", "pid of a is gone", instance="a", severity="warning")
    deliver_until(notifier, lambda: server.received)
    first, second = server.attempts
    assert 0.05 <= second - first < 5.0, (
        second - first
    )  # the backoff, not a guessed wait (a loaded host adds to it)


def test_the_hold_is_the_sinks_a_dead_letter_does_not_let_the_next_item_in_early(tmp_path, hook_server):
    server = hook_server(answers=[(429, {"Retry-After": "1"})])
    retry = {**FAST, "max_attempts": 1}
    notifier, events = slack_notifier(tmp_path, server.url, retry)
    events.emit("instance_down", "first", instance="a", severity="warning")
    events.emit("instance_down", "second", instance="b", severity="warning")
    deliver_until(notifier, lambda: server.received)
    first, second = server.attempts
    assert second - first >= 0.95, second - first
    assert [i.instance for i in notifier.outbox.items(state="dead")] == ["a"]
    [body] = server.bodies()
    assert "second" in body["text"]


def test_every_sink_reads_the_header_bounded(hook_server):
    server = hook_server(
        answers=[(429, {"Retry-After": "86400"}), (503, {"Retry-After": "5"}), (500, {"Retry-After": "5"})]
    )
    config = validate_config(
        {"notify": [{"type": "webhook", "url": server.url, "secret_env": "RETRY_AFTER_SECRET"}]}
    ).notify
    [sink] = create_sinks(config)
    waits = []
    for _ in range(3):
        with pytest.raises(DeliveryError) as info:
            sink.send(NOTE, 1, NOTE.ts)
        assert info.value.retryable
        waits.append(info.value.retry_after)
    sink.close()
    assert waits == [MAX_RETRY_AFTER, 5.0, None]  # a 500 is retried on medic's own backoff


def test_retry_after_forms():
    now = time.time()
    assert retry_after("0", now) == 0.0
    assert retry_after(" 120 ", now) == 120.0
    assert retry_after("9" * 400, now) == MAX_RETRY_AFTER
    assert retry_after(http_date(-600), now) == 0.0  # already past: no extra wait
    assert 29 <= retry_after(http_date(30), now) <= 30
    assert retry_after("Wed, 21 Oct 2099 07:28:00 GMT", now) == MAX_RETRY_AFTER
    for garbage in (None, "", "-5", "1.5", "soon", "Mon, 99 Foo 2020", "²"):
        assert retry_after(garbage, now) is None, garbage
