"""The probe interface: `collect(target) -> ProbeResult`, plus the schedule it runs on.

A probe reads figures about one live process and returns samples named after
`agent.core.catalog`. It never raises anything but `ProbeError` subclasses: `TargetGone` when the
process vanished, `ProbeAccessDenied` when the agent lacks permission, `ProbeUnavailable`
when the figure does not exist here. Figures it could not read while others worked go into
`ProbeResult.problems` (partial failure); "no data yet" is not an error.
"""

from __future__ import annotations

from typing import ClassVar, Literal, Protocol

from agent.core.records import ProbeResult, ProbeTarget

Schedule = Literal["fast", "slow"]


class Probe(Protocol):
    name: ClassVar[str]
    schedule: ClassVar[Schedule]  # fast: every agent interval; slow: every slow_interval

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult: ...

    def forget(self, target: ProbeTarget) -> None:
        """Drop any cache kept for a target that vanished or restarted."""
