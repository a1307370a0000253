"""Safety state lasts as long as it was set for, whatever happens to the wall clock: a pause, a
fleet-wide pause and an escalation's expiry are told by the boot clock (`remediation.deadlines`),
across agent restarts in one boot; after a reboot the wall clock tells, for at most the length set.

The clocks are injected: the wall clock jumps 400 days while the boot clock runs on as time does."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from agent.state.eventlog import EventLog
from agent.state.store import Store
from remediation.config import RemediationSection
from remediation.coordinator.local import LocalCoordinator
from remediation.deadlines import JUMP, Clocks, anchored, settle
from remediation.engine import Engine
from remediation.grants import FleetControl
from remediation.ledger import Ledger
from remediation.model import InstanceView, RemediationRequest
from remediation.pause import KillSwitch

T0 = 1_800_000_000.0
DAYS_400 = 400 * 86400.0
HOUR = 3600.0


@dataclass
class Host:
    """A host's clocks: the wall clock someone may move, the boot clock that only runs."""

    wall: float = T0
    boot: float = 5_000.0
    boot_id: str = "boot-a"

    def clocks(self) -> Clocks:
        return Clocks(wall=lambda: self.wall, boot=lambda: self.boot, boot_id=lambda: self.boot_id)

    def elapse(self, seconds: float) -> None:
        self.wall += seconds
        self.boot += seconds

    def reboot(self, down_for: float, wall_error: float = 0.0) -> None:
        self.wall += down_for + wall_error
        self.boot, self.boot_id = 12.0, self.boot_id + "+"


@pytest.fixture
def store(tmp_path):
    made = Store(tmp_path / "state")
    yield made
    made.close()


def switch(store: Store, host: Host) -> KillSwitch:
    """The kill switch as an agent (re)starting on this store builds it."""
    return KillSwitch(Ledger(store), EventLog(store), lambda: host.wall, host.clocks())


def test_a_pause_survives_the_wall_clock_moved_400_days_either_way_and_an_agent_restart(store):
    host = Host()
    switch(store, host).pause("INC-9: hands off", T0 + HOUR, by="alice")
    host.elapse(60)
    host.wall += DAYS_400  # someone moves the clock forward
    kill = switch(store, host)  # and the agent restarts, in the same boot
    held = kill.paused(host.wall)
    assert held is not None and held["reason"] == "INC-9: hands off"
    assert held["until"] == pytest.approx(host.wall + HOUR - 60)  # moved along: it reads right
    assert "boot_until" not in held
    assert Ledger(store).pause()["until"] == pytest.approx(host.wall + HOUR - 60), "stored again"

    host.wall -= 2 * DAYS_400  # and back, further than it was
    assert kill.paused(host.wall) is not None
    host.elapse(HOUR - 61)
    assert kill.paused(host.wall) is not None
    host.elapse(2)
    assert kill.paused(host.wall) is None, "it ends when its hour is over, not 800 days later"
    assert Ledger(store).pause() is None
    expired = [e for e in store.events(limit=10) if e.kind == "remediation_resumed"]
    assert expired and "expired" in expired[0].message and "boot_until" not in expired[0].data


def test_after_a_reboot_the_wall_clock_tells_for_at_most_the_length_set(store):
    host = Host()
    switch(store, host).pause("kernel upgrade", T0 + HOUR, by="bob")
    host.elapse(600)
    host.reboot(down_for=300)
    kill = switch(store, host)
    held = kill.paused(host.wall)
    assert held is not None and held["until"] == pytest.approx(T0 + HOUR)  # the wall clock was right
    host.wall += DAYS_400  # anchored on the new boot at once: a jump now changes nothing
    assert kill.paused(host.wall) is not None
    host.elapse(HOUR - 900 + 1)
    assert kill.paused(host.wall) is None

    # a host that comes up with its clock three years behind holds a 1 h pause for 1 h, not 3 years
    host = Host(wall=T0 + 10 * HOUR)
    switch(store, host).pause("drill", host.wall + HOUR)
    host.reboot(down_for=60, wall_error=-3 * 365 * 86400.0)
    kill = switch(store, host)
    assert kill.paused(host.wall) is not None
    host.elapse(HOUR + 1)
    assert kill.paused(host.wall) is None


