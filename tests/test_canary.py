"""The canary probe against a real server: timing, success, failures, and never two in flight."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from agent.core.records import ProbeTarget
from probes.canary import CanaryProbe
from support.latency_app import start_app
from support.procs import PATIENCE, wait_until


@pytest.fixture
def canary() -> Iterator[Callable[[], CanaryProbe]]:
    """`canary()` makes a probe; at teardown each waits for its canaries and closes its connections."""
    probes: list[CanaryProbe] = []

    def make() -> CanaryProbe:
        probes.append(CanaryProbe())
        return probes[-1]

    yield make
    for probe in probes:
        probe.close()


def canary_target(url: str, pid: int = 1, **extra) -> ProbeTarget:
    spec = {"url": url, "method": "GET", "headers": {}, "timeout": 2.0, "interval": 0.05, **extra}
    return ProbeTarget("svc", pid, 1.0, {}, {"latency": {"canary": spec}})


def collect_until(probe: CanaryProbe, target: ProbeTarget, metric: str, timeout: float = 5.0):
    """Tick the probe (as the agent does) until a sample of `metric` comes back."""
    found = []

    def tick():
        result = probe.collect(target, time.time())
        found.append(result)
        return any(s.metric == metric for s in result.samples)

    wait_until(tick, timeout, interval=0.02)
    return found[-1]


def test_success_is_timed_end_to_end(spawn, canary):
    app = start_app(spawn)
    probe = canary()
    result = collect_until(probe, canary_target(app.url("/work?ms=80")), "canary_latency_seconds")
    got = {s.metric: s.value for s in result.samples}
    assert got["canary_success"] == 1.0
    assert 0.08 <= got["canary_latency_seconds"] < 0.5 * PATIENCE  # the 80 ms request, end to end
    assert result.problems == []


@pytest.mark.slow
def test_never_more_than_one_in_flight_and_at_most_one_per_interval(spawn, canary):
    app = start_app(spawn)
    probe = canary()
    slow = canary_target(app.url("/work?ms=400"), interval=0.01)
    started = time.monotonic()
    while len(app.observed()) < 2:  # ticks far faster than the canary answers, until two answered
        assert time.monotonic() - started < 60, app.observed()
        probe.collect(slow, time.time())
        time.sleep(0.005)
    elapsed = time.monotonic() - started
    assert app.stats()["max_in_progress"] == 1
    assert len(app.observed()) <= 1 + elapsed / 0.4  # 0.4 s each, one at a time
    other = start_app(spawn)
    paced = canary_target(other.url("/work?ms=1"), pid=2, interval=0.3)
    started = time.monotonic()
    while len(other.observed()) < 3:
        assert time.monotonic() - started < 60, other.observed()
        probe.collect(paced, time.time())
        time.sleep(0.005)
    elapsed = time.monotonic() - started
    assert len(other.observed()) <= 1 + elapsed / 0.3  # at most one per 0.3 s interval
    assert other.stats()["max_in_progress"] == 1


def test_http_error_counts_as_failure_with_its_latency(spawn, canary):
    app = start_app(spawn)
    result = collect_until(canary(), canary_target(app.url("/work?ms=1&fail=1")), "canary_success")
    got = {s.metric: s.value for s in result.samples}
    assert got["canary_success"] == 0.0 and "canary_latency_seconds" in got
    assert "answered HTTP 500 (expected 2xx)" in str(result.problems[0])


@pytest.mark.parametrize(
    ("path", "message"), [("/hang", "did not answer within 0.3s"), ("/close", "closed the connection")]
)
def test_hung_or_closing_target_fails_within_the_timeout(spawn, path, message, canary):
    app = start_app(spawn)
    started = time.monotonic()
    result = collect_until(canary(), canary_target(app.url(path), timeout=0.3), "canary_success")
    assert time.monotonic() - started < 2.0 * PATIENCE
    assert [s.metric for s in result.samples] == ["canary_success"] and result.samples[0].value == 0.0
    assert message in str(result.problems[0])


def test_refused_target(canary):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = collect_until(canary(), canary_target(f"http://127.0.0.1:{port}/"), "canary_success")
    assert "cannot connect" in str(result.problems[0])


def test_post_with_headers_and_body_file(spawn, tmp_path, canary):
    app = start_app(spawn)
    body = tmp_path / "request.json"
    body.write_text(json.dumps({"instances": [[1.0, 2.0, 3.0]]}))
    target = canary_target(
        app.url("/work?ms=1"),
        method="POST",
        headers={"Content-Type": "application/json"},
        body_file=str(body),
    )
    result = collect_until(canary(), target, "canary_success")
    assert result.samples[0].value == 1.0
    missing = canary_target(app.url("/work"), method="POST", body_file=str(tmp_path / "nope.json"))
    result = collect_until(canary(), missing, "canary_success")
    assert "cannot read the canary body_file" in str(result.problems[0])


def test_forget_drops_the_schedule(spawn, canary):
    app = start_app(spawn)
    probe = canary()
    target = canary_target(app.url("/work?ms=300"))
    probe.collect(target, time.time())
    assert probe.in_flight(target)
    probe.forget(target)
    assert not probe.in_flight(target)
    time.sleep(0.4)
    assert probe.collect(target, time.time()).samples == []  # the orphaned answer is dropped
