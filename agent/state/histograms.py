"""Histogram snapshots (JVM classes, Python types, native allocation sites, NMT categories) kept compactly
in the store, and diffs between two of them.

A snapshot keeps the union of its top N rows by bytes and by count (a leaking class of small objects
ranks high by count long before it does by bytes) plus exact totals; rows are (name, count, bytes),
names interned in `histo_names`. Snapshots older than the retention are deleted as new ones arrive.

Probes run before the API exists and have no store handle, so they `publish()` snapshots into the
one `HistogramStore` that the runtime `attach()`es at start-up; until then (and in processes without
a store) the last few wait in a small queue.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent.core.errors import StoreError
from agent.state.store import Store

M = TypeVar("M")
DEFAULT_TOP = 200
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
# source -> what its rows name
KINDS = {"jvm": "class", "python": "type", "jemalloc": "site", "gperftools": "site", "nmt": "nmt"}


@dataclass(frozen=True, slots=True)
class HistogramRow:
    name: str
    count: float
    bytes: float
    detail: str | None = None  # a class's module, a site's call stack


@dataclass(slots=True)
class Snapshot:
    """One histogram of one process at one time; `rows` may be only the top of it (see `rows_total`)."""

    instance: str
    source: str  # jvm | python | jemalloc | gperftools | nmt
    ts: float
    rows: list[HistogramRow]
    total_count: float
    total_bytes: float
    pid: int | None = None
    start_time: float | None = None
    rows_total: int = 0  # distinct names before trimming
    meta: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    @property
    def kind(self) -> str:
        return KINDS.get(self.source, "class")

    @property
    def trimmed(self) -> bool:
        return self.rows_total > len(self.rows)

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "instance": self.instance,
            "source": self.source,
            "kind": self.kind,
            "ts": self.ts,
            "pid": self.pid,
            "start_time": self.start_time,
            "total_count": self.total_count,
            "total_bytes": self.total_bytes,
            "rows_kept": len(self.rows),
            "rows_total": self.rows_total,
            "meta": self.meta,
        }

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        rows = sorted(self.rows, key=lambda r: (-r.bytes, -r.count, r.name))[:top]
        return {
            **self.info(),
            "rows": [{"name": r.name, "count": r.count, "bytes": r.bytes, "detail": r.detail} for r in rows],
        }


def compact(snapshot: Snapshot, top: int = DEFAULT_TOP) -> Snapshot:
    """The snapshot with only its top `top` rows by bytes and by count (totals stay exact)."""
    rows = snapshot.rows
    total = max(snapshot.rows_total, len(rows))
    if len(rows) > top:
        by_bytes = sorted(rows, key=lambda r: (-r.bytes, r.name))[:top]
        by_count = sorted(rows, key=lambda r: (-r.count, r.name))[:top]
        kept = {r.name: r for r in (*by_bytes, *by_count)}
        rows = sorted(kept.values(), key=lambda r: (-r.bytes, -r.count, r.name))
    return Snapshot(
        snapshot.instance,
        snapshot.source,
        snapshot.ts,
        list(rows),
        snapshot.total_count,
        snapshot.total_bytes,
        snapshot.pid,
        snapshot.start_time,
        total,
        dict(snapshot.meta),
        snapshot.id,
    )


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


def _snapshot(row: tuple) -> Snapshot:
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


def _intern(db, names: list[str]) -> dict[str, int]:
    db.executemany("INSERT OR IGNORE INTO histo_names (name) VALUES (?)", [(n,) for n in names])
    ids: dict[str, int] = {}
    for start in range(0, len(names), 500):
        chunk = names[start : start + 500]
        marks = ",".join("?" * len(chunk))
        ids.update(db.execute(f"SELECT name, id FROM histo_names WHERE name IN ({marks})", chunk).fetchall())
    return ids


def _expire(db, instance: str, cutoff: float) -> None:
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


# ------------------------------------------------------------------------------------------ diffs
@dataclass(frozen=True, slots=True)
class RowDelta:
    name: str
    count_before: float
    count_after: float
    bytes_before: float
    bytes_after: float
    detail: str | None = None
    approximate: bool = False  # absent from a trimmed side: that side's value is at most its cutoff

    @property
    def delta_count(self) -> float:
        return self.count_after - self.count_before

    @property
    def delta_bytes(self) -> float:
        return self.bytes_after - self.bytes_before

    def to_dict(self, seconds: float) -> dict[str, Any]:
        return {
            "name": self.name,
            "count_before": self.count_before,
            "count_after": self.count_after,
            "delta_count": self.delta_count,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "delta_bytes": self.delta_bytes,
            "bytes_per_second": self.delta_bytes / seconds if seconds > 0 else None,
            "detail": self.detail,
            "approximate": self.approximate,
        }


@dataclass(slots=True)
class HistogramDiff:
    before: Snapshot
    after: Snapshot
    rows: list[RowDelta]  # largest growth in bytes first

    @property
    def seconds(self) -> float:
        return self.after.ts - self.before.ts

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        return {
            "before": self.before.info(),
            "after": self.after.info(),
            "seconds": self.seconds,
            "same_process": same_process(self.before, self.after),
            "delta_count": self.after.total_count - self.before.total_count,
            "delta_bytes": self.after.total_bytes - self.before.total_bytes,
            "rows": [r.to_dict(self.seconds) for r in self.rows[:top]],
        }


def same_process(a: Snapshot, b: Snapshot) -> bool:
    if a.pid is None or b.pid is None:
        return True
    return a.pid == b.pid and abs((a.start_time or 0) - (b.start_time or 0)) < 1.0


def diff(before: Snapshot, after: Snapshot) -> HistogramDiff:
    """Row-by-row change from `before` to `after`, sorted by growth in bytes, then in count."""
    old = {r.name: r for r in before.rows}
    new = {r.name: r for r in after.rows}
    rows = []
    for name in old.keys() | new.keys():
        a, b = old.get(name), new.get(name)
        rows.append(
            RowDelta(
                name,
                a.count if a else 0.0,
                b.count if b else 0.0,
                a.bytes if a else 0.0,
                b.bytes if b else 0.0,
                (b or a).detail if (b or a) else None,
                (a is None and before.trimmed) or (b is None and after.trimmed),
            )
        )
    rows.sort(key=lambda r: (-r.delta_bytes, -r.delta_count, r.name))
    return HistogramDiff(before, after, rows)


# ------------------------------------------------------------------------------------------ the sink
_lock = threading.Lock()
_sink: HistogramStore | None = None
_pending: deque[Snapshot] = deque(maxlen=64)


def attach(store: Store, top: int = DEFAULT_TOP, retention: float = DEFAULT_RETENTION) -> HistogramStore:
    """Make `store` the destination of published snapshots and write the ones waiting."""
    global _sink
    sink = HistogramStore(store, top, retention)
    with _lock:
        _sink = sink
        waiting = list(_pending)
        _pending.clear()
    for snapshot in waiting:
        sink.add(snapshot)
    return sink


def detach() -> None:
    global _sink
    with _lock:
        _sink = None
        _pending.clear()


def publish(snapshot: Snapshot) -> int | None:
    """Store a snapshot (or queue it until a store is attached); raises `StoreError` when writing fails."""
    with _lock:
        sink = _sink
        if sink is None:
            _pending.append(snapshot)
            return None
    return sink.add(snapshot)


def settings_for(target: Any, key: str, model: type[M]) -> M | None:
    """The instance's `histograms.<key>` settings as `model` (None when absent: `heap_profiles` is opt-in);
    settings that do not validate (a hand-made target) are a `ProbeError`, not a crash."""
    from pydantic import ValidationError

    from agent.core.errors import ProbeError

    raw = (target.settings.get("histograms") or {}).get(key)
    if raw is None and key == "heap_profiles":
        return None
    try:
        return model.model_validate(raw or {})
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem.get("loc", ()))
        raise ProbeError(f"invalid histograms.{key}.{where}: {problem.get('msg')}") from None


def rows_from(items: Iterable[tuple[str, float, float]]) -> list[HistogramRow]:
    """Rows from `(name, count, bytes)` triples, merging repeated names."""
    merged: dict[str, list[float]] = {}
    for name, count, size in items:
        row = merged.setdefault(name, [0.0, 0.0])
        row[0] += count
        row[1] += size
    return [HistogramRow(name, c, b) for name, (c, b) in merged.items()]
