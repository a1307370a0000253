"""The critical gate, end to end through the engine: of three real processes, the one whose leak
finding is critical gets its restart (dry-run's would-be restart), the one whose leak finding
falls short of critical is watched (no restart, no deadline, and the plan `medic plan` shows says
why, in the detector's words), and the healthy twin gets nothing. A watched request never holds a
critical one behind it on the same instance."""

from __future__ import annotations

import time

import pytest

from agent.cli.plan import _held
from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.discovery import by_pid
from agent.watch.supervisor import ManagedProcess
from remediation.config import RemediationSection
from remediation.coordinator.local import LocalCoordinator
from remediation.engine import Engine, EngineHooks
from remediation.model import InstanceView, RemediationRequest
from support.procs import VERIFY_TIMEOUT, wait_until, workload_argv

pytestmark = pytest.mark.slow
MiB = 2**20
WHY = "levelling not ruled out: a curve that stays below the limit for 1d (exp 0.6) fits the window scale with p 0.3"
CONFIG = {
    "mode": "dry-run",
    "interval": "0.25s",
    "budget": {"max_concurrent": 1, "min_interval": "1s", "max_per_hour": None, "cooldown": "1m"},
    "plan": {"safety_margin": "2s", "restart_duration": "1s", "deadline_granularity": 0},
    "blockers": {"min_uptime": 0},
    "verify": {"timeout": VERIFY_TIMEOUT, "stable_for": "0.3s"},
}


@pytest.fixture
def fleet(tmp_path):
    argvs = {
        "critical": workload_argv("leak", "--rate", "1Mi", "--every", "0.2s", "--cap", "16Mi"),
        "watched": workload_argv("leak", "--rate", "1Mi", "--every", "0.2s", "--cap", "16Mi"),
        "healthy": workload_argv("stable", "--size", "8Mi"),
    }
    managed = {name: ManagedProcess(name, argv, stop_timeout=2) for name, argv in argvs.items()}
    for process in managed.values():
        process.launch()
    store = Store(tmp_path / "state")
    engine = Engine(
        RemediationSection.model_validate(CONFIG),
        store=store,
        events=EventLog(store),
        coordinator=LocalCoordinator(tmp_path / "coordinator.db", timeout=1),
        agent_id="agent-a",
        hooks=EngineHooks(locate=lambda name: by_pid(managed[name].pid) if managed[name].pid else None),
        state_dir=store.dir,
    )
    yield engine, managed
    engine.close(timeout=5)
    for process in managed.values():
        process.stopping = True
        process.stop(1)
    store.close()


def views(managed: dict[str, ManagedProcess]) -> list[InstanceView]:
    out = []
    for name, process in managed.items():
        found = by_pid(process.pid) if process.pid else None
        out.append(
            InstanceView(
                name,
                found.pid if found else None,
                found.start_time if found else None,
                (),
                {"fleet": "f"},
                ready=found is not None,
                managed=True,
            )
        )
    return out


def leak(view: InstanceView, severity: str, deadline: float | None, kind: str = "leak") -> RemediationRequest:
    """A finding's request as the agent's remediation job makes it: a deadline only when critical."""
    evidence = {} if severity == "critical" else {"not_critical": WHY}
    return RemediationRequest(
        view.name,
        kind,  # type: ignore[arg-type]
        f"{kind}-{view.name}",
        f"{view.name} leaks",
        deadline=deadline,
        start_time=view.start_time,
        evidence=evidence,
        finding={"kind": kind, "severity": severity, "evidence": evidence},
    )


def test_only_the_critical_leak_is_restarted_the_other_is_watched_and_says_why(fleet):
    engine, managed = fleet
    wait_until(lambda: all(v.pid for v in views(managed)), 10)
    oom = time.time() + 6  # the critical leak's projected OOM: a restart is due within seconds

    def step():
        now = time.time()
        seen = {v.name: v for v in views(managed)}
        requests = [
            leak(seen["critical"], "critical", oom),
            leak(seen["watched"], "error", None),
            # the same instance's oom-risk is watched (a limit only medic's config sets) while its
            # leak is critical: the critical one leads
            leak(seen["critical"], "error", None, kind="oom-risk"),
        ]
        return engine.step(now, requests, list(seen.values()))

    def acted():
        report = step()
        return report if engine.ledger.actions() else None

    report = wait_until(acted, 60, interval=0.25)
    (action,) = engine.ledger.actions()
    assert action["instance"] == "critical" and action["outcome"] == "would-restart"
    watched = report.decisions["watched"]
    assert (watched.stage, watched.code) == ("policy", "watched"), watched
    assert "not yet critical" in watched.reason and WHY in watched.reason
    assert report.intents["watched"].deadline is None
    assert "healthy" not in report.decisions and "healthy" not in report.intents
    assert [e.instance for e in report.plan.entries] == ["critical"]
    # what `medic plan` reads (`/api/v1/plan`) and prints under the plan: held, watched, and why
    shown = engine.snapshot()["step"]["decisions"]["watched"]
    line = _held(shown, time.time())
    assert line.startswith("policy/watched: leak (error) watched, no restart planned") and WHY in line
    assert "healthy" not in engine.snapshot()["step"]["decisions"]
    for _ in range(3):  # later steps: still no action for the watched or the healthy instance
        step()
    assert [a["instance"] for a in engine.ledger.actions()] == ["critical"]
