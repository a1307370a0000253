"""SQLite (WAL) state of the agent: raw samples, 1-minute rollups, the event log and known instances.

One writer connection behind a lock (probes, flushes and events come from several threads);
each read borrows a reader connection from a pool (as many as read at once), which WAL lets run
beside the writer. Samples are buffered and written in batches by `flush()`; rollups are merged in
the same transaction, so they stay exact across agent restarts. Events are written at once: they are rare and
must not be lost. The directory is private (0700, medic's own, never a symlink) and the files
in it are created 0600 with `O_EXCL | O_NOFOLLOW` (`probes.linux.fstrust`). On a full disk the
agent keeps running: a failed flush keeps its samples (up to `MAX_BUFFERED`) for the next one and
raises `StoreError`, which the jobs log; instance bookkeeping is best effort.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.core.errors import StoreError
from agent.core.records import Event, Sample
from agent.core.sql import where_clause
from agent.state.corrupt import corrupt_advice, is_corrupt
from agent.state.series import ROLLUP_SECONDS, Aggregate, SeriesResult, read_series
from probes.linux.fstrust import ensure_private_dir, ensure_private_file

log = logging.getLogger("medic.store")
SCHEMA_VERSION = 1


# each reader connection keeps at most this page cache (SQLite's default is 2 MiB per connection):
# what a detection pass reads again is the recent rows of the instances it judges, and the OS page
# cache holds the rest of the file
READER_CACHE_KIB = 512
# samples kept in memory while the database cannot be written (disk full): the oldest go beyond this
MAX_BUFFERED = 200_000
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY, instance TEXT NOT NULL, metric TEXT NOT NULL, UNIQUE (instance, metric));
CREATE TABLE IF NOT EXISTS samples (
    series_id INTEGER NOT NULL, ts REAL NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (series_id, ts)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollups (
    series_id INTEGER NOT NULL, ts INTEGER NOT NULL,
    min REAL NOT NULL, max REAL NOT NULL, sum REAL NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (series_id, ts)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, instance TEXT, kind TEXT NOT NULL,
    severity TEXT NOT NULL, message TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
CREATE INDEX IF NOT EXISTS events_instance ON events (instance, id);
CREATE TABLE IF NOT EXISTS instances (
    name TEXT PRIMARY KEY, pid INTEGER, start_time REAL, first_seen REAL NOT NULL,
    last_seen REAL NOT NULL, restarts INTEGER NOT NULL DEFAULT 0, data TEXT NOT NULL DEFAULT '{}');
"""


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    """What the store remembers of an instance between agent runs."""

    name: str
    pid: int | None
    start_time: float | None
    first_seen: float
    last_seen: float
    restarts: int


