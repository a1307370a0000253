"""The planner: deadline-aware, as late as safe, spaced by the real budget, deterministic, honest when it cannot."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.budget import HOUR, BudgetLimits, BudgetState, admit
from remediation.model import FleetEntry, RestartRecord
from remediation.planner import PlanSettings, latest_start, on_time_until, plan
from remediation.windows import TimeWindow, Windows

T0 = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
LIMITS = BudgetLimits(max_concurrent=1, min_interval=600, max_per_hour=None, cooldown=3600)
SETTINGS = PlanSettings(safety_margin=3600, restart_duration=300, deadline_granularity=300)


def leak(name, hours, fleet="ranker", agent="agent-a"):
    return FleetEntry(name, fleet, agent, wants_restart=True, kind="leak", deadline=T0 + hours * HOUR)


def asap(name, requested_after=0.0, fleet="ranker"):
    return FleetEntry(
        name, fleet, "agent-a", wants_restart=True, kind="slow", requested_at=T0 + requested_after
    )


def slots(p):
    return {e.instance: e.slot_at - T0 for e in p.entries}


def test_one_instance_goes_as_late_as_safely_possible():
    p = plan([leak("s1", 10)], [], LIMITS, SETTINGS, T0)
    (entry,) = p.entries
    assert entry.slot_at == latest_start(T0 + 10 * HOUR, SETTINGS) == T0 + 10 * HOUR - 3600 - 300 - 200
    assert not entry.late and p.feasible and p.problems == ()
    assert "OOM projected" in entry.reason and "margin 1h" in entry.reason


def test_fleet_leaking_in_lockstep_starts_early_and_rolls_one_at_a_time():
    """User story 2: 20 instances, all projected to OOM within the same 36 hours, one restart per hour."""
    hourly = BudgetLimits(max_concurrent=1, min_interval=600, max_per_hour=1, cooldown=3600)
    entries = [leak(f"serving-{i}", 34 + i * 0.1) for i in range(20)]
    random.Random(7).shuffle(entries)
    p = plan(entries, [], hourly, SETTINGS, T0)
    assert p.feasible, p.problems
    ordered = [e.instance for e in p.entries]
    assert ordered == [f"serving-{i}" for i in range(20)]  # earliest deadline first
    times = [e.slot_at for e in p.entries]
    assert all(b - a >= HOUR - 1e-6 for a, b in pairwise(times))  # never two in one hour
    assert all(e.slot_at <= e.latest_start for e in p.entries)
    # the whole fleet fits: the first restart starts about 19 hours before the last safe start
    assert times[-1] - times[0] == pytest.approx(19 * HOUR)
    assert times[0] > T0  # ...but no earlier than needed
    assert p.entries[1].after == p.entries[0].instance and "after serving-0" in p.entries[1].reason


def test_infeasible_plan_says_so_and_goes_in_deadline_order():
    entries = [
        leak(f"s{i}", 1.2 + i * 0.01) for i in range(4)
    ]  # latest starts ~7 min from now, 10 min apart needed
    p = plan(entries, [], LIMITS, SETTINGS, T0)
    assert not p.feasible
    assert [e.instance for e in p.entries] == ["s0", "s1", "s2", "s3"]
    assert p.entries[0].slot_at == T0  # as early as possible once late
    times = [e.slot_at for e in p.entries]
    assert all(b - a >= 600 - 1e-6 for a, b in pairwise(times))
    late = [e.instance for e in p.entries if e.late]
    assert late and all(f"{name} (fleet ranker) cannot be restarted" in " ".join(p.problems) for name in late)
    assert "raise the budget" in p.problems[0] and "LATE by" in p.entries[-1].reason


def test_under_overload_slots_go_to_instances_that_can_still_be_saved():
    # 3 instances OOM in 12 min, 3 more in 40 min; one restart per 10 min: the first three cannot all be saved
    entries = [leak(f"soon{i}", 0.2) for i in range(3)] + [leak(f"later{i}", 0.67) for i in range(3)]
    p = plan(entries, [], LIMITS, SETTINGS, T0)
    assert not p.feasible
    hopeless = {e.instance for e in p.hopeless}
    assert len(hopeless) == 2 and hopeless <= {"soon0", "soon1", "soon2"}
    saved = [e for e in p.entries if not e.hopeless]
    assert saved[0].instance.startswith("soon") and {e.instance for e in saved[1:]} == {
        "later0",
        "later1",
        "later2",
    }
    assert [e.slot_at - T0 for e in saved] == [0, 600, 1200, 1800]  # every slot used, none wasted
    assert all(e.slot_at + SETTINGS.restart_duration <= e.deadline for e in saved)
    assert "CANNOT BE SAVED" in p.entry(sorted(hopeless)[0]).reason
    assert any("ends after the projected OOM" in problem for problem in p.problems)


def test_one_instance_held_by_its_cooldown_does_not_hold_the_others():
    history = [
        RestartRecord("s0", "ranker", "agent-b", T0 - 600, T0 - 300, "succeeded")
    ]  # cooldown to T0+3300
    entries = [leak("s0", 1.1)] + [leak(f"s{i}", 1.2 + i * 0.2) for i in range(1, 4)]
    p = plan(entries, history, LIMITS, SETTINGS, T0)
    s = slots(p)
    assert s["s0"] >= 3300 and p.entry("s0").late
    for i in range(1, 4):  # these keep their own as-late-as-possible slots, ahead of s0
        assert (
            not p.entry(f"s{i}").late
            and s[f"s{i}"] == latest_start(T0 + (1.2 + i * 0.2) * HOUR, SETTINGS) - T0
        )


def test_history_pushes_slots_cooldown_and_in_flight():
    history = [
        RestartRecord("s1", "ranker", "agent-b", T0 - 600, T0 - 300, "succeeded"),  # cooldown until T0+3300
        RestartRecord("s9", "ranker", "agent-b", T0 - 60),  # in flight now
    ]
    p = plan([leak("s1", 1.5), leak("s2", 1.6), leak("s9", 3)], history, LIMITS, SETTINGS, T0)
    s = slots(p)
    assert "s9" not in s  # already in flight: not planned again
    assert s["s1"] >= 3300  # its cooldown, though that makes it late
    assert s["s2"] >= 540  # after the in-flight restart (assumed 5 min) and min_interval from its start
    assert p.entry("s1").late and "cooldown" in p.entry("s1").reason


def test_requests_without_deadline_take_free_slots_without_pushing_deadlines():
    entries = [leak("d1", 3), asap("a2", requested_after=-120), asap("a1", requested_after=-300)]
    p = plan(entries, [], LIMITS, SETTINGS, T0)
    s = slots(p)
    assert s["a1"] == 0 and s["a2"] == 600  # first requested, first served, 10 min apart
    assert s["d1"] == latest_start(T0 + 3 * HOUR, SETTINGS) - T0
    assert p.feasible


def test_requests_without_deadline_wait_behind_tight_deadlines():
    entries = [leak("d1", 1.15), leak("d2", 1.3), asap("a1")]
    p = plan(entries, [], LIMITS, SETTINGS, T0)
    order = [e.instance for e in p.entries]
    assert order == ["d1", "d2", "a1"]
    assert p.feasible


def test_the_same_inputs_give_the_same_plan_in_any_order_and_on_any_agent():
    entries = [leak(f"s{i}", 5 + (i % 3) * 0.02, agent=f"agent-{i % 2}") for i in range(12)] + [
        asap("x"),
        asap("y"),
    ]
    reference = plan(entries, [], LIMITS, SETTINGS, T0).to_dict()["entries"]
    for seed in range(5):
        shuffled = entries[:]
        random.Random(seed).shuffle(shuffled)
        assert plan(shuffled, [], LIMITS, SETTINGS, T0).to_dict()["entries"] == reference
    # an agent computing a few seconds later agrees on every slot that is not due yet
    later = plan(entries, [], LIMITS, SETTINGS, T0 + 5)
    assert {e.instance: e.slot_at for e in later.entries if e.deadline} == {
        e["instance"]: e["slot_at"] for e in reference if e["deadline"]
    }


def test_a_wobbling_deadline_estimate_keeps_its_slot():
    base = T0 + 10 * HOUR - (T0 + 10 * HOUR) % 300 + 10  # 10 s into a 5-minute bucket
    seen = set()
    for wobble in (0, 30, 120, 250):
        entry = FleetEntry("s1", "ranker", "a", wants_restart=True, kind="leak", deadline=base + wobble)
        seen.add(plan([entry], [], LIMITS, SETTINGS, T0).entries[0].slot_at)
    assert len(seen) == 1


def test_fleets_are_planned_independently():
    entries = [leak("r1", 5, fleet="ranker"), leak("e1", 5, fleet="embedder")]
    s = slots(plan(entries, [], LIMITS, SETTINGS, T0))
    assert s["r1"] == s["e1"]  # different fleets, different budgets


def test_slots_fall_inside_the_restart_windows():
    windows = Windows([TimeWindow.parse("02:00", "04:00", timezone="UTC")])
    # T0 is 22:13 UTC; deadlines late the next day
    entries = [leak(f"s{i}", 20 + i * 0.1) for i in range(3)]
    p = plan(entries, [], LIMITS, SETTINGS, T0, windows)
    assert p.feasible
    for e in p.entries:
        assert windows.contains(e.slot_at), e.reason
    times = sorted(e.slot_at for e in p.entries)
    assert all(b - a >= 600 - 1e-6 for a, b in pairwise(times))


def test_a_window_that_never_comes_before_the_deadline_is_reported():
    windows = Windows([TimeWindow.parse("02:00", "02:30", timezone="UTC")])
    p = plan([leak("s1", 2)], [], LIMITS, SETTINGS, T0, windows)  # deadline at 00:13, window at 02:00
    assert not p.feasible and "windows" in p.entries[0].reason


def test_explain_false_keeps_the_schedule_and_drops_the_text():
    entries = [leak(f"s{i}", 2 + i * 0.01) for i in range(5)]
    with_text, without = (
        plan(entries, [], LIMITS, SETTINGS, T0),
        plan(entries, [], LIMITS, SETTINGS, T0, explain=False),
    )
    assert slots(with_text) == slots(without)
    assert all(e.reason == "" for e in without.entries) and without.problems == ()


# The engine steps every `step` seconds: the step that first reaches a slot at the latest safe start
# comes up to one step after it. (now - latest start, step, late?)
ON_TIME_WITHIN_ONE_STEP = [
    (0.0, 1.0, False),  # exactly on its latest safe start
    (0.4, 1.0, False),  # the step after it, a fraction of a second late: on time
    (1.0, 1.0, False),
    (1.5, 1.0, True),  # more than one step late: the engine missed it
    (0.4, 0.0, True),  # a caller that does not step (step 0) keeps the strict check
    (-30.0, 0.0, False),
]


@pytest.mark.parametrize("after_latest, step, late", ON_TIME_WITHIN_ONE_STEP)
def test_a_slot_reached_within_one_engine_step_after_the_latest_safe_start_is_on_time(
    after_latest, step, late
):
    stepped = PlanSettings(safety_margin=30, restart_duration=10, deadline_granularity=1, step=step)
    entry = leak("s1", 1)
    now = latest_start(entry.deadline, stepped) + after_latest
    p = plan([entry], [], LIMITS, stepped, now)
    (planned,) = p.entries
    assert planned.slot_at == max(now, planned.latest_start)  # the restart starts at this step either way
    assert planned.late == late and p.feasible == (not late)
    assert bool(p.problems) == late, p.problems
    assert ("LATE by" in planned.reason) == late


def test_lateness_is_judged_against_the_exact_deadline_not_the_rounded_one():
    """Deadlines are rounded down (5 min here) to keep slots stable; a slot pushed past the rounded latest
    start but not past the exact one still meets the deadline: no warning. One more second: late."""
    deadline = T0 + 2 * HOUR + 90  # rounded down by 4m50s (T0 is 200 s past a 5-min boundary)
    exact = deadline - SETTINGS.safety_margin - SETTINGS.restart_duration
    assert exact - latest_start(deadline, SETTINGS) == 290
    entry = FleetEntry("s1", "ranker", "a", wants_restart=True, kind="leak", deadline=deadline)
    for pushed_to, late in ((exact - 100, False), (exact, False), (exact + 1, True)):
        history = [
            RestartRecord("other", "ranker", "a", pushed_to - 600, pushed_to - 600 + 300)
        ]  # min_interval
        p = plan([entry], history, LIMITS, SETTINGS, T0)
        (planned,) = p.entries
        assert planned.slot_at == pytest.approx(pushed_to) and planned.slot_at > planned.latest_start
        assert planned.late == late and bool(p.problems) == late


def test_the_step_allowance_does_not_hide_a_deadline_that_cannot_be_met():
    """Two instances due at the same time, one restart at a time spaced 10 min: the second is late by
    minutes, far more than one step, and the plan still says so."""
    stepped = PlanSettings(safety_margin=3600, restart_duration=300, deadline_granularity=300, step=10)
    p = plan([leak("s1", 1.2), leak("s2", 1.2)], [], LIMITS, stepped, T0)
    assert not p.feasible and len(p.problems) == 1 and "cannot be restarted before" in p.problems[0]


# ----------------------------------------------------------------------------- properties

entry_lists = st.lists(
    st.tuples(st.integers(0, 30), st.integers(60, 48 * 3600)),
    min_size=1,
    max_size=15,
    unique_by=lambda x: x[0],
)


@settings(max_examples=150, deadline=None)
@given(
    raw=entry_lists,
    c=st.integers(1, 3),
    gap=st.integers(0, 1800),
    hourly=st.one_of(st.none(), st.integers(2, 8)),
)
def test_property_every_plan_keeps_the_budget(raw, c, gap, hourly):
    limits = BudgetLimits(c, gap, hourly, 0)
    entries = [
        FleetEntry(f"s{i}", "f", "a", wants_restart=True, kind="leak", deadline=T0 + d) for i, d in raw
    ]
    p = plan(entries, [], limits, SETTINGS, T0, explain=False)
    assert len(p.entries) == len(entries)
    state = BudgetState([], now=T0, assumed_duration=SETTINGS.restart_duration)
    for e in p.hopeless:  # not planned: even its earliest slot would end after the projected OOM
        assert e.late and e.slot_at + SETTINGS.restart_duration > e.deadline
    for e in sorted((e for e in p.entries if not e.hopeless), key=lambda e: e.slot_at):
        assert e.slot_at >= T0
        assert admit(state, "f", e.instance, e.slot_at, limits).ok
        state.add(RestartRecord(e.instance, "f", "a", e.slot_at, e.slot_at + SETTINGS.restart_duration))
        assert e.late == (e.slot_at > on_time_until(e.deadline, SETTINGS))


@settings(max_examples=150, deadline=None)
@given(raw=entry_lists, gap=st.integers(60, 3600))
def test_property_a_feasible_fleet_gets_a_feasible_plan(raw, gap):
    """One at a time, spacing `gap`: a schedule exists iff the k-th latest start leaves room for k-1 gaps."""
    limits = BudgetLimits(1, gap, None, 0)
    settings_ = PlanSettings(safety_margin=600, restart_duration=min(gap, 300), deadline_granularity=60)
    entries = [
        FleetEntry(f"s{i}", "f", "a", wants_restart=True, kind="leak", deadline=T0 + d) for i, d in raw
    ]
    latest = sorted(latest_start(e.deadline, settings_) for e in entries)
    exists = all(latest_k >= T0 + k * gap for k, latest_k in enumerate(latest))
    p = plan(entries, [], limits, settings_, T0, explain=False)
    if exists:
        assert p.feasible
    times = sorted(e.slot_at for e in p.entries if not e.hopeless)
    assert all(b - a >= gap - 1e-6 for a, b in pairwise(times))
