"""The engine end to end on real processes: leaking children launched with the agent's own ManagedProcess,
a tiny real detector (RSS slope → time to OOM), the real store, ledger and local coordinator.

Enforce restarts a leaking instance before its limit; dry-run only records; a pause holds everything;
crash loops and restarts that do not help are escalated; a stale finding, a down coordinator or an
excluded instance never lead to a restart; the budget survives an agent restart.
"""

from __future__ import annotations

import copy
import json
import time
from itertools import pairwise
from pathlib import Path

import pytest

from agent.state.eventlog import EventLog
from agent.state.store import Store
from probes.linux.procfs import read_cmdline, read_statm
from remediation.config import RemediationSection
from remediation.coordinator.etcd import EtcdCoordinator
from remediation.coordinator.local import LocalCoordinator
from remediation.engine import Engine, EngineHooks
from remediation.model import Decision, InstanceView, RemediationRequest
from remediation.planner import latest_start
from support.managed_children import ManagedChildren
from support.procs import VERIFY_TIMEOUT, free_port, workload_argv

pytestmark = pytest.mark.slow
MiB = 2**20
BASE = {
    "mode": "enforce",
    "interval": "0.2s",
    "budget": {"max_concurrent": 1, "min_interval": "1s", "max_per_hour": None, "cooldown": "30s"},
    "plan": {"safety_margin": "2s", "restart_duration": "1s", "deadline_granularity": "1s"},
    "ladder": {
        "purge_settle": "0.5s",
        "slow_confirm": "0.5s",
        "clear_check": "1.5s",
        "crash_loop": {"max_restarts": 3, "window": "1m", "reset_after": "20s"},
    },
    "blockers": {"min_uptime": 0},
    "verify": {"timeout": VERIFY_TIMEOUT, "stable_for": "0.3s"},
    "coordinator": {"lease_ttl": "3s"},
}


def config(**overrides) -> RemediationSection:
    data = copy.deepcopy(BASE)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return RemediationSection.model_validate(data)


class Fleet(ManagedChildren):
    """Real managed children plus a tiny leak detector: what the agent's runtime will inject."""

    def __init__(self, argvs: dict[str, list[str]], limit: int = 200 * MiB, fleet: str = "test") -> None:
        super().__init__(argvs)
        self.limit = limit
        self.fleet = fleet
        self.samples: dict[tuple[str, float], list[tuple[float, int]]] = {}
        self.peak: dict[str, int] = dict.fromkeys(argvs, 0)
        time.sleep(0.3)

    def relaunch_exited(self) -> None:
        """What the tracker does for managed children that died on their own."""
        for process in self.managed.values():
            if process.proc is not None and process.proc.poll() is not None and not process.stopping:
                process.launch()

    def views(self) -> list[InstanceView]:
        out = []
        for name in self.managed:
            identity = self.locate(name)
            try:
                cmdline = tuple(read_cmdline(identity.pid)) if identity else ()
            except Exception:
                cmdline = ()
            out.append(
                InstanceView(
                    name,
                    identity.pid if identity else None,
                    identity.start_time if identity else None,
                    cmdline,
                    {"fleet": self.fleet},
                    ready=identity is not None,
                    managed=True,
                )
            )
        return out

    def detect(self, now: float) -> list[RemediationRequest]:
        """oom-risk for every process whose RSS grows: deadline = when it reaches the limit."""
        found = []
        for view in self.views():
            if view.pid is None:
                continue
            try:
                rss = read_statm(view.pid).rss_bytes
            except Exception:
                continue
            self.peak[view.name] = max(self.peak[view.name], rss)
            series = self.samples.setdefault((view.name, view.start_time), [])
            series.append((now, rss))
            old = [s for s in series if now - s[0] >= 0.8]
            if not old:
                continue
            t0, r0 = old[-1]
            slope = (rss - r0) / (now - t0)
            if slope > MiB:
                found.append(
                    RemediationRequest(
                        view.name,
                        "oom-risk",
                        f"leak-{view.name}-{view.start_time:.2f}",
                        f"RSS grows {slope / MiB:.0f} MiB/s",
                        deadline=now + (self.limit - rss) / slope,
                        start_time=view.start_time,
                        evidence={"slope_bytes_per_s": slope, "rss_bytes": rss},
                    )
                )
        return found


