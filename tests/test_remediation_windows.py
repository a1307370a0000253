"""Restart windows: tables of moments in and out (DST and midnight included), and parsers fuzzed."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from remediation.windows import TimeWindow, Windows, parse_clock, parse_days, parse_timezone

PARIS = ZoneInfo("Europe/Paris")


def ts(text: str, zone: ZoneInfo = PARIS) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()


WEEKDAY_NIGHTS = Windows([TimeWindow.parse("02:00", "06:00", "mon-fri", "Europe/Paris")])
WEEKEND_LATE = Windows([TimeWindow.parse("22:00", "04:00", "sat,sun", "Europe/Paris")])

CONTAINS = [
    (WEEKDAY_NIGHTS, "2024-03-04 02:00", True),  # Monday, opening minute
    (WEEKDAY_NIGHTS, "2024-03-04 05:59", True),
    (WEEKDAY_NIGHTS, "2024-03-04 06:00", False),  # closing is exclusive
    (WEEKDAY_NIGHTS, "2024-03-04 01:59", False),
    (WEEKDAY_NIGHTS, "2024-03-09 03:00", False),  # Saturday
    (WEEKEND_LATE, "2024-03-09 23:30", True),  # Saturday night
    (WEEKEND_LATE, "2024-03-10 03:00", True),  # still Saturday's window
    (WEEKEND_LATE, "2024-03-11 03:00", True),  # Sunday's window ends Monday 04:00
    (WEEKEND_LATE, "2024-03-11 23:00", False),  # Monday night
    (WEEKEND_LATE, "2024-03-08 23:00", False),  # Friday night
]


@pytest.mark.parametrize("windows, moment, inside", CONTAINS)
def test_contains_table(windows, moment, inside):
    assert windows.contains(ts(moment)) is inside


def test_no_windows_means_any_time():
    anytime = Windows()
    assert (
        anytime.contains(0) and anytime.next_open(123.0) == 123.0 and anytime.latest_at_or_before(9.0) == 9.0
    )
    assert anytime.describe() == "any time"


def test_next_open_and_latest_before():
    friday_noon = ts("2024-03-08 12:00")
    assert WEEKDAY_NIGHTS.next_open(friday_noon) == ts("2024-03-11 02:00")  # skips the weekend
    assert WEEKDAY_NIGHTS.latest_at_or_before(friday_noon) == ts("2024-03-08 06:00") - 1
    inside = ts("2024-03-08 03:00")
    assert WEEKDAY_NIGHTS.next_open(inside) == inside == WEEKDAY_NIGHTS.latest_at_or_before(inside)


def test_daylight_saving_days_keep_local_hours():
    # Paris springs forward on 2024-03-31 at 02:00 -> 03:00 and falls back on 2024-10-27 at 03:00 -> 02:00
    early = Windows([TimeWindow.parse("01:00", "05:00", None, "Europe/Paris")])
    spring = early.intervals(ts("2024-03-31 00:00"), ts("2024-03-31 12:00"))[-1]
    assert spring == (ts("2024-03-31 01:00"), ts("2024-03-31 05:00"))
    assert spring[1] - spring[0] == 3 * 3600  # one hour shorter
    autumn = early.intervals(ts("2024-10-27 00:00"), ts("2024-10-27 12:00"))[-1]
    assert autumn[1] - autumn[0] == 5 * 3600  # one hour longer


def test_zones_differ():
    utc = Windows([TimeWindow.parse("02:00", "03:00", timezone="UTC")])
    ny = Windows([TimeWindow.parse("02:00", "03:00", timezone="America/New_York")])
    moment = ts("2024-06-03 02:30", ZoneInfo("UTC"))
    assert utc.contains(moment) and not ny.contains(moment)


def test_weekly_window_is_found_across_the_week():
    mondays = Windows([TimeWindow.parse("02:00", "03:00", "mon", "UTC")])
    tuesday = ts("2024-03-05 12:00", ZoneInfo("UTC"))
    assert mondays.next_open(tuesday) == ts("2024-03-11 02:00", ZoneInfo("UTC"))
    assert mondays.latest_at_or_before(tuesday) == ts("2024-03-04 03:00", ZoneInfo("UTC")) - 1


def test_an_empty_day_list_is_refused():
    with pytest.raises(ValueError, match="no days"):
        TimeWindow.parse("02:00", "03:00", [], "UTC")


def test_describe():
    assert WEEKDAY_NIGHTS.describe() == "mon,tue,wed,thu,fri 02:00-06:00 Europe/Paris"


@pytest.mark.parametrize(
    "text, minutes", [("00:00", 0), ("02:30", 150), ("9:05", 545), ("24:00", 1440), (" 23:59 ", 1439)]
)
def test_parse_clock(text, minutes):
    assert parse_clock(text) == minutes


@pytest.mark.parametrize("text", ["24:01", "25:00", "12:60", "noon", "12", "", "1:2", 3])
def test_parse_clock_refuses(text):
    with pytest.raises(ValueError, match="time of day"):
        parse_clock(text)


@pytest.mark.parametrize(
    "value, days",
    [
        ("mon-fri", {0, 1, 2, 3, 4}),
        ("fri-mon", {4, 5, 6, 0}),
        ("sat,sun", {5, 6}),
        (["monday", "wed"], {0, 2}),
        ("daily", set(range(7))),
        (None, set(range(7))),
        ("tue wed", {1, 2}),
    ],
)
def test_parse_days(value, days):
    assert parse_days(value) == days


@pytest.mark.parametrize("value", ["funday", "mon-xyz", "", [], [1, 2], 5, "mo"])
def test_parse_days_refuses_with_the_accepted_forms(value):
    with pytest.raises(ValueError, match=r"mon|day"):
        parse_days(value)


def test_parse_timezone():
    assert parse_timezone("Europe/Paris").key == "Europe/Paris"
    with pytest.raises(ValueError, match="IANA name"):
        parse_timezone("Mars/Olympus")
    with pytest.raises(ValueError, match="IANA name"):
        parse_timezone("../etc/passwd")


def test_empty_window_is_refused():
    with pytest.raises(ValueError, match="empty"):
        TimeWindow.parse("02:00", "02:00")
    with pytest.raises(ValueError, match="24:00"):
        TimeWindow.parse("24:00", "02:00")


@given(st.text(max_size=12))
def test_fuzz_clock_parser_raises_only_valueerror(text):
    try:
        minutes = parse_clock(text)
    except ValueError as exc:
        assert "time of day" in str(exc)
    else:
        assert 0 <= minutes <= 1440


@given(st.one_of(st.text(max_size=20), st.lists(st.text(max_size=8), max_size=4), st.integers(), st.none()))
def test_fuzz_days_parser_raises_only_valueerror(value):
    try:
        days = parse_days(value)
    except ValueError:
        return
    assert days and days <= set(range(7))


@given(start=st.integers(0, 1439), length=st.integers(1, 1440), t=st.floats(1.6e9, 1.8e9))
def test_property_next_open_is_inside_and_not_before(start, length, t):
    end = (start + length) % 1440 or 1440
    if end == start:
        return
    windows = Windows(
        [TimeWindow.parse(f"{start // 60:02d}:{start % 60:02d}", f"{end // 60:02d}:{end % 60:02d}")]
    )
    opened = windows.next_open(t)
    assert opened >= t and windows.contains(opened)
    latest = windows.latest_at_or_before(t)
    assert latest <= t and windows.contains(latest)
