"""Every process of every instance, kept in the store (`process_runs`): when it started, when it ended,
how. Managed commands are recorded by the supervisor at each launch and exit (also a child that dies
before a reconcile sees it); the others by the tracker when it attaches to and leaves a process.
Crash loops are judged from these real uptimes, never from samples.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.state.store import Store
from agent.watch.supervisor import Run

_SCHEMA = """
CREATE TABLE IF NOT EXISTS process_runs (
    instance TEXT NOT NULL, pid INTEGER NOT NULL, started_at REAL NOT NULL, ended_at REAL,
    exit_status INTEGER, managed INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (instance, pid, started_at));
CREATE INDEX IF NOT EXISTS process_runs_started ON process_runs (instance, started_at);
"""
KEPT = 10_000  # runs per instance: a week of crash loop at one start a minute
SAME_START = 0.05  # seconds: the same process seen twice


class ProcessRuns:
    def __init__(self, store: Store) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)

    def record(self, instance: str, runs: Iterable[Run], *, managed: bool) -> None:
        """Starts (and, for the supervisor's runs, ends) of `instance`'s processes; a known one is updated."""
        rows = [(instance, r.pid, r.started_at, r.ended_at, r.exit_status, int(managed)) for r in runs]
        if not rows:
            return
        with self.store.transaction() as db:
            db.executemany(
                "INSERT INTO process_runs VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (instance, pid, started_at) "
                "DO UPDATE SET ended_at = coalesce(excluded.ended_at, ended_at), "
                "exit_status = coalesce(excluded.exit_status, exit_status)",
                rows,
            )
            db.execute(
                "DELETE FROM process_runs WHERE instance = ? AND started_at < (SELECT started_at FROM "
                "process_runs WHERE instance = ? ORDER BY started_at DESC LIMIT 1 OFFSET ?)",
                (instance, instance, KEPT),
            )

    def end(self, instance: str, now: float, keep: tuple[int, float] | None = None) -> None:
        """The instance's processes still open ended by `now` (except `keep`: (pid, start time))."""
        sql = "UPDATE process_runs SET ended_at = ? WHERE instance = ? AND ended_at IS NULL"
        args: tuple[object, ...] = (now, instance)
        if keep is not None:
            sql += " AND NOT (pid = ? AND abs(started_at - ?) < ?)"
            args = (*args, keep[0], keep[1], SAME_START)
        with self.store.transaction() as db:
            db.execute(sql, args)

    def since(self, instance: str, since: float) -> list[Run]:
        rows = self.store.query(
            "SELECT pid, started_at, ended_at, exit_status FROM process_runs "
            "WHERE instance = ? AND started_at >= ? ORDER BY started_at",
            (instance, since),
        )
        return [Run(int(pid), float(started), ended, status) for pid, started, ended, status in rows]
