"""Workload profiles shared between agents through the coordinator (`agent/jobs/peers.py`):
a new agent of a workload gets its fleet's profile at once, and it judges a fresh process as a
prior should; a garbled doc is skipped, an unreachable coordinator means no peer priors, said once."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agent.detect.memory.fleet import analyze_fleet
from agent.detect.memory.priors import PriorBook, WorkloadProfile, learn_workload
from agent.jobs.peers import PUBLISH_EVERY, READ_EVERY, TTL, PeersJob
from remediation.coordinator.local import LocalCoordinator
from remediation.errors import CoordinatorUnavailable
from support.detect_shapes import HOUR, PARAMS, T0, cut_at_oom, fresh, oom_time

NOW = 1_800_000_000.0
HOUR_S = PUBLISH_EVERY  # an hour


class FakeDetection:
    """What the job needs of the detection job: its priors, its workload keys, what it learned."""

    def __init__(self, keys: list[str], shared: dict[str, dict[str, Any]] | None = None) -> None:
        self.priors = PriorBook()
        self.keys = keys
        self.shared = shared or {}

    def workload_keys(self) -> list[str]:
        return list(self.keys)

    def shared_profiles(self) -> dict[str, dict[str, Any]]:
        return dict(self.shared)


class Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, str, dict]] = []

    def emit(self, kind: str, message: str, **fields: Any) -> None:
        self.emitted.append((kind, message, fields))

    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.emitted]


class Flaky(LocalCoordinator):
    """A local coordinator that can be made unreachable."""

    down = False

    def get_profiles(self, keys):
        if self.down:
            raise CoordinatorUnavailable("local coordinator: database is locked")
        return super().get_profiles(keys)

    def put_profile(self, key, doc, ttl):
        if self.down:
            raise CoordinatorUnavailable("local coordinator: database is locked")
        super().put_profile(key, doc, ttl)


@pytest.fixture(scope="module")
def profile() -> WorkloadProfile:
    learned = learn_workload(
        [fresh(name=f"old-{i}", seed=i, history_days=7, hours=0) for i in range(3)], PARAMS
    )
    assert learned is not None
    return learned


@pytest.fixture
def coordinator(tmp_path):
    made = Flaky(tmp_path / "coordinator.db", clock=lambda: NOW)
    yield made
    made.close()


def _job(coordinator, detection, events, agent, **kwargs) -> PeersJob:
    return PeersJob(coordinator, detection, events, agent, **kwargs)  # type: ignore[arg-type]


def test_a_new_agent_gets_its_fleets_profile_at_its_first_tick(coordinator, profile):
    old = FakeDetection(["web"], {"web": profile.to_dict()})
    _job(coordinator, old, Events(), "host-a:1").tick(NOW)
    new, events = FakeDetection(["web", "batch"]), Events()
    _job(coordinator, new, events, "host-b:2").tick(NOW)
    got = new.priors.get("web")
    assert got is not None and got.daily == pytest.approx(profile.daily, abs=1e-6)
    assert got.level == pytest.approx(profile.level) and got.warmup == pytest.approx(profile.warmup)
    assert new.priors.get("batch") is None
    assert events.kinds() == ["priors_loaded"] and events.emitted[0][2]["workloads"] == ["web"]


def test_an_agent_never_reads_its_own_profile_back_as_a_peers(coordinator, profile):
    mine = FakeDetection(["web"], {"web": profile.to_dict()})
    job = _job(coordinator, mine, Events(), "host-a:1")
    job.tick(NOW)
    job.tick(NOW + READ_EVERY)  # a re-read: the key holds this agent's own doc
    assert mine.priors.get("web") is None


def test_a_garbled_profile_from_a_peer_is_skipped_and_logged(coordinator, profile, caplog):
    coordinator.put_profile("web", {**profile.to_dict(), "level": -5}, ttl=TTL)
    coordinator.put_profile("batch", profile.to_dict(), ttl=TTL)
    detection = FakeDetection(["web", "batch"])
    with caplog.at_level(logging.WARNING, logger="medic.peers"):
        _job(coordinator, detection, Events(), "host-b:2").tick(NOW)
    assert detection.priors.get("web") is None and detection.priors.get("batch") is not None
    assert "workload web is skipped: level must be between" in caplog.text


def test_publishing_only_on_change_at_most_hourly_and_before_the_lease_runs_out(coordinator, profile):
    puts: list[tuple[float, str]] = []
    put = coordinator.put_profile

    def counting(key, doc, ttl):
        puts.append((clock, key))
        put(key, doc, ttl)

    coordinator.put_profile = counting  # type: ignore[method-assign]
    detection = FakeDetection(["web"], {"web": profile.to_dict()})
    job = _job(coordinator, detection, Events(), "host-a:1")
    for clock in range(int(NOW), int(NOW + TTL), 5):  # a tick every 5 s for the lease's whole TTL
        if clock == int(NOW + 2 * HOUR_S):
            detection.shared = {"web": {**profile.to_dict(), "warmup": profile.warmup * 2}}
        job.tick(clock)
    times = [t - NOW for t, _ in puts]
    # at start; the change, at the next hourly publish; again when half the lease has gone
    assert times == [0, 2 * HOUR_S, 2 * HOUR_S + TTL / 2]
    assert coordinator.get_profiles(["web"])["web"]["by"] == "host-a:1"


def test_an_unreachable_coordinator_means_no_peer_priors_said_once_never_a_raise(coordinator, profile):
    coordinator.put_profile("web", profile.to_dict(), ttl=TTL)
    detection, events = FakeDetection(["web"]), Events()
    job = _job(coordinator, detection, events, "host-b:2")
    job.tick(NOW)
    assert detection.priors.get("web") is not None
    coordinator.down = True
    for k in range(1, 6):
        job.tick(NOW + READ_EVERY * k)
    assert detection.priors.get("web") is None  # what it gave is dropped while it cannot be read
    assert events.kinds() == ["priors_loaded", "peers_unavailable"]
    assert "database is locked" in events.emitted[1][1]
    coordinator.down = False
    job.tick(NOW + READ_EVERY * 6)
    assert detection.priors.get("web") is not None and events.kinds()[-1] == "priors_loaded"


def test_a_workload_that_appears_is_read_at_once(coordinator, profile):
    coordinator.put_profile("batch", profile.to_dict(), ttl=TTL)
    detection = FakeDetection(["web"])
    job = _job(coordinator, detection, Events(), "host-b:2")
    job.tick(NOW)
    detection.keys = ["web", "batch"]  # a new instance discovered, of another workload
    job.tick(NOW + 5)
    assert detection.priors.get("batch") is not None


def test_the_peers_prior_judges_a_fresh_process_as_a_prior_should(coordinator, profile):
    """Through the coordinator and back: a fresh leak is found far earlier than without it, and a
    healthy fresh process with the daily cycle stays without a finding."""
    _job(coordinator, FakeDetection(["web"], {"web": profile.to_dict()}), Events(), "host-a:1").tick(NOW)
    detection = FakeDetection(["web"])
    _job(coordinator, detection, Events(), "host-b:2").tick(NOW)
    prior = detection.priors.get("web")
    assert prior is not None

    def first(series, given):
        opened = [
            f.opened_at for f in analyze_fleet([series], PARAMS, prior=given)[0].findings if f.opened_at
        ]
        return (min(opened) - T0) / HOUR if opened else None

    leak = cut_at_oom(fresh(leak_pct_h=1.0))
    to_oom = (oom_time(leak) - T0) / HOUR
    without, with_peers = first(leak, None), first(leak, prior)
    assert with_peers is not None and with_peers < 0.5 * to_oom
    assert without is None or with_peers < without
    assert first(fresh(), prior) is None