@pytest.fixture
def made(tmp_path):
    """Build engines and fleets; everything is stopped at teardown."""
    engines, fleets, stores = [], [], []

    class Maker:
        def store(self, name="state"):
            store = Store(tmp_path / name)
            stores.append(store)
            return store

        def fleet(self, argvs, **kw):
            fleet = Fleet(argvs, **kw)
            fleets.append(fleet)
            return fleet

        def engine(self, cfg, fleet=None, store=None, coordinator=None, hooks=None, background=False, **kw):
            store = store or self.store()
            coordinator = coordinator or LocalCoordinator(tmp_path / "shared" / "coordinator.db", timeout=1)
            hooks = hooks or EngineHooks(
                locate=fleet.locate if fleet else None, managed_restart=fleet.restart if fleet else None
            )
            engine = Engine(
                cfg, store=store, events=EventLog(store), coordinator=coordinator, agent_id="agent-a",
                hooks=hooks, state_dir=store.dir, background=background, **kw,
            )  # fmt: skip
            engines.append(engine)
            return engine

    yield Maker()
    for engine in engines:
        engine.close(timeout=5)
    for fleet in fleets:
        fleet.close(timeout=1)
    for store in stores:
        store.close()


def leaker(rate="16Mi"):
    return workload_argv("leak", "--rate", rate, "--every", "0.05s", "--cap", "400Mi")


def run(engine: Engine, fleet: Fleet, seconds: float, until=None, requests=None, interval=0.2):
    """Step the engine like the runtime would, on real time; returns the last report."""
    end = time.monotonic() + seconds
    report = None
    while time.monotonic() < end:
        fleet.relaunch_exited()
        now = time.time()
        reqs = fleet.detect(now) if requests is None else requests(now)
        report = engine.step(now, reqs, fleet.views())
        if until is not None and until(report):
            return report
        time.sleep(interval)
    return report


def kinds(store: Store) -> list[str]:
    return [e.kind for e in reversed(store.events(limit=1000))]


# ----------------------------------------------------------------------------- enforce, dry-run, pause


def test_enforce_restarts_a_leaking_instance_before_its_limit_with_evidence(made):
    fleet = made.fleet({"leaky": leaker()}, limit=140 * MiB)
    store = made.store()
    captured = []

    def smaps(view, timeout):
        captured.append(view.pid)
        return Path(f"/proc/{view.pid}/smaps_rollup").read_text()

    hooks = EngineHooks(locate=fleet.locate, managed_restart=fleet.restart, captures={"smaps_rollup": smaps})
    engine = made.engine(config(), fleet, store=store, hooks=hooks)
    old_pid = fleet.locate("leaky").pid
    run(
        engine,
        fleet,
        25,
        until=lambda r: engine.ledger.actions() and engine.ledger.actions()[0]["finished_at"],
    )
    (action,) = engine.ledger.actions()
    assert action["action"] == "restart" and action["mode"] == "enforce", action
    assert action["outcome"] == "succeeded", action
    assert action["old_pid"] == old_pid and action["new_pid"] == fleet.locate("leaky").pid != old_pid
    assert action["finding_id"].startswith("leak-leaky-") and action["request_kind"] == "oom-risk"
    assert action["started_at"] <= action["deadline"]
    assert fleet.peak["leaky"] < fleet.limit  # restarted before it reached its limit
    assert [s["stage"] for s in action["stages"]] == ["evidence", "act", "verify"]
    names = {e["name"]: e for e in action["evidence"]}
    assert captured == [old_pid] and "Rss:" in Path(names["smaps_rollup"]["path"]).read_text()
    finding = json.loads(Path(names["finding"]["path"]).read_text())
    assert names["finding"]["path"].endswith("finding.json")
    assert finding["id"] == action["finding_id"] and finding["kind"] == "oom-risk"
    assert finding["evidence"]["rss_bytes"] > 0
    assert {"remediation_restart_started", "remediation_restart_succeeded"} <= set(kinds(store))
    (record,) = engine.coordinator.restarts(since=0)
    assert record.outcome == "succeeded" and record.instance == "leaky"


