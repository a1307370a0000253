"""One contract, every coordinator backend: `local` (a SQLite file) and `etcd` (a real etcd started here).

Each test gets a `make()` that builds a fresh client of the same backend and namespace, as a
separate agent would; several clients in one test are several agents sharing one budget.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import fields

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remediation.budget import BudgetLimits, BudgetState, admit
from remediation.coordinator.base import EXPIRED, PlannedGrant, SlotRequest, fleet_pause_decision, read_pause
from remediation.coordinator.etcd import EtcdCoordinator
from remediation.coordinator.etcd_store import RECENT
from remediation.coordinator.local import LocalCoordinator
from remediation.coordinator.store import Change, Put
from remediation.errors import CoordinatorError, CoordinatorUnavailable, LeaseLost
from remediation.model import Decision, FleetEntry
from support.procs import PATIENCE, free_port
from support.remediation import NEEDS_ETCD, etcd_server, silent_server

TTL = 2.0  # etcd's minimum
SEAT_TTL = 60.0  # a leader that lasts the test, where its expiry is not what the test is about
EXPIRY_WAIT = TTL + 1.8  # etcd's leader checks expiry about once a second
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def etcd_url():
    with etcd_server() as url:
        yield url


@pytest.fixture(params=["local", pytest.param("etcd", marks=[NEEDS_ETCD, pytest.mark.slow])])
def make(request, tmp_path):
    made = []
    namespace = f"t{uuid.uuid4().hex[:8]}"
    if request.param == "local":

        def factory(**kwargs):
            coordinator = LocalCoordinator(tmp_path / "coord.db", namespace=namespace, **kwargs)
            made.append(coordinator)
            return coordinator
    else:
        url = request.getfixturevalue("etcd_url")

        def factory(**kwargs):
            coordinator = EtcdCoordinator([url], namespace=namespace, **kwargs)
            made.append(coordinator)
            return coordinator

    yield factory
    for coordinator in made:
        coordinator.close()


def allow(records, now):
    return Decision.allow("budget", "test: always")


def refuse(records, now):
    return Decision.block("budget", "test", "test: never", retry_at=now + 60)


def one_at_a_time(records, now):
    state = BudgetState(records, now=now)
    return admit(
        state, "f", "?", now, BudgetLimits(max_concurrent=1, min_interval=0, max_per_hour=None, cooldown=0)
    )


def slot(instance, holder="agent-a", ttl=TTL, fleet="f"):
    return SlotRequest(instance=instance, fleet=fleet, holder=holder, ttl=ttl)


def test_grant_is_listed_in_flight_then_released_with_outcome(make):
    c = make()
    result = c.acquire(slot("serving-1"), allow)
    assert result.granted and result.decision.ok
    grant = result.grant
    assert grant.instance == "serving-1" and grant.holder == "agent-a"
    (record,) = c.restarts(since=0)
    assert record.in_flight and record.instance == "serving-1" and record.holder == "agent-a"
    assert abs(record.started_at - time.time()) < 5

    c.release(grant, "succeeded")
    (record,) = c.restarts(since=0)
    assert not record.in_flight and record.outcome == "succeeded"
    assert record.finished_at >= record.started_at
    c.release(grant, "failed")  # idempotent: the first outcome stays
    assert c.restarts(since=0)[0].outcome == "succeeded"


def test_refusal_passes_the_budget_reason_through_and_takes_nothing(make):
    c = make()
    result = c.acquire(slot("serving-1"), refuse)
    assert not result.granted
    assert result.decision.reason == "test: never" and result.decision.retry_at is not None
    assert c.restarts(since=0) == []


def test_admit_sees_the_other_agents_restarts(make):
    a, b = make(), make()
    seen = []

    def spy(records, now):
        seen.append([(r.instance, r.holder, r.in_flight) for r in records])
        return Decision.allow("budget", "ok")

    a.acquire(slot("serving-1", "agent-a"), allow)
    b.acquire(slot("serving-2", "agent-b"), spy)
    assert seen == [[("serving-1", "agent-a", True)]]


def test_the_same_instance_cannot_be_restarted_twice_at_once(make):
    a, b = make(), make()
    assert a.acquire(slot("serving-1", "agent-a"), allow).granted
    second = b.acquire(slot("serving-1", "agent-b"), allow)
    assert not second.granted
    assert second.decision.code == "in-flight" and "agent-a" in second.decision.reason


def test_racing_agents_never_exceed_the_budget(make):
    clients = [make() for _ in range(6)]
    results = []
    barrier = threading.Barrier(len(clients))

    def race(i, c):
        barrier.wait()
        results.append(c.acquire(slot(f"serving-{i}", f"agent-{i}"), one_at_a_time))

    threads = [threading.Thread(target=race, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    granted = [r for r in results if r.granted]
    assert len(granted) == 1, [r.decision.reason for r in results]
    assert all(r.decision.code == "max-concurrent" for r in results if not r.granted)
    assert sum(r.in_flight for r in clients[0].restarts(since=0)) == 1


@pytest.mark.slow  # waits for a TTL
def test_renew_keeps_the_slot_past_its_ttl(make):
    c = make()
    grant = c.acquire(slot("serving-1"), allow).grant
    end = time.monotonic() + EXPIRY_WAIT
    while time.monotonic() < end:
        expires = c.renew(grant)
        assert expires > time.time()
        time.sleep(0.5)
    (record,) = c.restarts(since=0)
    assert record.in_flight


@pytest.mark.slow  # waits for a TTL
def test_a_dead_holders_slot_frees_itself_after_the_ttl(make):
    dead, alive = make(), make()
    grant = dead.acquire(slot("serving-1", "agent-dead"), allow).grant
    assert not alive.acquire(slot("serving-1", "agent-alive"), allow).granted
    time.sleep(EXPIRY_WAIT)  # nobody renews
    (record,) = alive.restarts(since=0)
    assert not record.in_flight and record.outcome == EXPIRED
    assert grant.started_at < record.finished_at <= grant.started_at + TTL + 3
    again = alive.acquire(slot("serving-1", "agent-alive"), allow)
    assert again.granted
    with pytest.raises(LeaseLost):
        dead.renew(grant)


def test_released_slot_cannot_be_renewed(make):
    c = make()
    grant = c.acquire(slot("serving-1"), allow).grant
    c.release(grant, "succeeded")
    with pytest.raises(LeaseLost):
        c.renew(grant)


def test_restarts_since_keeps_in_flight_and_recent(make):
    c = make()
    old = c.acquire(slot("serving-1"), allow).grant
    c.release(old, "succeeded")
    time.sleep(0.05)
    cut = time.time()
    time.sleep(0.05)
    c.acquire(slot("serving-2"), allow)
    assert [r.instance for r in c.restarts(since=0)] == ["serving-1", "serving-2"]
    assert [r.instance for r in c.restarts(since=cut)] == ["serving-2"]


def test_finished_restarts_older_than_retention_are_forgotten(make):
    c = make(retention=0.5)
    grant = c.acquire(slot("serving-1"), allow).grant
    c.release(grant, "succeeded")
    time.sleep(0.7)
    c.acquire(slot("serving-2"), allow)
    assert [r.instance for r in c.restarts(since=0)] == ["serving-2"]


@pytest.mark.slow  # waits for a TTL
def test_published_fleet_is_shared_replaced_and_expires(make):
    a, b = make(), make()
    now = time.time()
    a.publish(
        "agent-a", [FleetEntry("s1", "f", "agent-a", updated_at=now), FleetEntry("s2", "f", "agent-a")], 60
    )
    b.publish(
        "agent-b",
        [FleetEntry("s3", "f", "agent-b", wants_restart=True, kind="leak", deadline=now + 3600)],
        TTL,
    )
    fleet = {e.instance: e for e in a.fleet()}
    assert sorted(fleet) == ["s1", "s2", "s3"]
    assert fleet["s3"].wants_restart and fleet["s3"].deadline == pytest.approx(now + 3600)
    assert fleet["s1"].updated_at == pytest.approx(now)

    a.publish("agent-a", [FleetEntry("s2", "f", "agent-a", ready=False)], 60)
    fleet = {e.instance: e for e in b.fleet()}
    assert sorted(fleet) == ["s2", "s3"] and fleet["s2"].ready is False

    time.sleep(EXPIRY_WAIT)  # agent-b stopped publishing
    assert [e.instance for e in a.fleet()] == ["s2"]


@pytest.mark.slow  # waits for a TTL
def test_publish_refreshes_the_lease(make):
    c = make()
    end = time.monotonic() + EXPIRY_WAIT
    while time.monotonic() < end:
        c.publish("agent-a", [FleetEntry("s1", "f", "agent-a")], TTL)
        time.sleep(0.5)
    assert [e.instance for e in c.fleet()] == ["s1"]


def test_namespaces_do_not_share_a_budget(make, request):
    a = make()
    a.acquire(slot("serving-1"), allow)
    other = type(a)(
        *(([a.path]) if isinstance(a, LocalCoordinator) else ([a.gateway.endpoints])),
        namespace=f"other{uuid.uuid4().hex[:6]}",
    )
    try:
        assert other.restarts(since=0) == []
        assert other.acquire(slot("serving-1"), allow).granted
    finally:
        other.close()


# ----------------------------------------------------------------------------- the elected planner
def granted(instance, agent, revision, slot_at=0.0, fleet="f"):
    return PlannedGrant(
        instance, fleet, agent, slot_at, slot_at, revision, reason=f"test slot for {instance}"
    )


def test_one_leader_at_a_time_and_it_stays_while_it_campaigns(make):
    a, b = make(), make()
    lead = a.campaign("agent-a", TTL)
    assert lead is not None and lead.agent == "agent-a"
    assert b.campaign("agent-b", TTL) is None
    assert a.campaign("agent-a", TTL) == lead  # renewed, same fencing revision
    assert b.leader() == "agent-a" and a.leader() == "agent-a"


def test_grants_reach_their_agent_and_are_written_only_when_they_change(make):
    a, b = make(), make()
    lead = a.campaign("agent-a", SEAT_TTL)
    assert b.campaign("agent-b", SEAT_TTL) is None
    grants = {"agent-b": [granted("b1", "agent-b", lead.revision, slot_at=100.0)]}
    assert a.write_grants(lead, grants) == 1
    assert a.write_grants(lead, grants) == 0  # unchanged: nothing written
    wait_until_equal(lambda: [g.instance for g in b.grants("agent-b") or []], ["b1"])
    (grant,) = b.grants("agent-b")
    assert grant.revision == lead.revision and grant.not_before == 100.0
    assert b.grants("agent-c") == []
    assert a.write_grants(lead, {}) == 1  # agent-b's grants withdrawn
    wait_until_equal(lambda: b.grants("agent-b"), [])


def test_a_resigned_leaders_grants_and_writes_no_longer_count(make):
    a, b = make(), make()
    old = a.campaign("agent-a", SEAT_TTL)
    a.write_grants(old, {"agent-b": [granted("b1", "agent-b", old.revision)]})
    wait_until_equal(lambda: len(b.grants("agent-b") or []), 1)  # b holds a grant from agent-a
    a.resign()
    new = wait_until_value(lambda: b.campaign("agent-b", SEAT_TTL))
    assert new.agent == "agent-b" and new.revision > old.revision
    assert b.grants("agent-b") == []  # the old leader's grant is ignored
    with pytest.raises(LeaseLost):
        a.write_grants(old, {"agent-b": [granted("b1", "agent-b", old.revision)]})


def test_acquire_under_a_deposed_leaders_grant_takes_nothing(make):
    a, b, c = make(), make(), make()
    old = a.campaign("agent-a", SEAT_TTL)
    a.write_grants(old, {"agent-b": [granted("b1", "agent-b", old.revision)]})
    wait_until_equal(lambda: len(b.grants("agent-b") or []), 1)
    a.resign()  # the grant is in b's hands; its grantor is gone
    assert wait_until_value(lambda: c.campaign("agent-c", SEAT_TTL)) is not None
    result = b.acquire(slot("b1", "agent-b"), allow)
    assert not result.granted and result.decision.code == "stale-grant"
    assert b.restarts(since=0) == []
    # the new leader's grant is honoured
    new = c.campaign("agent-c", SEAT_TTL)
    c.write_grants(new, {"agent-b": [granted("b1", "agent-b", new.revision)]})
    wait_until_equal(lambda: [g.revision for g in b.grants("agent-b") or []], [new.revision])
    assert b.acquire(slot("b1", "agent-b"), allow).granted


def test_nothing_is_granted_while_the_fleet_is_paused(make):
    a, b = make(), make()
    lead = a.campaign("agent-a", SEAT_TTL)
    a.write_grants(lead, {"agent-b": [granted("b1", "agent-b", lead.revision)]})
    wait_until_equal(lambda: len(b.grants("agent-b") or []), 1)
    a.set_fleet_pause({"reason": "incident 42", "by": "oncall"})
    wait_until_equal(lambda: b.grants("agent-b"), [])
    assert b.fleet_pause()["reason"] == "incident 42"
    a.set_fleet_pause(None)
    wait_until_equal(lambda: len(b.grants("agent-b") or []), 1)
    assert b.fleet_pause() is None


def test_no_slot_is_taken_while_the_fleet_is_paused_and_the_pause_ends_at_its_until(make):
    a, b = make(), make()
    until = time.time() + 2.5
    a.set_fleet_pause({"reason": "INC-7", "until": until, "by": "oncall", "since": time.time(), "agent": "a"})
    pause = wait_until_value(b.fleet_pause)
    assert (pause["reason"], pause["until"], pause["by"], pause["agent"]) == ("INC-7", until, "oncall", "a")
    refused = b.acquire(slot("b1", "agent-b"), allow)
    assert not refused.granted and refused.decision.code == "paused"
    assert "fleet-wide by oncall" in refused.decision.reason and "INC-7" in refused.decision.reason
    assert refused.decision.retry_at == until and b.restarts(since=0) == []
    time.sleep(max(0.0, until - time.time()) + 0.1)
    assert b.fleet_pause() is None and a.fleet_pause() is None  # by itself: nobody lifted it
    assert b.acquire(slot("b1", "agent-b"), allow).granted


def test_the_leader_is_described_with_its_fencing_revision_and_since_when(make):
    a, b = make(), make()
    assert b.leader_info() is None
    before = time.time()
    lead = a.campaign("agent-a", SEAT_TTL)
    info = wait_until_value(b.leader_info)
    assert info["agent"] == "agent-a" and info["revision"] == lead.revision
    assert before - 1 <= info["since"] <= time.time() and lead.since == pytest.approx(info["since"], abs=1)


@given(text=st.text(max_size=300) | JSON_VALUES.map(json.dumps), now=st.floats(0, 5e9))
def test_a_pause_record_read_back_is_checked_and_never_raises(text, now):
    pause = read_pause(text, now)
    if pause is None:
        return
    assert {"reason", "until", "by", "since", "agent"} <= set(pause) <= {
        "reason", "until", "by", "since", "agent", "boot_id", "boot_until"
    }  # fmt: skip
    assert isinstance(pause["reason"], str) and pause["reason"]
    assert pause["until"] is None or (isinstance(pause["until"], float) and pause["until"] > now)
    assert all(pause[k] is None or isinstance(pause[k], str) for k in ("by", "agent"))
    fleet_pause_decision(pause)  # any record read back can be said


def test_an_unreadable_pause_record_holds_until_lifted():
    assert read_pause("[1, 2]", 0.0)["reason"].startswith("unreadable")
    assert read_pause("{" * 5000, 0.0)["until"] is None
    assert read_pause('{"reason": "x", "until": 10}', 11.0) is None
    assert read_pause('{"reason": "x", "until": "soon"}', 11.0)["until"] is None  # no time: it holds


@pytest.mark.slow  # waits for a TTL
def test_a_leader_that_stops_campaigning_is_replaced_within_its_ttl(make):
    a, b = make(), make()
    old = a.campaign("agent-a", TTL)
    assert b.campaign("agent-b", TTL) is None
    started = time.monotonic()
    new = wait_until_value(lambda: b.campaign("agent-b", TTL), timeout=TTL + 4)
    assert new.revision > old.revision
    # etcd checks expiry about once a second; b's copy of the seat is up to RECENT old
    assert time.monotonic() - started <= TTL + (2.5 + RECENT) * PATIENCE


def test_bad_grants_from_another_writer_are_no_grants(make):
    a, b = make(), make()
    lead = a.campaign("agent-a", SEAT_TTL)
    a.write_grants(lead, {"agent-b": [granted("b1", "agent-b", lead.revision)]})
    wait_until_equal(lambda: len(b.grants("agent-b") or []), 1)
    corrupt(a, "agent-b", '[{"instance": "b1", "slot_at": "soon"}, 7, "x"]')
    wait_until_equal(lambda: b.grants("agent-b"), [])


def corrupt(coordinator, agent, text):
    """Write `text` as `agent`'s grants behind the rules' back (another writer, a bug), in the store."""
    assert coordinator.store.commit(Change(puts={"grants/" + agent: Put(text)})) is not None


@given(st.dictionaries(st.sampled_from([f.name for f in fields(PlannedGrant)] + ["x"]), JSON_VALUES))
def test_a_grant_parses_or_says_what_is_wrong(data):
    try:
        grant = PlannedGrant.from_dict(data)
    except ValueError as exc:
        assert str(exc)
    else:
        assert isinstance(grant.instance, str) and isinstance(grant.revision, int)


def wait_until_equal(fn, expected, timeout=5.0):
    end = time.monotonic() + timeout * PATIENCE
    while (value := fn()) != expected and time.monotonic() < end:
        time.sleep(0.02)
    assert value == expected


def wait_until_value(fn, timeout=5.0):
    end = time.monotonic() + timeout * PATIENCE
    while (value := fn()) is None and time.monotonic() < end:
        time.sleep(0.05)
    assert value is not None
    return value


# ----------------------------------------------------------------------------- unreachable


def test_local_lock_held_too_long_is_unavailable_not_a_restart(tmp_path):
    c = LocalCoordinator(tmp_path / "coord.db", timeout=0.3)
    blocker = sqlite3.connect(tmp_path / "coord.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(CoordinatorUnavailable, match="lock"):
            c.acquire(slot("serving-1"), allow)
        assert time.monotonic() - started < 3 * PATIENCE
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert c.acquire(slot("serving-1"), allow).granted
    c.close()


def test_a_local_coordinator_overwritten_while_in_use_is_unavailable_for_every_call(tmp_path):
    c = LocalCoordinator(tmp_path / "coord.db", timeout=0.3)
    assert c.acquire(slot("serving-1"), allow).granted
    with open(tmp_path / "coord.db", "r+b") as damaged:  # another program, a bad restore, a disk error
        damaged.write(b"garbage!" * 4096)
    calls = [
        lambda: c.acquire(slot("serving-2"), allow),
        lambda: c.restarts(0.0),
        lambda: c.publish("agent-a", [], 30.0),
        c.fleet,
        lambda: c.campaign("agent-a", 30.0),
        c.fleet_pause,
        lambda: c.get_profiles(["workload"]),
    ]
    for call in calls:
        with pytest.raises(CoordinatorUnavailable, match="damaged or not medic's"):
            call()
    c.close()


def test_a_local_coordinator_damaged_at_start_is_unavailable_until_it_opens(tmp_path):
    path = tmp_path / "coord.db"
    path.write_bytes(b"garbage!" * 4096)
    path.chmod(0o600)
    c = LocalCoordinator(path, timeout=0.3, reopen_interval=1.0)  # the agent starts, remediation held
    for _ in range(2):  # the second within the reopen interval: the same answer, no new attempt
        with pytest.raises(CoordinatorUnavailable, match=r"damaged or not medic's.*move it aside"):
            c.acquire(slot("serving-1"), allow)
    path.rename(tmp_path / "coord.db.damaged")
    with pytest.raises(CoordinatorUnavailable, match="damaged"):
        c.fleet()  # not tried again before the interval
    time.sleep(1.1)
    assert c.acquire(slot("serving-1"), allow).granted
    c.close()


def test_local_unwritable_path_says_what_to_fix(tmp_path):
    target = tmp_path / "file"
    target.write_text("")
    with pytest.raises(CoordinatorUnavailable, match=r"remediation\.coordinator\.local\.path"):
        LocalCoordinator(target / "sub" / "coord.db")


def test_etcd_down_is_unavailable_quickly():
    c = EtcdCoordinator([f"http://127.0.0.1:{free_port()}"], timeout=0.5)
    started = time.monotonic()
    with pytest.raises(CoordinatorUnavailable, match="etcd unreachable"):
        c.acquire(slot("serving-1"), allow)
    with pytest.raises(CoordinatorUnavailable):
        c.fleet()
    assert time.monotonic() - started < 3 * PATIENCE
    c.close()


def test_etcd_hung_is_unavailable_after_the_timeout():
    with silent_server() as url:
        c = EtcdCoordinator([url], timeout=0.4)
        started = time.monotonic()
        with pytest.raises(CoordinatorUnavailable, match=r"no answer within 0\.4s"):
            c.restarts(since=0)
        assert 0.35 < time.monotonic() - started < 3 * PATIENCE
        c.close()


@NEEDS_ETCD
@pytest.mark.slow
def test_etcd_second_endpoint_is_used_when_the_first_is_down(etcd_url):
    c = EtcdCoordinator([f"http://127.0.0.1:{free_port()}", etcd_url], namespace=f"t{uuid.uuid4().hex[:6]}")
    assert c.acquire(slot("serving-1"), allow).granted
    c.close()


# ----------------------------------------------------------------------------- workload profiles
PROFILE = {"daily": [0.0, 0.05, -0.05, 0.0], "slot_seconds": 21600.0, "level": 2.0e9, "warmup": 1800.0}


def test_a_profile_one_agent_puts_is_what_another_gets(make):
    first, second = make(), make()
    assert second.get_profiles(["web"]) == {}
    first.put_profile("web", PROFILE, ttl=60)
    first.put_profile("batch", {**PROFILE, "level": 1.0}, ttl=60)
    assert second.get_profiles(["web", "gone", "web"]) == {"web": PROFILE}
    first.put_profile("web", {**PROFILE, "level": 3.0e9}, ttl=60)  # replaced, not added
    assert second.get_profiles(["web", "batch"])["web"]["level"] == 3.0e9
    assert second.get_profiles([]) == {}


def test_a_profile_expires_unless_put_again(make):
    coordinator = make()
    coordinator.put_profile("web", PROFILE, ttl=TTL)
    assert coordinator.get_profiles(["web"]) == {"web": PROFILE}
    time.sleep(EXPIRY_WAIT)
    assert coordinator.get_profiles(["web"]) == {}


@pytest.mark.parametrize(
    "key, doc",
    [
        ("web", {"daily": [0.1] * 2000}),  # over the size bound
        ("web", ["not", "an", "object"]),
        ("web", {"level": float("nan")}),
        ("a/b", PROFILE),
        ("", PROFILE),
        ("x" * 201, PROFILE),
    ],
)
def test_an_oversized_or_malformed_profile_is_refused_and_nothing_is_written(make, key, doc):
    coordinator = make()
    with pytest.raises(CoordinatorError):
        coordinator.put_profile(key, doc, ttl=60)
    assert coordinator.get_profiles(["web"]) == {}
    with pytest.raises(CoordinatorError):
        coordinator.get_profiles(["a/b"])


def test_profiles_are_kept_per_namespace(make, tmp_path, request):
    coordinator = make()
    coordinator.put_profile("web", PROFILE, ttl=60)
    if isinstance(coordinator, LocalCoordinator):
        other = LocalCoordinator(coordinator.path, namespace="elsewhere")
    else:
        other = EtcdCoordinator([request.getfixturevalue("etcd_url")], namespace="elsewhere")
    try:
        assert other.get_profiles(["web"]) == {}
    finally:
        other.close()
