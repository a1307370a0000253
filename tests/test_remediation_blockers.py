"""Blockers: minimum uptime, the fleet's capacity floor, Prometheus alerts (a real loopback server), windows."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remediation.blockers import (
    BlockerContext,
    CapacityFloor,
    MinUptime,
    PrometheusAlerts,
    TimeWindowGate,
    parse_alerts,
)
from remediation.model import FleetEntry, InstanceView, RestartRecord
from remediation.windows import TimeWindow, Windows
from support.procs import PATIENCE, free_port
from support.remediation import HttpRecorder, dripping_server, silent_server

T0 = 1_700_000_000.0  # 22:13 UTC
TARGET = InstanceView("s1", 10, T0 - 7200, labels={"fleet": "ranker"})


def ctx(fleet=(), in_flight=(), view=TARGET, now=T0):
    return BlockerContext(view=view, now=now, fleet=list(fleet), in_flight=list(in_flight))


def peer(name, ready=True, fleet="ranker"):
    return FleetEntry(name, fleet, "agent-b", ready=ready)


@pytest.mark.parametrize("start_offset, ok", [(-7200, True), (-600, True), (-599, False), (-5, False)])
def test_min_uptime(start_offset, ok):
    view = InstanceView("s1", 10, T0 + start_offset)
    decision = MinUptime(600).check(ctx(view=view))
    assert decision.ok is ok
    if not ok:
        assert (
            decision.retry_at == pytest.approx(T0 + start_offset + 600)
            and "min_uptime is 10m" in decision.reason
        )


def test_min_uptime_without_a_process_blocks():
    assert not MinUptime(600).check(ctx(view=InstanceView("s1", None, None))).ok


CAPACITY = [
    # (peers, in flight, max_unavailable, min_ready_fraction, ok)
    ([peer("s2"), peer("s3")], [], 1, None, True),
    ([peer("s2", ready=False), peer("s3")], [], 1, None, False),
    ([peer("s2"), peer("s3")], [RestartRecord("s3", "ranker", "b", T0 - 10)], 1, None, False),
    ([peer("s2", ready=False), peer("s3")], [], 2, None, True),
    ([peer("x", ready=False, fleet="other"), peer("s2")], [], 1, None, True),  # other fleets do not count
    ([peer("s2"), peer("s3"), peer("s4")], [], 2, 0.8, False),  # 3 of 4 ready = 75 %
    ([peer(f"s{i}") for i in range(2, 11)], [], 2, 0.8, True),  # 9 of 10 ready
    ([], [], 1, None, True),  # alone in its fleet
]


@pytest.mark.parametrize("peers, in_flight, max_unavailable, fraction, ok", CAPACITY)
def test_capacity_floor_table(peers, in_flight, max_unavailable, fraction, ok):
    decision = CapacityFloor(max_unavailable, fraction).check(ctx(peers, in_flight))
    assert decision.ok is ok, decision.reason


def test_capacity_reason_names_the_instances_down():
    decision = CapacityFloor(1).check(ctx([peer("serving-3", ready=False), peer("serving-4")]))
    assert "serving-3" in decision.reason and "max_unavailable 1" in decision.reason


ALERTS = {
    "status": "success",
    "data": {
        "alerts": [
            {"labels": {"alertname": "NodeMemoryHigh", "severity": "warning"}, "state": "firing"},
            {"labels": {"alertname": "Watchdog"}, "state": "firing"},
            {"labels": {"alertname": "DiskFilling"}, "state": "pending"},
        ]
    },
}


@pytest.mark.parametrize(
    "match, ignore, ok, named",
    [
        ([], ["Watchdog"], False, "NodeMemoryHigh"),
        (["^Disk"], [], True, None),  # pending does not block
        (["Memory"], [], False, "NodeMemoryHigh"),
        ([], ["Watchdog", "Node"], True, None),
    ],
)
def test_prometheus_alerts_from_a_real_server(match, ignore, ok, named):
    with HttpRecorder() as server:
        server.respond("/api/v1/alerts", 200, ALERTS)
        decision = PrometheusAlerts(server.url, match, ignore, timeout=2).check(ctx())
        assert decision.ok is ok, decision.reason
        if named:
            assert named in decision.reason
        assert server.requests[0]["path"] == "/api/v1/alerts"


def test_prometheus_that_cannot_be_asked_holds_the_restart():
    assert not PrometheusAlerts(f"http://127.0.0.1:{free_port()}").check(ctx()).ok
    with silent_server() as url:
        decision = PrometheusAlerts(url, timeout=0.3).check(ctx())
        assert not decision.ok and "did not answer within 0.3s" in decision.reason
    with dripping_server() as url:  # a byte now and then: held, within a bounded time
        started = time.monotonic()
        decision = PrometheusAlerts(url, timeout=0.3).check(ctx())
        assert not decision.ok and "did not answer within 0.3s" in decision.reason
        assert time.monotonic() - started < 2.5 * PATIENCE
    with HttpRecorder() as server:
        server.respond("/api/v1/alerts", 200, b"<html>not prometheus</html>")
        assert "unexpected" in PrometheusAlerts(server.url).check(ctx()).reason
        server.respond("/api/v1/alerts", 503, {"status": "error", "error": "unavailable"})
        assert "unexpected" in PrometheusAlerts(server.url).check(ctx()).reason


@pytest.mark.parametrize(
    "payload, message",
    [
        ([], "expected a JSON object"),
        ({"status": "error", "error": "bad"}, "status is 'error'"),
        ({"status": "success", "data": {}}, "no data.alerts"),
        ({"status": "success", "data": {"alerts": [{"state": "firing"}]}}, "without labels"),
    ],
)
def test_parse_alerts_refuses_malformed_answers(payload, message):
    with pytest.raises(ValueError, match=message):
        parse_alerts(payload)


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(json_values)
def test_fuzz_parse_alerts_raises_only_valueerror(payload):
    try:
        alerts = parse_alerts(payload)
    except ValueError:
        return
    assert all(isinstance(a["name"], str) for a in alerts)


def test_window_gate_says_when_the_next_window_opens():
    gate = TimeWindowGate(Windows([TimeWindow.parse("02:00", "04:00", timezone="UTC")]))
    closed = gate.check(ctx(now=T0))  # 22:13 UTC
    assert not closed.ok and closed.retry_at == pytest.approx(T0 + 3 * 3600 + 47 * 60 - 20)
    assert "next opens" in closed.reason
    assert gate.check(ctx(now=T0 + 4 * 3600)).ok  # 02:13
