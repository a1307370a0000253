"""The restart ledger and the engine's memory, kept in the agent's SQLite store (tables `remediation_*`).

    remediation_actions    every purge, restart (done, or `would-restart` in dry-run), escalation,
                           and a person's restart request from the moment it is asked (`requested`,
                           `held` with the reason): reason, finding, mode, timings, outcome,
                           verification, evidence
    remediation_decisions  each instance's decisions, one row whenever its verdict changes
    remediation_cases      per (instance, finding): first/last seen, purge, restart, escalation
    remediation_starts     every process start seen per instance (crash-loop counting)
    remediation_escalations  instances handed to a person: no automatic action until cleared
    remediation_resets     when each instance's escalation was last cleared or expired: crash loops
                           are counted from the processes started after it
    remediation_control    the global pause (reason, who, until)

All of it survives an agent restart; the budget itself lives in the coordinator. The tables' schema
and the records these queries return are `remediation.ledger_rows`'.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from agent.core.ports import TableStore
from agent.core.sql import where_clause
from remediation.ledger_rows import (
    ACTION_COLUMNS,
    ADDED_COLUMNS,
    CASE_COLUMNS,
    FINISHED,
    SCHEMA,
    START_TOLERANCE,
    WOULD,
    DecisionRow,
    EscalationRow,
    decode_action,
    encode_action,
)
from remediation.model import WOULD_RESTART, Decision, RemediationRequest, RestartRecord, WouldRestart
from remediation.policy import CaseHistory, related_kinds

WAITING = ("requested", "held")  # the outcomes of a person's request until it is carried out
UNFINISHED = ("running", "planned", *WAITING)  # what an agent that stopped leaves open


class Ledger:
    def __init__(self, store: TableStore) -> None:
        self.store = store
        store.ensure_schema(SCHEMA)
        self._add_columns()
        self._last_decision: dict[str, tuple[str, str, bool]] = {}
        for instance, stage, code, ok in store.query(
            "SELECT instance, stage, code, ok FROM remediation_decisions WHERE id IN "
            "(SELECT max(id) FROM remediation_decisions GROUP BY instance)"
        ):
            self._last_decision[instance] = (stage, code, bool(ok))

    def _add_columns(self) -> None:
        """A state dir written by an older medic lacks the newer columns: add them (NULL in old rows)."""
        for table, column, kind in ADDED_COLUMNS:
            present = {row[1] for row in self.store.query(f"PRAGMA table_info({table})")}
            if column not in present:
                with self.store.transaction() as db:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    # ----------------------------------------------------------------------------- actions
    def open_action(
        self,
        *,
        instance: str,
        action: str,
        mode: str,
        reason: str,
        outcome: str,
        now: float,
        request: RemediationRequest | None = None,
        **fields: Any,
    ) -> int:
        row: dict[str, Any] = {
            "instance": instance,
            "action": action,
            "mode": mode,
            "reason": reason,
            "outcome": outcome,
            "created_at": now,
            "request_kind": request.kind if request else None,
            "finding_id": request.finding_id if request else None,
            "deadline": request.deadline if request else None,
            **fields,
        }
        row = encode_action(row)
        with self.store.transaction() as db:
            cur = db.execute(
                f"INSERT INTO remediation_actions ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                tuple(row.values()),
            )
            assert cur.lastrowid is not None  # an INSERT into a rowid table always has one
            return cur.lastrowid

    def update_action(self, action_id: int, *, only_while: tuple[str, ...] = (), **fields: Any) -> None:
        """Write `fields` into the action; with `only_while`, only if its outcome is still one of
        those (a waiting request's answer must not overwrite the restart that carried it out)."""
        if not fields:
            return
        row = encode_action(fields)
        still = f" AND outcome IN ({', '.join('?' * len(only_while))})" if only_while else ""
        with self.store.transaction() as db:
            db.execute(
                f"UPDATE remediation_actions SET {', '.join(f'{k} = ?' for k in row)} WHERE id = ?{still}",
                (*row.values(), action_id, *only_while),
            )

    def actions(
        self, *, instance: str | None = None, since: float | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Newest first."""
        where, args = where_clause([("instance = ?", instance), ("created_at >= ?", since)])
        sql = f"SELECT {', '.join(ACTION_COLUMNS)} FROM remediation_actions{where} ORDER BY id DESC LIMIT ?"
        args.append(max(1, min(limit, 10_000)))
        return [decode_action(dict(zip(ACTION_COLUMNS, row))) for row in self.store.query(sql, args)]

    def action(self, action_id: int) -> dict[str, Any] | None:
        rows = self.store.query(
            f"SELECT {', '.join(ACTION_COLUMNS)} FROM remediation_actions WHERE id = ?", (action_id,)
        )
        return decode_action(dict(zip(ACTION_COLUMNS, rows[0]))) if rows else None

    def would_restarts(self, since: float, holder: str) -> list[RestartRecord]:
        """The restarts dry-run mode would have made since `since`, as the budget counts them
        (fleet-wide as enforce's would be, never for the instance's own cooldown: `remediation.dry_run`)."""
        rows = self.store.query(
            "SELECT instance, fleet, started_at, finished_at FROM remediation_actions "
            f"WHERE action = 'restart' AND outcome IN {WOULD} AND started_at >= ?",
            (since,),
        )
        return [
            RestartRecord(instance, fleet or "default", holder, started, finished, WOULD_RESTART)
            for instance, fleet, started, finished in rows
        ]

    def would_restart(self, instance: str, start_time: float | None) -> WouldRestart | None:
        """The would-be restart dry-run recorded for the process of `instance` started at `start_time`."""
        if start_time is None:
            return None
        rows = self.store.query(
            "SELECT id, started_at, old_start_time, reason FROM remediation_actions WHERE instance = ? "
            f"AND action = 'restart' AND outcome IN {WOULD} AND abs(old_start_time - ?) <= ? "
            "ORDER BY id DESC LIMIT 1",
            (instance, start_time, START_TOLERANCE),
        )
        return WouldRestart(*rows[0]) if rows else None

    def interrupt_unfinished(self, now: float) -> list[dict[str, Any]]:
        """Actions left open by an agent that stopped: a restart it was running, or a person's request
        it had not carried out yet (requests are kept in memory only), closed as `interrupted`."""
        rows = self.store.query(
            f"SELECT id, outcome FROM remediation_actions WHERE outcome IN ({', '.join('?' * len(UNFINISHED))})",
            UNFINISHED,
        )
        for action_id, outcome in rows:
            asked = outcome in WAITING
            self.update_action(
                action_id,
                outcome="interrupted",
                finished_at=now,
                detail="the agent stopped before this request was carried out; ask again (`medic restart`)"
                if asked
                else "the agent stopped during this restart; its coordinator slot expires with its lease",
            )
        return [a for a in (self.action(r[0]) for r in rows) if a]

    # ----------------------------------------------------------------------------- decisions
    def record_decision(self, instance: str, decision: Decision, now: float) -> bool:
        """Write the decision if the instance's verdict changed; True when written."""
        key = (decision.stage, decision.code, decision.ok)
        if self._last_decision.get(instance) == key:
            return False
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO remediation_decisions (ts, instance, stage, ok, code, reason, retry_at, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    now,
                    instance,
                    decision.stage,
                    int(decision.ok),
                    decision.code,
                    decision.reason,
                    decision.retry_at,
                    json.dumps(dict(decision.data), default=str),
                ),
            )
        self._last_decision[instance] = key
        return True

    def decisions(self, *, instance: str | None = None, limit: int = 100) -> list[DecisionRow]:
        sql = "SELECT id, ts, instance, stage, ok, code, reason, retry_at, data FROM remediation_decisions"
        args: list[Any] = []
        if instance is not None:
            sql += " WHERE instance = ?"
            args.append(instance)
        sql += " ORDER BY id DESC LIMIT ?"
        args.append(max(1, min(limit, 10_000)))
        return [
            {
                "id": i,
                "ts": ts,
                "instance": inst,
                "stage": stage,
                "ok": bool(ok),
                "code": code,
                "reason": reason,
                "retry_at": retry,
                "data": json.loads(data),
            }
            for i, ts, inst, stage, ok, code, reason, retry, data in self.store.query(sql, args)
        ]

    # ----------------------------------------------------------------------------- cases
    def touch_case(self, request: RemediationRequest, now: float, inherit_window: float) -> CaseHistory:
        """The open case of this request, created (or reopened) if needed.

        A new case of the same kind (leak and oom-risk count as one) as a restart that ended less
        than `inherit_window` ago inherits that restart, its deadline and its finding: the finding
        came back on the new process, and the ladder decides whether that means the restart did
        not help (`policy.decide`). A person's request inherits none: it is a new ask.
        """
        existing = self.case(request.instance, request.finding_id)
        kinds = related_kinds(request.kind)
        with self.store.transaction() as db:
            if existing is None:
                inherited = db.execute(
                    "SELECT restarted_at, restart_outcome, restart_deadline, restart_finding "
                    f"FROM remediation_cases WHERE instance = ? AND kind IN ({', '.join('?' * len(kinds))}) "
                    "AND restarted_at IS NOT NULL AND restarted_at >= ? ORDER BY restarted_at DESC LIMIT 1",
                    (request.instance, *kinds, now - inherit_window),
                ).fetchone()
                db.execute(
                    "INSERT INTO remediation_cases (instance, finding_id, kind, first_seen, last_seen, "
                    "restarted_at, restart_outcome, restart_deadline, restart_finding) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        request.instance,
                        request.finding_id,
                        request.kind,
                        request.requested_at or now,
                        now,
                        *(inherited or (None, None, None, None)),
                    ),
                )
            else:
                db.execute(
                    "UPDATE remediation_cases SET last_seen = ?, closed_at = NULL WHERE instance = ? AND finding_id = ?",
                    (now, request.instance, request.finding_id),
                )
        case = self.case(request.instance, request.finding_id)
        assert case is not None
        return case

    def case(self, instance: str, finding_id: str) -> CaseHistory | None:
        rows = self.store.query(
            f"SELECT {', '.join(CASE_COLUMNS)} FROM remediation_cases WHERE instance = ? AND finding_id = ?",
            (instance, finding_id),
        )
        return CaseHistory(*rows[0]) if rows else None

    def open_cases(self) -> list[CaseHistory]:
        rows = self.store.query(
            f"SELECT {', '.join(CASE_COLUMNS)} FROM remediation_cases WHERE closed_at IS NULL ORDER BY instance"
        )
        return [CaseHistory(*row) for row in rows]

    def update_case(self, instance: str, finding_id: str, **fields: Any) -> None:
        with self.store.transaction() as db:
            db.execute(
                f"UPDATE remediation_cases SET {', '.join(f'{k} = ?' for k in fields)} "
                "WHERE instance = ? AND finding_id = ?",
                (*fields.values(), instance, finding_id),
            )

    def close_missing_cases(
        self, seen: Iterable[tuple[str, str]], now: float, grace: float
    ) -> list[CaseHistory]:
        """Close open cases whose request has not come for `grace` seconds: the finding cleared."""
        seen = set(seen)
        closed = [
            case
            for case in self.open_cases()
            if (case.instance, case.finding_id) not in seen and now - case.last_seen >= grace
        ]
        with self.store.transaction() as db:
            db.executemany(
                "UPDATE remediation_cases SET closed_at = ? WHERE instance = ? AND finding_id = ?",
                [(now, c.instance, c.finding_id) for c in closed],
            )
        return closed

    # ----------------------------------------------------------------------------- escalations
    def escalate(
        self, instance: str, code: str, reason: str, finding_id: str | None, action_id: int, now: float
    ) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO remediation_escalations VALUES (?, ?, ?, ?, ?, ?)",
                (instance, now, code, reason, finding_id, action_id),
            )
            if finding_id is not None:
                db.execute(
                    "UPDATE remediation_cases SET escalated_at = ? WHERE instance = ? AND finding_id = ?",
                    (now, instance, finding_id),
                )

    def escalation(self, instance: str) -> EscalationRow | None:
        rows = self.store.query(
            "SELECT instance, at, code, reason, finding_id, action_id FROM remediation_escalations WHERE instance = ?",
            (instance,),
        )
        if not rows:
            return None
        name, at, code, reason, finding_id, action_id = rows[0]
        return EscalationRow(
            instance=name, at=at, code=code, reason=reason, finding_id=finding_id, action_id=action_id
        )

    def escalations(self) -> list[EscalationRow]:
        rows = self.store.query("SELECT instance FROM remediation_escalations ORDER BY instance")
        return [e for e in (self.escalation(r[0]) for r in rows) if e]

    def clear_escalation(self, instance: str, *, reset_history: bool, now: float | None = None) -> bool:
        """Forget an instance's escalation (its open cases no longer say they are escalated);
        `reset_history` also forgets its restarts and starts its crash-loop count afresh at `now`."""
        with self.store.transaction() as db:
            cur = db.execute("DELETE FROM remediation_escalations WHERE instance = ?", (instance,))
            db.execute(
                "UPDATE remediation_cases SET escalated_at = NULL WHERE instance = ? AND closed_at IS NULL",
                (instance,),
            )
            if reset_history:
                db.execute(
                    "UPDATE remediation_cases SET restarted_at = NULL, restart_outcome = NULL, "
                    "restart_deadline = NULL, restart_finding = NULL WHERE instance = ? AND closed_at IS NULL",
                    (instance,),
                )
                db.execute("DELETE FROM remediation_starts WHERE instance = ?", (instance,))
                if now is not None:
                    db.execute("INSERT OR REPLACE INTO remediation_resets VALUES (?, ?)", (instance, now))
            return cur.rowcount > 0

    def reset_at(self, instance: str) -> float | None:
        """When the instance's escalation was last cleared or expired (crash loops count from then)."""
        rows = self.store.query("SELECT at FROM remediation_resets WHERE instance = ?", (instance,))
        return float(rows[0][0]) if rows else None

    # ----------------------------------------------------------------------------- process starts
    def record_start(self, instance: str, start_time: float, now: float) -> bool:
        """Remember a process start of `instance`; False when already known (same start, to a clock tick)."""
        known = self.store.query(
            "SELECT 1 FROM remediation_starts WHERE instance = ? AND abs(start_time - ?) <= ?",
            (instance, start_time, START_TOLERANCE),
        )
        if known:
            return False
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO remediation_starts VALUES (?, ?, ?)", (instance, start_time, now)
            )
        return True

    def starts(self, instance: str, since: float) -> list[float]:
        rows = self.store.query(
            "SELECT start_time FROM remediation_starts WHERE instance = ? AND start_time >= ? ORDER BY start_time",
            (instance, since),
        )
        return [r[0] for r in rows]

    # ----------------------------------------------------------------------------- pause
    def set_pause(
        self, reason: str, until: float, by: str | None, now: float, anchor: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Store the pause; `anchor`: its end on the boot clock (`remediation.deadlines`)."""
        value = {"reason": reason, "until": until, "by": by, "since": now, **(anchor or {})}
        with self.store.transaction() as db:
            db.execute("INSERT OR REPLACE INTO remediation_control VALUES ('pause', ?)", (json.dumps(value),))
        return value

    def clear_pause(self) -> dict[str, Any] | None:
        current = self.pause()
        with self.store.transaction() as db:
            db.execute("DELETE FROM remediation_control WHERE key = 'pause'")
        return current

    def pause(self) -> dict[str, Any] | None:
        rows = self.store.query("SELECT value FROM remediation_control WHERE key = 'pause'")
        return json.loads(rows[0][0]) if rows else None

    # ----------------------------------------------------------------------------- retention
    def prune(self, now: float, retention: float) -> None:
        cutoff = now - retention
        with self.store.transaction() as db:
            db.execute("DELETE FROM remediation_decisions WHERE ts < ?", (cutoff,))
            db.execute(
                "DELETE FROM remediation_cases WHERE closed_at IS NOT NULL AND closed_at < ?", (cutoff,)
            )
            db.execute("DELETE FROM remediation_starts WHERE seen_at < ?", (cutoff,))
            db.execute(
                "DELETE FROM remediation_actions WHERE created_at < ? AND outcome IN "
                f"({', '.join('?' * len(FINISHED))})",
                (cutoff, *FINISHED),
            )