class Store:
    def __init__(self, state_dir: str | Path, *, raw_retention: float = 48 * 3600.0) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / "medic.db"
        self.raw_retention = raw_retention
        self._lock = threading.Lock()
        self._buffer: list[Sample] = []
        self._buffer_lock = threading.Lock()
        self.dropped = 0  # samples given up after the buffer filled while writes failed
        self.write_error: str | None = None  # the last failed flush, until one succeeds
        self._series_ids: dict[str, dict[str, int]] = {}  # instance → metric → id: no pair tuple per series
        # reader connections, lent to one read at a time: as many as ever read at once (one or two),
        # not one per thread that ever read (the executor's job threads, anyio's API workers that end
        # after 10 s idle and are replaced), each with its own schema copy and page cache
        self._idle_readers: list[sqlite3.Connection] = []
        self._open_readers = 0
        self._readers_lock = threading.Lock()
        self._closed = False
        try:
            if self.dir.exists() and not self.dir.is_symlink() and not self.dir.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(self.dir))
            ensure_private_dir(self.dir, "state_dir")  # UnsafePath: another user could plant files there
            ensure_private_file(self.path, "state database")
            self._db = self._connect()
            self._db.executescript(_SCHEMA)
            self._check_version()
        except sqlite3.Error as exc:
            if is_corrupt(exc):
                raise StoreError(f"{corrupt_advice(self.path)} (SQLite: {exc})") from None
            raise StoreError(self._unreachable(exc)) from None
        except OSError as exc:
            raise StoreError(self._unreachable(exc)) from None

    def _unreachable(self, exc: Exception) -> str:
        return (
            f"cannot open the state database {self.path}: {exc}; check that state_dir is writable "
            "by the user running medic and that no other program holds it"
        )

    def _failed(self, what: str, exc: sqlite3.Error) -> str:
        """`cannot WHAT in medic.db: why`, with what to do when the file is corrupt."""
        said = f"cannot {what} in {self.path}: {exc}"
        return f"{said}; {corrupt_advice(self.path)}" if is_corrupt(exc) else said

    # ----------------------------------------------------------------------------- connections
    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=10.0, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=10000")
        return db

    @contextmanager
    def _reader(self) -> Iterator[sqlite3.Connection]:
        """A reader connection for one read (an idle one, the most recently used first: its cache is
        warm), given back when the read is done."""
        with self._readers_lock:
            if self._closed:
                raise StoreError(f"the state database {self.path} is closed")
            db = self._idle_readers.pop() if self._idle_readers else None
            if db is None:
                self._open_readers += 1
        if db is None:
            try:
                db = self._connect()
                db.execute("PRAGMA query_only=1")
                db.execute(f"PRAGMA cache_size=-{READER_CACHE_KIB}")
            except BaseException:
                with self._readers_lock:
                    self._open_readers -= 1
                raise
        try:
            yield db
        finally:
            with self._readers_lock:
                if self._closed:
                    self._open_readers -= 1
                    db.close()
                else:
                    self._idle_readers.append(db)

    def reader_count(self) -> int:
        """Open reader connections: as many as read at the same time, at most."""
        with self._readers_lock:
            return self._open_readers

    def _check_version(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} was written by a newer medic (schema {row[0]} > {SCHEMA_VERSION}); "
                "upgrade medic or point state_dir elsewhere"
            )

    # ----------------------------------------------------------------------------- extensions
    def ensure_schema(self, sql: str) -> None:
        """Create the tables another part of medic keeps here (idempotent `CREATE ... IF NOT EXISTS`)."""
        with self._lock:
            self._db.executescript(sql)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The write connection inside `BEGIN IMMEDIATE … COMMIT` (rolled back on error), under the writer lock."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def query(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> list[tuple[Any, ...]]:
        """Read-only rows, through a reader connection."""
        with self._reader() as db:
            return db.execute(sql, args).fetchall()

    def close(self) -> None:
        """Flush and close; the connections are closed even when the final flush fails (`StoreError`)."""
        try:
            self.flush()
        finally:
            with self._readers_lock:
                self._closed = True
                for db in self._idle_readers:
                    db.close()
                self._open_readers -= len(self._idle_readers)
                self._idle_readers.clear()
            with self._lock:
                self._db.close()

    # ----------------------------------------------------------------------------- samples
    def add_samples(self, samples: Iterable[Sample]) -> None:
        """Buffer samples; they reach the database on the next `flush()`."""
        good = [s for s in samples if math.isfinite(s.value)]
        with self._buffer_lock:
            self._buffer.extend(good)

    def pending(self) -> int:
        with self._buffer_lock:
            return len(self._buffer)

    def flush(self) -> int:
        """Write buffered samples and merge them into the rollups in one transaction."""
        with self._buffer_lock:
            batch, self._buffer = self._buffer, []
        if not batch:
            return 0
        # (series, minute) → [min, max, sum, count] of the batch's values, in the batch's order
        rollups: dict[tuple[int, int], list[float]] = {}
        rows = []
        series_ids = self._series_ids
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for sample in batch:
                    ids = series_ids.get(sample.instance)
                    sid = ids.get(sample.metric) if ids is not None else None
                    if sid is None:
                        sid = self._series_id(sample.instance, sample.metric)
                    ts, value = sample.ts, sample.value
                    rows.append((sid, ts, value))
                    key = (sid, int(ts // ROLLUP_SECONDS) * ROLLUP_SECONDS)
                    merged = rollups.get(key)
                    if merged is None:
                        rollups[key] = [value, value, value, 1]
                    else:
                        merged[0], merged[1] = min(merged[0], value), max(merged[1], value)
                        merged[2] += value
                        merged[3] += 1
                self._db.executemany("INSERT OR REPLACE INTO samples VALUES (?, ?, ?)", rows)
                self._db.executemany(
                    """INSERT INTO rollups VALUES (?, ?, ?, ?, ?, ?)
                       ON CONFLICT (series_id, ts) DO UPDATE SET
                         min = min(min, excluded.min), max = max(max, excluded.max),
                         sum = sum + excluded.sum, count = count + excluded.count""",
                    [(sid, ts, *merged) for (sid, ts), merged in rollups.items()],
                )
                self._db.execute("COMMIT")
            except sqlite3.Error as exc:
                self._db.execute("ROLLBACK") if self._db.in_transaction else None
                self._keep_for_retry(batch)
                self.write_error = self._failed("write samples", exc)
                fix = "" if is_corrupt(exc) else ": free space on the state_dir's filesystem"
                raise StoreError(
                    f"{self.write_error}; {self.pending()} sample(s) kept in memory and retried on the next "
                    f"flush ({self.dropped} dropped so far){fix}"
                ) from None
        self.write_error = None
        return len(rows)

    def _keep_for_retry(self, batch: list[Sample]) -> None:
        """Put a batch that could not be written back in front; beyond `MAX_BUFFERED` the oldest go,
        counted in `dropped`, so a long outage (disk full) costs bounded memory, not the agent."""
        with self._buffer_lock:
            self._buffer[:0] = batch
            excess = len(self._buffer) - MAX_BUFFERED
            if excess > 0:
                del self._buffer[:excess]
                self.dropped += excess

    def _series_id(self, instance: str, metric: str) -> int:
        ids = self._series_ids.get(instance)
        if ids is None:
            ids = self._series_ids[instance] = {}
        sid = ids.get(metric)
        if sid is None:
            key = (instance, metric)
            self._db.execute("INSERT OR IGNORE INTO series (instance, metric) VALUES (?, ?)", key)
            sid = self._db.execute("SELECT id FROM series WHERE instance=? AND metric=?", key).fetchone()[0]
            ids[metric] = sid
        return sid

    def metrics(self, instance: str) -> list[str]:
        with self._reader() as db:
            rows = db.execute("SELECT metric FROM series WHERE instance=? ORDER BY metric", (instance,))
            return [r[0] for r in rows]

    def series(
        self,
        instance: str,
        metric: str,
        since: float,
        until: float | None = None,
        step: float | None = None,
        agg: Aggregate = "mean",
        max_points: int = 2000,
        now: float | None = None,
    ) -> SeriesResult:
        """Points of one series in [since, until], bucketed by `step` so that at most `max_points` return.

        Raw samples serve ranges inside the raw retention with buckets under a minute; rollups
        serve the rest, so a 30-day view never scans 30 days of raw samples.
        """
        now = time.time() if now is None else now
        until = now if until is None else until
        span = max(until - since, 0.0)
        step = max(step or 0.0, span / max_points if max_points else 0.0)
        use_raw = since >= now - self.raw_retention and step < ROLLUP_SECONDS
        with self._reader() as db:
            return read_series(db, instance, metric, since, until, step, agg, use_raw)

    def latest(self, instance: str, metric: str) -> tuple[float, float] | None:
        with self._reader() as db:
            row = db.execute(
                """SELECT ts, value FROM samples WHERE series_id =
                     (SELECT id FROM series WHERE instance=? AND metric=?) ORDER BY ts DESC LIMIT 1""",
                (instance, metric),
            ).fetchone()
        return (row[0], row[1]) if row else None

    # ----------------------------------------------------------------------------- events
    def add_event(self, event: Event) -> Event:
        """Write one event now and give it its id."""
        with self._lock:
            try:
                cur = self._db.execute(
                    "INSERT INTO events (ts, instance, kind, severity, message, data) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        event.ts,
                        event.instance,
                        event.kind,
                        event.severity,
                        event.message,
                        json.dumps(event.data, default=str),
                    ),
                )
            except sqlite3.Error as exc:
                raise StoreError(self._failed("write an event", exc)) from None
        event.id = cur.lastrowid
        return event

    def events(
        self,
        *,
        since: float | None = None,
        after_id: int | None = None,
        instance: str | None = None,
        kinds: Iterable[str] | None = None,
        limit: int = 100,
    ) -> list[Event]:
        """Newest events first, or oldest first after `after_id` (for tailing)."""
        where, args = where_clause([("ts >= ?", since), ("id > ?", after_id), ("instance = ?", instance)])
        kinds = list(kinds or [])
        if kinds:
            where += (" AND " if where else " WHERE ") + f"kind IN ({','.join('?' * len(kinds))})"
            args.extend(kinds)
        order = "ASC" if after_id is not None else "DESC"
        sql = f"SELECT id, ts, instance, kind, severity, message, data FROM events{where} ORDER BY id {order} LIMIT ?"
        args.append(max(1, min(limit, 10_000)))
        with self._reader() as db:
            return [
                Event(kind=k, message=m, instance=i, severity=s, data=json.loads(d), ts=ts, id=eid)
                for eid, ts, i, k, s, m, d in db.execute(sql, args)
            ]

    # ----------------------------------------------------------------------------- instances
    def remember_instance(self, name: str, pid: int | None, start_time: float | None, now: float) -> None:
        """Best effort, like `count_restart`: a failed write is logged, not raised, so that the tracker
        keeps following its processes when the disk is full."""
        with self._lock, self._best_effort(f"remember instance {name}"):
            self._db.execute(
                """INSERT INTO instances (name, pid, start_time, first_seen, last_seen) VALUES (?, ?, ?, ?, ?)
                   ON CONFLICT (name) DO UPDATE SET pid=excluded.pid, start_time=excluded.start_time,
                   last_seen=excluded.last_seen""",
                (name, pid, start_time, now, now),
            )

    def count_restart(self, name: str) -> None:
        with self._lock, self._best_effort(f"count a restart of {name}"):
            self._db.execute("UPDATE instances SET restarts = restarts + 1 WHERE name=?", (name,))

    @contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """sqlite errors of a write (disk full, locked) as `StoreError`, which the agent's jobs log and survive."""
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(self._failed(what, exc)) from None

    @contextmanager
    def _best_effort(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            self.write_error = self._failed(what, exc)
            log.error("%s; carrying on without it", self.write_error)

    def known_instances(self) -> dict[str, InstanceRecord]:
        with self._reader() as db:
            rows = db.execute("SELECT name, pid, start_time, first_seen, last_seen, restarts FROM instances")
            return {r[0]: InstanceRecord(*r) for r in rows}

    # ----------------------------------------------------------------------------- retention
    def enforce_retention(self, now: float, raw_retention: float, rollup_retention: float) -> dict[str, int]:
        """Delete raw samples, rollups and events past their retention; returns rows deleted per table."""
        deleted = {}
        with self._lock, self._writing("delete old rows"):
            for table, cutoff in (
                ("samples", now - raw_retention),
                ("rollups", now - rollup_retention),
                ("events", now - rollup_retention),
            ):
                cur = self._db.execute(f"DELETE FROM {table} WHERE ts < ?", (cutoff,))
                deleted[table] = cur.rowcount
        return deleted
