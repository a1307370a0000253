"""The lease store on a SQLite file that several agents on one host share (point them at one path).

Keys live in `kv` (value, the revision it was created at and last written at, its lease), leases in
`leases` (expiry on the store's wall clock), the store's revision in `revision`. Each write is one
`BEGIN IMMEDIATE` transaction, so SQLite's file lock makes check-then-write atomic across processes;
it first deletes the keys of leases that ran out (one revision), as etcd does by itself. Reads are
one deferred transaction and leave out keys whose lease ran out. The rollback journal (not WAL) is
used so that the file also works in a directory shared over a network file system with working
locks. A lock held longer than `timeout` (another agent stuck) counts as unavailable: no restart.

The file holds the budget of every agent that shares it, so another user must not be able to plant
or swap it: its directory must be owned by root or medic's user and not writable by others (a
missing one is created 0700), and the file itself is created `O_EXCL | O_NOFOLLOW` 0600 and refused
when it is a symlink, another user's, or writable by others (`UnsafePath`, with the fix). A file
that will not open (damaged, overwritten) leaves every call unavailable, retried every
`reopen_interval` seconds: moving the file aside heals it.

Rows of the previous layout (tables `restarts` and `controls`, written by agents of the previous
release on the same file) are read as keys too (`sqlite_legacy.py`), so an agent upgraded in place
keeps the budget and the fleet pause; while an agent of the previous release is alive on the file,
no slot is taken (it cannot see them).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from agent.core.errors import UnsafePath
from probes.linux.fstrust import check_trusted_path, ensure_private_file, trusted_uids
from remediation.coordinator import sqlite_legacy
from remediation.coordinator.store import ABSENT, Change, Item, Snapshot
from remediation.errors import CoordinatorError, CoordinatorUnavailable

log = logging.getLogger(__name__)
REOPEN_INTERVAL = 10.0  # seconds between two attempts to open a coordinator file that would not open
T = TypeVar("T")

_SCHEMA = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY, value TEXT NOT NULL, created INTEGER NOT NULL, revision INTEGER NOT NULL,
    lease INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS kv_lease ON kv (lease) WHERE lease != 0;
CREATE TABLE IF NOT EXISTS leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ttl REAL NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS revision (value INTEGER NOT NULL);
INSERT INTO revision SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM revision);
COMMIT;
"""
_LIVE = "(lease = 0 OR lease IN (SELECT id FROM leases WHERE expires_at > ?))"


