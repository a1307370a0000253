"""The etcd coordinator pointed at something that is not etcd (a fake HTTP server on loopback, named
as such: it answers any JSON, deep JSON, endless or dripping bodies): every call ends in a
`CoordinatorError` (no restart, said why) within a bounded time and memory, never another exception.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remediation.coordinator import etcd_gateway
from remediation.coordinator.base import SlotRequest
from remediation.coordinator.etcd import EtcdCoordinator
from remediation.errors import CoordinatorError, CoordinatorUnavailable
from remediation.model import Decision, FleetEntry
from support.procs import PATIENCE
from support.remediation import HttpRecorder, dripping_server

TIMEOUT = 0.5


def allow(records, now):
    return Decision.allow("budget", "test: always")


def calls(c: EtcdCoordinator) -> list:
    request = SlotRequest(instance="serving-1", holder="agent-a", ttl=30.0, fleet="f")
    return [
        lambda: c.acquire(request, allow),
        lambda: c.restarts(since=0),
        lambda: c.publish("agent-a", [FleetEntry(instance="serving-1", fleet="f", agent="agent-a")], 30.0),
        c.fleet,
        lambda: c.campaign("agent-a", 30.0),
        c.fleet_pause,
        lambda: c.grants("agent-a"),
        lambda: c.get_profiles(["workload"]),
    ]


@pytest.fixture(scope="module")
def fake_etcd() -> Iterator[HttpRecorder]:
    """Not etcd: a loopback HTTP server whose every path answers what the test sets."""
    with HttpRecorder() as server:
        yield server


ETCD_LIKE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=6)
    | st.sampled_from(["", "AAAA", "-1", "x"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "kvs",
                    "key",
                    "value",
                    "header",
                    "revision",
                    "ID",
                    "TTL",
                    "succeeded",
                    "responses",
                    "response_range",
                    "lease",
                    "mod_revision",
                    "create_revision",
                    "count",
                    "error",
                    "code",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=ETCD_LIKE, status=st.sampled_from([200, 200, 400, 500]), which=st.integers(0, 7))
def test_any_json_from_a_fake_etcd_is_a_coordinator_error(fake_etcd, answer, status, which):
    fake_etcd.fallback = (status, json.dumps(answer).encode(), 0.0)
    c = EtcdCoordinator([fake_etcd.url], timeout=TIMEOUT)
    try:
        calls(c)[which]()
    except CoordinatorError:
        pass
    finally:
        c.close()


def test_deep_json_is_a_coordinator_error(fake_etcd):
    fake_etcd.fallback = (200, b"[" * 100_000 + b"]" * 100_000, 0.0)
    c = EtcdCoordinator([fake_etcd.url], timeout=TIMEOUT)
    for call in calls(c):
        with pytest.raises(CoordinatorError, match="non-JSON"):
            call()
    c.close()


def test_a_dripping_etcd_is_unavailable_after_the_total_deadline():
    with dripping_server(0.05, b" ") as url:
        c = EtcdCoordinator([url], timeout=TIMEOUT)
        started = time.monotonic()
        with pytest.raises(CoordinatorUnavailable, match=r"no answer within 0\.5s"):
            c.restarts(since=0)
        assert time.monotonic() - started < etcd_gateway.REPLY_DEADLINE_FACTOR * TIMEOUT + 1.5 * PATIENCE
        c.close()


def test_an_endless_etcd_answer_stops_at_the_bound(monkeypatch):
    monkeypatch.setattr(etcd_gateway, "MAX_REPLY_BYTES", 2**20)
    with dripping_server(0.0, b"0," * 32768) as url:
        c = EtcdCoordinator([url], timeout=TIMEOUT)
        with pytest.raises(CoordinatorUnavailable, match="answered more than 1 MiB"):
            c.fleet()
        c.close()


class _Detection:
    """The little of the detection job the peers job reads: priors and one workload key."""

    def __init__(self) -> None:
        from agent.detect.memory.priors import PriorBook

        self.priors = PriorBook()

    def workload_keys(self) -> list[str]:
        return ["workload"]

    def shared_profiles(self) -> dict:
        return {}


class _Events:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def emit(self, kind: str, message: str, **fields) -> None:
        self.kinds.append(kind)


@pytest.mark.parametrize(
    "answer",
    [{}, {"header": {}}, {"responses": None}, {"responses": []}, {"responses": "x"}, {"responses": [{}]}, []],
)
def test_the_peers_job_reads_a_junk_answer_as_peers_unavailable(fake_etcd, answer):
    """Not "0 of 1 workloads loaded": an answer that cannot be read is no answer."""
    from agent.jobs.peers import PeersJob

    fake_etcd.fallback = (200, json.dumps(answer).encode(), 0.0)
    c = EtcdCoordinator([fake_etcd.url], timeout=TIMEOUT)
    events = _Events()
    try:
        PeersJob(c, _Detection(), events, "agent-a").tick(now=1_800_000_000.0)  # type: ignore[arg-type]
    finally:
        c.close()
    assert "peers_unavailable" in events.kinds and "priors_loaded" not in events.kinds, events.kinds


def test_an_etcd_answer_with_empty_ranges_is_no_profiles_yet(fake_etcd):
    """etcd's own answer for a key nobody put: one range answer without kvs, read as none found."""
    fake_etcd.fallback = (
        200,
        json.dumps(
            {"header": {}, "succeeded": True, "responses": [{"response_range": {"header": {}}}]}
        ).encode(),
        0.0,
    )
    c = EtcdCoordinator([fake_etcd.url], timeout=TIMEOUT)
    try:
        assert c.get_profiles(["workload"]) == {}
    finally:
        c.close()
