"""Numbers from outside the agent: what a count, size or time read from a reply, a payload or a file may be.

JSON and the text formats carry integers of any length, and Python reads them exactly; one of 400
digits then overflows every float it meets (`float()`, `math.isfinite`, a division, a format) and
SQLite's INTEGER. Whatever takes such a figure from outside checks it here first and treats a
failure as malformed input, said as such.
"""

from __future__ import annotations

from typing import TypeGuard

FIGURE_LIMIT = 2**63  # a signed 64-bit counter: a Java long, SQLite's INTEGER; far past any real figure
EARLIEST_TIME, LATEST_TIME = 0.0, 4_102_444_800.0  # 1970 to 2100: a unix time outside is a typo or junk


def decimal(text: str, limit: int = FIGURE_LIMIT) -> int | None:
    """`text` as a non-negative integer below `limit`, or None: ASCII digits only (`int()` also takes
    '²', '١٢' and '+5'), and never a parse of thousands of digits (`int()` refuses past 4300)."""
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(limit)):
        return None
    value = int(text)
    return value if value < limit else None


def is_number(value: object) -> TypeGuard[int | float]:
    """A real number (not a bool) that is finite and within ±2**63."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and -FIGURE_LIMIT < value < FIGURE_LIMIT
    )


def is_figure(value: object) -> TypeGuard[int | float]:
    """A count or size: a number that is also not negative."""
    return is_number(value) and value >= 0