def test_dry_run_records_what_it_would_do_and_touches_nothing(made):
    fleet = made.fleet({"leaky": leaker()}, limit=140 * MiB)
    store = made.store()
    engine = made.engine(config(mode="dry-run"), fleet, store=store)
    old_pid = fleet.locate("leaky").pid
    report = run(engine, fleet, 15, until=lambda r: engine.ledger.actions())
    (action,) = engine.ledger.actions()
    assert (
        action["mode"] == "dry-run"
        and action["outcome"] == "would-restart"
        and "nothing was restarted" in action["detail"]
        and action["old_pid"] == old_pid
    )
    assert report.decisions["leaky"].code == "dry-run"
    assert fleet.locate("leaky").pid == old_pid and fleet.restarts == []
    assert "remediation_dry_run" in kinds(store)
    assert engine.coordinator.restarts(since=0) == []  # dry-run never takes a real slot
    # the process still runs and leaks: the next steps judge it as it is, against the deadline its
    # finding projects now, and show the would-be restart; no second one, no "cannot be saved"
    later = run(engine, fleet, 1.0)
    assert len(engine.ledger.actions()) == 1
    decision = later.decisions["leaky"]
    assert decision.code == "dry-run" and "nothing was restarted" in decision.reason, decision
    (entry,) = later.plan.entries
    assert entry.dry_run and not entry.hopeless and entry.slot_at == action["started_at"]
    assert entry.deadline == later.intents["leaky"].deadline


def test_paused_means_untouched_until_resumed(made):
    fleet = made.fleet({"leaky": leaker()}, limit=140 * MiB)
    store = made.store()
    engine = made.engine(config(), fleet, store=store)
    with pytest.raises(ValueError, match="reason"):
        engine.pause("  ", time.time() + 60)
    engine.pause("investigating INC-42", time.time() + 60, by="alice")
    old_pid = fleet.locate("leaky").pid
    report = run(engine, fleet, 4)
    assert report.decisions["leaky"].stage == "pause" and "INC-42" in report.decisions["leaky"].reason
    assert "alice" in report.decisions["leaky"].reason
    assert fleet.locate("leaky").pid == old_pid and engine.ledger.actions() == []
    engine.resume(by="alice")
    run(engine, fleet, 20, until=lambda r: engine.ledger.actions())
    assert engine.ledger.actions()[0]["action"] == "restart"
    assert {"remediation_paused", "remediation_resumed"} <= set(kinds(store))


def test_a_pause_expires_by_itself(made):
    fleet = made.fleet({"flat": workload_argv("stable", "--size", "8Mi")})
    engine = made.engine(config(), fleet)
    engine.pause("short", time.time() + 0.5)
    assert engine.paused(time.time()) is not None
    time.sleep(0.6)
    assert engine.paused(time.time()) is None


# ----------------------------------------------------------------------------- escalation


def test_a_crash_looping_instance_is_escalated_not_restarted_forever(made):
    """It dies 0.4 s after each start (a crash at start-up, say) and its supervisor brings it back; every
    process gets its own finding, an OOM projected 10 min away: the crash loop is seen before any restart
    by medic is due, and escalated."""
    fleet = made.fleet({"crashy": [workload_argv("stable")[0], "-c", "import time; time.sleep(0.4)"]})
    store = made.store()
    escalated = []
    hooks = EngineHooks(
        locate=fleet.locate,
        managed_restart=fleet.restart,
        on_escalate=lambda v, r, i: escalated.append(i.code),
    )
    engine = made.engine(config(ladder={"clear_check": "30s"}), fleet, store=store, hooks=hooks)

    def findings(now):
        view = fleet.views()[0]
        if view.start_time is None:
            return []
        return [
            RemediationRequest(
                "crashy",
                "oom-risk",
                f"OOM-{view.start_time:.2f}",
                "OOM in 10 min",
                deadline=view.start_time + 600,
                start_time=view.start_time,
            )
        ]

    report = run(engine, fleet, 15, requests=findings, until=lambda r: escalated, interval=0.15)
    assert escalated == ["crash-loop"], report.decisions
    actions = engine.ledger.actions()
    assert actions[0]["action"] == "escalate" and "crash loop" in actions[0]["reason"]
    assert "remediation_escalated" in kinds(store)
    critical = [e for e in store.events(limit=100) if e.kind == "remediation_escalated"]
    assert critical[0].severity == "critical"
    # escalated: no more restarts, one escalation
    restarts_before = len(fleet.restarts)
    report = run(engine, fleet, 1.5, requests=findings, interval=0.15)
    assert len(fleet.restarts) == restarts_before
    assert sum(1 for a in engine.ledger.actions() if a["action"] == "escalate") == 1
    # a person clears it: the crash-loop count starts again
    engine.clear_escalation("crashy", by="bob")
    assert engine.ledger.starts("crashy", 0) == []