def test_a_fleet_pause_on_a_shared_file_holds_every_agent_of_the_host_through_a_jump(tmp_path):
    host = Host()
    path = tmp_path / "shared.db"
    setter, other = (LocalCoordinator(path, timeout=1, clock=lambda: host.wall) for _ in range(2))
    for coordinator in (setter, other):
        coordinator.clocks = host.clocks()
    record = {"reason": "INC-4", "until": T0 + HOUR, "by": "carol", "since": T0, "agent": "agent-a"}
    setter.set_fleet_pause(anchored(record, host.wall, host.clocks()))
    host.elapse(120)
    host.wall += DAYS_400
    seen = other.fleet_pause()
    assert seen is not None and seen["reason"] == "INC-4"
    control = FleetControl(paused=seen, clocks=host.clocks())
    shown = control.pause_at(host.wall)
    assert shown is not None and shown["until"] == pytest.approx(host.wall + HOUR - 120)
    host.elapse(HOUR - 119)
    assert other.fleet_pause() is None and control.pause_at(host.wall) is None
    for coordinator in (setter, other):
        coordinator.close()


def test_an_escalation_does_not_expire_when_the_wall_clock_jumps(tmp_path):
    host = Host()
    store = Store(tmp_path / "state")
    config = RemediationSection.model_validate(
        {
            "interval": "10s",
            "blockers": {"min_uptime": 0},
            "mode": "enforce",
            "ladder": {"escalation_expiry": "1h"},
        }
    )
    engine = Engine(
        config,
        store=store,
        events=EventLog(store),
        coordinator=LocalCoordinator(tmp_path / "coord.db", timeout=1, clock=lambda: host.wall),
        agent_id="agent-a",
        state_dir=store.dir,
        background=False,
        clock=lambda: host.wall,
    )
    engine.actions.clocks = host.clocks()

    def view() -> InstanceView:  # a process that keeps crashing: up for 5 s whenever it is seen
        return InstanceView("svc", 4242, host.wall - 5, ("serve",))

    loop = RemediationRequest("svc", "crash-loop", "svc:crash-loop:1", "svc crashed 5 times within 10m")
    leak = RemediationRequest("svc", "leak", "svc:leak:1", "RSS grows", deadline=T0 + 1000 * 86400)
    try:
        assert engine.step(host.wall, [loop, leak], [view()]).intents["svc"].action == "escalate"
        host.elapse(60)
        host.wall += DAYS_400
        held = engine.step(host.wall, [leak], [view()]).decisions["svc"]
        assert held.code == "escalated", held.reason
        assert engine.snapshot(host.wall)["escalations"][0]["expires_at"] == pytest.approx(
            host.wall + HOUR - 60
        )
        host.elapse(HOUR - 59)
        assert engine.step(host.wall, [leak], [view()]).decisions["svc"].code != "escalated"
        assert [e.kind for e in store.events(limit=100)].count("remediation_escalation_expired") == 1
    finally:
        engine.close(timeout=2)
        store.close()


@given(
    length=st.floats(1, 30 * 86400),
    elapsed=st.floats(0, 60 * 86400),
    jump=st.floats(-5e8, 5e8),
)
def test_in_one_boot_a_deadline_ends_after_its_length_whatever_the_wall_clock_does(length, elapsed, jump):
    assume(abs(jump) > JUMP and abs(elapsed - length) > 1e-3)  # a step within JUMP is the wall's own time
    host = Host()
    record = anchored({"until": T0 + length, "since": T0}, host.wall, host.clocks())
    host.elapse(elapsed)
    host.wall += jump
    settled, _ = settle(record, host.wall, host.clocks())
    assert (settled["until"] > host.wall) == (elapsed < length)
