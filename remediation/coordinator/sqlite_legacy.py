"""The previous release's rows in a local coordinator file, read as keys (one release of compatibility).

Agents of the previous release kept restarts in a `restarts` table and the fleet pause in the
`controls` row `pause`. An agent upgraded in place, or sharing the file with agents not upgraded
yet, must not forget them: its reads see each such restart as `restarts/legacy-<token>` (and, while
its row is in flight and unexpired, as the instance's slot `slots/<instance>`), and the pause as
`control/pause` when no pause of the new layout exists. The previous release does not read the new
layout, so while one of its agents is alive on the file (its `leaders` or `fleet_entries` rows are
unexpired: it campaigns and publishes every step) no slot is taken in the new layout
(`refuse_slots`): the old agents restart alone, as they did, and no restart runs unseen beside theirs. They are never written in the old layout:
writing or deleting `control/pause` deletes the old row (write new), and pruning an old restart
deletes its row. The old release's leader,
fleet entries, grants and profiles are not read: each is written again within seconds by whoever
runs. These items carry revision 0: a commit cannot expect them (nothing of the new layout does).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from remediation.coordinator.store import Item

PAUSE = "control/pause"


def _tables(db: sqlite3.Connection) -> set[str]:
    rows = db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' "
        "AND name IN ('restarts', 'controls', 'leaders', 'fleet_entries')"
    )
    return {row[0] for row in rows}


def _wanted(keys: Sequence[str], key: str) -> bool:
    return any(key == k or (k.endswith("/") and key.startswith(k)) for k in keys)


def items(db: sqlite3.Connection, namespace: str, now: float, keys: Sequence[str]) -> dict[str, Item]:
    """The old rows of `namespace` that `keys` (prefixes ending in "/") cover, as items."""
    tables = _tables(db)
    out: dict[str, Item] = {}
    if "restarts" in tables and any(k.startswith(("restarts/", "slots/")) for k in keys):
        rows = db.execute(
            "SELECT instance, fleet, holder, started_at, expires_at, finished_at, outcome, token "
            "FROM restarts WHERE namespace = ?",
            (namespace,),
        )
        for instance, fleet, holder, started, expires, finished, outcome, token in rows:
            record = {
                "instance": instance, "fleet": fleet, "holder": holder, "started_at": started,
                "expires_at": expires, "finished_at": finished, "outcome": outcome, "token": str(token),
            }  # fmt: skip
            key = f"restarts/legacy-{token}"
            if _wanted(keys, key):
                out[key] = Item(json.dumps(record), 0, 0)
            slot = f"slots/{instance}"
            if finished is None and expires > now and _wanted(keys, slot):
                out[slot] = Item(
                    json.dumps({"token": str(token), "holder": holder, "started_at": started}), 0, 0
                )
    if "controls" in tables and _wanted(keys, PAUSE):
        row = db.execute(
            "SELECT data FROM controls WHERE namespace = ? AND name = 'pause'", (namespace,)
        ).fetchone()
        if row is not None:
            out[PAUSE] = Item(row[0] if isinstance(row[0], str) else "", 0, 0)
    return out


def written(db: sqlite3.Connection, namespace: str, keys: Sequence[str]) -> None:
    """The new layout now holds (or deleted) `keys`: the old rows they stand for go."""
    tables = _tables(db)
    if PAUSE in keys and "controls" in tables:
        db.execute("DELETE FROM controls WHERE namespace = ? AND name = 'pause'", (namespace,))
    old = [(namespace, k[len("restarts/legacy-") :]) for k in keys if k.startswith("restarts/legacy-")]
    if old and "restarts" in tables:
        db.executemany("DELETE FROM restarts WHERE namespace = ? AND token = ?", old)


def refuse_slots(db: sqlite3.Connection, namespace: str, now: float) -> str | None:
    """Why no slot may be taken now: an agent of the previous release is alive on the file, or None."""
    tables = _tables(db)
    for table in ("leaders", "fleet_entries"):
        if (
            table in tables
            and db.execute(
                f"SELECT 1 FROM {table} WHERE namespace = ? AND expires_at > ? LIMIT 1", (namespace, now)
            ).fetchone()
        ):
            return (
                f"an agent of the previous release still uses this file (its {table} rows are live) and "
                "cannot see restarts of this release: no restart until every agent that shares it is upgraded"
            )
    return None
