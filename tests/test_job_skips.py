"""A job whose run outlasts its interval (a coordinator call waiting out its timeout) makes the
scheduler skip its next runs: counted and said once per streak, not apscheduler's WARNING per tick."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from agent.jobs.streak import SkippedRuns, quiet_skipped_runs


@pytest.mark.slow
def test_a_hanging_job_is_counted_and_said_once_per_streak(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    counted: list[str] = []
    release = threading.Event()
    runs = 0

    def hanging_call() -> None:  # the first run waits as a call to a slow etcd does; later ones return
        nonlocal runs
        runs += 1
        if runs == 1:
            release.wait(5)

    async def scenario() -> None:
        scheduler = AsyncIOScheduler(
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        )

        async def job() -> None:
            await asyncio.to_thread(hanging_call)

        scheduler.add_job(job, "interval", seconds=0.1, id="peers", name="peers")
        quiet_skipped_runs(scheduler, SkippedRuns(counted.append, logging.getLogger("medic.runtime")))
        scheduler.start()
        await asyncio.sleep(1.2)  # about ten ticks while the first run hangs
        release.set()
        await asyncio.sleep(0.5)  # it ends, and the next ticks run
        scheduler.shutdown(wait=False)

    asyncio.run(scenario())
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert not [r for r in records if "maximum number of running instances" in r[2]], records
    assert len(counted) >= 5 and set(counted) == {"peers"}
    started = [r for r in records if r[1] >= logging.INFO and "still running at its next tick" in r[2]]
    ended = [r for r in records if r[1] >= logging.INFO and "ran again after" in r[2]]
    assert len(started) == 1 and len(ended) == 1, records
    assert f"after {len(counted)} skipped run(s)" in ended[0][2]
    assert runs >= 2  # the job ran again once the slow call ended


def test_a_new_streak_is_said_again() -> None:
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("test.skips")
    logger.addHandler(Lines())
    logger.setLevel(logging.INFO)
    runs = SkippedRuns(lambda job: None, logger)
    for event in ("skipped", "skipped", "ran", "ran", "skipped"):  # a second `ran` ends nothing
        getattr(runs, event)("detect")
    assert [line.split(" ", 3)[-1] for line in lines] == [
        "still running at its next tick: its runs are skipped until it ends (counted in medic_job_skipped_runs_total)",
        "again after 2 skipped run(s)",
        "still running at its next tick: its runs are skipped until it ends (counted in medic_job_skipped_runs_total)",
    ]