def restart_actions(engine: Engine) -> list[dict]:
    return sorted((a for a in engine.ledger.actions() if a["action"] == "restart"), key=lambda a: a["id"])


def escalations(engine: Engine) -> list[dict]:
    return [a for a in engine.ledger.actions() if a["action"] == "escalate"]


def test_a_leak_that_comes_back_after_its_restart_is_restarted_again_by_its_deadline(made):
    """A restart buys time, it does not fix the code: the leak found again on the new process is planned
    by its new deadline at once (never held to check the restart), restarted before its limit again,
    and nobody is paged."""
    fleet = made.fleet({"leaky": leaker("24Mi")}, limit=300 * MiB)
    store = made.store()
    # stepped every 0.2 s below, told 1 s (the runtime's steps are 10 s apart by default): a loaded
    # machine that stalls this loop for a second past the latest safe start is not a late plan
    engine = made.engine(config(interval="1s", budget={"cooldown": "1s"}), fleet, store=store)
    intents: list[str] = []

    def two_restarts(report) -> bool:
        if "leaky" in report.intents:
            intents.append(report.intents["leaky"].code)
        return len([a for a in restart_actions(engine) if a["finished_at"]]) >= 2

    report = run(engine, fleet, 45, until=two_restarts)
    first, second = restart_actions(engine)[:2]
    assert (first["outcome"], second["outcome"]) == ("succeeded", "succeeded"), report.decisions
    assert second["old_pid"] == first["new_pid"] and second["finding_id"] != first["finding_id"]
    assert "leak-returned" in intents and "checking-restart" not in intents, intents
    assert "a restart buys time" in second["reason"]
    margin = engine.plan_settings.safety_margin
    for action in (first, second):  # as late as safely possible, inside the safety margin's protection
        assert action["started_at"] <= action["deadline"] - margin, action
    assert fleet.peak["leaky"] < fleet.limit
    assert escalations(engine) == []
    # the step that reaches the slot starts it on time: no "cannot meet their deadline" warning
    assert "remediation_plan_infeasible" not in kinds(store)


def test_a_leak_restart_that_buys_no_time_is_escalated(made):
    """The new process is back at the old level at once (it reloads what the old one held, say): its OOM is
    as close as before, another restart would be due before the old process would have run out, so
    one restart is made and then a person is paged."""
    fleet = made.fleet({"leaky": leaker("24Mi")}, limit=300 * MiB)
    store = made.store()
    paged = []

    def restart_at_the_old_level(name: str, timeout: float) -> int:
        process = fleet.managed[name]
        held = read_statm(process.pid).rss_bytes
        process.argv = workload_argv(
            "leak", "--base", str(held), "--rate", "24Mi", "--every", "0.05s", "--cap", "64Mi"
        )
        return fleet.restart(name, timeout)

    hooks = EngineHooks(
        locate=fleet.locate,
        managed_restart=restart_at_the_old_level,
        on_escalate=lambda view, request, intent: paged.append(intent.code),
    )
    engine = made.engine(config(budget={"cooldown": "1s"}), fleet, store=store, hooks=hooks)
    report = run(engine, fleet, 40, until=lambda r: escalations(engine))
    assert paged == ["restart-did-not-help"], report.decisions
    (escalation,) = escalations(engine)
    assert "bought no time" in escalation["reason"] and "a person must look" in escalation["reason"]
    (restart,) = restart_actions(engine)
    assert restart["outcome"] == "succeeded"
    assert escalation["finding_id"] != restart["finding_id"]  # judged on the new process's finding
    run(engine, fleet, 1.0)  # escalated: left alone
    assert len(restart_actions(engine)) == 1


