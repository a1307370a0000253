"""The fleet-wide pause (`medic pause --fleet`, `medic resume --fleet`): set through one agent, held by
every agent that shares its coordinator, ended by `resume --fleet` or by its own expiry; and what
`medic plan` says of it and of the namespace's elected planner.

Real parts: engines on real managed processes sharing one SQLite coordinator file, the agent's
whole API app over a real store, real agents (`medic run`) sharing a coordinator file, a real etcd,
and the real CLI.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.discovery import by_pid
from agent.watch.supervisor import ManagedProcess
from probes.linux.procfs import read_cmdline
from remediation.config import RemediationSection
from remediation.coordinator.base import SlotRequest
from remediation.coordinator.etcd import PAUSE, EtcdCoordinator
from remediation.coordinator.local import LocalCoordinator
from remediation.engine import Engine, EngineHooks
from remediation.errors import NotShared
from remediation.model import Decision, InstanceView, RemediationRequest
from support.agent_runner import AgentRunner
from support.compressed import DETECT, remediation
from support.http_guard import World, admin, read_response
from support.procs import VERIFY_TIMEOUT, wait_until, workload_argv
from support.remediation import NEEDS_ETCD, etcd_server

ENGINE = {
    "mode": "enforce",
    "interval": "0.2s",
    "budget": {"max_concurrent": 1, "min_interval": "1s", "max_per_hour": None, "cooldown": "30s"},
    "blockers": {"min_uptime": 0},
    "verify": {"timeout": VERIFY_TIMEOUT, "stable_for": "0.3s"},
    "coordinator": {"lease_ttl": "3s", "fleet_ttl": "5s"},
}


# ----------------------------------------------------------------------------- two engines, one file
class Managed:
    """One real managed child, as the agent's runtime injects it into the engine."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.process = ManagedProcess(name, workload_argv("stable", "--size", "8Mi"), stop_timeout=2)
        self.process.launch()
        self.restarts = 0

    def locate(self, name: str):
        return by_pid(self.process.pid) if self.process.pid else None

    def restart(self, name: str, timeout: float) -> int:
        self.process.stop(timeout)
        self.process.stopping = False
        self.restarts += 1
        return self.process.launch()

    def view(self) -> InstanceView:
        identity = self.locate(self.name)
        assert identity is not None
        cmdline = tuple(read_cmdline(identity.pid))
        return InstanceView(
            self.name, identity.pid, identity.start_time, cmdline, {"fleet": "f"}, ready=True, managed=True
        )


@pytest.fixture
def pair(tmp_path):
    """Engines `agent-a` (no instance) and `agent-b` (managed `svc`), one coordinator file."""
    made: list = []

    def engine(agent_id: str, managed: Managed | None = None, coordinator: Path | None = None) -> Engine:
        store = Store(tmp_path / agent_id)
        path = coordinator or tmp_path / "shared" / "coordinator.db"
        hooks = EngineHooks(
            locate=managed.locate if managed else None, managed_restart=managed.restart if managed else None
        )
        built = Engine(
            RemediationSection.model_validate(ENGINE),
            store=store,
            events=EventLog(store),
            coordinator=LocalCoordinator(path, timeout=1),
            agent_id=agent_id,
            hooks=hooks,
            state_dir=store.dir,
            background=False,
        )
        made.append((built, store))
        return built

    svc = Managed("svc")
    yield engine, svc
    for built, store in made:
        built.close(timeout=5)
        store.close()
    svc.process.stopping = True
    svc.process.stop(1)


def step_both(a: Engine, b: Engine, svc: Managed) -> Decision | None:
    a.step(time.time(), [], [])
    return b.step(time.time(), [], [svc.view()]).decisions.get("svc")


def manual(name: str) -> RemediationRequest:
    return RemediationRequest(
        name, "manual", f"manual-{name}-{time.time()}", "a person asked", requested_by="t"
    )


def kinds(engine: Engine) -> list[tuple[str, dict]]:
    return [(e.kind, e.data) for e in reversed(engine.events.store.events(limit=1000))]


