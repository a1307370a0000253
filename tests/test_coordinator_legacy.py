"""A local coordinator file written by the previous release (tables `restarts`, `controls`, `leaders`,
`fleet_entries`) keeps its budget and pause for an agent upgraded in place, and while an agent of the
previous release is alive on it (it cannot see the new layout) no slot is taken."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from remediation.coordinator.local import LocalCoordinator
from remediation.coordinator.records import SlotRequest
from remediation.errors import CoordinatorUnavailable
from remediation.model import Decision

# the previous release's layout, as it created it
OLD_SCHEMA = """
CREATE TABLE restarts (
    token TEXT PRIMARY KEY, namespace TEXT NOT NULL, instance TEXT NOT NULL, fleet TEXT NOT NULL,
    holder TEXT NOT NULL, started_at REAL NOT NULL, expires_at REAL NOT NULL,
    finished_at REAL, outcome TEXT);
CREATE TABLE fleet_entries (
    namespace TEXT NOT NULL, instance TEXT NOT NULL, agent TEXT NOT NULL, data TEXT NOT NULL,
    expires_at REAL NOT NULL, PRIMARY KEY (namespace, instance));
CREATE TABLE leaders (
    namespace TEXT PRIMARY KEY, agent TEXT NOT NULL, term INTEGER NOT NULL, expires_at REAL NOT NULL);
CREATE TABLE controls (
    namespace TEXT NOT NULL, name TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (namespace, name));
"""


def allow(records, now):
    return Decision.allow("budget", "ok")


@pytest.fixture
def old_file(tmp_path):
    path = tmp_path / "coord" / "coordinator.db"
    path.parent.mkdir(mode=0o700)
    now = time.time()
    db = sqlite3.connect(path)
    db.executescript(OLD_SCHEMA)
    db.executemany(
        "INSERT INTO restarts VALUES (?, 'ns', ?, 'f', 'old-agent', ?, ?, ?, ?)",
        [
            ("t1", "done-1", now - 60, now - 30, now - 40, "healthy"),
            ("t2", "busy-1", now - 5, now + 600, None, None),
        ],
    )
    pause = {"reason": "old pause", "until": now + 3600, "by": "ops", "since": now, "agent": "old"}
    db.execute("INSERT INTO controls VALUES ('ns', 'pause', ?)", (json.dumps(pause),))
    db.commit()
    db.close()
    path.chmod(0o600)
    return path


def test_old_restarts_and_pause_are_read_and_the_pause_lifts(old_file):
    coordinator = LocalCoordinator(old_file, namespace="ns")
    try:
        seen = [(r.instance, r.outcome, r.in_flight) for r in coordinator.restarts(0)]
        assert seen == [("done-1", "healthy", False), ("busy-1", None, True)]
        assert coordinator.fleet_pause()["reason"] == "old pause"
        refused = coordinator.acquire(SlotRequest("other", "f", "new", 60), allow).decision
        assert refused.code == "paused"
        coordinator.set_fleet_pause(None)
        assert coordinator.fleet_pause() is None
        busy = coordinator.acquire(SlotRequest("busy-1", "f", "new", 60), allow).decision
        assert busy.code == "in-flight" and "old-agent" in busy.reason
        taken = coordinator.acquire(SlotRequest("other", "f", "new", 60), allow)
        assert taken.granted
        coordinator.release(taken.grant, "healthy")
    finally:
        coordinator.close()


@pytest.mark.parametrize("table", ["leaders", "fleet_entries"])
def test_no_slot_while_an_agent_of_the_previous_release_is_alive(old_file, table):
    db = sqlite3.connect(old_file)
    db.execute("DELETE FROM controls")
    if table == "leaders":
        db.execute("INSERT INTO leaders VALUES ('ns', 'old-agent', 1, ?)", (time.time() + 600,))
    else:
        db.execute(
            "INSERT INTO fleet_entries VALUES ('ns', 'svc', 'old-agent', '{}', ?)", (time.time() + 600,)
        )
    db.commit()
    coordinator = LocalCoordinator(old_file, namespace="ns")
    try:
        with pytest.raises(CoordinatorUnavailable, match="previous release"):
            coordinator.acquire(SlotRequest("other", "f", "new", 60), allow)
        assert [r.instance for r in coordinator.restarts(0) if r.in_flight] == ["busy-1"]
        db.execute(f"UPDATE {table} SET expires_at = 0")  # the old agent stopped (or was upgraded)
        db.commit()
        assert coordinator.acquire(SlotRequest("other", "f", "new", 60), allow).granted
    finally:
        coordinator.close()
        db.close()
