"""Histogram snapshots kept compactly in the agent's SQLite store (tables `histo_*`).

The collector adds the snapshots probes return; the API, the suspects ranking and the attribution read
them back. Each is stored compacted (`agent.core.histograms.compact`): its top N rows plus exact
totals, row names interned in `histo_names`. Snapshots older than the retention are deleted as new
ones of the same instance arrive. SQLite errors become `StoreError`.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from agent.core.errors import StoreError
from agent.core.histograms import DEFAULT_TOP, HistogramRow, Snapshot, compact
from agent.state.store import Store

DEFAULT_RETENTION = 7 * 86400.0
SCHEMA = """
CREATE TABLE IF NOT EXISTS histo_snapshots (
    id INTEGER PRIMARY KEY AUTOINCREMENT, instance TEXT NOT NULL, source TEXT NOT NULL, kind TEXT NOT NULL,
    ts REAL NOT NULL, pid INTEGER, start_time REAL, total_count REAL NOT NULL, total_bytes REAL NOT NULL,
    rows_total INTEGER NOT NULL, meta TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS histo_snapshots_by_instance ON histo_snapshots (instance, kind, ts);
CREATE TABLE IF NOT EXISTS histo_names (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
CREATE TABLE IF NOT EXISTS histo_rows (
    snapshot_id INTEGER NOT NULL, name_id INTEGER NOT NULL, count REAL NOT NULL, bytes REAL NOT NULL,
    detail TEXT, PRIMARY KEY (snapshot_id, name_id)) WITHOUT ROWID;
"""


class HistogramStore:
    """Snapshots in the agent's SQLite store (tables `histo_*`)."""

    def __init__(self, store: Store, top: int = DEFAULT_TOP, retention: float = DEFAULT_RETENTION) -> None:
        self.store = store
        self.top = top
        self.retention = retention
        store.ensure_schema(SCHEMA)

    def add(self, snapshot: Snapshot) -> int:
        """Store a snapshot (trimmed to its top rows), drop this instance's expired ones; returns its id."""
        kept = compact(snapshot, self.top)
        try:
            with self.store.transaction() as db:
                cur = db.execute(
                    """INSERT INTO histo_snapshots (instance, source, kind, ts, pid, start_time, total_count,
                       total_bytes, rows_total, meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    (
                        kept.instance,
                        kept.source,
                        kept.kind,
                        kept.ts,
                        kept.pid,
                        kept.start_time,
                        kept.total_count,
                        kept.total_bytes,
                        kept.rows_total,
                        json.dumps(kept.meta, default=str),
                    ),
                )
                snapshot_id = int(cur.lastrowid or 0)
                names = _intern(db, [r.name for r in kept.rows])
                db.executemany(
                    "INSERT OR REPLACE INTO histo_rows VALUES (?, ?, ?, ?, ?)",
                    [(snapshot_id, names[r.name], r.count, r.bytes, r.detail) for r in kept.rows],
                )
                _expire(db, kept.instance, kept.ts - self.retention)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot store a {kept.source} histogram of {kept.instance}: {exc}") from None
        snapshot.id = snapshot_id
        return snapshot_id

    def snapshots(
        self,
        instance: str,
        since: float,
        until: float,
        kind: str | None = None,
        source: str | None = None,
        limit: int = 1000,
    ) -> list[Snapshot]:
        """Snapshots (without rows) in [since, until], oldest first."""
        where, args = _filters(instance, since, until, kind, source)
        rows = self.store.query(
            f"SELECT {_COLUMNS} FROM histo_snapshots WHERE {where} ORDER BY ts DESC, id DESC LIMIT ?",
            [*args, max(1, limit)],
        )
        return [_snapshot(row) for row in reversed(rows)]

    def load(self, snapshot_id: int) -> Snapshot | None:
        rows = self.store.query(f"SELECT {_COLUMNS} FROM histo_snapshots WHERE id = ?", (snapshot_id,))
        if not rows:
            return None
        snapshot = _snapshot(rows[0])
        snapshot.rows = self._rows([snapshot_id])[snapshot_id]
        return snapshot

    def nearest(self, instance: str, kind: str, ts: float, source: str | None = None) -> Snapshot | None:
        """The last snapshot at or before `ts`, else the first one after it."""
        for op, order in (("<=", "DESC"), (">", "ASC")):
            args: list[Any] = [instance, kind, ts]
            extra = ""
            if source:
                extra, args = " AND source = ?", [*args, source]
            rows = self.store.query(
                f"SELECT id FROM histo_snapshots WHERE instance = ? AND kind = ? AND ts {op} ?{extra} "
                f"ORDER BY ts {order}, id {order} LIMIT 1",
                args,
            )
            if rows:
                return self.load(rows[0][0])
        return None

    def history(
        self,
        instance: str,
        kind: str,
        since: float,
        until: float,
        source: str | None = None,
        limit: int = 500,
    ) -> list[Snapshot]:
        """The most recent `limit` snapshots in [since, until] with their rows, oldest first."""
        snapshots = self.snapshots(instance, since, until, kind, source, limit)
        rows = self._rows([s.id for s in snapshots if s.id is not None])
        for snapshot in snapshots:
            snapshot.rows = rows.get(snapshot.id or 0, [])
        return snapshots

    def _rows(self, ids: list[int]) -> dict[int, list[HistogramRow]]:
        out: dict[int, list[HistogramRow]] = {i: [] for i in ids}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for snapshot_id, name, count, size, detail in self.store.query(
                f"""SELECT r.snapshot_id, n.name, r.count, r.bytes, r.detail FROM histo_rows r
                    JOIN histo_names n ON n.id = r.name_id WHERE r.snapshot_id IN ({marks})""",
                chunk,
            ):
                out[snapshot_id].append(HistogramRow(name, count, size, detail))
        return out


_COLUMNS = "id, instance, source, ts, pid, start_time, total_count, total_bytes, rows_total, meta"


def _snapshot(row: tuple[Any, ...]) -> Snapshot:
    sid, instance, source, ts, pid, start_time, count, size, rows_total, meta = row
    return Snapshot(instance, source, ts, [], count, size, pid, start_time, rows_total, json.loads(meta), sid)


def _filters(
    instance: str, since: float, until: float, kind: str | None, source: str | None
) -> tuple[str, list[Any]]:
    where, args = ["instance = ?", "ts BETWEEN ? AND ?"], [instance, since, until]
    if kind:
        where.append("kind = ?")
        args.append(kind)
    if source:
        where.append("source = ?")
        args.append(source)
    return " AND ".join(where), args


def _intern(db: sqlite3.Connection, names: list[str]) -> dict[str, int]:
    db.executemany("INSERT OR IGNORE INTO histo_names (name) VALUES (?)", [(n,) for n in names])
    ids: dict[str, int] = {}
    for start in range(0, len(names), 500):
        chunk = names[start : start + 500]
        marks = ",".join("?" * len(chunk))
        ids.update(db.execute(f"SELECT name, id FROM histo_names WHERE name IN ({marks})", chunk).fetchall())
    return ids


def _expire(db: sqlite3.Connection, instance: str, cutoff: float) -> None:
    old = [
        r[0]
        for r in db.execute(
            "SELECT id FROM histo_snapshots WHERE instance = ? AND ts < ?", (instance, cutoff)
        )
    ]
    for start in range(0, len(old), 500):
        chunk = old[start : start + 500]
        marks = ",".join("?" * len(chunk))
        db.execute(f"DELETE FROM histo_rows WHERE snapshot_id IN ({marks})", chunk)
        db.execute(f"DELETE FROM histo_snapshots WHERE id IN ({marks})", chunk)
