"""The production detector and remediation on a compressed time axis, for the tests that run a real agent.

`DETECT`: a 24 s main window (1 s buckets), judged every 4 s. Before a daily profile is known the
detector speaks only when the limit is near (under horizon / 8) and within 5 times the history it
has seen, so a leak in these tests runs against a limit about 100 s away.
`remediation(mode, **sections)`: one restart at a time, a second apart, a 5 s cooldown and a 15 s
safety margin; `sections` adds or replaces whole sections (`verify`, `ladder`, `coordinator`, ...).
"""

from __future__ import annotations

from typing import Any

DETECT = {
    "interval": "0.5s",
    "memory": {"window": "24s", "long_window": "48s", "warmup": "2s", "season": "6s", "horizon": "30m"},
}
FAST = {"interval": "0.2s", "slow_interval": "1s", "flush_interval": "0.3s"}  # the agent's probes and flushes


def remediation(mode: str = "enforce", **sections: Any) -> dict[str, Any]:
    return {
        "mode": mode,
        "interval": "0.5s",
        "budget": {"max_concurrent": 1, "min_interval": "1s", "max_per_hour": None, "cooldown": "5s"},
        "plan": {"safety_margin": "15s", "restart_duration": "3s", "deadline_granularity": "1s"},
        "blockers": {"min_uptime": "1s"},
        **sections,
    }