class SqliteStore:
    max_ops = 1_000_000  # one transaction carries any number

    def __init__(
        self,
        path: str | Path,
        *,
        namespace: str = "default",
        timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
        reopen_interval: float = REOPEN_INTERVAL,
    ) -> None:
        self.path = Path(path)
        self.namespace = namespace
        self.base = f"{namespace}/"
        self.timeout = timeout
        self.clock = clock
        self.reopen_interval = reopen_interval
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._open_error = ""
        self._reopen_at = 0.0
        try:
            if not os.path.lexists(self.path.parent):
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            check_trusted_path(self.path.parent)  # maybe shared by several agents: checked, never re-moded
            ensure_private_file(self.path, "local coordinator", owners=trusted_uids())
        except OSError as exc:
            raise CoordinatorUnavailable(
                f"cannot open the local coordinator {self.path}: {exc}; check that its directory exists "
                "and is writable by every agent that shares it (remediation.coordinator.local.path)"
            ) from None
        try:
            with self._lock:
                self._connection(checked=True)
        except CoordinatorUnavailable as exc:
            log.warning("%s; no restart until it opens", exc)

    def describe(self) -> str:
        return f"local coordinator {self.path} (namespace {self.namespace})"

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def unwatch(self, key: str) -> None:
        """Nothing to forget: every read is a local one."""

    # ----------------------------------------------------------------------------- the five operations
    def read(self, keys: Sequence[str], *, watch: bool = False, recent: bool = False) -> Snapshot:
        def read(db: sqlite3.Connection, now: float) -> Snapshot:
            items: dict[str, Item] = {}
            for key in dict.fromkeys(keys):
                full = self.base + key
                if key.endswith("/"):
                    rows = db.execute(
                        f"SELECT key, value, revision, created, lease FROM kv WHERE key >= ? AND key < ? "
                        f"AND {_LIVE}",
                        (full, full[:-1] + chr(ord("/") + 1), now),
                    )
                else:
                    rows = db.execute(
                        f"SELECT key, value, revision, created, lease FROM kv WHERE key = ? AND {_LIVE}",
                        (full, now),
                    )
                for k, value, revision, created, lease in rows:
                    items[k[len(self.base) :]] = Item(value, int(revision), int(created), int(lease))
            for key, item in sqlite_legacy.items(db, self.namespace, now, keys).items():
                items.setdefault(key, item)
            return Snapshot(items, _revision(db))

        return self._run("read", read, write=False)

    def commit(self, change: Change) -> int | None:
        def write(db: sqlite3.Connection, now: float) -> int | None:
            revision = self._sweep(db, now)
            for key, expected in change.expect.items():
                row = db.execute("SELECT revision FROM kv WHERE key = ?", (self.base + key,)).fetchone()
                if (int(row[0]) if row else ABSENT) != expected:
                    return None
            if not change.puts and not change.deletes:
                return revision
            if any(k.startswith("slots/") for k in change.puts):
                refused = sqlite_legacy.refuse_slots(db, self.namespace, now)
                if refused is not None:
                    raise CoordinatorUnavailable(f"{self.describe()}: {refused}")
            revision += 1
            for key, put in change.puts.items():
                if (
                    put.lease
                    and db.execute("SELECT 1 FROM leases WHERE id = ?", (put.lease,)).fetchone() is None
                ):
                    raise CoordinatorError(f"{self.describe()}: lease {put.lease} not found (it ran out)")
                db.execute(
                    "INSERT INTO kv (key, value, created, revision, lease) VALUES (?, ?, ?, ?, ?) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value, revision = excluded.revision, "
                    "lease = excluded.lease",
                    (self.base + key, put.value, revision, revision, put.lease),
                )
            db.executemany("DELETE FROM kv WHERE key = ?", [(self.base + k,) for k in change.deletes])
            sqlite_legacy.written(db, self.namespace, [*change.puts, *change.deletes])
            db.execute("UPDATE revision SET value = ?", (revision,))
            return revision

        return self._run("write", write)

    def grant(self, ttl: float) -> int:
        def grant(db: sqlite3.Connection, now: float) -> int:
            cur = db.execute("INSERT INTO leases (ttl, expires_at) VALUES (?, ?)", (ttl, now + ttl))
            return int(cur.lastrowid or 0)

        return self._run("grant a lease", grant)

    def keepalive(self, lease: int) -> float:
        def renew(db: sqlite3.Connection, now: float) -> float:
            self._sweep(db, now)
            row = db.execute("SELECT ttl FROM leases WHERE id = ?", (lease,)).fetchone()
            if row is None:
                return 0.0
            db.execute("UPDATE leases SET expires_at = ? WHERE id = ?", (now + row[0], lease))
            return float(row[0])

        return self._run("keep a lease alive", renew)

    def revoke(self, lease: int) -> None:
        def revoke(db: sqlite3.Connection, now: float) -> None:
            self._sweep(db, now)
            self._drop(db, [lease])

        self._run("revoke a lease", revoke)

    # ----------------------------------------------------------------------------- plumbing
    def _sweep(self, db: sqlite3.Connection, now: float) -> int:
        """Delete the leases that ran out and their keys; the store's revision after."""
        gone = [row[0] for row in db.execute("SELECT id FROM leases WHERE expires_at <= ?", (now,))]
        return self._drop(db, gone)

    def _drop(self, db: sqlite3.Connection, leases: list[int]) -> int:
        revision = _revision(db)
        if not leases:
            return revision
        marks = ",".join("?" * len(leases))
        deleted = db.execute(f"DELETE FROM kv WHERE lease IN ({marks})", leases).rowcount
        db.execute(f"DELETE FROM leases WHERE id IN ({marks})", leases)
        if deleted:
            revision += 1
            db.execute("UPDATE revision SET value = ?", (revision,))
        return revision

    def _connection(self, checked: bool = False) -> sqlite3.Connection:
        """The open database (under `_lock`). The file is checked (`ensure_private_file`) before each
        attempt to open it, unless the caller just did."""
        if self._db is not None:
            return self._db
        now = time.monotonic()
        if self._open_error and now < self._reopen_at:
            raise CoordinatorUnavailable(self._open_error)
        db: sqlite3.Connection | None = None
        try:
            if not checked:
                ensure_private_file(self.path, "local coordinator", owners=trusted_uids())
            db = sqlite3.connect(
                self.path, timeout=self.timeout, check_same_thread=False, isolation_level=None
            )
            db.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            db.execute("PRAGMA journal_mode=DELETE")
            db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error, UnsafePath) as exc:
            if db is not None:
                db.close()
            self._open_error = (
                f"{self.describe()}: cannot open it: {exc}: the file is damaged or not medic's; move it "
                f"aside (the agents that share it try again every {self.reopen_interval:g} s)"
            )
            self._reopen_at = now + self.reopen_interval
            raise CoordinatorUnavailable(self._open_error) from None
        self._db, self._open_error = db, ""
        return db

    def _run(self, what: str, fn: Callable[[sqlite3.Connection, float], T], write: bool = True) -> T:
        """`fn(db, now)` in one transaction (immediate for a write); lock waits and errors are unavailable."""
        with self._lock:
            db = self._connection()
            started = time.monotonic()
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.OperationalError as exc:
                raise CoordinatorUnavailable(
                    f"{self.describe()}: cannot {what}: {exc} after {time.monotonic() - started:.1f}s "
                    "(another agent holds the lock too long); no restart until it answers"
                ) from None
            except sqlite3.Error as exc:  # e.g. "file is not a database": overwritten or damaged
                raise CoordinatorUnavailable(
                    f"{self.describe()}: cannot {what}: {exc}: the file is damaged or not medic's; move it "
                    "aside and restart the agents that share it"
                ) from None
            try:
                result = fn(db, self.clock())
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                _rollback(db)
                damaged = "not a database" in str(exc) or "malformed" in str(exc)
                hint = ": the file is damaged or not medic's; move it aside" if damaged else ""
                raise CoordinatorUnavailable(f"{self.describe()}: cannot {what}: {exc}{hint}") from None
            except BaseException:
                _rollback(db)
                raise
            return result


def _revision(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT value FROM revision").fetchone()
    return int(row[0]) if row else 0


def _rollback(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