def test_a_slow_finding_that_persists_after_the_restart_is_escalated(made):
    """Slowness found again on the new process is checked for `clear_check`, then escalated."""
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "4Mi")})
    engine = made.engine(config(), fleet)
    intents: list[str] = []

    def slow(now: float) -> list[RemediationRequest]:
        view = fleet.views()[0]
        if view.start_time is None:
            return []
        return [
            RemediationRequest(
                "svc", "slow", f"slow-{view.start_time:.2f}", "p99 3x the SLO", start_time=view.start_time
            )
        ]

    def escalated(report) -> bool:
        if "svc" in report.intents:
            intents.append(report.intents["svc"].code)
        return bool(escalations(engine))

    report = run(engine, fleet, 15, requests=slow, until=escalated)
    (escalation,) = escalations(engine)
    assert escalation["detail"] == "restart-did-not-help" and "did not clear" in escalation["reason"]
    assert [a["outcome"] for a in restart_actions(engine)] == ["succeeded"], report.decisions
    assert (
        intents.index("confirming")
        < intents.index("checking-restart")
        < intents.index("restart-did-not-help")
    ), intents


# ----------------------------------------------------------------------------- the plan and the step


def leak_due(fleet: Fleet, deadline: float) -> list[RemediationRequest]:
    view = fleet.views()[0]
    return [RemediationRequest("svc", "leak", "L1", "leaks", deadline=deadline, start_time=view.start_time)]


def test_the_step_after_the_latest_safe_start_starts_the_restart_without_a_warning(made):
    """The engine steps every second; the slot is the latest safe start; the first step past it is
    a fraction of a second late and starts the restart: on time, no "cannot meet" warning."""
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "4Mi")})
    store = made.store()
    engine = made.engine(config(interval="1s"), fleet, store=store)
    deadline = float(int(time.time()) + 5)
    latest = latest_start(deadline, engine.plan_settings)
    before = engine.step(latest - 0.6, leak_due(fleet, deadline), fleet.views())
    assert before.decisions["svc"].code == "scheduled", before.decisions["svc"]
    after = engine.step(latest + 0.4, leak_due(fleet, deadline), fleet.views())
    assert after.decisions["svc"].code == "started", after.decisions["svc"]
    assert after.plan.feasible and after.plan.problems == ()
    assert "remediation_plan_infeasible" not in kinds(store)
    assert len(fleet.restarts) == 1


def test_a_start_more_than_one_step_after_the_latest_safe_start_is_reported(made):
    """An engine that first looks 1.5 steps after the latest safe start really is late: it says so."""
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "4Mi")})
    store = made.store()
    engine = made.engine(config(interval="1s"), fleet, store=store)
    deadline = float(int(time.time()) + 5)
    latest = latest_start(deadline, engine.plan_settings)
    report = engine.step(latest + 1.5, leak_due(fleet, deadline), fleet.views())
    assert report.decisions["svc"].code == "started"  # still restarted, as early as it can
    assert not report.plan.feasible and "cannot be restarted before its deadline" in report.plan.problems[0]
    (warning,) = [e for e in store.events(limit=100) if e.kind == "remediation_plan_infeasible"]
    assert warning.severity == "warning"


# ----------------------------------------------------------------------------- never restart the healthy


def test_a_stale_finding_never_restarts_the_new_process(made):
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "8Mi")})
    engine = made.engine(config(), fleet)
    view = fleet.views()[0]
    stale = RemediationRequest(
        "svc", "leak", "L1", "old process leaked", deadline=time.time(), start_time=view.start_time - 50
    )
    report = run(engine, fleet, 1.0, requests=lambda now: [stale])
    assert report.decisions["svc"].code == "stale" and "fresh finding" in report.decisions["svc"].reason
    assert engine.ledger.actions() == [] and fleet.restarts == []


