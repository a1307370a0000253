"""`local` coordinator: a SQLite file that several agents on one host share (point them at one path).

Each operation is one `BEGIN IMMEDIATE` transaction, so SQLite's file lock makes read-check-write
atomic across processes. The rollback journal (not WAL) is used so that the file also works in a
directory shared over a network file system with working locks. A slot is a restart row whose
`finished_at` is empty and whose `expires_at` is in the future; a holder that dies stops renewing
and its row is closed as `lease-expired` at its expiry. A lock held longer than `timeout` (another
agent stuck) counts as unavailable: no restart.

The file holds the budget of every agent that shares it, so another user must not be able to
plant or swap it: its directory must be owned by root or medic's user and not writable by others
(a missing one is created 0700), and the file itself is created `O_EXCL | O_NOFOLLOW` 0600 and
refused when it is a symlink, another user's, or writable by others (`UnsafePath`, with the fix).

The elected planner on one host: the leader is whichever agent holds the `leaders` row of the
namespace (taken under the file lock when it is vacant or expired, kept by campaigning again
within its TTL); each new leader gets the next term, which fences its grants, and writes when it
took the seat beside it (`controls` row `leader`). There is no watch on a file: followers read their
grants row when they want a restart (one local read). The fleet pause is the `controls` row `pause`,
deleted by the first read after its `until`; `acquire` takes no slot while it holds.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.core.errors import UnsafePath
from probes.linux.fstrust import check_trusted_path, ensure_private_file, trusted_uids
from remediation.coordinator.base import (
    EXPIRED,
    MAX_PROFILE_READ,
    AcquireResult,
    Admit,
    Coordinator,
    Grant,
    Leadership,
    PlannedGrant,
    SlotRequest,
    check_profile_key,
    checked_time,
    fleet_pause_decision,
    profile_doc,
    profile_text,
    read_pause,
)
from remediation.deadlines import Clocks
from remediation.errors import CoordinatorUnavailable, LeaseLost
from remediation.model import Decision, FleetEntry, RestartRecord

log = logging.getLogger(__name__)
REOPEN_INTERVAL = 10.0  # seconds between two attempts to open a coordinator file that would not open

_SCHEMA = """
CREATE TABLE IF NOT EXISTS restarts (
    token TEXT PRIMARY KEY, namespace TEXT NOT NULL, instance TEXT NOT NULL, fleet TEXT NOT NULL,
    holder TEXT NOT NULL, started_at REAL NOT NULL, expires_at REAL NOT NULL,
    finished_at REAL, outcome TEXT);
CREATE INDEX IF NOT EXISTS restarts_recent ON restarts (namespace, started_at);
CREATE TABLE IF NOT EXISTS fleet_entries (
    namespace TEXT NOT NULL, instance TEXT NOT NULL, agent TEXT NOT NULL, data TEXT NOT NULL,
    expires_at REAL NOT NULL, PRIMARY KEY (namespace, instance));
