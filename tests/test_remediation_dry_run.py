"""Dry-run stays true: the same scenario of real leaking processes in dry-run and in enforce, on the
`local` and the `etcd` coordinator, gives the same plan up to the first restart; after it, dry-run
shows its would-be restart as such (the process still runs, against the same deadline, never "cannot
be saved") and plans the other instances where enforce does."""

from __future__ import annotations

import copy
import time
import uuid

import pytest

from agent.state.eventlog import EventLog
from agent.state.store import Store
from remediation.config import RemediationSection
from remediation.coordinator.etcd import EtcdCoordinator
from remediation.coordinator.local import LocalCoordinator
from remediation.engine import Engine, EngineHooks
from remediation.model import InstanceView, PlanEntry, RemediationRequest
from support.managed_children import ManagedChildren
from support.procs import VERIFY_TIMEOUT, workload_argv
from support.remediation import NEEDS_ETCD, etcd_server

pytestmark = pytest.mark.slow
CONFIG = {
    "interval": "0.25s",
    "budget": {"max_concurrent": 1, "min_interval": "3s", "max_per_hour": None, "cooldown": "1m"},
    "plan": {"safety_margin": "4s", "restart_duration": "1s", "deadline_granularity": 0},
    "blockers": {"min_uptime": 0},
    "verify": {"timeout": VERIFY_TIMEOUT, "stable_for": "0.3s"},
    "coordinator": {"lease_ttl": "10s", "fleet_ttl": "10s", "timeout": "5s"},
}
# the projected OOM of each instance's first process, from the scenario's start: a must start by
# +3.5 s, c by +25 s; b's leak is found at +4.5 s and must start by +5.25 s, but one min_interval
# after a's restart is +6.5 s: late by over a second, and still saved (2.75 s before its OOM)
DEADLINES = {"a": 8.5, "b": 10.25, "c": 30.0}
FOUND = {"a": 0.0, "b": 4.5, "c": 0.0}


class Children(ManagedChildren):
    """Real leaking processes for one engine: launched, found, restarted like managed commands."""

    def __init__(self, names: list[str]) -> None:
        argv = workload_argv("leak", "--rate", "1Mi", "--every", "0.1s", "--cap", "32Mi")
        super().__init__(dict.fromkeys(names, argv))
        self.names = names
        self.first: dict[str, float] = {}  # the start time of each first process

    def views(self) -> list[InstanceView]:
        out = []
        for name in self.names:
            found = self.locate(name)
            start = found.start_time if found else None
            if start is not None:
                self.first.setdefault(name, start)
            out.append(
                InstanceView(name, found.pid if found else None, start, (), {"fleet": "f"}, managed=True)
            )
        return out

    def findings(self, views: list[InstanceView], origin: float, now: float) -> list[RemediationRequest]:
        """A leak finding about each instance's first process once found (a restarted one leaks from
        scratch: no finding yet), with its projected OOM; the same in both modes."""
        return [
            RemediationRequest(
                v.name,
                "leak",
                f"{v.name}:leak",
                "RSS grows 1 MiB/s",
                deadline=origin + DEADLINES[v.name],
                start_time=v.start_time,
                requested_at=origin + FOUND[v.name],
            )
            for v in views
            if v.start_time is not None
            and v.start_time == self.first.get(v.name)
            and now >= origin + FOUND[v.name]
        ]


def coordinator_for(kind: str, tmp_path, url: str | None, namespace: str):
    if kind == "local":
        return LocalCoordinator(tmp_path / f"{namespace}.db", namespace=namespace, timeout=5)
    return EtcdCoordinator([url], namespace=namespace, timeout=5)


@pytest.fixture(params=["local", pytest.param("etcd", marks=NEEDS_ETCD)])
def backend(request):
    if request.param == "local":
        yield "local", None
    else:
        with etcd_server() as url:
            yield "etcd", url


def comparable(entry: PlanEntry) -> dict:
    """An entry but for its slot, its reason (which names the slot), what held it and the entry
    before it: enforce's restarts start when the coordinator grants them, a few milliseconds after
    the step's time, so at the step that reaches a slot enforce may still see it held that long (and
    plan it, one step longer than dry-run does)."""
    return {k: v for k, v in entry.to_dict().items() if k not in ("reason", "slot_at", "held_by", "after")}


