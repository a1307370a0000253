"""How the engine writes times and durations into reasons, so every message reads the same way."""

from __future__ import annotations

import math
from datetime import datetime

from agent.core.units import format_duration


def at(ts: float | None) -> str:
    """`2026-05-09 06:05:00 CEST`: a wall-clock time in the agent's local zone; `never` for None/inf."""
    try:
        if ts is None or not math.isfinite(ts):
            return "never"
        return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    except (OverflowError, OSError, ValueError):  # past year 9999 (a peer's odd figure): said as it is
        return f"unix time {str(ts)[:30]}"


def span(seconds: float | None) -> str:
    """`1h30m`, `45s`: a duration for messages."""
    return format_duration(seconds)
