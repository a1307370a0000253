"""Escalations that hold and end consistently, crash loops judged on real uptimes, the warm-up section,
and plan problems reported once per change: the engine on a fake clock (no process is touched: the
instances are only views), the policy's pure functions, the config's parser."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.supervisor import relaunch_warnings
from remediation.config import RemediationSection, VerifySection, WarmupSection
from remediation.coordinator.local import LocalCoordinator
from remediation.engine import Engine
from remediation.model import InstanceView, Lifetime, RemediationRequest
from remediation.policy import crash_loop_run, primary_request

T0 = 1_800_000_000.0


@pytest.fixture
def engine_for(tmp_path):
    built = []

    def build(**section) -> tuple[Engine, Store]:
        store = Store(tmp_path / f"state{len(built)}")
        config = RemediationSection.model_validate(
            {"interval": "10s", "blockers": {"min_uptime": 0}, **section}
        )
        engine = Engine(
            config,
            store=store,
            events=EventLog(store),
            coordinator=LocalCoordinator(tmp_path / f"coord{len(built)}.db", timeout=1),
            agent_id="agent-a",
            state_dir=store.dir,
            background=False,
            clock=lambda: T0,
        )
        built.append((engine, store))
        return engine, store

    yield build
    for engine, store in built:
        engine.close(timeout=2)
        store.close()


def view(name: str = "svc", start: float = T0 - 5) -> InstanceView:
    return InstanceView(name, 4242, start, ("serve",))


def crash_loop(name: str = "svc") -> RemediationRequest:
    return RemediationRequest(
        name, "crash-loop", f"{name}:crash-loop:1", f"{name} crashed 5 times within 10m"
    )


def leak(name: str = "svc", at: float = T0) -> RemediationRequest:
    return RemediationRequest(name, "leak", f"{name}:leak:1", "RSS grows", deadline=at + 7 * 86400)


def kinds(store: Store) -> list[str]:
    return [e.kind for e in store.events(limit=1000)]


def test_an_escalation_expires_and_everything_says_so(engine_for):
    engine, store = engine_for(
        mode="enforce", ladder={"escalation_expiry": "1h", "crash_loop": {"reset_after": "2h"}}
    )
    report = engine.step(T0, [crash_loop(), leak()], [view()])
    assert report.intents["svc"].action == "escalate" and report.intents["svc"].code == "crash-loop"
    held = engine.step(T0 + 60, [leak()], [view()]).decisions["svc"]
    assert held.code == "escalated" and "medic clear svc" in held.reason and "expires at" in held.reason
    shown = engine.snapshot(T0 + 60)["escalations"]
    assert shown[0]["expires_at"] == T0 + 3600 and shown[0]["hold"] == held.reason

    after = engine.step(T0 + 3601, [leak()], [view()]).decisions["svc"]
    assert after.code != "escalated" and "clears it" not in after.reason
    assert engine.snapshot(T0 + 3601)["escalations"] == []
    assert engine.ledger.reset_at("svc") == T0 + 3601
    assert all(c.escalated_at is None for c in engine.ledger.open_cases())
    expired = [e for e in store.events(limit=100) if e.kind == "remediation_escalation_expired"]
    assert len(expired) == 1 and "expired after 1h" in expired[0].message
    assert "may act again" in expired[0].message


def test_a_cleared_escalation_says_who_and_is_gone_from_plan_and_decisions(engine_for):
    engine, store = engine_for(mode="enforce")
    engine.step(T0, [crash_loop()], [view()])
    assert engine.clear_escalation("svc", by="token:abc (note: alice)")
    assert not engine.clear_escalation("svc", by="token:abc")  # nothing left to clear: no event
    cleared = [e for e in store.events(limit=100) if e.kind == "remediation_escalation_cleared"]
    assert len(cleared) == 1 and "alice" in cleared[0].message
    decision = engine.step(T0 + 30, [leak()], [view()]).decisions["svc"]
    assert decision.code != "escalated"


def test_a_crash_loop_leads_every_other_request_of_its_instance():
    requests = [leak(), RemediationRequest("svc", "slow", "s", "slow"), crash_loop()]
    assert primary_request(requests).kind == "crash-loop"


def test_plan_problems_are_reported_once_per_change_in_dry_run(engine_for):
    engine, store = engine_for(
        mode="dry-run", budget={"max_concurrent": 1, "min_interval": "1h", "cooldown": "1h"}
    )
    views = [view("a"), view("b"), view("c")]

    def requests(now: float, names: str = "abc") -> list[RemediationRequest]:  # three OOMs in 10 min
        return [
            RemediationRequest(v.name, "leak", f"{v.name}:leak", "grows", deadline=now + 600)
            for v in views
            if v.name in names
        ]

    for step in range(6):  # every step words its problems anew (the deadlines move on by 10 s)
        report = engine.step(T0 + 10 * step, requests(T0 + 10 * step), views)
    infeasible = [e for e in store.events(limit=100) if e.kind == "remediation_plan_infeasible"]
    # one restart an hour: the first is late, the two others cannot be saved; the would-be restart
    # of the first changes nothing of that (it is shown as such, never as "cannot be saved")
    assert len(infeasible) == 1, [e.message for e in infeasible]
    would = [e for e in report.plan.entries if e.dry_run]
    assert len(would) == 1 and not would[0].hopeless and would[0].slot_at == T0
    assert sorted(e.instance for e in report.plan.entries if e.hopeless) == sorted(
        {"a", "b", "c"} - {would[0].instance}
    )
    saved = would[0].instance
    engine.step(T0 + 60, requests(T0 + 60, saved + min({"a", "b", "c"} - {saved})), views)
    infeasible = [e for e in store.events(limit=100) if e.kind == "remediation_plan_infeasible"]
    assert len(infeasible) == 2  # one instance fewer cannot be saved: a change, said once


def test_crash_loops_count_real_uptimes_whatever_the_back_off():
    """Each process lived 0.3 s; the relaunch back-off grew 1, 2, 4, 8, 16 s, past reset_after (3 s)."""
    start, runs = T0, []
    for backoff in (1, 2, 4, 8, 16):
        runs.append(Lifetime(start, start + 0.3, 3))
        start += 0.3 + backoff
    assert len(crash_loop_run(runs, start, window=600, reset_after=3)) == 5
    stayed_up = [*runs, Lifetime(start, start + 3.5, 0), Lifetime(start + 4, start + 4.2, 3)]
    assert (
        len(crash_loop_run(stayed_up, start + 5, window=600, reset_after=3)) == 1
    )  # the long one ended the run
    running = [*runs, Lifetime(start, None)]
    assert crash_loop_run(running, start + 4, window=600, reset_after=3) == []  # up 4 s now: no loop
    assert (
        len(crash_loop_run(runs, start, window=20, reset_after=3)) == 1
    )  # only the last one is in the window


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0, 1e5),
            st.one_of(st.none(), st.floats(0, 1e4)),
            st.one_of(st.none(), st.integers(-5, 300)),
        ),
        max_size=40,
    ),
    st.floats(0, 2e5),
    st.floats(0.1, 1e5),
    st.floats(0, 1e5),
)
def test_crash_loop_run_is_a_subset_of_ended_short_lived_processes(raw, now, window, reset_after):
    lifetimes = [Lifetime(s, None if d is None else s + d, code) for s, d, code in raw]
    run = crash_loop_run(lifetimes, now, window, reset_after)
    assert all(lt.end is not None and lt.uptime(now) < reset_after and lt.start >= now - window for lt in run)
    assert [lt.start for lt in run] == sorted(lt.start for lt in run)


def test_warmup_true_is_refused_with_the_new_form():
    with pytest.raises(ValidationError) as caught:
        VerifySection.model_validate({"warmup": True})
    assert "warmup: {requests: DIR, target: 250ms, consecutive: 5, deadline: 2m}" in str(caught.value)
    assert VerifySection.model_validate({"warmup": False}).warmup is None
    section = VerifySection.model_validate(
        {"warmup": {"requests": "warm/", "target": "250ms", "consecutive": 5, "deadline": "2m"}}
    ).warmup
    assert (
        section is not None
        and section.target == 0.25
        and section.deadline == 120
        and section.on_cold == "escalate"
    )


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            ["requests", "url", "target", "consecutive", "deadline", "timeout", "on_cold", "extra"]
        ),
        st.one_of(
            st.text(max_size=12), st.integers(-10, 10**6), st.floats(allow_nan=True), st.booleans(), st.none()
        ),
        max_size=8,
    )
)
def test_the_warmup_section_accepts_or_refuses_never_crashes(data):
    try:
        section = WarmupSection.model_validate(data)
    except ValidationError as exc:
        assert str(exc)
    else:
        assert section.consecutive >= 1 and section.deadline > 0


def test_config_check_warns_when_the_back_off_outgrows_reset_after():
    class Match:
        managed = True

    class Spec:
        name, match, restart_on_exit = "crashy", Match(), True

    warnings = relaunch_warnings([Spec()], window=3600, reset_after=60, max_restarts=3)
    assert len(warnings) == 1 and "reset_after (60s)" in warnings[0] and "crashy" in warnings[0]
    assert relaunch_warnings([Spec()], window=3600, reset_after=1800, max_restarts=3) == []
    spread = relaunch_warnings([Spec()], window=60, reset_after=1800, max_restarts=10)
    assert any("never found" in w for w in spread)


def test_medic_plan_says_when_a_due_slot_is_held_by_a_blocker():
    from agent.cli.plan import _row

    entry = {"instance": "svc", "kind": "leak", "slot_at": T0 - 5, "deadline": T0 + 3600, "reason": "planned"}
    blocked = {
        "ok": False,
        "stage": "blocker",
        "code": "min_uptime",
        "reason": "up 2m, needs 10m",
        "retry_at": T0 + 480,
    }
    row = _row(entry, blocked, T0)
    assert row[4] == "on time, held: min_uptime" and row[5].startswith("up 2m, needs 10m (retried ")
    scheduled = {"ok": False, "stage": "plan", "code": "scheduled", "reason": "planned", "retry_at": T0 + 60}
    assert _row(entry, scheduled, T0)[4] == "on time"


def test_medic_config_check_prints_the_back_off_warning_and_still_accepts_the_file(tmp_path):
    import os
    import subprocess

    import yaml

    from support.procs import PYTHON, REPO

    path = tmp_path / "medic.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "instances": [{"name": "crashy", "match": {"command": ["/bin/false"]}}],
                "remediation": {"ladder": {"crash_loop": {"reset_after": "1m"}}},
            }
        )
    )
    checked = subprocess.run(
        [PYTHON, "-m", "agent.cli.main", "config", "check", str(path), "-q"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert checked.returncode == 0 and checked.stdout == ""
    assert "warning: remediation.ladder.crash_loop.reset_after (60s)" in checked.stderr