def test_no_restart_when_the_coordinator_is_down(made):
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "8Mi")})
    store = made.store()
    down = EtcdCoordinator([f"http://127.0.0.1:{free_port()}"], timeout=0.3)
    engine = made.engine(config(), fleet, store=store, coordinator=down)
    request = RemediationRequest("svc", "manual", "M1", "on-call asked")
    report = run(engine, fleet, 1.0, requests=lambda now: [request])
    decision = report.decisions["svc"]
    assert decision.stage == "lock" and decision.code == "coordinator-unavailable"
    assert "etcd unreachable" in decision.reason and report.coordinator_error
    assert fleet.restarts == [] and engine.ledger.actions() == []
    events = [e for e in store.events(limit=100) if e.kind == "remediation_coordinator_unavailable"]
    assert len(events) == 1 and events[0].severity == "error"  # said once, not every step


def test_excluded_and_unknown_instances_and_bad_requests(made):
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "8Mi")})
    store = made.store()
    engine = made.engine(config(exclude=["svc"]), fleet, store=store)
    requests = [
        RemediationRequest("svc", "manual", "M1", "please"),
        RemediationRequest("ghost", "manual", "M2", "no such instance"),
        RemediationRequest("svc", "reboot", "M3", "bad kind"),  # type: ignore[arg-type]
    ]
    report = run(engine, fleet, 0.8, requests=lambda now: requests)
    assert report.decisions["svc"].code == "excluded" and fleet.restarts == []
    rejected = [e.message for e in store.events(limit=100) if e.kind == "remediation_request_rejected"]
    assert len(rejected) == 2  # once each, not every step
    assert any("ghost" in m for m in rejected) and any("unknown request kind" in m for m in rejected)


# ----------------------------------------------------------------------------- ladder, budget, failures


def test_fragmentation_is_purged_first_then_restarted_if_it_persists(made):
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "8Mi")})
    purges = []

    def purge(view, timeout):
        purges.append(view.pid)
        return Decision.allow(
            "purge", "jemalloc arenas purged: 1.3 GB returned", released_bytes=1_300_000_000
        )

    hooks = EngineHooks(locate=fleet.locate, managed_restart=fleet.restart, purge=purge)
    engine = made.engine(config(), fleet, hooks=hooks)
    frag = RemediationRequest("svc", "fragmentation", "FR1", "resident 2.1 GB vs 0.6 GB allocated")
    report = engine.step(time.time(), [frag], fleet.views())
    assert report.decisions["svc"].code == "purged" and len(purges) == 1
    report = engine.step(time.time(), [frag], fleet.views())
    assert report.intents["svc"].code == "purge-settling" and len(purges) == 1
    time.sleep(0.6)
    run(engine, fleet, 10, requests=lambda now: [frag], until=lambda r: fleet.restarts)
    assert len(purges) == 1 and len(fleet.restarts) == 1
    purge_action = next(a for a in engine.ledger.actions() if a["action"] == "purge")
    assert purge_action["outcome"] == "purged" and purge_action["data"]["released_bytes"] == 1_300_000_000


def test_one_restart_at_a_time_and_spaced(made):
    fleet = made.fleet({f"s{i}": workload_argv("stable", "--size", "4Mi") for i in range(3)})
    engine = made.engine(config(budget={"min_interval": "1.5s"}), fleet, background=True)
    for i in range(3):  # one-shot requests, as the API's restart endpoint submits them
        assert engine.submit(RemediationRequest(f"s{i}", "manual", f"M{i}", "roll")).ok
    done = lambda r: len([a for a in engine.ledger.actions() if a["finished_at"]]) == 3  # noqa: E731
    run(engine, fleet, 20, requests=lambda now: [], until=done)
    actions = sorted(engine.ledger.actions(), key=lambda a: a["started_at"])
    assert [a["outcome"] for a in actions] == ["succeeded"] * 3
    for first, second in pairwise(actions):
        assert second["started_at"] >= first["finished_at"]  # never two in flight
        assert second["started_at"] - first["started_at"] >= 1.5  # spacing


