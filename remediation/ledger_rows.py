"""The ledger's tables as SQLite keeps them, and the records its queries return.

The schema and the columns of each table, the columns added since the first release (added to an
older state dir when it is opened), how an action's JSON columns are written and read, and the
typed rows people and the API see: an escalation (`EscalationRow`), a decision (`DecisionRow`).
The queries themselves are `remediation.ledger`'s.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from probes.linux.procfs import CLOCK_TICKS
from remediation.model import WOULD_RESTART

SCHEMA = """
CREATE TABLE IF NOT EXISTS remediation_actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, instance TEXT NOT NULL, action TEXT NOT NULL,
    mode TEXT NOT NULL, request_kind TEXT, finding_id TEXT, reason TEXT NOT NULL,
    deadline REAL, slot_at REAL, created_at REAL NOT NULL, started_at REAL, finished_at REAL,
    outcome TEXT NOT NULL, detail TEXT NOT NULL DEFAULT '', fleet TEXT, actuator TEXT,
    old_pid INTEGER, old_start_time REAL, new_pid INTEGER, holder TEXT, token TEXT,
    stages TEXT NOT NULL DEFAULT '[]', evidence TEXT NOT NULL DEFAULT '[]', data TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS remediation_actions_instance ON remediation_actions (instance, id);
CREATE INDEX IF NOT EXISTS remediation_actions_created ON remediation_actions (created_at);
CREATE TABLE IF NOT EXISTS remediation_decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, instance TEXT NOT NULL, stage TEXT NOT NULL,
    ok INTEGER NOT NULL, code TEXT NOT NULL, reason TEXT NOT NULL, retry_at REAL,
    data TEXT NOT NULL DEFAULT '{}');
CREATE INDEX IF NOT EXISTS remediation_decisions_instance ON remediation_decisions (instance, id);
CREATE TABLE IF NOT EXISTS remediation_cases (
    instance TEXT NOT NULL, finding_id TEXT NOT NULL, kind TEXT NOT NULL,
    first_seen REAL NOT NULL, last_seen REAL NOT NULL, closed_at REAL,
    purged_at REAL, purge_result TEXT, restarted_at REAL, restart_outcome TEXT, escalated_at REAL,
    restart_deadline REAL, restart_finding TEXT,
    PRIMARY KEY (instance, finding_id));
CREATE TABLE IF NOT EXISTS remediation_starts (
    instance TEXT NOT NULL, start_time REAL NOT NULL, seen_at REAL NOT NULL,
    PRIMARY KEY (instance, start_time));
CREATE TABLE IF NOT EXISTS remediation_control (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS remediation_escalations (
    instance TEXT PRIMARY KEY, at REAL NOT NULL, code TEXT NOT NULL, reason TEXT NOT NULL,
    finding_id TEXT, action_id INTEGER);
CREATE TABLE IF NOT EXISTS remediation_resets (instance TEXT PRIMARY KEY, at REAL NOT NULL);
"""
JSON_COLUMNS = ("stages", "evidence", "data")
ACTION_COLUMNS = [
    "id",
    "instance",
    "action",
    "mode",
    "request_kind",
    "finding_id",
    "reason",
    "deadline",
    "slot_at",
    "created_at",
    "started_at",
    "finished_at",
    "outcome",
    "detail",
    "fleet",
    "actuator",
    "old_pid",
    "old_start_time",
    "new_pid",
    "holder",
    "token",
    "stages",
    "evidence",
    "data",
]
CASE_COLUMNS = [
    "instance",
    "finding_id",
    "kind",
    "first_seen",
    "last_seen",
    "purged_at",
    "purge_result",
    "restarted_at",
    "restart_outcome",
    "escalated_at",
    "restart_deadline",
    "restart_finding",
]
# columns added since the first release: (table, column, type), added to older state dirs on open
ADDED_COLUMNS = [
    ("remediation_cases", "restart_deadline", "REAL"),
    ("remediation_cases", "restart_finding", "TEXT"),
]
START_TOLERANCE = 1.0 / CLOCK_TICKS + 1e-6
FINISHED = (
    "succeeded",
    "failed",
    "interrupted",
    "dry-run",
    WOULD_RESTART,
    "purged",
    "escalated",
    "abandoned",
    "replaced",
)
WOULD = f"('{WOULD_RESTART}', 'dry-run')"  # 'dry-run': what an older medic called a would-be restart


class EscalationRow(TypedDict):
    """An instance handed to a person (`remediation_escalations`): no automatic action until cleared."""

    instance: str
    at: float
    code: str
    reason: str
    finding_id: str | None
    action_id: int | None


class DecisionRow(TypedDict):
    """One change of an instance's verdict (`remediation_decisions`), newest first in `decisions()`."""

    id: int
    ts: float
    instance: str
    stage: str
    ok: bool
    code: str
    reason: str
    retry_at: float | None
    data: dict[str, Any]


def encode_action(row: dict[str, Any]) -> dict[str, Any]:
    """An action's fields as columns: a field the table lacks is refused (a typo would be lost)."""
    unknown = set(row) - set(ACTION_COLUMNS)
    if unknown:
        raise ValueError(f"unknown action field(s): {', '.join(sorted(unknown))}")
    return {k: (json.dumps(v, default=str) if k in JSON_COLUMNS else v) for k, v in row.items()}


def decode_action(row: dict[str, Any]) -> dict[str, Any]:
    """A row read back: its JSON columns parsed, empty ones as an empty list (or dict, for `data`)."""
    for key in JSON_COLUMNS:
        row[key] = json.loads(row[key]) if row.get(key) else ([] if key != "data" else {})
    return row
