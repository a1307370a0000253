"""What routes read from a query string the same way: a time, as a unix timestamp or a duration ago.
A value out of shape or out of range is a 400 that says what to give, never a 500.
"""

from __future__ import annotations

import math

from fastapi import HTTPException

from agent.core.figures import EARLIEST_TIME as EARLIEST
from agent.core.figures import LATEST_TIME as LATEST
from agent.core.units import parse_duration


def parse_time(value: str | None, now: float, default_ago: float) -> float:
    """A unix timestamp, or a duration meaning that long ago (`1h`); default `default_ago` ago."""
    if value is None or value == "":
        return now - default_ago
    try:
        number = float(value)
    except ValueError:
        number = None
    if number is not None and number > 10**9:
        when = number
    else:
        try:
            when = now - parse_duration(value)
        except ValueError:
            raise HTTPException(
                400, f"expected a unix timestamp or a duration ago such as 15m or 6h, got {value[:100]!r}"
            ) from None
    if not (math.isfinite(when) and EARLIEST <= when <= LATEST):
        raise HTTPException(
            400,
            f"time {value[:100]!r} is out of range: give a unix time between 1970 and 2100 or a duration ago",
        )
    return when
