"""The ladder as tables on a fake clock: purge first, restart by deadline, confirm slowness, escalate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remediation.model import RemediationRequest
from remediation.planner import PlanSettings, latest_start
from remediation.policy import (
    CaseHistory,
    LadderSettings,
    crash_loop_count,
    decide,
    primary_request,
    related_kinds,
)

T0 = 1_700_000_000.0
LADDER = LadderSettings(
    purge_settle=120, slow_confirm=300, clear_check=600, crash_loop_restarts=3, crash_loop_window=3600,
    crash_loop_reset_after=1800,
)  # fmt: skip


PLAN = PlanSettings(safety_margin=3600, restart_duration=300, deadline_granularity=300)
HOUR = 3600.0


def request(kind="leak", deadline=None, **kw):
    return RemediationRequest("serving-7", kind, "F1", "leaks 41 MB/h", deadline=deadline, **kw)


def case(kind="leak", first_seen=T0, **kw):
    return CaseHistory("serving-7", "F1", kind, first_seen, first_seen, **kw)


LADDER_TABLE = [
    # (request, case, starts, now offset, can_purge, action, code)
    (request("leak", T0 + 9000), case(), [], 10, True, "restart", "leak"),
    (request("oom-risk", T0 + 600), case("oom-risk"), [], 10, True, "restart", "oom-risk"),
    (request("leak"), case(), [], 10, True, "restart", "leak"),  # no deadline: as soon as allowed
    (request("fragmentation"), case("fragmentation"), [], 10, True, "purge", "purge-first"),
    (request("fragmentation"), case("fragmentation"), [], 10, False, "restart", "no-purge"),
    (
        request("fragmentation"),
        case("fragmentation", purged_at=T0 + 5),
        [],
        60,
        True,
        "wait",
        "purge-settling",
    ),
    (
        request("fragmentation"),
        case("fragmentation", purged_at=T0 + 5),
        [],
        200,
        True,
        "restart",
        "purge-did-not-help",
    ),
    (request("slow"), case("slow"), [], 100, True, "wait", "confirming"),
    (request("slow"), case("slow"), [], 301, True, "restart", "slow"),
    (request("manual"), case("manual"), [], 0, True, "restart", "manual"),
    (request("external"), case("external"), [], 0, True, "restart", "external"),
    # after our restart: wait for the finding to clear, then escalate if it did not
    (
        request(),
        case(restarted_at=T0, restart_outcome="succeeded"),
        [],
        300,
        True,
        "wait",
        "checking-restart",
    ),
    (
        request(),
        case(restarted_at=T0, restart_outcome="succeeded"),
        [],
        700,
        True,
        "escalate",
        "restart-did-not-help",
    ),
    (request(), case(restarted_at=T0, restart_outcome="failed"), [], 30, True, "escalate", "restart-failed"),
    # crash loop: 3 restarts within the hour, never up 30 min
    (request(), case(), [T0 - 3000, T0 - 2000, T0 - 1000, T0 - 100], 0, True, "escalate", "crash-loop"),
    (request(), case(), [T0 - 3000, T0 - 2000, T0 - 100], 0, True, "restart", "leak"),
    # already escalated: nothing more until a person clears it
    (request(), case(escalated_at=T0), [], 10, True, "none", "escalated"),
    # forced manual request overrides escalation and crash loop
    (
        request("manual", force=True, requested_by="alice"),
        case(escalated_at=T0),
        [T0 - 300, T0 - 200, T0 - 100, T0 - 50],
        10,
        True,
        "restart",
        "forced",
    ),
]


@pytest.mark.parametrize("req, history, starts, offset, can_purge, action, code", LADDER_TABLE)
def test_ladder_table(req, history, starts, offset, can_purge, action, code):
    intent = decide(req, history, starts, LADDER, T0 + offset, can_purge=can_purge)
    assert (intent.action, intent.code) == (action, code), intent.reason
    assert intent.reason
    if action == "restart" and req.kind in ("leak", "oom-risk"):
        assert intent.deadline == req.deadline


def restarted(kind="leak", deadline=None, finding="F0", outcome="succeeded", at=T0, **kw):
    """The case of finding F1, first seen on the process that the restart for `finding` started."""
    return case(
        kind, at + 30, restarted_at=at, restart_outcome=outcome, restart_deadline=deadline,
        restart_finding=finding, **kw,
    )  # fmt: skip


# The old process (finding F0) was restarted at T0 for an OOM projected at T0 + 1h10m (its latest safe
# start, with the 1 h margin and 5 min restart). F1 is the same kind of finding on the new process.
BEFORE = T0 + HOUR + 600
AFTER_RESTART_TABLE = [
    # (request, case, now offset, action, code)
    # a leak that comes back is planned again by its new deadline, at once: never held
    (request("leak", T0 + 30 * HOUR), restarted(deadline=BEFORE), 40, "restart", "leak-returned"),
    (request("oom-risk", T0 + 3 * HOUR), restarted("oom-risk", BEFORE), 40, "restart", "leak-returned"),
    (request("oom-risk", T0 + 3 * HOUR), restarted(deadline=BEFORE), 40, "restart", "leak-returned"),
    # its new latest safe start (deadline - 1h05m) just after the old projected OOM: it bought time
    (request("leak", BEFORE + 3900 + 300), restarted(deadline=BEFORE), 40, "restart", "leak-returned"),
    # the restart had no deadline to compare with: planned by the new one
    (request("leak", T0 + 5 * HOUR), restarted(), 40, "restart", "leak-returned"),
    # memory back at the old level at once: the OOM is as close as before; the next restart would be
    # due before the old process would have run out: the restart bought no time
    (request("leak", BEFORE + 60), restarted(deadline=BEFORE), 40, "escalate", "restart-did-not-help"),
    (request("leak", BEFORE + 3900), restarted(deadline=BEFORE), 40, "escalate", "restart-did-not-help"),
    (request("oom-risk", BEFORE - 600), restarted(deadline=BEFORE), 40, "escalate", "restart-did-not-help"),
    # the restart itself failed: escalated whatever the kind
    (request("leak", T0 + 30 * HOUR), restarted(outcome="failed"), 40, "escalate", "restart-failed"),
    # a returning leak without a deadline cannot be planned: checked like any other finding
    (request("leak"), restarted(deadline=BEFORE), 300, "wait", "checking-restart"),
    (request("leak"), restarted(deadline=BEFORE), 700, "escalate", "restart-did-not-help"),
    # the same leak finding still reported after its own restart (same process): did not help
    (request("leak", T0 + 30 * HOUR), restarted(finding="F1"), 300, "wait", "checking-restart"),
    (request("leak", T0 + 30 * HOUR), restarted(finding="F1"), 700, "escalate", "restart-did-not-help"),
    # slowness, fragmentation, alerts that persist after the restart: checked for `clear_check`, then
    # escalated (a restart that does not clear them did not help)
    (request("slow"), restarted("slow"), 300, "wait", "checking-restart"),
    (request("slow"), restarted("slow"), 700, "escalate", "restart-did-not-help"),
    (request("fragmentation"), restarted("fragmentation"), 300, "wait", "checking-restart"),
    (request("fragmentation"), restarted("fragmentation"), 700, "escalate", "restart-did-not-help"),
    (request("external"), restarted("external"), 700, "escalate", "restart-did-not-help"),
]


@pytest.mark.parametrize("req, history, offset, action, code", AFTER_RESTART_TABLE)
def test_ladder_after_a_restart_table(req, history, offset, action, code):
    intent = decide(req, history, [T0 - 5 * HOUR, T0], LADDER, T0 + offset, can_purge=True, plan=PLAN)
    assert (intent.action, intent.code) == (action, code), intent.reason
    if action == "restart":
        assert intent.deadline == req.deadline


def test_a_returning_leak_says_why():
    planned = decide(
        request("leak", T0 + 3 * HOUR), restarted(deadline=BEFORE), [], LADDER, T0 + 40,
        can_purge=True, plan=PLAN,
    )  # fmt: skip
    assert "a restart buys time" in planned.reason and "1h50m later than before" in planned.reason
    escalated = decide(
        request("leak", BEFORE + 60),
        restarted(deadline=BEFORE),
        [],
        LADDER,
        T0 + 40,
        can_purge=True,
        plan=PLAN,
    )
    assert "bought no time" in escalated.reason and "F1" in escalated.reason
    assert "a person must look" in escalated.reason


@given(
    kind=st.sampled_from(["leak", "oom-risk"]),
    deadline=st.floats(-2 * HOUR, 60 * HOUR),
    before=st.one_of(st.none(), st.floats(0, 48 * HOUR)),
    since_restart=st.floats(0, 2 * HOUR),
)
def test_property_a_returning_leak_with_a_deadline_is_never_held(kind, deadline, before, since_restart):
    """Planned by its deadline or escalated, at once: never waiting past its latest safe start."""
    req = request(kind, T0 + deadline)
    history = restarted(kind, None if before is None else T0 + before)
    intent = decide(req, history, [T0 - 5 * HOUR, T0], LADDER, T0 + since_restart, can_purge=True, plan=PLAN)
    bought_time = before is None or latest_start(T0 + deadline, PLAN) > T0 + before
    expected = ("restart", "leak-returned") if bought_time else ("escalate", "restart-did-not-help")
    assert (intent.action, intent.code) == expected, intent.reason
    if bought_time:
        assert intent.deadline == req.deadline


def test_leak_and_oom_risk_share_their_restart_history():
    assert set(related_kinds("leak")) == set(related_kinds("oom-risk")) == {"leak", "oom-risk"}
    assert related_kinds("slow") == ("slow",) and related_kinds("fragmentation") == ("fragmentation",)


def test_reasons_say_what_happens_next():
    intent = decide(request("fragmentation"), case("fragmentation"), [], LADDER, T0, can_purge=False)
    assert "no allocator purge" in intent.reason
    intent = decide(
        request(), case(restarted_at=T0, restart_outcome="succeeded"), [], LADDER, T0 + 700, can_purge=True
    )
    assert "did not clear" in intent.reason and "F1" in intent.reason
    intent = decide(
        request(), case(), [T0 - 3000, T0 - 2000, T0 - 1000, T0 - 100], LADDER, T0, can_purge=True
    )
    assert "crash loop" in intent.reason and "a person must look" in intent.reason
    forced = decide(
        request("manual", force=True, requested_by="alice"), case(), [], LADDER, T0, can_purge=True
    )
    assert "alice" in forced.reason


CRASH_LOOP = [
    # (starts as offsets, now offset, expected count)
    ([], 0, 0),
    ([0], 10, 0),
    ([0, 100], 200, 1),
    ([0, 100, 200, 300], 400, 3),
    ([0, 100, 200, 300], 300 + 1800, 0),  # up 30 min: the count resets
    ([0, 5000, 5100, 5200], 5300, 3),  # the long-lived first process ends the run, its successor counts
    ([0, 2000, 2100], 2200, 2),  # 0 lived 2000 s > 1800: run starts at 2000
    ([0, 100, 200, 4000, 4100], 4200, 2),  # older restarts are outside the window
    ([0, 100, 200, 300, 400], 350, 3),  # a start in the future is ignored
]


@pytest.mark.parametrize("starts, now, count", CRASH_LOOP)
def test_crash_loop_count_table(starts, now, count):
    assert crash_loop_count([T0 + s for s in starts], T0 + now, 3600, 1800) == count


@given(st.lists(st.floats(0, 20000), max_size=30), st.floats(0, 25000))
def test_crash_loop_count_is_bounded(starts, now):
    absolute = [T0 + s for s in starts]
    count = crash_loop_count(absolute, T0 + now, 3600, 1800)
    assert 0 <= count <= max(0, len([s for s in absolute if s <= T0 + now]) - 1)


def test_primary_request_prefers_forced_then_earliest_deadline_then_kind():
    slow = RemediationRequest("s", "slow", "a", "x")
    leak_late = RemediationRequest("s", "leak", "b", "x", deadline=T0 + 9000)
    oom_soon = RemediationRequest("s", "oom-risk", "c", "x", deadline=T0 + 600)
    manual = RemediationRequest("s", "manual", "d", "x", force=True)
    assert primary_request([slow, leak_late, oom_soon]).finding_id == "c"
    assert primary_request([slow, leak_late]).finding_id == "b"
    assert primary_request([slow, RemediationRequest("s", "fragmentation", "e", "x")]).finding_id == "a"
    assert primary_request([slow, oom_soon, manual]).finding_id == "d"


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        ({"instance": ""}, "names no instance"),
        ({"kind": "reboot"}, "unknown request kind"),
        ({"finding_id": ""}, "no finding id"),
        ({"deadline": float("nan")}, "deadline must be a finite"),
        ({"deadline": "tomorrow"}, "deadline must be a finite"),
        ({"start_time": True}, "start_time must be"),
        ({"force": True}, "only manual requests may be forced"),
    ],
)
def test_bad_requests_are_described_not_raised(kwargs, problem):
    base = {"instance": "s", "kind": "leak", "finding_id": "f", "reason": "r"}
    assert problem in RemediationRequest(**{**base, **kwargs}).problem()


@given(
    instance=st.one_of(st.text(max_size=5), st.integers(), st.none()),
    kind=st.one_of(st.sampled_from(["leak", "slow", "x"]), st.integers()),
    deadline=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3)),
)
def test_fuzz_request_validation_never_raises(instance, kind, deadline):
    result = RemediationRequest(instance, kind, "f", "r", deadline=deadline).problem()  # type: ignore[arg-type]
    assert result is None or isinstance(result, str)


@pytest.mark.parametrize("kind", ["leak", "oom-risk"])
@pytest.mark.parametrize("severity", ["warning", "error", "critical"])
def test_no_restart_is_planned_for_a_finding_below_critical(severity, kind):
    """Only a critical leak or OOM risk stands on evidence that the growth does not level off below
    the limit; the others are watched, and the plan says so."""
    found = {"severity": severity, "evidence": {"not_critical": "a levelling curve fits as well"}}
    intent = decide(request(kind, T0 + 9000, finding=found), case(kind), [], LADDER, T0, can_purge=True)
    assert (intent.action == "restart") == (severity == "critical"), intent
    if severity != "critical":
        assert intent.code == "watched" and "a levelling curve fits as well" in intent.reason


def test_peaks_past_the_limit_and_a_persons_request_are_not_judged_by_severity():
    """Peaks already at or past the limit are no projection that may level off: restarted whatever
    the severity (a limit set only in medic's config is error-level); a person's request carries no
    finding and leads a watched one."""
    past = {"severity": "error", "evidence": {"above_limit": True}}
    intent = decide(request("oom-risk", finding=past), case("oom-risk"), [], LADDER, T0, can_purge=True)
    assert (intent.action, intent.code) == ("restart", "oom-risk")
    watched = request("leak", finding={"severity": "error"})
    critical = request("oom-risk", T0 + 600, finding={"severity": "critical"})
    assert primary_request([watched, critical]) is critical  # a watched one never holds a critical one
    person = request("manual")
    assert primary_request([watched, person]) is person
    assert decide(person, case("manual"), [], LADDER, T0, can_purge=True).action == "restart"
