"""Time windows in which restarts are allowed: days of the week and hours, in a named time zone.

    - {days: mon-fri, start: "02:00", end: "06:00", timezone: Europe/Paris}
    - {days: [sat, sun], start: "22:00", end: "04:00"}      # crosses midnight: ends the next day
    - {start: "00:00", end: "24:00"}                         # all day, every day

`days` name the day a window opens. No windows at all means "any time". The planner uses
`next_open` and `latest_at_or_before` to put slots inside windows; the engine's window stage uses
`contains`. Parsers raise ValueError saying what was wrong and what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as dtime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

_FULL_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_DAYS = tuple(day[:3] for day in _FULL_DAYS)
_ALL_DAYS = frozenset(range(7))
_CLOCK = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*$")
_LOOKAROUND_DAYS = 9  # a weekly pattern repeats within 8 days; one more for windows crossing midnight


def parse_clock(value: str) -> int:
    """Minutes after midnight from `HH:MM` (00:00 to 24:00)."""
    if not isinstance(value, str):
        raise ValueError(f"expected a time of day such as 02:00 or 17:30, got {value!r}")
    match = _CLOCK.match(value)
    if not match:
        raise ValueError(f"expected a time of day such as 02:00 or 17:30 (HH:MM, 24-hour), got {value!r}")
    hours, minutes = int(match.group(1)), int(match.group(2))
    if minutes > 59 or hours > 24 or (hours == 24 and minutes):
        raise ValueError(f"{value!r} is not a time of day: use 00:00 to 24:00")
    return hours * 60 + minutes


def parse_days(value: str | Sequence[str] | None) -> frozenset[int]:
    """Weekday numbers (Monday 0) from `mon-fri`, `sat,sun`, `[mon, wed]`, `daily` or None (every day)."""
    if value is None:
        return _ALL_DAYS
    parts: list[str] = []
    if isinstance(value, str):
        parts = [p for p in re.split(r"[,\s]+", value.strip().lower()) if p]
    elif isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
        parts = [p.strip().lower() for p in value]
    else:
        raise ValueError(f"expected days such as mon-fri, 'sat,sun' or [mon, wed], got {value!r}")
    if not parts:
        raise ValueError("no days given: name at least one day (mon..sun) or use daily")
    days: set[int] = set()
    for part in parts:
        if part in ("daily", "all", "*"):
            days |= _ALL_DAYS
        elif "-" in part:
            first, _, last = part.partition("-")
            a, b = _day(first, value), _day(last, value)
            days.update((a + i) % 7 for i in range((b - a) % 7 + 1))
        else:
            days.add(_day(part, value))
    return frozenset(days)


def _day(name: str, whole: object) -> int:
    name = name.strip()
    for number, full in enumerate(_FULL_DAYS):
        if name == full or name == full[:3]:
            return number
    raise ValueError(f"unknown day {name!r} in {whole!r}: use mon, tue, wed, thu, fri, sat, sun")


def parse_timezone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r}: use an IANA name such as UTC, Europe/Paris or America/New_York"
        ) from None


@dataclass(frozen=True, slots=True)
class TimeWindow:
    days: frozenset[int]
    start: int  # minutes after local midnight
    end: int  # minutes after local midnight of the opening day, or of the next day if end <= start
    zone: ZoneInfo

    @classmethod
    def parse(
        cls, start: str, end: str, days: str | Sequence[str] | None = None, timezone: str = "UTC"
    ) -> TimeWindow:
        first, last = parse_clock(start), parse_clock(end)
        if first == last:
            raise ValueError(
                f"window {start}-{end} is empty: give different start and end (00:00-24:00 is all day)"
            )
        if first == 24 * 60:
            raise ValueError("a window cannot start at 24:00; use 00:00")
        return cls(parse_days(days), first, last, parse_timezone(timezone))

    def intervals_on(self, day: date) -> tuple[float, float] | None:
        """The [open, close) unix interval of the window opening on local `day`, if it opens that day."""
        if day.weekday() not in self.days:
            return None
        opened = datetime.combine(day, dtime(0), tzinfo=self.zone) + timedelta(minutes=self.start)
        close_day = day if self.end > self.start else day + timedelta(days=1)
        closed = datetime.combine(close_day, dtime(0), tzinfo=self.zone) + timedelta(minutes=self.end)
        # adding a timedelta to an aware datetime moves the wall clock; zoneinfo then gives the
        # offset in force at that wall time, so DST days open and close at the configured hours
        return opened.timestamp(), closed.timestamp()


class Windows:
    """A set of allowed windows; empty means always allowed."""

    def __init__(self, windows: Iterable[TimeWindow] = ()) -> None:
        self.windows = tuple(windows)

    def __bool__(self) -> bool:
        return bool(self.windows)

    def intervals(self, lo: float, hi: float) -> list[tuple[float, float]]:
        """Merged [open, close) intervals that overlap [lo, hi], oldest first."""
        found = []
        for window in self.windows:
            first = datetime.fromtimestamp(lo, window.zone).date() - timedelta(days=1)
            last = datetime.fromtimestamp(hi, window.zone).date()
            day = first
            while day <= last:
                interval = window.intervals_on(day)
                if interval and interval[1] > lo and interval[0] <= hi:
                    found.append(interval)
                day += timedelta(days=1)
        found.sort()
        merged: list[tuple[float, float]] = []
        for opened, closed in found:
            if merged and opened <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], closed))
            else:
                merged.append((opened, closed))
        return merged

    def contains(self, t: float) -> bool:
        if not self.windows:
            return True
        return any(opened <= t < closed for opened, closed in self.intervals(t, t))

    def next_open(self, t: float) -> float:
        """`t` itself when inside a window, else the next opening; inf if none within 9 days."""
        if not self.windows:
            return t
        for opened, closed in self.intervals(t, t + _LOOKAROUND_DAYS * 86400):
            if closed > t:
                return max(opened, t)
        return math.inf

    def latest_at_or_before(self, t: float) -> float:
        """`t` itself when inside a window, else the last moment of the previous window; -inf if none."""
        if not self.windows:
            return t
        best = -math.inf
        for opened, closed in self.intervals(t - _LOOKAROUND_DAYS * 86400, t):
            if opened <= t:
                best = t if t < closed else closed - 1.0
        return best

    def describe(self) -> str:
        parts = []
        for w in self.windows:
            days = ",".join(_DAYS[d] for d in sorted(w.days)) if w.days != _ALL_DAYS else "daily"
            parts.append(
                f"{days} {w.start // 60:02d}:{w.start % 60:02d}-{w.end // 60:02d}:{w.end % 60:02d} {w.zone.key}"
            )
        return "; ".join(parts) or "any time"
