"""The durable outbox: notifications wait in SQLite until their sink accepts them.

Each row belongs to one sink and is `pending`, `delivered` or `dead`. A sink's items go out in
order: only the oldest pending item of a sink is attempted, so a target that is down for a while
gets everything once it is back, in the order it happened. A failed attempt waits
`min(cap, base·2^(n-1))`, shortened by a random part (jitter) so that many agents do not retry
in step; a target that said when to come back (`Retry-After`) is not tried sooner than that. After
`max_attempts`, or at once for an answer that no retry can fix (a 4xx other than 408/429), the item
becomes a dead letter and the next one goes.

Dedup keys: `enqueue(..., replace=False)` drops an item whose (sink, key) was ever queued (an
event is notified once, even when routed twice); `replace=True` overwrites the payload of the
pending item with that key, keeping its place (the latest state of an alert wins), or queues a
new one when none is pending.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.notify.config import RetrySpec
from agent.state.store import Store

State = Literal["pending", "delivered", "dead"]
STATES: tuple[str, ...] = ("pending", "delivered", "dead")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS notify_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sink TEXT NOT NULL,
    dedup_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    instance TEXT,
    payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    next_attempt_at REAL NOT NULL,
    last_attempt_at REAL,
    done_at REAL,
    last_error TEXT,
    revision INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS notify_outbox_queue ON notify_outbox (sink, state, id);
CREATE INDEX IF NOT EXISTS notify_outbox_key ON notify_outbox (sink, dedup_key);
"""
_COLUMNS = (
    "id, sink, dedup_key, kind, instance, payload, state, attempts, created_at, next_attempt_at, "
    "last_attempt_at, done_at, last_error, revision"
)
MAX_ERROR = 500


def backoff_delay(attempt: int, retry: RetrySpec, draw: float) -> float:
    """Seconds to wait after the `attempt`-th failed attempt (1-based); `draw` in [0, 1) is the jitter."""
    full = min(retry.cap, retry.base * 2.0 ** min(max(attempt - 1, 0), 60))
    return full * (1.0 - retry.jitter * min(max(draw, 0.0), 1.0))


@dataclass(frozen=True, slots=True)
class OutboxItem:
    id: int
    sink: str
    dedup_key: str
    kind: str
    instance: str | None
    payload: dict[str, Any]
    state: State
    attempts: int
    created_at: float
    next_attempt_at: float
    last_attempt_at: float | None
    done_at: float | None
    last_error: str | None
    revision: int = 0  # bumped when a pending item's payload is replaced

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sink": self.sink,
            "dedup_key": self.dedup_key,
            "kind": self.kind,
            "instance": self.instance,
            "state": self.state,
            "attempts": self.attempts,
            "created_at": self.created_at,
            "next_attempt_at": self.next_attempt_at if self.state == "pending" else None,
            "last_attempt_at": self.last_attempt_at,
            "done_at": self.done_at,
            "last_error": self.last_error,
            "payload": self.payload,
        }


@dataclass(slots=True)
class SinkStats:
    """Per-sink figures for `/metrics`: queue gauges from the store, counters since the agent started."""

    pending: int = 0
    dead: int = 0
    oldest_pending: float | None = None
    delivered_total: int = 0
    failures_total: int = 0
    dead_total: int = 0
    last_success: float | None = None


@dataclass
class _Counters:
    delivered: dict[str, int] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)
    dead: dict[str, int] = field(default_factory=dict)
    last_success: dict[str, float] = field(default_factory=dict)


def ensure_outbox_schema(store: Store) -> None:
    store.ensure_schema(_SCHEMA)