@pytest.mark.slow
def test_a_fleet_pause_holds_the_other_agent_until_it_expires_by_itself(pair):
    engine, svc = pair
    a, b = engine("agent-a"), engine("agent-b", svc)
    step_both(a, b, svc)  # a campaigned first: it plans for the namespace
    until = time.time() + 4
    paused = a.pause_fleet("INC-7: hands off", until, by="alice")
    assert paused["reason"] == "INC-7: hands off" and paused["by"] == "alice" and paused["agent"] == "agent-a"
    step_both(a, b, svc)
    held = b.submit(manual("svc"))
    assert (
        held.code == "held" and "fleet-wide by alice" in held.reason and "medic resume --fleet" in held.reason
    )
    first_pid = svc.process.pid
    while time.time() < until - 1:
        decision = step_both(a, b, svc)
        assert decision is not None and (decision.stage, decision.code) == ("pause", "paused"), decision
        assert "INC-7" in decision.reason and decision.data["scope"] == "fleet"
        time.sleep(0.2)
    assert svc.process.pid == first_pid and svc.restarts == 0

    fleet_b, fleet_a = b.snapshot()["fleet"], a.snapshot()["fleet"]
    assert fleet_b["paused"]["reason"] == "INC-7: hands off" and fleet_b["paused"]["until"] == until
    assert fleet_b["leader"]["agent"] == "agent-a" and not fleet_b["leads"] and fleet_b["role"] == "follower"
    assert fleet_a["leads"] and fleet_a["role"] == "leader" and fleet_a["leader"]["revision"] >= 1
    assert fleet_a["leader"]["since"] <= time.time() and fleet_b["shared"]

    # nobody resumes: the pause ends at its expiry, and the held request goes through
    wait_until(lambda: step_both(a, b, svc) and svc.restarts, 20, interval=0.2)
    assert svc.process.pid != first_pid
    assert b.snapshot()["fleet"]["paused"] is None

    def expired() -> list[dict]:  # said by the agent that set the pause, on its first step after `until`
        a.step(time.time(), [], [])  # (b may have stepped past `until` and restarted before a did)
        return [d for k, d in kinds(a) if k == "remediation_resumed" and d.get("scope") == "fleet"]

    wait_until(expired, 5, interval=0.2)
    assert expired()[0]["reason"] == "INC-7: hands off" and len(expired()) == 1
    assert ("remediation_paused", "fleet") in [(k, d.get("scope")) for k, d in kinds(a)]


@pytest.mark.slow
def test_resume_fleet_lets_the_other_agent_proceed_at_once(pair):
    engine, svc = pair
    a, b = engine("agent-a"), engine("agent-b", svc)
    step_both(a, b, svc)
    a.pause_fleet("deploy window", time.time() + 600, by="alice")
    step_both(a, b, svc)
    b.submit(manual("svc"))
    for _ in range(5):
        decision = step_both(a, b, svc)
        assert decision is not None and decision.code == "paused", decision
    assert svc.restarts == 0
    lifted = a.resume_fleet(by="bob")
    assert lifted is not None and lifted["reason"] == "deploy window"
    assert a.resume_fleet(by="bob") is None  # nothing left to lift
    wait_until(lambda: step_both(a, b, svc) and svc.restarts, 20, interval=0.2)
    resumed = [d for k, d in kinds(a) if k == "remediation_resumed"]
    assert resumed and resumed[0]["scope"] == "fleet" and resumed[0]["by"] == "bob"


def test_an_agent_whose_coordinator_is_its_own_refuses_a_fleet_pause(pair, tmp_path):
    engine, _ = pair
    alone = engine("agent-c", coordinator=tmp_path / "agent-c" / "coordinator.db")
    with pytest.raises(NotShared, match=r"no shared coordinator.*medic pause` \(without --fleet\)"):
        alone.pause_fleet("x-ray", time.time() + 60)
    with pytest.raises(NotShared):
        alone.resume_fleet()
    assert alone.snapshot()["fleet"]["shared"] is False
    shared = engine("agent-d")
    with pytest.raises(ValueError, match="reason"):
        shared.pause_fleet("   ", time.time() + 60)
    with pytest.raises(ValueError, match="future"):
        shared.pause_fleet("late", time.time() - 1)
    assert shared.coordinator.fleet_pause() is None


# ----------------------------------------------------------------------------- the API
@pytest.fixture
def shared_world(tmp_path, spawn):
    """The API app of an agent whose coordinator is a file another agent may share."""
    child = spawn(["sleep", "60"])
    path = tmp_path / "shared" / "coordinator.db"
    made = World(tmp_path, child.pid, remediation={"coordinator": {"local": {"path": str(path)}}})
    yield made, LocalCoordinator(path)
    made.close()


