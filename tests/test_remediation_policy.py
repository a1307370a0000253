"""The ladder as tables on a fake clock: purge first, restart by deadline, confirm slowness, escalate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remediation.model import RemediationRequest
from remediation.policy import CaseHistory, LadderSettings, crash_loop_count, decide, primary_request

T0 = 1_700_000_000.0
LADDER = LadderSettings(
    purge_settle=120, slow_confirm=300, clear_check=600, crash_loop_restarts=3, crash_loop_window=3600,
    crash_loop_reset_after=1800,
)  # fmt: skip


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