class Outbox:
    def __init__(self, store: Store, retry: RetrySpec, rng: Callable[[], float] = random.random) -> None:
        self.store = store
        self.retry = retry
        self.rng = rng
        self._counters = _Counters()
        self._lock = threading.Lock()
        ensure_outbox_schema(store)

    # ----------------------------------------------------------------------------- writing
    def enqueue(
        self,
        db: sqlite3.Connection,
        *,
        sink: str,
        dedup_key: str,
        payload: dict[str, Any],
        kind: str,
        instance: str | None,
        now: float,
        replace: bool = False,
    ) -> int | None:
        """Queue one item inside the caller's transaction (`store.transaction()`); its id, or None if deduplicated."""
        text = json.dumps(payload, default=str, separators=(",", ":"))
        if replace:
            row = db.execute(
                "SELECT id FROM notify_outbox WHERE sink=? AND dedup_key=? AND state='pending' ORDER BY id LIMIT 1",
                (sink, dedup_key),
            ).fetchone()
            if row is not None:
                db.execute(
                    "UPDATE notify_outbox SET payload=?, kind=?, revision=revision+1 WHERE id=?",
                    (text, kind, row[0]),
                )
                item_id: int = row[0]
                return item_id
        elif db.execute(
            "SELECT 1 FROM notify_outbox WHERE sink=? AND dedup_key=? LIMIT 1", (sink, dedup_key)
        ).fetchone():
            return None
        cur = db.execute(
            """INSERT INTO notify_outbox (sink, dedup_key, kind, instance, payload, created_at, next_attempt_at)
               VALUES (?, ?, ?, ?, ?, ?, ?)""",
            (sink, dedup_key, kind, instance, text, now, now),
        )
        return cur.lastrowid

    def put(self, **kwargs: Any) -> int | None:
        """`enqueue` in a transaction of its own."""
        with self.store.transaction() as db:
            return self.enqueue(db, **kwargs)

    def delivered(self, item: OutboxItem, now: float) -> bool:
        """Mark the item delivered; False if its payload was replaced meanwhile (then it goes again, now)."""
        with self.store.transaction() as db:
            cur = db.execute(
                """UPDATE notify_outbox SET state='delivered', attempts=attempts+1, last_attempt_at=?,
                   done_at=?, last_error=NULL WHERE id=? AND revision=?""",
                (now, now, item.id, item.revision),
            )
            if cur.rowcount == 0:
                db.execute("UPDATE notify_outbox SET next_attempt_at=? WHERE id=?", (now, item.id))
        with self._lock:
            counters = self._counters
            counters.delivered[item.sink] = counters.delivered.get(item.sink, 0) + 1
            counters.last_success[item.sink] = now
        return cur.rowcount > 0

    def failed(
        self, item: OutboxItem, error: str, retryable: bool, now: float, retry_after: float | None = None
    ) -> State:
        """Record a failed attempt; the item waits for its backoff, or for as long as the target asked
        (`retry_after` seconds) when that is longer, or becomes a dead letter."""
        attempts = item.attempts + 1
        dead = not retryable or attempts >= self.retry.max_attempts
        delay = max(backoff_delay(attempts, self.retry, self.rng()), retry_after or 0.0)
        with self.store.transaction() as db:
            db.execute(
                """UPDATE notify_outbox SET state=?, attempts=?, last_attempt_at=?, next_attempt_at=?,
                   done_at=?, last_error=? WHERE id=?""",
                (
                    "dead" if dead else "pending",
                    attempts,
                    now,
                    now + delay,
                    now if dead else None,
                    error[:MAX_ERROR],
                    item.id,
                ),
            )
        with self._lock:
            counters = self._counters
            counters.failures[item.sink] = counters.failures.get(item.sink, 0) + 1
            if dead:
                counters.dead[item.sink] = counters.dead.get(item.sink, 0) + 1
        return "dead" if dead else "pending"

    def requeue_dead(self, ids: list[int], now: float) -> int:
        """Give dead letters another round of attempts (an operator fixed the target)."""
        if not ids:
            return 0
        marks = ",".join("?" * len(ids))
        with self.store.transaction() as db:
            cur = db.execute(
                f"""UPDATE notify_outbox SET state='pending', attempts=0, next_attempt_at=?, done_at=NULL
                    WHERE state='dead' AND id IN ({marks})""",
                (now, *ids),
            )
        return cur.rowcount

    def dead_among(self, ids: list[int]) -> list[int]:
        """Which of `ids` are dead letters, in order."""
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = self.store.query(
            f"SELECT id FROM notify_outbox WHERE state='dead' AND id IN ({marks}) ORDER BY id", tuple(ids)
        )
        return [row[0] for row in rows]

    def prune(self, now: float, keep_delivered: float, keep_dead: float) -> int:
        with self.store.transaction() as db:
            cur = db.execute(
                """DELETE FROM notify_outbox WHERE (state='delivered' AND done_at < ?)
                   OR (state='dead' AND done_at < ?)""",
                (now - keep_delivered, now - keep_dead),
            )
        return cur.rowcount

    # ----------------------------------------------------------------------------- reading
    def head(self, sink: str) -> OutboxItem | None:
        """The sink's oldest pending item, due or not: nothing behind it goes first."""
        rows = self.store.query(
            f"SELECT {_COLUMNS} FROM notify_outbox WHERE sink=? AND state='pending' ORDER BY id LIMIT 1",
            (sink,),
        )
        return _item(rows[0]) if rows else None

    def items(
        self,
        *,
        state: str | None = None,
        sink: str | None = None,
        instance: str | None = None,
        limit: int = 100,
    ) -> list[OutboxItem]:
        """Newest first."""
        where: list[str] = []
        args: list[object] = []
        for column, value in (("state", state), ("sink", sink), ("instance", instance)):
            if value is not None:
                where.append(f"{column}=?")
                args.append(value)
        sql = f"SELECT {_COLUMNS} FROM notify_outbox"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(max(1, min(limit, 10_000)))
        return [_item(row) for row in self.store.query(sql, args)]

    def stats(self, sinks: list[str]) -> dict[str, SinkStats]:
        out = {name: SinkStats() for name in sinks}
        rows = self.store.query(
            """SELECT sink, state, count(*), min(created_at) FROM notify_outbox
               WHERE state IN ('pending', 'dead') GROUP BY sink, state"""
        )
        for sink, state, count, oldest in rows:
            stats = out.setdefault(sink, SinkStats())
            if state == "pending":
                stats.pending, stats.oldest_pending = count, oldest
            else:
                stats.dead = count
        with self._lock:
            counters = self._counters
            for sink, stats in out.items():
                stats.delivered_total = counters.delivered.get(sink, 0)
                stats.failures_total = counters.failures.get(sink, 0)
                stats.dead_total = counters.dead.get(sink, 0)
                stats.last_success = counters.last_success.get(sink)
        return out


def _item(row: tuple[Any, ...]) -> OutboxItem:
    values = list(row)
    values[5] = json.loads(values[5])
    return OutboxItem(*values)
