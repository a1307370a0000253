"""Whether a job's dependency works, so that its failures are said once per failing streak.

The history and peers jobs read an outside source (Prometheus, the coordinator) on a schedule; a
source that stays down must not fill the event log with one `*_unavailable` per try, and the first
read that works after it (or at all) is worth one `*_loaded`.
"""

from __future__ import annotations


class FailureStreak:
    """Unknown until the first try, then working or failing; each transition answers True once."""

    def __init__(self) -> None:
        self._failing: bool | None = None  # None: never tried

    @property
    def working(self) -> bool:
        """The last try worked (False before any try)."""
        return self._failing is False

    def failed(self) -> bool:
        """Record a failed try; True when it starts a failing streak: the one to say."""
        starts = self._failing is not True
        self._failing = True
        return starts

    def succeeded(self) -> bool:
        """Record a try that worked; True when it is the first, or ends a failing streak."""
        ends = self._failing is not False
        self._failing = False
        return ends