CREATE TABLE IF NOT EXISTS leaders (
    namespace TEXT PRIMARY KEY, agent TEXT NOT NULL, term INTEGER NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS grants (
    namespace TEXT NOT NULL, agent TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (namespace, agent));
CREATE TABLE IF NOT EXISTS controls (
    namespace TEXT NOT NULL, name TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (namespace, name));
CREATE TABLE IF NOT EXISTS profiles (
    namespace TEXT NOT NULL, key TEXT NOT NULL, data TEXT NOT NULL, expires_at REAL NOT NULL,
    PRIMARY KEY (namespace, key));
"""


class LocalCoordinator(Coordinator):
    name = "local"

    def __init__(
        self,
        path: str | Path,
        *,
        namespace: str = "default",
        retention: float = 86400.0,
        timeout: float = 2.0,
        clock: Callable[[], float] = time.time,
        reopen_interval: float = REOPEN_INTERVAL,
    ) -> None:
        self.path = Path(path)
        self.reopen_interval = reopen_interval
        self.namespace = namespace
        self.retention = retention
        self.timeout = timeout
        self.clock = clock
        self.clocks = Clocks.for_wall(clock)  # how long a fleet pause lasts (remediation.deadlines)
        self._lock = threading.Lock()
        self._leadership: Leadership | None = None
        self._fences: dict[str, int] = {}  # instance -> the term its grant requires at acquire
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
            self._connection(checked=True)
        except CoordinatorUnavailable as exc:
            log.warning("%s; no restart until it opens", exc)

    def _connection(self, checked: bool = False) -> sqlite3.Connection:
        """The open database (under `_lock`, or from `__init__`). A file that will not open (damaged,
        overwritten, not medic's) leaves the agent running with every call unavailable, so no restart,
        and it is tried again at most every `reopen_interval` seconds: moving the file aside heals it.
        The file is checked (`ensure_private_file`) before each attempt, unless the caller just did."""
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

    def describe(self) -> str:
        return f"local coordinator {self.path} (namespace {self.namespace})"

    # ----------------------------------------------------------------------------- plumbing
    def _run(self, what: str, fn: Callable[[sqlite3.Connection, float], object]) -> object:
        """Run `fn(db, now)` in one immediate transaction; lock waits and errors become unavailable."""
        with self._lock:
            db = self._connection()
            started = time.monotonic()
            try:
                db.execute("BEGIN IMMEDIATE")
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
            except sqlite3.Error as exc:
                db.execute("ROLLBACK") if db.in_transaction else None
                raise CoordinatorUnavailable(f"{self.describe()}: cannot {what}: {exc}") from None
            except BaseException:
                db.execute("ROLLBACK") if db.in_transaction else None
                raise
            try:
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                db.execute("ROLLBACK") if db.in_transaction else None
                raise CoordinatorUnavailable(f"{self.describe()}: cannot {what}: {exc}") from None
            return result

    def _expire(self, db: sqlite3.Connection, now: float) -> None:
        db.execute(
            "UPDATE restarts SET finished_at = expires_at, outcome = ? "
            "WHERE namespace = ? AND finished_at IS NULL AND expires_at <= ?",
            (EXPIRED, self.namespace, now),
        )
        db.execute(
            "DELETE FROM restarts WHERE namespace = ? AND finished_at IS NOT NULL AND finished_at < ? "
            "AND started_at < ?",
            (self.namespace, now - self.retention, now - self.retention),
        )

    def _records(self, db: sqlite3.Connection, since: float) -> list[RestartRecord]:
        rows = db.execute(
            "SELECT instance, fleet, holder, started_at, finished_at, outcome, token FROM restarts "
            "WHERE namespace = ? AND (finished_at IS NULL OR finished_at >= ? OR started_at >= ?) "
            "ORDER BY started_at, instance",
            (self.namespace, since, since),
        ).fetchall()
        return [RestartRecord(*row) for row in rows]

    # ----------------------------------------------------------------------------- slots
    def acquire(self, request: SlotRequest, admit: Admit) -> AcquireResult:
        def take(db: sqlite3.Connection, now: float) -> AcquireResult:
            self._expire(db, now)
            records = self._records(db, now - self.retention)
            for record in records:
                if record.instance == request.instance and record.in_flight:
                    return AcquireResult(
                        None,
                        Decision.block(
                            "lock",
                            "in-flight",
                            f"{request.instance} is already being restarted by {record.holder}",
                        ),
                    )
            pause = self._pause(db, now)
            if pause is not None:
                return AcquireResult(None, fleet_pause_decision(pause))
            fence = self._fences.get(request.instance)
            if fence is None and self._leadership is not None:
                fence = self._leadership.revision
            if fence is not None and self._term(db, now) != fence:
                self._fences.pop(request.instance, None)
                return AcquireResult(
                    None,
                    Decision.block(
                        "lock",
                        "stale-grant",
                        f"the grant for {request.instance} came from a leader that is no longer in charge "
                        f"(term {fence}); waiting for the new leader's plan",
                    ),
                )
            decision = admit(records, now)
            if not decision.ok:
                return AcquireResult(None, decision)
            token = uuid.uuid4().hex
            db.execute(
                "INSERT INTO restarts (token, namespace, instance, fleet, holder, started_at, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    token,
                    self.namespace,
                    request.instance,
                    request.fleet,
                    request.holder,
                    now,
                    now + request.ttl,
                ),
            )
            grant = Grant(request.instance, request.fleet, request.holder, token, now, request.ttl)
            return AcquireResult(grant, Decision.allow("lock", f"slot taken in {self.describe()}"))

        return self._run("take a restart slot", take)  # type: ignore[return-value]

    def renew(self, grant: Grant) -> float:
        def extend(db: sqlite3.Connection, now: float) -> float:
            expires = now + grant.ttl
            cur = db.execute(
                "UPDATE restarts SET expires_at = ? WHERE token = ? AND finished_at IS NULL AND expires_at > ?",
                (expires, grant.token, now),
            )
            if cur.rowcount != 1:
                raise LeaseLost(
                    f"the restart slot of {grant.instance} in {self.describe()} expired before it was renewed; "
                    "another agent may hold it now"
                )
            return expires

        return self._run("renew a restart slot", extend)  # type: ignore[return-value]

    def release(self, grant: Grant, outcome: str) -> None:
        def close(db: sqlite3.Connection, now: float) -> None:
            db.execute(
                "UPDATE restarts SET finished_at = ?, outcome = ? WHERE token = ? AND finished_at IS NULL",
                (now, outcome, grant.token),
            )

        self._run("release a restart slot", close)

    def restarts(self, since: float) -> list[RestartRecord]:
        def read(db: sqlite3.Connection, now: float) -> list[RestartRecord]:
            self._expire(db, now)
            return self._records(db, since)

        return self._run("list restarts", read)  # type: ignore[return-value]

    # ----------------------------------------------------------------------------- fleet view
    def publish(self, agent: str, entries: Sequence[FleetEntry], ttl: float) -> None:
        def write(db: sqlite3.Connection, now: float) -> None:
            names = [e.instance for e in entries]
            db.execute(
                f"DELETE FROM fleet_entries WHERE namespace = ? AND agent = ? "
                f"AND instance NOT IN ({','.join('?' * len(names))})",
                (self.namespace, agent, *names),
            )
            db.executemany(
                "INSERT OR REPLACE INTO fleet_entries VALUES (?, ?, ?, ?, ?)",
                [(self.namespace, e.instance, agent, json.dumps(e.to_dict()), now + ttl) for e in entries],
            )

        self._run("publish this agent's instances", write)

    def fleet(self) -> list[FleetEntry]:
        def read(db: sqlite3.Connection, now: float) -> list[str]:
            db.execute("DELETE FROM fleet_entries WHERE expires_at <= ?", (now,))
            rows = db.execute(
                "SELECT data FROM fleet_entries WHERE namespace = ? ORDER BY instance", (self.namespace,)
            )
            return [row[0] for row in rows]

        entries = []
        for data in self._run("list the fleet", read):  # type: ignore[attr-defined]
            try:
                entries.append(FleetEntry.from_dict(json.loads(data)))
            except ValueError:
                continue  # another agent's bad entry must not stop this one; it expires
        return entries

    # ----------------------------------------------------------------------------- the elected planner
    def _leader_row(self, db: sqlite3.Connection, now: float) -> tuple[str, int] | None:
        row = db.execute(
            "SELECT agent, term FROM leaders WHERE namespace = ? AND expires_at > ?", (self.namespace, now)
        ).fetchone()
        return (row[0], int(row[1])) if row else None

    def _term(self, db: sqlite3.Connection, now: float) -> int | None:
        row = self._leader_row(db, now)
        return row[1] if row else None

    def campaign(self, agent: str, ttl: float, spread: float = 0.0) -> Leadership | None:
        def take(db: sqlite3.Connection, now: float) -> Leadership | None:
            current = self._leader_row(db, now)
            mine = self._leadership
            if current is not None:
                if mine is not None and current == (agent, mine.revision):
                    db.execute(
                        "UPDATE leaders SET expires_at = ? WHERE namespace = ?", (now + ttl, self.namespace)
                    )
                    return mine
                return None
            row = db.execute("SELECT term FROM leaders WHERE namespace = ?", (self.namespace,)).fetchone()
            term = (int(row[0]) if row else 0) + 1
            db.execute(
                "INSERT OR REPLACE INTO leaders VALUES (?, ?, ?, ?)", (self.namespace, agent, term, now + ttl)
            )
            seat = json.dumps({"agent": agent, "term": term, "since": now})
            db.execute("INSERT OR REPLACE INTO controls VALUES (?, 'leader', ?)", (self.namespace, seat))
            return Leadership(agent, term, now)

        leadership: Leadership | None = self._run("campaign for leadership", take)  # type: ignore[assignment]
        self._leadership = leadership
        return leadership

    def resign(self) -> None:
        mine, self._leadership = self._leadership, None
        if mine is None:
            return

        def leave(db: sqlite3.Connection, now: float) -> None:
            db.execute(
                "UPDATE leaders SET expires_at = 0 WHERE namespace = ? AND agent = ? AND term = ?",
                (self.namespace, mine.agent, mine.revision),
            )

        self._run("resign leadership", leave)

    def leader(self) -> str | None:
        row = self._run("read the leader", self._leader_row)
        return row[0] if row else None  # type: ignore[index]

    def leader_info(self) -> dict[str, Any] | None:
        def read(db: sqlite3.Connection, now: float) -> tuple[tuple[str, int] | None, str | None]:
            seat = db.execute(
                "SELECT data FROM controls WHERE namespace = ? AND name = 'leader'", (self.namespace,)
            ).fetchone()
            return self._leader_row(db, now), (seat[0] if seat else None)

        found: tuple[tuple[str, int] | None, str | None] = self._run("read the leader", read)  # type: ignore[assignment]
        row, seat = found
        if row is None:
            return None
        took = profile_doc(seat) if isinstance(seat, str) else None
        since = took.get("since") if took and (took.get("agent"), took.get("term")) == row else None
        return {"agent": row[0], "revision": row[1], "since": checked_time(since)}

    def write_grants(self, leadership: Leadership, grants: Mapping[str, Sequence[PlannedGrant]]) -> int:
        docs = {
            agent: json.dumps([g.to_dict() for g in sorted(items, key=lambda g: g.instance)], sort_keys=True)
            for agent, items in grants.items()
            if items
        }

        def write(db: sqlite3.Connection, now: float) -> int:
            if self._leader_row(db, now) != (leadership.agent, leadership.revision):
                self._leadership = None
                raise LeaseLost(
                    f"{self.describe()}: leadership (term {leadership.revision}) was lost before the "
                    "grants were written; the new leader plans"
                )
            old = dict(db.execute("SELECT agent, data FROM grants WHERE namespace = ?", (self.namespace,)))
            gone = [a for a in old if a not in docs]
            changed = [(self.namespace, a, d) for a, d in docs.items() if old.get(a) != d]
            db.executemany(
                "DELETE FROM grants WHERE namespace = ? AND agent = ?", [(self.namespace, a) for a in gone]
            )
            db.executemany("INSERT OR REPLACE INTO grants VALUES (?, ?, ?)", changed)
            return len(gone) + len(changed)

        return self._run("write the grants", write)  # type: ignore[return-value]

    def grants(self, agent: str) -> list[PlannedGrant] | None:
        def read(db: sqlite3.Connection, now: float) -> tuple[int | None, str | None, bool]:
            row = db.execute(
                "SELECT data FROM grants WHERE namespace = ? AND agent = ?", (self.namespace, agent)
            ).fetchone()
            return self._term(db, now), (row[0] if row else None), self._pause(db, now) is not None

        found: tuple[int | None, str | None, bool] = self._run("read this agent's grants", read)  # type: ignore[assignment]
        term, data, paused = found
        out: list[PlannedGrant] = []
        if term is not None and data is not None and not paused:
            try:
                items = json.loads(data)
            except ValueError:
                items = []
            for item in items if isinstance(items, list) else []:
                try:
                    grant = PlannedGrant.from_dict(item)
                except ValueError:
                    continue  # a bad grant is no grant: that instance waits
                if grant.revision == term:
                    out.append(grant)
        self._fences = {g.instance: g.revision for g in out}
        return out

    def _pause(self, db: sqlite3.Connection, now: float) -> dict[str, Any] | None:
        """The fleet pause in force at `now`; one past its `until` is deleted on the way."""
        row = db.execute(
            "SELECT data FROM controls WHERE namespace = ? AND name = 'pause'", (self.namespace,)
        ).fetchone()
        text = None if row is None else row[0] if isinstance(row[0], str) else ""  # not text: unreadable
        pause = read_pause(text, now, self.clocks)
        if row is not None and pause is None:
            db.execute("DELETE FROM controls WHERE namespace = ? AND name = 'pause'", (self.namespace,))
        return pause

    def fleet_pause(self) -> dict[str, Any] | None:
        return self._run("read the fleet pause", self._pause)  # type: ignore[return-value]

    def set_fleet_pause(self, pause: dict[str, Any] | None) -> None:
        def write(db: sqlite3.Connection, now: float) -> None:
            if pause is None:
                db.execute("DELETE FROM controls WHERE namespace = ? AND name = 'pause'", (self.namespace,))
            else:
                db.execute(
                    "INSERT OR REPLACE INTO controls VALUES (?, 'pause', ?)",
                    (self.namespace, json.dumps(pause)),
                )

        self._run("set the fleet pause", write)

    # ----------------------------------------------------------------------------- workload profiles
    def put_profile(self, key: str, doc: Mapping[str, Any], ttl: float) -> None:
        text = profile_text(key, doc)

        def write(db: sqlite3.Connection, now: float) -> None:
            db.execute("DELETE FROM profiles WHERE expires_at <= ?", (now,))
            db.execute(
                "INSERT OR REPLACE INTO profiles VALUES (?, ?, ?, ?)", (self.namespace, key, text, now + ttl)
            )

        self._run("share a workload profile", write)

    def get_profiles(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        wanted = list(dict.fromkeys(keys))[:MAX_PROFILE_READ]
        for key in wanted:
            check_profile_key(key)
        if not wanted:
            return {}

        def read(db: sqlite3.Connection, now: float) -> list[tuple[str, str]]:
            return db.execute(
                f"SELECT key, data FROM profiles WHERE namespace = ? AND expires_at > ? "
                f"AND key IN ({','.join('?' * len(wanted))})",
                (self.namespace, now, *wanted),
            ).fetchall()

        rows: list[tuple[str, str]] = self._run("read workload profiles", read)  # type: ignore[assignment]
        return {key: doc for key, data in rows if (doc := profile_doc(data)) is not None}

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