def test_a_failing_actuator_is_recorded_and_escalated(made):
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "4Mi")})
    cfg = config(actuator={"type": "exec", "command": ["false"]})
    engine = made.engine(cfg, fleet)
    request = RemediationRequest("svc", "manual", "M1", "please")
    run(engine, fleet, 5, requests=lambda now: [request], until=lambda r: len(engine.ledger.actions()) >= 2)
    actions = engine.ledger.actions()
    assert actions[-1]["outcome"] == "failed" and "exited with status 1" in actions[-1]["detail"]
    assert actions[0]["action"] == "escalate" and actions[0]["detail"] == "restart-failed"


def test_forced_manual_request_skips_plan_and_budget_but_not_pause(made):
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "4Mi")})
    engine = made.engine(config(budget={"cooldown": "1h"}, blockers={"min_uptime": "1h"}), fleet)
    plain = RemediationRequest("svc", "manual", "M1", "please")
    report = engine.step(time.time(), [plain], fleet.views())
    assert report.decisions["svc"].code == "min-uptime"
    forced = RemediationRequest("svc", "manual", "M2", "INC-7: stuck", force=True, requested_by="alice")
    engine.pause("maintenance", time.time() + 60)
    assert engine.submit(forced).ok
    report = engine.step(time.time(), [], fleet.views())
    assert report.decisions["svc"].code == "paused" and fleet.restarts == []
    engine.resume()
    report = engine.step(time.time(), [], fleet.views())
    assert report.decisions["svc"].code == "started", report.decisions["svc"]
    assert len(fleet.restarts) == 1
    assert engine.ledger.actions()[0]["reason"].startswith("restart forced by alice")
    report = engine.step(time.time(), [], fleet.views())  # the one-shot request is done
    assert "svc" not in report.decisions


def test_a_request_submitted_while_a_step_runs_is_not_given_that_step_s_answer(made):
    """A person forces a restart while a step is deciding the held request it replaces: the step's
    "held: min-uptime" belongs to the old request's action, never to the forced one's."""
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "4Mi")})
    engine = made.engine(config(budget={"cooldown": "1h"}, blockers={"min_uptime": "1h"}), fleet)
    assert engine.submit(RemediationRequest("svc", "manual", "M1", "please")).ok
    forced = RemediationRequest("svc", "manual", "M2", "INC-8: stuck", force=True, requested_by="alice")
    take = engine.intake.take

    def take_then_force(*args):
        taken = take(*args)
        assert engine.submit(forced).ok  # from the API's thread, while this step runs
        return taken

    engine.intake.take = take_then_force
    report = engine.step(time.time(), [], fleet.views())
    assert report.decisions["svc"].code == "min-uptime"
    engine.intake.take = take
    old, new = sorted(engine.ledger.actions(), key=lambda a: a["id"])
    assert old["outcome"] == "replaced" and new["outcome"] == "requested", (old, new)
    report = engine.step(time.time(), [], fleet.views())
    assert report.decisions["svc"].code == "started" and len(fleet.restarts) == 1


def test_a_waiting_request_s_answer_never_overwrites_the_restart_that_carried_it_out(made):
    """The restart that carried a request out finished while a step was deciding: the step's "held"
    is not written over the action's outcome."""
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "4Mi")})
    engine = made.engine(config(budget={"cooldown": "1h"}, blockers={"min_uptime": "1h"}), fleet)
    decision = engine.submit(RemediationRequest("svc", "manual", "M1", "please"))
    action_id = decision.data["action_id"]
    engine.ledger.update_action(action_id, outcome="succeeded", detail="restarted", finished_at=time.time())
    report = engine.step(time.time(), [], fleet.views())
    assert report.decisions["svc"].code == "min-uptime"
    action = engine.ledger.action(action_id)
    assert (action["outcome"], action["detail"]) == ("succeeded", "restarted"), action