def test_the_pause_endpoint_pauses_and_resumes_the_fleet_and_the_plan_shows_it(shared_world):
    world, coordinator = shared_world
    paused = world.request(
        "POST",
        "/api/v1/pause",
        json={"reason": "INC-9", "duration": "10m", "scope": "fleet"},
        headers=admin(),
    )
    assert paused.status_code == 200, paused.text
    reply = paused.json()
    assert reply["scope"] == "fleet" and reply["paused"]["reason"] == "INC-9"
    assert reply["paused"]["by"].startswith("token:") and "local coordinator" in reply["coordinator"]
    record = coordinator.fleet_pause()
    assert record["reason"] == "INC-9" and abs(record["until"] - (time.time() + 600)) < 5
    plan = world.request("GET", "/api/v1/plan").json()
    assert plan["fleet"]["paused"]["reason"] == "INC-9" and plan["paused"] is None  # this agent's own: none
    assert (
        world.request("POST", "/api/v1/resume", json={"scope": "agent"}, headers=admin()).json()["resumed"]
        is False
    )
    assert coordinator.fleet_pause() is not None  # the agent's resume leaves the fleet's alone
    resumed = world.request("POST", "/api/v1/resume", json={"scope": "fleet"}, headers=admin())
    assert resumed.status_code == 200 and resumed.json()["resumed"] is True
    assert resumed.json()["previous_pause"]["reason"] == "INC-9" and coordinator.fleet_pause() is None
    assert world.request("GET", "/api/v1/plan").json()["fleet"]["paused"] is None
    events = [(e.kind, e.data.get("scope")) for e in world.store.events(limit=100)]
    assert ("remediation_paused", "fleet") in events and ("remediation_resumed", "fleet") in events


def test_bad_scope_and_bad_fleet_input_are_400_with_what_was_expected(shared_world):
    world, coordinator = shared_world
    for body, expected in (
        ({"reason": "INC-9", "scope": "everyone"}, "scope"),
        ({"reason": "INC-9", "scope": "fleet", "duration": "9d"}, "between 1s and 7d"),
        ({"reason": "INC-9", "scope": "fleet", "duration": "soon"}, "duration"),
        ({"reason": "   ", "scope": "fleet"}, "reason"),
        ({"scope": "fleet"}, "reason"),
    ):
        answer = world.request("POST", "/api/v1/pause", json=body, headers=admin())
        assert answer.status_code == 400, (body, answer.text)
        assert expected in answer.json()["error"], (body, answer.text)
    assert world.request("POST", "/api/v1/resume", json={"scope": 1}, headers=admin()).status_code == 400
    assert coordinator.fleet_pause() is None
    refused = world.request("POST", "/api/v1/pause", json={"reason": "INC-9", "scope": "fleet"})
    assert refused.status_code == 401 and coordinator.fleet_pause() is None


def test_a_lone_agent_says_it_has_no_shared_coordinator(tmp_path, spawn):
    child = spawn(["sleep", "60"])
    world = World(tmp_path, child.pid)  # the default: a coordinator file in its own state dir
    try:
        for path, body in (
            ("/api/v1/pause", {"reason": "INC-9", "scope": "fleet"}),
            ("/api/v1/resume", {"scope": "fleet"}),
        ):
            answer = world.request("POST", path, json=body, headers=admin())
            assert answer.status_code == 409 and "no shared coordinator" in answer.json()["error"], (
                answer.text
            )
        assert world.request("GET", "/api/v1/plan").json()["fleet"]["shared"] is False
    finally:
        world.close()


PAUSE_BODIES = st.fixed_dictionaries(
    {},
    optional={
        "reason": st.text(max_size=600),
        "duration": st.sampled_from(["1s", "10m", "2h", "7d", "8d", "0s", "-1h", "1e400s", "1h30m"])
        | st.text(max_size=12),
        "scope": st.sampled_from(["agent", "fleet", "", "FLEET", "namespace"]) | st.integers() | st.none(),
        "note": st.text(max_size=120),
        "by": st.text(max_size=120),
        "extra": st.booleans(),
    },
)


def test_random_pause_and_resume_bodies_never_fail_the_agent(shared_world):
    world, coordinator = shared_world

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(body=PAUSE_BODIES, path=st.sampled_from(["/api/v1/pause", "/api/v1/resume"]))
    def answered(body, path) -> None:
        answer = world.request("POST", path, json=body, headers=admin())
        assert answer.status_code in (200, 400), (body, answer.text)
        if answer.status_code == 400:
            error = answer.json()["error"]
            assert isinstance(error, str) and error and "\n" not in error
            return
        if body.get("scope") == "fleet":
            fleet = coordinator.fleet_pause()
            assert (fleet is not None) == (path == "/api/v1/pause"), (body, fleet)
            if fleet is not None:
                assert fleet["reason"] == body["reason"].strip()

    answered()


