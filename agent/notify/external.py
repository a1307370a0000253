"""`external` findings: alerts from Alertmanager (or another system) about a watched instance.

`open_external_finding` is the one way in; the receiver calls it for each firing alert, and the
lead's code may call it too. It records the finding (table `external_findings`) and emits
`finding_opened` with `{finding: {..., kind: "external"}}`, the same event the detectors emit, so
the finding flows through the same policy and budget. Idempotent on (instance, fingerprint): an
alert already open is only marked seen again, and a duplicate of an alert already resolved (same
fingerprint and start time) changes nothing. `resolve_external_finding` and
`expire_external_findings` (alerts not seen for `stale_after`) emit `finding_resolved`.

Events are emitted after the transaction commits: the event log writes through the same store.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agent.core.sql import where_clause
from agent.state.eventlog import EventLog
from agent.state.store import Store

KIND = "external"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS external_findings (
    id TEXT PRIMARY KEY, instance TEXT NOT NULL, fingerprint TEXT NOT NULL, alertname TEXT NOT NULL,
    severity TEXT NOT NULL, state TEXT NOT NULL, summary TEXT NOT NULL, evidence TEXT NOT NULL,
    first_seen REAL NOT NULL, opened_at REAL NOT NULL, updated_at REAL NOT NULL, last_seen REAL NOT NULL,
    resolved_at REAL, reason TEXT);
CREATE INDEX IF NOT EXISTS external_findings_open ON external_findings (instance, fingerprint, state);
"""
_COLUMNS = (
    "id, instance, fingerprint, alertname, severity, state, summary, evidence, first_seen, opened_at, "
    "updated_at, last_seen, resolved_at, reason"
)


@dataclass(frozen=True, slots=True)
class ExternalAlert:
    instance: str
    fingerprint: str
    alertname: str
    severity: str
    summary: str
    starts_at: float
    evidence: dict[str, Any] = field(default_factory=dict)  # labels, annotations, links


def ensure_external_schema(store: Store) -> None:
    store.ensure_schema(_SCHEMA)


def finding_dict(row: tuple[Any, ...]) -> dict[str, Any]:
    (fid, instance, fingerprint, alertname, severity, state, summary, evidence, first_seen, opened_at, updated_at,
     last_seen, resolved_at, _reason) = row  # fmt: skip
    return {
        "id": fid,
        "instance": instance,
        "kind": KIND,
        "state": "open" if state == "open" else "resolved",
        "severity": severity,
        "verdict": None,
        "first_seen": first_seen,
        "opened_at": opened_at,
        "updated_at": updated_at,
        "resolved_at": resolved_at,
        "summary": summary,
        "evidence": {
            **json.loads(evidence),
            "fingerprint": fingerprint,
            "alertname": alertname,
            "last_seen": last_seen,
        },
    }


def open_external_finding(
    store: Store, events: EventLog, alert: ExternalAlert, now: float
) -> tuple[dict[str, Any], bool]:
    """The open finding for this alert and whether this call opened it (False: a duplicate)."""
    ensure_external_schema(store)
    finding_id = f"{alert.instance}:{KIND}:{alert.fingerprint}:{int(alert.starts_at)}"
    with store.transaction() as db:
        row = (
            db.execute(
                f"SELECT {_COLUMNS} FROM external_findings WHERE instance=? AND fingerprint=? AND state='open'",
                (alert.instance, alert.fingerprint),
            ).fetchone()
            or db.execute(f"SELECT {_COLUMNS} FROM external_findings WHERE id=?", (finding_id,)).fetchone()
        )
        if row is not None:
            if row[5] == "open":
                db.execute("UPDATE external_findings SET last_seen=? WHERE id=?", (now, row[0]))
            return finding_dict(row), False
        values = (
            finding_id, alert.instance, alert.fingerprint, alert.alertname, alert.severity, "open", alert.summary,
            json.dumps(alert.evidence, default=str), alert.starts_at, now, now, now, None, None,
        )  # fmt: skip
        db.execute(f"INSERT INTO external_findings ({_COLUMNS}) VALUES ({','.join('?' * 14)})", values)
    finding = finding_dict(values)
    events.emit(
        "finding_opened",
        f"external alert {alert.alertname}: {alert.summary}",
        instance=alert.instance,
        severity=alert.severity,  # type: ignore[arg-type]
        finding=finding,
    )
    return finding, True


def resolve_external_finding(
    store: Store, events: EventLog, instance: str, fingerprint: str, reason: str, now: float
) -> dict[str, Any] | None:
    """Resolve the open finding of this alert; None when none is open (a duplicate resolution)."""
    ensure_external_schema(store)
    with store.transaction() as db:
        row = db.execute(
            f"SELECT {_COLUMNS} FROM external_findings WHERE instance=? AND fingerprint=? AND state='open'",
            (instance, fingerprint),
        ).fetchone()
        if row is None:
            return None
        db.execute(
            "UPDATE external_findings SET state='resolved', resolved_at=?, updated_at=?, reason=? WHERE id=?",
            (now, now, reason, row[0]),
        )
        row = db.execute(f"SELECT {_COLUMNS} FROM external_findings WHERE id=?", (row[0],)).fetchone()
    finding = finding_dict(row)
    events.emit(
        "finding_resolved",
        f"external alert {row[3]} resolved: {reason}",
        instance=instance,
        severity=row[4],
        finding=finding,
        reason=reason,
    )
    return finding


def expire_external_findings(store: Store, events: EventLog, now: float, stale_after: float) -> int:
    """Resolve external findings whose alert was not seen for `stale_after` (its sender went quiet)."""
    ensure_external_schema(store)
    stale = store.query(
        "SELECT instance, fingerprint, last_seen FROM external_findings WHERE state='open' AND last_seen < ?",
        (now - stale_after,),
    )
    for instance, fingerprint, last_seen in stale:
        resolve_external_finding(
            store, events, instance, fingerprint, f"not seen again for {now - last_seen:.0f}s (stale)", now
        )
    return len(stale)


def external_findings(
    store: Store, *, state: str | None = "open", instance: str | None = None
) -> list[dict[str, Any]]:
    ensure_external_schema(store)
    where, args = where_clause([("state = ?", state or None), ("instance = ?", instance or None)])
    sql = f"SELECT {_COLUMNS} FROM external_findings{where}"
    return [finding_dict(row) for row in store.query(sql + " ORDER BY opened_at DESC", args)]