def test_budget_and_ledger_survive_an_agent_restart(made, tmp_path):
    fleet = made.fleet(
        {"a": workload_argv("stable", "--size", "4Mi"), "b": workload_argv("stable", "--size", "4Mi")}
    )
    store = made.store()
    cfg = config(budget={"min_interval": "1h"})
    first = made.engine(cfg, fleet, store=store)
    report = first.step(time.time(), [RemediationRequest("a", "manual", "M1", "x")], fleet.views())
    assert report.decisions["a"].code == "started"
    first.close()
    # a new agent process: new engine, same state dir, same shared coordinator file
    second = made.engine(cfg, fleet, store=store)
    report = second.step(time.time(), [RemediationRequest("b", "manual", "M2", "y")], fleet.views())
    decision = report.decisions["b"]
    assert not decision.ok and decision.code in ("scheduled", "min-interval"), decision
    assert "min_interval is 1h" in decision.reason and "(a)" in decision.reason
    assert second.ledger.actions()[0]["outcome"] == "succeeded"


def test_an_agent_killed_mid_restart_leaves_an_interrupted_action(made):
    fleet = made.fleet({"a": workload_argv("stable", "--size", "4Mi")})
    store = made.store()
    engine = made.engine(config(), fleet, store=store)
    action_id = engine.ledger.open_action(
        instance="a", action="restart", mode="enforce", reason="x", outcome="running", now=time.time()
    )
    restarted = made.engine(config(), fleet, store=store)
    assert restarted.ledger.action(action_id)["outcome"] == "interrupted"
    assert "remediation_interrupted" in kinds(store)


def test_mode_off_does_nothing_and_snapshot_is_json(made):
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "4Mi")})
    engine = made.engine(config(mode="off"), fleet)
    report = engine.step(time.time(), [RemediationRequest("svc", "manual", "M1", "x")], fleet.views())
    assert report.decisions == {} and fleet.restarts == []
    enforce = made.engine(config(), fleet)
    enforce.step(
        time.time(),
        [RemediationRequest("svc", "leak", "L1", "x", deadline=time.time() + 3600)],
        fleet.views(),
    )
    snapshot = json.loads(json.dumps(enforce.snapshot()))
    assert snapshot["mode"] == "enforce" and snapshot["coordinator"]["ok"]
    assert snapshot["step"]["plan"]["entries"][0]["instance"] == "svc"
    assert snapshot["step"]["decisions"]["svc"]["code"] == "scheduled"


def test_a_failing_hook_on_one_instance_does_not_stop_the_others(made):
    fleet = made.fleet(
        {"a": workload_argv("stable", "--size", "4Mi"), "b": workload_argv("stable", "--size", "4Mi")}
    )

    def can_purge(view):
        if view.name == "a":
            raise RuntimeError("hook socket vanished")
        return True

    purge = lambda view, timeout: Decision.allow("purge", "purged 10 MB")  # noqa: E731
    hooks = EngineHooks(locate=fleet.locate, managed_restart=fleet.restart, purge=purge, can_purge=can_purge)
    engine = made.engine(config(), fleet, hooks=hooks)
    requests = [
        RemediationRequest(n, "fragmentation", f"FR-{n}", "rss far above allocated") for n in ("a", "b")
    ]
    report = engine.step(time.time(), requests, fleet.views())
    assert report.decisions["a"].code == "error" and "hook socket vanished" in report.decisions["a"].reason
    assert report.decisions["b"].code == "purged"


def test_a_pause_that_lands_while_a_restart_drains_stops_it_before_it_acts(made):
    fleet = made.fleet({"svc": workload_argv("stable", "--size", "4Mi")})
    engine = made.engine(config(), fleet, background=True)
    original = engine.restarts._verifier
    pid_before = fleet.managed["svc"].pid

    def pause_then_verify(view):  # runs while the restart is being set up, after the step decided it
        engine.pause("INC-9: hands off", time.time() + 60)
        return original(view)

    engine.restarts._verifier = pause_then_verify
    forced = RemediationRequest("svc", "manual", "M1", "INC-9", force=True, requested_by="alice")
    assert engine.submit(forced).ok
    engine.step(time.time(), [], fleet.views())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and engine.ledger.actions()[0].get("outcome") in (None, "running"):
        time.sleep(0.05)
    action = engine.ledger.actions()[0]
    assert action["outcome"] == "skipped" and "paused" in action["detail"], action
    assert fleet.restarts == [] and fleet.managed["svc"].pid == pid_before