# ----------------------------------------------------------------------------- real agents
LIMIT = 320 * 2**20


def agent_config(name: str, argv: list[str], coordinator: dict, mode: str = "enforce") -> dict:
    return {
        "agent": {"interval": "0.2s", "slow_interval": "2s", "flush_interval": "0.3s"},
        "detect": DETECT,
        "remediation": remediation(
            mode,
            verify={"timeout": "10s", "stable_for": "1s"},
            ladder={"clear_check": "2m"},
            coordinator={"lease_ttl": "3s", "fleet_ttl": "5s", **coordinator},
        ),
        "instances": [
            {"name": name, "labels": {"fleet": "f"}, "match": {"command": argv}, "memory_limit": LIMIT}
        ],
    }


def restarts(agent: AgentRunner, name: str) -> list[dict]:
    return [e for e in agent.events(kind="instance_restarted") if e["instance"] == name]


def wait_held(agent: AgentRunner, name: str, reason: str) -> None:
    """Until the instance has a leak finding and a remediation decision held for `reason`."""
    wait_until(lambda: agent.get("/api/v1/findings", kind="leak", instance=name)["findings"], 90)

    def held() -> bool:
        decisions = agent.get("/api/v1/decisions", instance=name)["decisions"]
        return any(reason in (d.get("reason") or "") for d in decisions)

    wait_until(held, 60, interval=0.5)


@pytest.mark.slow
def test_medic_pause_fleet_on_one_agent_holds_the_other_agents_leak_restart_until_resume(
    agent, spawn, tmp_path
):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    coordinator = {"backend": "local", "local": {"path": str(shared / "coordinator.db")}}
    agent.start(agent_config("calm", workload_argv("stable", "--size", "16Mi"), coordinator))
    (tmp_path / "b").mkdir()
    other = AgentRunner(spawn, tmp_path / "b")
    try:
        leak = workload_argv("leak", "--rate", "4Mi", "--every", "0.05s", "--cap", "300Mi")
        other.start(agent_config("leaky", leak, coordinator))
        paused = agent.cli("pause", "--fleet", "--for", "10m", "--reason", "INC-12: hands off", "--json")
        assert paused.returncode == 0, paused.stderr
        reply = json.loads(paused.stdout)
        assert reply["scope"] == "fleet" and reply["paused"]["reason"] == "INC-12: hands off"
        first_pid = other.instance("leaky")["pid"]
        wait_held(other, "leaky", "paused fleet-wide")
        assert other.instance("leaky")["pid"] == first_pid and not restarts(other, "leaky")
        for runner in (agent, other):
            plan = runner.cli("plan", token=False)
            assert plan.returncode == 0, plan.stderr
            assert "FLEET PAUSED" in plan.stdout and "INC-12: hands off" in plan.stdout, plan.stdout
            assert "planner of namespace default:" in plan.stdout and "revision" in plan.stdout
        leads = [r.get("/api/v1/plan")["fleet"]["leads"] for r in (agent, other)]
        assert sorted(leads) == [False, True]  # one planner for both, and each knows which
        assert "(this agent)" in (agent if leads[0] else other).cli("plan", token=False).stdout

        resumed = agent.cli("resume", "--fleet")
        assert resumed.returncode == 0 and "resumed fleet-wide" in resumed.stdout, resumed.stderr
        wait_until(lambda: restarts(other, "leaky"), 90, interval=0.5)
        assert other.instance("leaky")["pid"] != first_pid
        kinds = [(e["kind"], e["data"].get("scope")) for e in agent.events()]
        assert ("remediation_paused", "fleet") in kinds and ("remediation_resumed", "fleet") in kinds
    finally:
        other.close()


@pytest.mark.slow
def test_a_lone_agent_refuses_a_fleet_pause_and_refuses_it_unauthenticated_before_the_body(agent):
    agent.start(agent_config("calm", workload_argv("stable", "--size", "8Mi"), {}, mode="dry-run"))
    for argv in (("pause", "--fleet", "--for", "1h", "--reason", "INC-3"), ("resume", "--fleet")):
        refused = agent.cli(*argv)
        assert refused.returncode == 4, (argv, refused.stdout, refused.stderr)
        assert (
            "no shared coordinator" in refused.stderr and "medic pause` (without --fleet)" in refused.stderr
        )
    without = agent.cli("pause", "--fleet", "--for", "1h", "--reason", "INC-3", token=False)
    assert without.returncode == 2 and "admin token" in without.stderr
    plan = agent.cli("plan", token=False)
    assert "planner: this agent (no other agent shares its coordinator)" in plan.stdout, plan.stdout

    # no token: refused before a byte of the (huge, never sent) body is read
    host, port = agent.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        head = (
            f"POST /api/v1/pause HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            "Content-Length: 50000\r\n\r\n"
        )
        conn.sendall(head.encode() + b'{"scope": "fleet", "reason": "')
        status, body, _ = read_response(conn)
    assert status == 401, body[:200]
    assert b"admin token" in body