def test_dry_run_plans_what_enforce_does_and_keeps_judging_the_leak(backend, tmp_path):
    kind, url = backend
    built: list = []
    try:
        engines = {}
        for mode in ("dry-run", "enforce"):
            children = Children(["a", "b", "c"])
            store = Store(tmp_path / mode)
            config = RemediationSection.model_validate({**copy.deepcopy(CONFIG), "mode": mode})
            engine = Engine(
                config,
                store=store,
                events=EventLog(store),
                coordinator=coordinator_for(kind, tmp_path, url, f"{mode}-{uuid.uuid4().hex[:6]}"),
                agent_id="agent-a",
                state_dir=store.dir,
                hooks=EngineHooks(locate=children.locate, managed_restart=children.restart),
                background=False,
            )
            built.append((engine, children, store))
            engines[mode] = (engine, children)
        for _, children in engines.values():
            children.views()  # their first processes
        origin = time.time()
        plans: dict[str, list] = {"dry-run": [], "enforce": []}

        def carried_out(engine: Engine, outcome: str) -> list[str]:
            return sorted(a["instance"] for a in engine.ledger.actions() if a["outcome"] == outcome)

        # until a and b are restarted (and would be, in dry-run); c's slot (+25 s) is not reached
        while time.time() < origin + 20 and not (
            carried_out(engines["enforce"][0], "succeeded") == ["a", "b"]
            and carried_out(engines["dry-run"][0], "would-restart") == ["a", "b"]
        ):
            now = time.time()
            for mode, (engine, children) in engines.items():
                views = children.views()
                report = engine.step(now, children.findings(views, origin, now), views)
                plans[mode].append((now, report))
            time.sleep(0.1)

        enforce_engine, enforce_children = engines["enforce"]
        dry_engine, dry_children = engines["dry-run"]
        restarted = [a for a in enforce_engine.ledger.actions() if a["outcome"] == "succeeded"]
        assert sorted(a["instance"] for a in restarted) == ["a", "b"], restarted
        first = min(a["started_at"] for a in restarted)
        would = dry_engine.ledger.actions()
        assert sorted(a["instance"] for a in would) == ["a", "b"] and {a["outcome"] for a in would} == {
            "would-restart"
        }
        assert dry_children.locate("a").start_time == dry_children.first["a"]  # nothing restarted
        assert enforce_children.locate("a").start_time != enforce_children.first["a"]

        compared = 0
        for (now, dry), (_, enforce) in zip(plans["dry-run"], plans["enforce"], strict=True):
            assert not dry.coordinator_error and not enforce.coordinator_error, enforce.coordinator_error
            if now < first:  # up to the first restart: the same plan, to the letter
                assert [e.to_dict() for e in dry.plan.entries] == [e.to_dict() for e in enforce.plan.entries]
                compared += 1
                continue
            for entry in dry.plan.entries:  # after it: never a verdict about a restart that did not happen
                assert not entry.hopeless and "CANNOT BE SAVED" not in entry.reason, entry
            shown = {e.instance: e for e in dry.plan.entries}
            would_a = shown["a"]
            assert would_a.dry_run and would_a.deadline == origin + DEADLINES["a"]
            assert "nothing was restarted" in would_a.reason
            assert dry.decisions["a"].code == "dry-run"
            for entry in enforce.plan.entries:  # the others: where enforce plans them
                twin = shown[entry.instance]
                if twin.dry_run:  # reached a step sooner: enforce waits out its restart's milliseconds
                    assert twin.deadline == entry.deadline and not twin.hopeless
                    continue
                assert comparable(twin) == comparable(entry), (twin, entry)
                assert abs(twin.slot_at - entry.slot_at) < 1.0  # enforce's restarts start when they run
        assert compared >= 5
        late = [e for _, r in plans["dry-run"] for e in r.plan.entries if e.instance == "b" and not e.dry_run]
        assert late and all(e.late for e in late) and late[0].held_by == "min-interval", late[:1]
    finally:
        for engine, children, store in built:
            engine.close(timeout=5)
            engine.coordinator.close()
            children.close()
            store.close()
