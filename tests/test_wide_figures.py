"""Figures from outside the agent that no float can carry: a reply, a peer's document or a header.

JSON carries integers of any width and Python reads them exactly; one of 400 digits overflows the
first float it meets. Every reader of such figures (the hook's stats and purge replies, the
coordinator's records, grants and pause, the workload profiles peers share, the Content-Length the
API checks) either takes the figure or refuses it with its own clear error, never another exception.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.api.guard import content_length
from agent.core.figures import FIGURE_LIMIT, is_figure, is_number
from agent.detect.memory.priors import WorkloadProfile
from native_hooks.errors import HookProtocolError
from native_hooks.purge import purge_result
from probes.allocator import samples_from_stats
from remediation.coordinator.base import PlannedGrant, checked_time, read_pause
from remediation.model import FleetEntry, RestartRecord
from remediation.text import at

# what JSON may hand over where a number is expected
WIDE = st.one_of(
    st.integers(-(10**400), 10**400),
    st.integers(FIGURE_LIMIT - 2, FIGURE_LIMIT + 2),
    st.integers(-(2**53), 2**53),
    st.floats(),
    st.booleans(),
    st.none(),
    st.text(max_size=5),
)
T0 = 1_800_000_000.0


def test_is_number_and_is_figure_draw_the_line_at_64_bits():
    assert is_number(FIGURE_LIMIT - 1) and not is_number(FIGURE_LIMIT) and not is_number(-FIGURE_LIMIT)
    assert is_number(-1.5) and not is_figure(-1.5) and is_figure(0) and is_figure(2.5)
    assert not any(is_number(v) for v in (True, math.inf, -math.inf, math.nan, 10**400, "1", None))


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["allocated", "active", "resident", "mapped", "retained"]), WIDE), WIDE
)
def test_allocator_stats_keep_the_figures_a_float_can_carry(figures, blocks):
    reply = {"ok": True, "figures": figures, "python": {"pymalloc_allocated_blocks": blocks}}
    for sample in samples_from_stats("svc", T0, reply):
        assert math.isfinite(sample.value) and sample.value >= 0, sample
        if sample.metric != "allocator_fragmentation_ratio":  # a ratio of two figures may pass 2**63
            assert sample.value <= FIGURE_LIMIT, sample


@settings(max_examples=300, deadline=None)
@given(
    st.fixed_dictionaries({}, optional={k: WIDE for k in ("rss_before", "rss_after", "duration_s", "pid")})
)
def test_a_purge_reply_is_figures_or_a_protocol_error(reply):
    try:
        result = purge_result({"ok": True, **reply})
    except HookProtocolError as exc:
        assert "purge reply" in str(exc)
    else:
        assert 0 <= result.returned_bytes <= result.rss_before < FIGURE_LIMIT
        json.dumps(result.to_dict(), allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(started=WIDE, finished=WIDE, deadline=WIDE, requested=WIDE)
def test_coordinator_records_from_other_agents_parse_or_raise_value_error(
    started, finished, deadline, requested
):
    """One bad document among the others is skipped (ValueError), never a crash of the whole read."""
    documents = [
        (RestartRecord, {"instance": "a", "fleet": "f", "holder": "h", "started_at": started, "finished_at": finished}),
        (FleetEntry, {"instance": "a", "fleet": "f", "agent": "x", "deadline": deadline, "requested_at": requested}),
    ]  # fmt: skip
    for cls, doc in documents:
        try:
            record = cls.from_dict(doc)
        except ValueError as exc:
            assert len(str(exc)) < 300, exc
        else:
            figures = [v for v in record.to_dict().values() if isinstance(v, float)]
            assert all(math.isfinite(v) for v in figures)


@settings(max_examples=300, deadline=None)
@given(slot=WIDE, not_before=WIDE, deadline=WIDE)
def test_a_leaders_grant_parses_or_raises_value_error_and_reads_as_text(slot, not_before, deadline):
    doc = {
        "instance": "a",
        "fleet": "f",
        "agent": "x",
        "slot_at": slot,
        "not_before": not_before,
        "revision": 7,
    }
    doc["deadline"] = deadline
    try:
        grant = PlannedGrant.from_dict(doc)
    except ValueError:
        return
    for value in (grant.slot_at, grant.not_before, grant.deadline):
        assert isinstance(at(value), str)  # how the engine writes it into a reason


@settings(max_examples=300, deadline=None)
@given(until=WIDE, since=WIDE)
def test_a_fleet_pause_document_reads_its_times_or_drops_them(until, since):
    try:
        text = json.dumps({"reason": "r", "until": until, "since": since})
    except ValueError:
        return
    pause = read_pause(text, T0)
    for key in ("until", "since"):
        if pause is not None and pause[key] is not None:
            assert 0 <= pause[key] <= 4_102_444_800  # 2100
    assert checked_time(10**400) is None and checked_time(math.nan) is None


@pytest.mark.parametrize("ts", [1e18, 1e300, 10**30, -(10**30), 2**63 - 1, math.inf, math.nan, None])
def test_times_past_year_9999_read_as_text(ts):
    text = at(ts)
    assert text == "never" or "unix time" in text


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["slot_seconds", "level", "warmup", "noise", "lifetimes", "days"]), value=WIDE)
def test_a_peers_workload_profile_parses_or_raises_value_error(field, value):
    doc = {"daily": [0.0] * 24, "slot_seconds": 3600, "level": 1e6, "warmup": 600, "noise": 0.01}
    doc |= {"lifetimes": 2, "days": 3, field: value}
    try:
        profile = WorkloadProfile.from_dict(doc)
    except ValueError as exc:
        assert field in str(exc) or "must" in str(exc)
    else:
        assert math.isfinite(profile.level) and math.isfinite(profile.slot_seconds)


@settings(max_examples=300, deadline=None)
@given(
    st.text(max_size=30)
    | st.from_regex(r"[0-9]{1,5000}", fullmatch=True)
    | st.sampled_from(["²", "١٢", " 12 ", "+5", "-1"])
)
def test_content_length_is_ascii_digits_or_none(header):
    size = content_length(header)
    if size is not None:
        assert header.strip().isascii() and header.strip().isdigit() and size == int(header.strip())
