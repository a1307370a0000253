"""Whether a job's dependency works, so that its failures are said once per failing streak.

The history and peers jobs read an outside source (Prometheus, the coordinator) on a schedule; a
source that stays down must not fill the event log with one `*_unavailable` per try, and the first
read that works after it (or at all) is worth one `*_loaded`. Likewise a job whose run outlasts its
interval makes the scheduler skip its next runs: said once per streak too (`SkippedRuns`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

# apscheduler 3 ships neither inline types nor a py.typed marker, and no stubs exist for it
from apscheduler.events import (  # type: ignore[import-untyped]
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MAX_INSTANCES,
)


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


class SkippedRuns:
    """Scheduled runs skipped because the job's previous run was still going (a call to a slow
    coordinator, waiting out its timeout): each counted through `count`, said once per streak at
    INFO and then at DEBUG, and the streak's end said with how many were skipped."""

    def __init__(self, count: Callable[[str], None], logger: logging.Logger) -> None:
        self._count = count
        self._log = logger
        self._streaks: dict[str, int] = {}  # job -> runs skipped since it last ran

    def skipped(self, job: str) -> None:
        self._count(job)
        skipped = self._streaks.get(job, 0) + 1
        self._streaks[job] = skipped
        if skipped == 1:
            self._log.info(
                "job %s is still running at its next tick: its runs are skipped until it ends "
                "(counted in medic_job_skipped_runs_total)",
                job,
            )
        else:
            self._log.debug(
                "job %s: run skipped (%d in a row); the previous one is still going", job, skipped
            )

    def ran(self, job: str) -> None:
        skipped = self._streaks.pop(job, 0)
        if skipped:
            self._log.info("job %s ran again after %d skipped run(s)", job, skipped)


_SKIP_WARNING = 'Execution of job "%s" skipped'  # apscheduler's WARNING on every tick a run is still going


def _not_a_skip_warning(record: logging.LogRecord) -> bool:
    return not (isinstance(record.msg, str) and record.msg.startswith(_SKIP_WARNING))


def quiet_skipped_runs(scheduler: Any, runs: SkippedRuns) -> None:
    """A run skipped because the previous one still waits (on a slow etcd, up to its timeout) goes
    to `runs` (a counter, one line per streak) instead of apscheduler's WARNING on every tick."""
    scheduler_log = logging.getLogger("apscheduler.scheduler")
    if _not_a_skip_warning not in scheduler_log.filters:
        scheduler_log.addFilter(_not_a_skip_warning)
    scheduler.add_listener(lambda event: runs.skipped(event.job_id), EVENT_JOB_MAX_INSTANCES)
    scheduler.add_listener(lambda event: runs.ran(event.job_id), EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