@pytest.mark.slow
@NEEDS_ETCD
def test_pause_fleet_through_a_real_etcd_holds_every_agent_and_expires_with_its_lease(agent):
    with etcd_server() as url:
        section = {"backend": "etcd", "namespace": "ranker", "etcd": {"endpoints": [url]}}
        agent.start(agent_config("calm", workload_argv("stable", "--size", "8Mi"), section))
        client = EtcdCoordinator([url], namespace="ranker")
        try:
            paused = agent.cli("pause", "--fleet", "--for", "10m", "--reason", "INC-21")
            assert paused.returncode == 0 and "paused fleet-wide" in paused.stdout, paused.stderr
            record = wait_until(client.fleet_pause, 10)
            assert record["reason"] == "INC-21" and record["by"].startswith("token:")
            assert abs(record["until"] - (time.time() + 600)) < 10 and record["agent"]
            refused = client.acquire(
                SlotRequest("other-1", "f", "agent-x", 3.0), lambda r, n: Decision.allow("b", "ok")
            )
            assert not refused.granted and refused.decision.code == "paused"
            assert client.grants("agent-x") == []
            plan = agent.cli("plan", token=False)
            assert "FLEET PAUSED (namespace ranker)" in plan.stdout and "INC-21" in plan.stdout, plan.stdout
            wait_until(lambda: "planner of namespace ranker:" in agent.cli("plan", token=False).stdout, 20)
            leader = agent.get("/api/v1/plan")["fleet"]["leader"]
            seen = wait_until(client.leader_info, 5)  # the client's copy of the seat is up to a second old
            assert leader["revision"] == seen["revision"] and leader["since"] is not None

            resumed = agent.cli("resume", "--fleet", "--json")
            assert resumed.returncode == 0 and json.loads(resumed.stdout)["resumed"] is True
            wait_until(lambda: client.fleet_pause() is None, 10)
            again = agent.cli("resume", "--fleet")
            assert again.returncode == 0 and "the fleet was not paused" in again.stdout

            # a short pause ends by itself, and its key goes with its lease
            assert agent.cli("pause", "--fleet", "--for", "2s", "--reason", "blip").returncode == 0
            assert wait_until(client.fleet_pause, 5)["reason"] == "blip"
            wait_until(lambda: client.fleet_pause() is None, 5)
            wait_until(lambda: client.gateway.get(client.base + PAUSE) is None, 10)
        finally:
            client.close()
    # etcd is gone: the pause cannot be written, and the CLI says so
    down = agent.cli("pause", "--fleet", "--for", "1h", "--reason", "INC-22")
    assert down.returncode == 4 and "the fleet was not paused" in down.stderr, down.stderr
    assert "HTTP 503" in down.stderr


@pytest.mark.slow
def test_an_agent_with_a_damaged_coordinator_file_runs_restarts_nothing_and_heals_when_it_is_moved_aside(
    agent, tmp_path
):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    damaged = shared / "coordinator.db"
    damaged.write_bytes(b"garbage!" * 4096)  # a bad restore, another program's file
    damaged.chmod(0o600)
    coordinator = {"backend": "local", "local": {"path": str(damaged)}}
    leak = workload_argv("leak", "--rate", "4Mi", "--every", "0.05s", "--cap", "300Mi")
    agent.start(agent_config("leaky", leak, coordinator))
    first_pid = agent.instance("leaky")["pid"]
    wait_held(agent, "leaky", "damaged or not medic's")
    assert agent.instance("leaky")["pid"] == first_pid and not restarts(agent, "leaky")
    damaged.rename(shared / "coordinator.db.damaged")  # what the message says to do
    wait_until(lambda: restarts(agent, "leaky"), 90, interval=0.5)
    assert agent.instance("leaky")["pid"] != first_pid
    assert (shared / "coordinator.db").stat().st_mode & 0o777 == 0o600
